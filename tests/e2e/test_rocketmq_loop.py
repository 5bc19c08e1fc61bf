"""End to end, closing the loop: the streaming governor (--once) on a generated retry storm, with the RocketMQ admin
sink pointed at a loopback name server and brokers of the current Sohu fork line (5.3.1-sohu-01: defaults
10000 / 1000, non-default rates persisted); the brokers' ``%RETRY%<group>`` rate becomes the decided limit, is
pushed again when it drifts, and returns to the broker's own ``sendRetryMsgRateLimitQps`` (read with
GET_BROKER_CONFIG) when the limit expires, leaving nothing persisted."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from control import remoting as rm
from control.record import parse_expires_at
from control.remoting_client import RemotingClient
from pipelines import governor
from pipelines.config import RocketMQSinkConfig, load_config
from pipelines.writeback.rocketmq_ledger import read_ledger
from pipelines.sim.render import render_landing
from pipelines.sim.spec import ScenarioSpec
from tests.helpers import lean_config_file
from tests.rocketmq_loopback import LoopbackBroker, LoopbackNameServer

pytestmark = pytest.mark.slow

CULPRIT = "get-pugc-to-ai-consumer"
RETRY = rm.retry_topic(CULPRIT)
SPEC = ScenarioSpec(
    seed=11, start=dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc), minutes=24, brokers=2, topics=6,
    groups=4, onset_minute=14,
)


@pytest.fixture()
def rocketmq():
    brokers = [LoopbackBroker("broker-a"), LoopbackBroker("broker-b")]
    ns = LoopbackNameServer(SPEC.cluster, brokers)
    yield ns, brokers
    ns.stop()
    for b in brokers:
        b.stop()


def test_retry_storm_limit_reaches_the_brokers_is_refreshed_and_lifted(spark, tmp_path, rocketmq):
    ns, brokers = rocketmq
    client = RemotingClient(timeout_s=2)
    for b in brokers:  # the storm's send-backs reach RateLimitHandler: the retry limiter exists at its default
        client.invoke(b.addr, rm.CONSUMER_SEND_MSG_BACK, {"group": CULPRIT, "offset": "0", "delayLevel": "0"})
        client.invoke(b.addr, rm.SEND_MESSAGE_V2, {"a": "producer", "b": "orders-0"})
    client.close()
    assert [b.rates[RETRY] for b in brokers] == [1000.0, 1000.0]

    landing, lake = tmp_path / "landing", tmp_path / "lake"
    render_landing(SPEC, landing)
    conf = lean_config_file(tmp_path / "lean.toml")
    cfg = load_config(conf).with_paths(str(landing), str(lake))
    sink_cfg = RocketMQSinkConfig(enabled=True, namesrv_addr=(ns.addr,), cluster=SPEC.cluster, timeout_ms=2000)
    cfg = cfg.model_copy(update={"sink": cfg.sink.model_copy(update={"rocketmq": sink_cfg})})

    gov = governor.run(spark, cfg, once=True)

    [record] = json.loads((lake / "control" / "limits.json").read_text())["records"]
    assert (record["resource_type"], record["resource"], record["mode"]) == ("group", CULPRIT, "enforce")
    assert [b.rates[RETRY] for b in brokers] == [record["limit_qps"], record["limit_qps"]]
    assert record["limit_qps"] < 1000.0  # tighter than the broker's own sendRetryMsgRateLimitQps
    assert [b.rates["orders-0"] for b in brokers] == [10000.0, 10000.0]  # topics the governor left alone: untouched
    owned = {RETRY: None}  # it was at the broker's default before
    assert read_ledger(lake / "control" / "rocketmq_owned.json") == {"broker-a": owned, "broker-b": owned}
    assert [b.persisted for b in brokers] == [{RETRY: record["limit_qps"]}] * 2  # RateLimitConfigManager

    brokers[1].rates[RETRY] = 1000.0  # drift (e.g. reset from MQCloud): the next micro-batch pushes it again
    gov.gold.publisher.publish(dt.datetime.now(dt.timezone.utc), batch_id=100)
    assert [b.rates[RETRY] for b in brokers] == [record["limit_qps"], record["limit_qps"]]

    after_expiry = parse_expires_at(record["expires_at"]) + dt.timedelta(seconds=1)
    gov.gold.publisher.publish(after_expiry, batch_id=101)  # the limit expired: fail open, back to the broker's default
    assert [b.rates[RETRY] for b in brokers] == [1000.0, 1000.0]
    assert [b.persisted for b in brokers] == [{}, {}]  # nothing of the governor's survives a broker restart
    assert read_ledger(lake / "control" / "rocketmq_owned.json") == {}
    assert json.loads((lake / "control" / "limits.json").read_text())["records"] == []
    for sink in gov.gold.publisher.sinks.sinks:
        sink.close()
