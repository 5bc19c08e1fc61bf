"""The RocketMQ admin sink against loopback name server + brokers over real sockets (tests/rocketmq_loopback.py)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys

import pytest

from control import remoting as rm
from pipelines.config import GovernorConfig, RocketMQSinkConfig
from pipelines.io.rocketmq_sink import RocketMQAdminSink, broker_resource, main, read_ledger
from pipelines.io.sinks import build_sinks
from tests.rocketmq_loopback import LoopbackBroker, LoopbackNameServer

NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
LATER = "2026-11-22T10:10:00Z"


def rec(resource, qps, rtype="group", mode="enforce", expires_at=LATER, version=1):
    return {"resource_type": rtype, "resource": resource, "limit_qps": qps, "burst": int(qps), "mode": mode,
            "breaker_open_ms": 1000, "expires_at": expires_at, "version": version, "reason": "test"}


@pytest.fixture()
def cluster(tmp_path):
    brokers = [LoopbackBroker("broker-a"), LoopbackBroker("broker-b")]
    ns = LoopbackNameServer("c1", brokers, slaves={"broker-a": "127.0.0.1:9"})  # a slave is never pushed to
    for b in brokers:  # traffic created the limiters, as RateLimitHandler.computeIfAbsent does
        b.traffic("%RETRY%g1", retry=True)
        b.traffic("orders")
    cfg = RocketMQSinkConfig(enabled=True, namesrv_addr=("127.0.0.1:1", ns.addr), cluster="c1", timeout_ms=500)
    sink = RocketMQAdminSink(cfg, tmp_path)
    yield sink, brokers, ns, tmp_path
    sink.close()
    ns.stop()
    for b in brokers:
        b.stop()


def test_resource_mapping_group_is_its_retry_topic():
    assert broker_resource(rec("g1", 5)) == "%RETRY%g1"
    assert broker_resource(rec("orders", 5, rtype="topic")) == "orders"


def test_push_read_back_and_restore_on_lift(cluster):
    sink, brokers, ns, root = cluster
    current = [rec("g1", 40.0), rec("orders", 500.0, rtype="topic")]
    assert sink.publish([], current, now=NOW) == 4  # two resources on two masters
    for b in brokers:
        assert b.rates == {"%RETRY%g1": 40.0, "orders": 500.0}
    update = [r for r in brokers[0].requests if r.code == rm.UPDATE_SEND_MESSAGE_RATE_LIMIT]
    assert {r.ext_fields["topic"]: r.ext_fields["topicLimitQps"] for r in update} == {"%RETRY%g1": "40.0",
                                                                                        "orders": "500.0"}
    assert read_ledger(root / "control/rocketmq_owned.json") == {"%RETRY%g1", "orders"}
    assert sink.publish(current, current, now=NOW) == 0  # in line: nothing sent
    # lift of the group: back to sendRetryMsgRateLimitQps, the topic untouched
    assert sink.publish(current, current[1:], now=NOW) == 2
    assert [b.rates["%RETRY%g1"] for b in brokers] == [100.0, 100.0]
    assert [b.rates["orders"] for b in brokers] == [500.0, 500.0]
    assert sink.owned == {"orders"}
    assert sink.publish(current[1:], [], now=NOW) == 2
    assert [b.rates["orders"] for b in brokers] == [2000.0, 2000.0] and sink.owned == set()


def test_drift_is_repushed(cluster):
    sink, brokers, _, _ = cluster
    current = [rec("g1", 40.0)]
    sink.publish([], current, now=NOW)
    brokers[1].rates["%RETRY%g1"] = 100.0  # e.g. someone reset it in MQCloud
    assert sink.publish(current, current, now=NOW) == 1
    assert brokers[1].rates["%RETRY%g1"] == 40.0


def test_expiry_and_advisory_mean_default(cluster):
    sink, brokers, _, _ = cluster
    sink.publish([], [rec("g1", 40.0)], now=NOW)
    expired_now = dt.datetime(2026, 11, 22, 10, 10, tzinfo=dt.timezone.utc)
    assert sink.publish([rec("g1", 40.0)], [rec("g1", 40.0)], now=expired_now) == 2
    assert [b.rates["%RETRY%g1"] for b in brokers] == [100.0, 100.0]
    assert sink.publish([], [rec("orders", 7.0, rtype="topic", mode="advisory")], now=NOW) == 0
    assert [b.rates["orders"] for b in brokers] == [2000.0, 2000.0]


def test_no_limiter_yet_is_pushed_again_until_traffic_creates_it(cluster):
    sink, brokers, _, _ = cluster
    current = [rec("quiet", 30.0)]
    sink.publish([], current, now=NOW)
    assert "%RETRY%quiet" not in brokers[0].rates  # updateLimitQps ignores a resource without a limiter
    brokers[0].traffic("%RETRY%quiet", retry=True)
    assert sink.publish(current, current, now=NOW) == 2  # pushed to both again; broker-a now takes it
    assert brokers[0].rates["%RETRY%quiet"] == 30.0


def test_broker_errors_are_logged_per_broker_and_retried(cluster, caplog):
    sink, brokers, _, _ = cluster
    current = [rec("g1", 40.0)]
    brokers[0].error_code = rm.SYSTEM_ERROR
    brokers[1].stall = True
    with caplog.at_level(logging.WARNING, logger="rate_governor.sink.rocketmq"):
        assert sink.publish([], current, now=NOW) == 0  # never raises
    assert set(sink.status) == {brokers[0].addr, brokers[1].addr}
    assert "code 1" in sink.status[brokers[0].addr] and "broker-b" in caplog.text
    brokers[0].error_code, brokers[1].stall = None, False
    assert sink.publish(current, current, now=NOW) == 2
    assert [b.rates["%RETRY%g1"] for b in brokers] == [40.0, 40.0] and sink.status == {}


def test_garbage_answer_and_dead_name_servers_do_not_raise(cluster):
    sink, brokers, ns, _ = cluster
    brokers[0].garbage = True
    assert sink.publish([], [rec("g1", 40.0)], now=NOW) == 1  # broker-b still served
    assert "not JSON" in sink.status[brokers[0].addr]
    dead = RocketMQAdminSink(RocketMQSinkConfig(enabled=True, namesrv_addr=("127.0.0.1:1",), timeout_ms=200),
                             sink.ledger.parent.parent)
    assert dead.publish([], [rec("g1", 40.0)], now=NOW) == 0 and "no name server" in dead.status["namesrv"]
    dead.close()


def test_old_request_codes(tmp_path):
    broker = LoopbackBroker(old_codes=True)
    broker.traffic("%RETRY%g1", retry=True)
    ns = LoopbackNameServer("c1", [broker])
    sink = RocketMQAdminSink(RocketMQSinkConfig(enabled=True, namesrv_addr=(ns.addr,), request_codes="330/329"),
                             tmp_path)
    try:
        assert sink.publish([], [rec("g1", 12.5)], now=NOW) == 1 and broker.rates["%RETRY%g1"] == 12.5
    finally:
        sink.close()
        ns.stop()
        broker.stop()


def test_restore_command_sets_governor_rates_back_and_leaves_others(cluster, capsys):
    sink, brokers, ns, root = cluster
    sink.publish([], [rec("g1", 40.0)], now=NOW)
    brokers[0].traffic("payments")
    brokers[0].rates["payments"] = 300.0  # set by an operator in MQCloud, not by the governor
    conf = root / "rmq.toml"
    conf.write_text(f'[lake]\npath = "{root}"\n[sink.rocketmq]\nnamesrv_addr = ["{ns.addr}"]\ncluster = "c1"\n')
    assert main(["restore", "--conf", str(conf)]) == 0
    assert "restored 2 rates" in capsys.readouterr().out
    assert [b.rates["%RETRY%g1"] for b in brokers] == [100.0, 100.0] and brokers[0].rates["payments"] == 300.0
    assert read_ledger(root / "control/rocketmq_owned.json") == set()
    assert main(["show", "--conf", str(conf)]) == 0
    assert capsys.readouterr().out.split() == ["broker-a", brokers[0].addr, "payments", "300.0"]
    assert main(["restore", "--all", "--conf", str(conf)]) == 0 and brokers[0].rates["payments"] == 2000.0


def test_restore_command_fails_with_one_line(tmp_path):
    conf = tmp_path / "x.toml"
    conf.write_text('[sink.rocketmq]\nnamesrv_addr = ["127.0.0.1:1"]\ntimeout_ms = 200\n')
    done = subprocess.run([sys.executable, "-m", "pipelines.io.rocketmq_sink", "restore", "--conf", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "no name server answered" in done.stderr
    missing = subprocess.run([sys.executable, "-m", "pipelines.io.rocketmq_sink", "restore", "--conf", "nope.toml"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and missing.stderr.strip().count("\n") == 0 and "not found" in missing.stderr


def test_config_and_build_sinks(tmp_path):
    with pytest.raises(ValueError, match="namesrv_addr"):
        RocketMQSinkConfig(enabled=True)
    cfg = GovernorConfig.model_validate({"lake": {"path": str(tmp_path)},
                                         "sink": {"rocketmq": {"enabled": True, "namesrv_addr": ["127.0.0.1:1"]}}})
    sinks = build_sinks(cfg)
    assert [s.name for s in sinks] == ["rocketmq"]
    assert sinks[0].ledger == tmp_path / "control/rocketmq_owned.json"
    sinks[0].close()
    assert json.loads(json.dumps(sorted(read_ledger(tmp_path / "absent.json")))) == []
