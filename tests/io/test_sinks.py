"""Sinks fail soft: against a real Kafka-protocol broker (Tansu) that is not started, killed mid-run and back, the
publish never raises, reports each outcome, and catches up from the set the sink last delivered."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from pipelines.config import KafkaSinkConfig
from pipelines.writeback import sinks as sinks_module
from pipelines.writeback.kafka_sink import KafkaLimitsSink
from pipelines.dataplane.lake import DeltaRsLake
from pipelines.writeback.sinks import SinkSet, read_delivered
from tests.kafka_broker import KafkaBroker, free_port, start_kafka_broker

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc)
TOPIC = "rate-governor-limits"


def record(resource, version, qps=40.0):
    return {"resource_type": "group", "resource": resource, "limit_qps": qps, "version": version}


def kafka_sink(bootstrap: str) -> KafkaLimitsSink:
    cfg = KafkaSinkConfig(enabled=True, bootstrap_servers=bootstrap, topic=TOPIC)  # the shipped producer settings
    return KafkaLimitsSink(cfg)


class RecordingSink:
    name = "recording"
    status: dict[str, str] = {}  # LimitsSink: no endpoint left behind

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[tuple[list, list]] = []

    def publish(self, previous, current):
        self.calls.append((list(previous), list(current)))
        if self.failures:
            self.failures -= 1
            raise ConnectionError("refused")
        return len(current)

    def close(self):
        pass


def test_broker_not_started_then_started_catches_up_and_other_sinks_go_on(spark, tmp_path, caplog):
    port = free_port()
    other = RecordingSink()
    lake = DeltaRsLake(spark, str(tmp_path))
    sinks = SinkSet([kafka_sink(f"127.0.0.1:{port}"), other], lake)  # constructing connects nothing
    started = time.monotonic()
    down = sinks._publish_one(sinks.sinks[0], [record("g", 1)], 0, NOW)
    took = time.monotonic() - started
    sinks.healthy["kafka"] = True
    rows = sinks.publish_all([record("g", 1)], batch_id=0, now=NOW)  # the same again, with the status rows
    down, ok = rows
    assert (down["sink"], down["ok"], down["sent"], down["attempts"]) == ("kafka", False, 0, 3)
    # kafka-python 3: the first connection times out (2.x raised NoBrokersAvailable); the class name once
    assert down["error"].startswith(f"KafkaTimeoutError: Unable to bootstrap from ['127.0.0.1:{port}']"), down["error"]
    assert ok["ok"] and other.calls == [([], [record("g", 1)])]  # the other sink was not held back
    assert took < sinks_module.GIVE_UP_SECONDS + 4, f"a down sink held the micro-batch {took:.1f} s"
    assert sinks.behind and read_delivered(str(tmp_path), "kafka") == []
    assert any(r.levelname == "WARNING" and "sink kafka: publish failed" in r.message for r in caplog.records)

    broker = KafkaBroker(port).start()
    try:
        broker.create_topic(TOPIC)
        rows = sinks.publish_all([record("g", 1)], batch_id=1, now=NOW)
        assert (rows[0]["ok"], rows[0]["sent"], rows[0]["attempts"]) == (True, 1, 1)
        assert [(k, json.loads(v)["version"]) for k, v in broker.read_topic(TOPIC)] == [("group:g", 1)]
    finally:
        broker.kill()
    assert not sinks.behind
    status = lake.read("control/sink_status").orderBy("batch_id", "sink").collect()
    assert [(r["batch_id"], r["sink"], r["ok"]) for r in status] == [
        (0, "kafka", False), (0, "recording", True), (1, "kafka", True), (1, "recording", True)]
    print(f"\nmeasured: one publish with the broker down took {took:.2f} s (3 attempts)")


def test_broker_killed_mid_run_then_back_gets_the_missed_changes_after_a_restart(tmp_path):
    broker = start_kafka_broker()
    try:
        broker.create_topic(TOPIC)
        first = SinkSet([kafka_sink(broker.bootstrap)], lake_root=str(tmp_path))
        assert first.publish_all([record("g", 1), record("h", 1)], batch_id=0, now=NOW)[0]["sent"] == 2
        broker.kill()
        changed = [record("g", 2, qps=20.0)]  # g tightened, h lifted while the broker is down
        row = first.publish_all(changed, batch_id=1, now=NOW)[0]
        assert not row["ok"] and row["attempts"] >= 2  # 3 s delivery timeout, then a 2 s bootstrap timeout; 5 s budget
        first.close()

        broker.start()  # back, empty (in-memory); the governor restarted meanwhile: a new SinkSet
        broker.create_topic(TOPIC)
        second = SinkSet([kafka_sink(broker.bootstrap)], lake_root=str(tmp_path))
        row = second.publish_all(changed, batch_id=2, now=NOW)[0]
        assert row["ok"] and row["sent"] == 2
        got = broker.read_topic(TOPIC)
        assert [(k, v and json.loads(v)["version"]) for k, v in got] == [("group:g", 2), ("group:h", None)]
        assert second.publish_all(changed, batch_id=3, now=NOW)[0]["sent"] == 0  # nothing twice
        second.close()
    finally:
        broker.kill()


def test_transient_failure_is_retried_within_the_batch(tmp_path, monkeypatch):
    flaky = RecordingSink(failures=2)
    rows = SinkSet([flaky], lake_root=str(tmp_path), sleep=lambda s: None).publish_all([record("g", 1)], batch_id=0,
                                                                                      now=NOW)
    assert (rows[0]["ok"], rows[0]["attempts"], rows[0]["sent"]) == (True, 3, 1)
    assert read_delivered(str(tmp_path), "recording") == [record("g", 1)]
    # the diff is against what the sink delivered, not limits.json
    flaky2 = RecordingSink(failures=sinks_module.ATTEMPTS)
    s = SinkSet([flaky2], lake_root=str(tmp_path), sleep=lambda s: None)
    assert not s.publish_all([record("g", 2)], batch_id=1, now=NOW)[0]["ok"]
    s.publish_all([record("g", 2)], batch_id=2, now=NOW)
    assert flaky2.calls[-1] == ([record("g", 1)], [record("g", 2)])


@pytest.mark.parametrize("bad", ["{half", '{"records": 3}'])
def test_unreadable_delivered_state_resends_everything(tmp_path, bad):
    path = sinks_module.delivered_path(str(tmp_path), "recording")
    path.parent.mkdir(parents=True)
    path.write_text(bad)
    sink = RecordingSink()
    SinkSet([sink], lake_root=str(tmp_path)).publish_all([record("g", 1)], batch_id=0, now=NOW)
    assert sink.calls == [([], [record("g", 1)])]


class EndpointSink(RecordingSink):
    """A sink that retries per endpoint itself and keeps the endpoints still failing in ``status`` (as the
    RocketMQ admin sink does per broker)."""

    name = "endpoints"

    def __init__(self) -> None:
        super().__init__()
        self.status: dict[str, str] = {"broker-b": "timeout"}


def test_a_sink_reporting_failing_endpoints_is_recorded_as_not_ok_and_caught_up_later(tmp_path):
    sink = EndpointSink()
    sinks = SinkSet([sink], lake_root=str(tmp_path), sleep=lambda _: None)
    rows = sinks.publish_all([record("g", 1)], batch_id=0, now=NOW)
    assert [(r["ok"], r["error"], r["attempts"]) for r in rows] == [(False, "broker-b: timeout", 1)]
    assert sinks.behind and read_delivered(str(tmp_path), "endpoints") == []   # the next batch sends it again
    sink.status.clear()
    rows = sinks.publish_all([record("g", 1)], batch_id=1, now=NOW)
    assert rows[0]["ok"] and not sinks.behind and sink.calls[-1][0] == []
    assert read_delivered(str(tmp_path), "endpoints") == [record("g", 1)]


def test_limiter_rejections_the_sinks_see_are_recorded_once_each_time_they_move(spark, tmp_path):
    """A sink that reads its limiters (the RocketMQ admin sink's ``last_rejections``): each move of a limiter's
    last rejection becomes one row of control/limiter_rejections; an unchanged or a never (-1) value none."""
    from pipelines import tables

    class ViewingSink(RecordingSink):
        name = "rocketmq"
        last_rejections: dict = {}

    sink = ViewingSink()
    lake = DeltaRsLake(spark, str(tmp_path))
    sinks = SinkSet([sink], lake, sleep=lambda s: None)
    t1 = int(NOW.timestamp() * 1000) - 30_000
    sink.last_rejections = {("broker-a", "%RETRY%g"): t1, ("broker-b", "%RETRY%g"): -1}
    sinks.publish_all([record("g", 1)], batch_id=0, now=NOW)
    sinks.publish_all([record("g", 1)], batch_id=1, now=NOW)                     # nothing moved
    sink.last_rejections = {("broker-a", "%RETRY%g"): t1 + 20_000, ("broker-b", "%RETRY%g"): t1}
    sinks.publish_all([record("g", 1)], batch_id=2, now=NOW)
    rows = sorted((r["batch_id"], r["broker"], r["resource"], r["last_rejected_at"])
                  for r in lake.read(tables.CONTROL_LIMITER_REJECTIONS).collect())
    at = lambda ms: dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).replace(tzinfo=None)  # noqa: E731
    assert rows == [(0, "broker-a", "%RETRY%g", at(t1)), (2, "broker-a", "%RETRY%g", at(t1 + 20_000)),
                    (2, "broker-b", "%RETRY%g", at(t1))]
