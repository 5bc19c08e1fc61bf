"""Write-back faults through the running governor (continuous job, processing-time trigger): the RocketMQ admin
sink against a loopback name server and three masters of both Sohu fork lines, and the Kafka sink against a real
Tansu broker, while a consumer that stays up across the broker's restart keeps every message it received (Tansu
keeps its log in memory only, so a re-sent record shows as a second copy there, not in the broker).

One run, minute by minute: a retry storm is limited and delivered; then Kafka is SIGKILLed, one master refuses
(error code), one stalls, one is unreachable (stopped); then the name server is down; then everything is back (the
servers restarted on their ports, closing idle connections after 0.5 s); then the storm stops and the limit is
lifted. Checked at each step: the queries keep running, ``control/sink_status`` says per sink (and per broker)
what failed, and the first micro-batch after the fault is gone delivers what changed meanwhile, nothing twice.

A real Prometheus (tests/prometheus_server.py) scrapes the governor's metrics endpoint every second and evaluates
the shipped alert rules: through its HTTP API the storm's limit shows with the published value and each broker's
share, the failing sinks show (and their alert is pending), and the lift removes the limit's series."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
from deltalake import DeltaTable

from control import remoting as rm
from control.record import broker_limit
from control.remoting_client import RemotingClient
from pipelines.config import RocketMQSinkConfig, load_config
from pipelines.writeback.publish import read_published
from pipelines.ops import dashboard
from tests.e2e.continuous import ContinuousGovernor, stats_minute
from tests.helpers import write_config
from tests.kafka_broker import KafkaBroker, free_port
from tests.prometheus_server import MISSING, PrometheusServer, prometheus_binary
from tests.rocketmq_loopback import LoopbackBroker, LoopbackNameServer

pytestmark = pytest.mark.slow

GROUP, TOPIC, CLUSTER = "storm-group", "orders", "c1"
RETRY = rm.retry_topic(GROUP)
KAFKA_TOPIC = "rate-governor-limits"


def minute(m: int, storm: bool) -> list[tuple[str, str]]:
    """Both brokers' lines of minute ``m``: the group consumes 100 msg/s per broker; in a storm it sends back as
    much (RUNAWAY_RETRY), else 1 msg/s."""
    retry = 100.0 if storm else 1.0
    return [stats_minute(b, m, {TOPIC: 100.0}, {(TOPIC, GROUP): (100.0, retry)}) for b in ("broker-a", "broker-b")]


def sink_status(lake) -> list[dict]:
    path = lake / "control" / "sink_status"
    if not (path / "_delta_log").is_dir():
        return []
    return sorted(DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: r["at"])


class Consumer:
    """A kafka-python consumer of the limits topic that stays up for the whole test and keeps every message."""

    def __init__(self, bootstrap: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.partition = TopicPartition(KAFKA_TOPIC, 0)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                      auto_offset_reset="earliest", reconnect_backoff_max_ms=500,
                                      allow_auto_create_topics=False)
        self.consumer.assign([self.partition])
        self.received: list[tuple[str, int | None]] = []  # (key, version; None for a tombstone)

    def drain(self, expect: int = 0, timeout_s: float = 30.0, quiet_ms: int = 2000) -> list[tuple[str, int | None]]:
        """Poll until ``expect`` new messages came (within ``timeout_s``), then until none comes for ``quiet_ms``;
        returns the new ones (also kept in ``received``)."""
        new: list[tuple[str, int | None]] = []
        deadline = time.monotonic() + timeout_s
        while len(new) < expect and time.monotonic() < deadline:
            new += self._poll(500)
        while more := self._poll(quiet_ms):
            new += more
        self.received += new
        return new

    def _poll(self, timeout_ms: int) -> list[tuple[str, int | None]]:
        batch = self.consumer.poll(timeout_ms=timeout_ms)
        return [(m.key.decode(), m.value and json.loads(m.value)["version"]) for ms in batch.values() for m in ms]

    def broker_restarted(self, timeout_s: float = 30.0) -> None:
        """The broker came back empty and the governor's sink has created the topic again: read every partition of
        its new log from the start. Called only after the catch-up: when this consumer was re-pointed right after
        the restart, before the topic existed again, the record sent next was not found in partition 0, not even by
        a fresh consumer (seen with Tansu; not explained), so it waits for the topic and takes every partition."""
        from kafka import TopicPartition

        deadline = time.monotonic() + timeout_s
        while not (found := self.consumer.partitions_for_topic(KAFKA_TOPIC)) and time.monotonic() < deadline:
            self._poll(200)
        partitions = [TopicPartition(KAFKA_TOPIC, p) for p in sorted(found or {0})]
        self.consumer.assign(partitions)
        self.consumer.seek_to_beginning(*partitions)


def send_backs(brokers) -> None:
    """The group's send-backs reach each broker: its retry limiter exists (at the broker's default)."""
    client = RemotingClient(timeout_s=2)
    for b in brokers:
        client.invoke(b.addr, rm.CONSUMER_SEND_MSG_BACK, {"group": GROUP, "offset": "0", "delayLevel": "0"})
    client.close()


def limits_seen(prom: PrometheusServer, resource: str) -> tuple[dict, dict]:
    """({"<mode>/<anomaly>": cluster-wide msg/s}, {broker: share}) of ``resource`` in Prometheus now."""
    where = f'{{resource="{resource}"}}'
    limit = {f"{dict(k)['mode']}/{dict(k)['anomaly']}": v
             for k, v in prom.query(f"rate_governor_limit_messages_per_second{where}").items()}
    shares = {dict(k)["broker"]: v
              for k, v in prom.query(f"rate_governor_limit_broker_messages_per_second{where}").items()}
    return limit, shares


def limits_published(lake, resource: str) -> tuple[dict, dict]:
    """The same pair from ``limits.json`` (a group's limit answers RUNAWAY_RETRY)."""
    record = {r["resource"]: r for r in read_published(str(lake))}.get(resource)
    if record is None:
        return {}, {}
    return ({f"{record['mode']}/RUNAWAY_RETRY": record["limit_qps"]},
            {b: f["limit_qps"] for b, f in record.get("brokers", {}).items()})


def alerting(prom: PrometheusServer) -> set[tuple[str, str]]:
    """(alert name, its sink or resource) of every alert pending or firing."""
    return {(a["labels"]["alertname"], a["labels"].get("sink") or a["labels"].get("resource", ""))
            for a in prom.alerts()}


@pytest.fixture()
def prometheus(tmp_path):
    """A real Prometheus scraping the governor's endpoint on the port it yields; None without the binary."""
    port = free_port()
    prom = PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{port}"]).start() if prometheus_binary() else None
    yield port, prom
    if prom is not None:
        prom.stop()


@pytest.fixture()
def servers(tmp_path):
    brokers = [LoopbackBroker("broker-a", idle_close_s=0.5), LoopbackBroker("broker-b", idle_close_s=0.5),
               LoopbackBroker("broker-c", "older", idle_close_s=0.5)]
    ns = LoopbackNameServer(CLUSTER, brokers, idle_close_s=0.5)
    kafka = KafkaBroker(log_file=tmp_path / "tansu.log").start()
    yield ns, brokers, kafka
    kafka.kill()
    ns.stop()
    for b in brokers:
        b.stop()


def test_sink_faults_never_stop_the_governor_and_the_next_micro_batch_catches_up(spark, tmp_path, servers, prometheus):
    ns, brokers, kafka = servers
    metrics_port, prom = prometheus
    started = dt.datetime.now(dt.timezone.utc)
    send_backs(brokers)
    kafka.create_topic(KAFKA_TOPIC)
    consumer = Consumer(kafka.bootstrap)

    landing, lake = tmp_path / "landing", tmp_path / "lake"
    (landing / "send_failures").mkdir(parents=True)
    conf = write_config(tmp_path / "sinks.toml", **{
        "quality.validate_every_n_batches": 0, "windows.trigger_seconds": 2, "windows.watermark_seconds": 60,
        "limits.recovery_windows": 1, "metrics.port": metrics_port, "metrics.address": "127.0.0.1",
        "sink.kafka.enabled": True, "sink.kafka.bootstrap_servers": kafka.bootstrap,  # shipped producer settings
    })
    cfg = load_config(conf).with_paths(str(landing), str(lake))
    rocketmq = RocketMQSinkConfig(enabled=True, namesrv_addr=(ns.addr,), cluster=CLUSTER, timeout_ms=1000,
                                  publish_deadline_ms=1500, idle_timeout_seconds=0.5)
    cfg = cfg.model_copy(update={"sink": cfg.sink.model_copy(update={"rocketmq": rocketmq})})

    def rates_in_line() -> bool:
        records = {r["resource"]: r for r in read_published(str(lake))}
        want = [broker_limit(records[GROUP], b.name)[0] if GROUP in records else b.retry_qps for b in brokers]
        return [b.rates.get(RETRY) for b in brokers] == pytest.approx(want)

    def failed_since(seen: int, sink: str) -> list[dict]:
        return [r for r in sink_status(lake)[seen:] if r["sink"] == sink and not r["ok"]]

    with ContinuousGovernor(spark, cfg) as gov:
        # healthy: quiet minutes, then the storm; the limit reaches every master and the Kafka topic
        gov.land(landing, [f for m in range(6) for f in minute(m, storm=False)])
        for m in (6, 7):
            gov.land(landing, minute(m, storm=True))
        gov.wait(lambda: GROUP in {r["resource"] for r in read_published(str(lake))}, 120, "the storm's limit")
        gov.wait(rates_in_line, 60, "the rates on the masters")
        assert consumer.drain(expect=1) and all(k == f"group:{GROUP}" for k, _ in consumer.received)
        if prom is not None:  # the limit as published, cluster-wide and per broker (two carriers and "*")
            prom.wait(lambda: limits_seen(prom, GROUP) == limits_published(lake, GROUP), 30, "the limit in Prometheus")
            limit, shares = limits_seen(prom, GROUP)
            assert list(limit) == ["enforce/RUNAWAY_RETRY"] and set(shares) == {"broker-a", "broker-b", "*"}
            assert shares["broker-a"] + shares["broker-b"] == pytest.approx(limit["enforce/RUNAWAY_RETRY"])
            prom.wait(lambda: ("RateGovernorLimitEnforced", GROUP) in alerting(prom), 30, "the limit's alert")

        # Kafka killed; broker-a refuses, broker-b stalls, broker-c is unreachable
        seen = len(sink_status(lake))
        kafka.kill()
        brokers[0].error_code, brokers[1].stall = rm.SYSTEM_ERROR, True
        brokers[2].stop()
        gov.land(landing, minute(8, storm=False),
                 until=lambda: failed_since(seen, "kafka") and failed_since(seen, "rocketmq"), what="failed publishes")
        assert gov.running()
        assert failed_since(seen, "kafka")[0]["error"], sink_status(lake)[seen:]
        errors = " | ".join(r["error"] for r in failed_since(seen, "rocketmq"))
        for b in brokers:
            assert b.addr in errors, errors  # logged per broker
        assert "injected error" in errors or str(rm.SYSTEM_ERROR) in errors
        if prom is not None:  # both failing sinks show, and their alert is pending (its `for` is 10 minutes)
            failing = lambda: {dict(k)["sink"] for k in prom.query("rate_governor_sink_failing == 1")}  # noqa: E731
            prom.wait(lambda: failing() == {"kafka", "rocketmq"}, 30, "the failing sinks in Prometheus")
            assert prom.value('rate_governor_sink_publishes_total{sink="kafka", outcome="failed"}') >= 1
            prom.wait(lambda: {("RateGovernorSinkFailing", "kafka"), ("RateGovernorSinkFailing", "rocketmq")}
                      <= alerting(prom), 30, "the sink-failing alerts")

        # the masters are back, the name server is down
        seen = len(sink_status(lake))
        brokers[0].error_code, brokers[1].stall = None, False
        brokers[2].restart()  # the older line keeps no rates across a restart: traffic creates the limiter again
        send_backs(brokers[2:])
        ns.stop()
        gov.land(landing, minute(9, storm=False), what="the name server's failure",
                 until=lambda: any("namesrv" in r["error"] for r in failed_since(seen, "rocketmq")))
        assert gov.running()

        # the name server is back, Kafka still down: the storm is over and the limit is lifted meanwhile; the
        # masters go back to their own defaults at once
        ns.restart()
        published = lambda: {r["resource"] for r in read_published(str(lake))}  # noqa: E731
        for m in (10, 11, 12):  # the brokers print every minute, lifted or not (a lift proven on the fast path's open
            gov.land(landing, minute(m, storm=False))  # windows may land before them; the watermark needs them)
        gov.wait(lambda: GROUP not in published(), 120, "the lift")
        if prom is not None:  # lifted: the limit's series are gone (stale) from the next scrape
            prom.wait(lambda: limits_seen(prom, GROUP) == ({}, {}), 30, "the lift in Prometheus")
        gov.wait(rates_in_line, 60, "the masters back at their defaults")
        assert [b.rates[RETRY] for b in brokers] == [b.retry_qps for b in brokers]
        assert gov.running() and not [r for r in sink_status(lake) if r["sink"] == "kafka"][-1]["ok"]

        # Kafka back (empty): the next micro-batch sends the change made during the outage (the lift's tombstone)
        delivered_before = list(consumer.received)
        kafka.start()
        seen = len(sink_status(lake))
        gov.land(landing, minute(13, storm=False), what="Kafka caught up",
                 until=lambda: any(r["ok"] for r in sink_status(lake)[seen:] if r["sink"] == "kafka"))
        consumer.broker_restarted()
        assert consumer.drain(expect=1) == [(f"group:{GROUP}", None)]
        if prom is not None:
            prom.wait(lambda: prom.value('rate_governor_sink_failing{sink="kafka"}') == 0, 30, "Kafka healthy again")
            assert prom.value('time() - rate_governor_sink_last_success_timestamp_seconds{sink="kafka"}') < 60
            runs = prom.query("rate_governor_micro_batch_duration_seconds_count")
            assert {dict(k)["query"] for k in runs} == {"ingest", "fast", "gold"}
            triggers = {dict(k)["query"]: v for k, v in prom.query("rate_governor_trigger_seconds").items()}
            assert triggers == {"ingest": 2, "gold": 2, "fast": cfg.windows.fast_trigger_seconds}
            assert prom.value("rate_governor_lease_held") == 1
            assert prom.value('sum(rate_governor_anomalies_total{anomaly="RUNAWAY_RETRY"})') >= 1
            assert {dict(k)["broker"] for k in prom.query("rate_governor_broker_last_report_timestamp_seconds")} \
                == {"broker-a", "broker-b"}
        seen = len(sink_status(lake))
        gov.land(landing, minute(14, storm=False), until=lambda: len(sink_status(lake)) > seen,
                 what="one more publish")  # which sends nothing again
        assert gov.running()
        if prom is not None:  # the dashboard's panels, drawn from this run (docs/metrics.md §5): each has data
            drawn = dashboard.render(prom.url, started, dt.datetime.now(dt.timezone.utc), tmp_path / "dashboard.png",
                                     rate_interval="30s", step_seconds=2)
            assert all(drawn.values()), drawn
    assert consumer.drain(quiet_ms=3000) == []  # nothing sent twice
    consumer.consumer.close()
    assert delivered_before and len(delivered_before) == len(set(delivered_before))  # nothing twice before the kill
    assert [b.persisted for b in brokers[:2]] == [{}, {}]  # nothing of the governor's left on the current line
    if prom is None:
        pytest.skip(MISSING + " (the sink-fault checks above passed)")
