"""The RocketMQ admin sink against loopback name server + brokers over real sockets (tests/rocketmq_loopback.py).
The five findings of the write-back review have their own file, tests/io/test_rocketmq_findings.py."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
import time

import pytest

from control import remoting as rm
from control.remoting_client import RemotingClient
from pipelines.config import ConfigError, GovernorConfig, RocketMQSinkConfig
from pipelines.writeback.rocketmq_ledger import ANY_MASTER, read_ledger
from pipelines.writeback.rocketmq_sink import RocketMQAdminSink, broker_resource, main
from pipelines.writeback.sinks import build_sinks
from tests.rocketmq_loopback import RC, LoopbackBroker, LoopbackNameServer

NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
LATER = "2026-11-22T10:10:00Z"
ACL = {"rocketmq2": "12345678"}


def rec(resource, qps, rtype="group", mode="enforce", expires_at=LATER, version=1, brokers=None):
    r = {"resource_type": rtype, "resource": resource, "limit_qps": qps, "burst": int(qps), "mode": mode,
         "breaker_open_ms": 1000, "expires_at": expires_at, "version": version, "reason": "test"}
    if brokers is not None:
        r["brokers"] = {name: {"limit_qps": q, "burst": int(q)} for name, q in brokers.items()}
    return r


def make_cluster(tmp_path, brokers, ns_kwargs=None, **cfg):
    ns = LoopbackNameServer("c1", brokers, **(ns_kwargs or {}))
    settings = {"enabled": True, "namesrv_addr": (ns.addr,), "cluster": "c1", "timeout_ms": 500, **cfg}
    return RocketMQAdminSink(RocketMQSinkConfig(**settings), tmp_path), ns


@pytest.fixture()
def cluster(tmp_path):
    brokers = [LoopbackBroker("broker-a"), LoopbackBroker("broker-b")]  # the current fork line: 10000 / 1000
    for b in brokers:  # traffic created the limiters, as RateLimitHandler.computeIfAbsent does
        b.traffic("%RETRY%g1", retry=True)
        b.traffic("orders")
    ns = LoopbackNameServer("c1", brokers, slaves={"broker-a": "127.0.0.1:9"})  # a slave is never pushed to
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
    owned = {"%RETRY%g1": None, "orders": None}  # both were at the broker's default before
    assert read_ledger(root / "control/rocketmq_owned.json") == {"broker-a": owned, "broker-b": owned}
    assert sink.publish(current, current, now=NOW) == 0  # in line: nothing sent
    # lift of the group: back to the broker's own sendRetryMsgRateLimitQps (GET_BROKER_CONFIG), the topic untouched
    assert sink.publish(current, current[1:], now=NOW) == 2
    assert [b.rates["%RETRY%g1"] for b in brokers] == [1000.0, 1000.0]
    assert [b.rates["orders"] for b in brokers] == [500.0, 500.0]
    assert sink.owned == {"orders"}
    assert sink.publish(current[1:], [], now=NOW) == 2
    assert [b.rates["orders"] for b in brokers] == [10000.0, 10000.0] and sink.owned == set()
    assert [b.persisted for b in brokers] == [{}, {}]  # RateLimitConfigManager keeps nothing of the governor's


def test_drift_is_repushed(cluster):
    sink, brokers, _, _ = cluster
    current = [rec("g1", 40.0)]
    sink.publish([], current, now=NOW)
    brokers[1].rates["%RETRY%g1"] = 1000.0  # e.g. someone reset it in MQCloud
    assert sink.publish(current, current, now=NOW) == 1
    assert brokers[1].rates["%RETRY%g1"] == 40.0


def test_expiry_and_advisory_mean_default(cluster):
    sink, brokers, _, _ = cluster
    sink.publish([], [rec("g1", 40.0)], now=NOW)
    expired_now = dt.datetime(2026, 11, 22, 10, 10, tzinfo=dt.timezone.utc)
    assert sink.publish([rec("g1", 40.0)], [rec("g1", 40.0)], now=expired_now) == 2
    assert [b.rates["%RETRY%g1"] for b in brokers] == [1000.0, 1000.0]
    assert sink.publish([], [rec("orders", 7.0, rtype="topic", mode="advisory")], now=NOW) == 0
    assert [b.rates["orders"] for b in brokers] == [10000.0, 10000.0]


def test_no_limiter_yet_is_pushed_again_until_traffic_creates_it(cluster):
    sink, brokers, _, _ = cluster
    current = [rec("quiet", 30.0)]
    sink.publish([], current, now=NOW)
    assert "%RETRY%quiet" not in brokers[0].rates  # updateLimitQps ignores a resource without a limiter
    brokers[0].traffic("%RETRY%quiet", retry=True)
    assert sink.publish(current, current, now=NOW) == 2  # pushed to both again; broker-a now takes it
    assert brokers[0].rates["%RETRY%quiet"] == 30.0


def test_per_broker_shares_land_each_master_at_its_own_rate(cluster):
    """docs/contracts.md §3 "Per-broker shares": each master its own entry, else "*", else limit_qps."""
    sink, brokers, _, _ = cluster
    shared = rec("g1", 40.0, brokers={"broker-a": 30.0, "broker-b": 10.0})
    assert sink.publish([], [shared], now=NOW) == 2
    assert [b.rates["%RETRY%g1"] for b in brokers] == [30.0, 10.0]
    starred = rec("g1", 40.0, brokers={"broker-a": 25.0, "*": 5.0})
    assert sink.publish([shared], [starred], now=NOW) == 2
    assert [b.rates["%RETRY%g1"] for b in brokers] == [25.0, 5.0]
    assert sink.publish([starred], [rec("g1", 40.0)], now=NOW) == 2  # no shares: the cluster-wide figure
    assert [b.rates["%RETRY%g1"] for b in brokers] == [40.0, 40.0]


def test_a_rate_set_by_hand_is_the_ceiling_and_what_a_lift_restores(cluster):
    sink, brokers, _, root = cluster
    brokers[0].rates["orders"] = 500.0  # set in MQCloud before the governor came
    sink.publish([], [rec("orders", 300.0, rtype="topic")], now=NOW)
    assert [b.rates["orders"] for b in brokers] == [300.0, 300.0]
    assert read_ledger(root / "control/rocketmq_owned.json") == {"broker-a": {"orders": 500.0},
                                                                  "broker-b": {"orders": None}}
    sink.publish([], [rec("orders", 800.0, rtype="topic")], now=NOW)  # relaxed above the hand-set rate
    assert [b.rates["orders"] for b in brokers] == [500.0, 800.0]  # never above what the operator set
    sink.publish([], [], now=NOW)  # lift
    assert [b.rates["orders"] for b in brokers] == [500.0, 10000.0] and sink.owned == set()
    assert brokers[0].persisted == {"orders": 500.0}  # the operator's rate is what the broker keeps


def test_lift_never_lowers_a_rate_raised_after_the_takeover(cluster):
    sink, brokers, _, _ = cluster
    sink.publish([], [rec("g1", 40.0)], now=NOW)
    brokers[0].rates["%RETRY%g1"] = 5000.0  # raised by hand above the default meanwhile
    assert sink.publish([], [], now=NOW) == 1  # only broker-b needed the restore
    assert [b.rates["%RETRY%g1"] for b in brokers] == [5000.0, 1000.0] and sink.owned == set()


def test_defaults_are_read_again_when_an_operator_changes_them(tmp_path):
    brokers = [LoopbackBroker("broker-a")]
    brokers[0].traffic("%RETRY%g1", retry=True)
    sink, ns = make_cluster(tmp_path, brokers, defaults_refresh_seconds=0)
    try:
        sink.publish([], [rec("g1", 40.0)], now=NOW)
        brokers[0].update_broker_config(retry_qps=1500.0)  # setSendMsgBackLimitQps: every retry limiter to 1500
        assert brokers[0].rates["%RETRY%g1"] == 1500.0
        assert sink.publish([], [rec("g1", 40.0)], now=NOW) == 1  # the governor's limit comes back
        assert sink.publish([], [], now=NOW) == 1 and brokers[0].rates["%RETRY%g1"] == 1500.0  # the new default
    finally:
        sink.close()
        ns.stop()
        brokers[0].stop()


@pytest.mark.parametrize("version", [RC.V4_9_1, RC.V5_1_1])  # 4.9.3-sohu after 2023-05, 5.1.1-sohu
def test_older_line_defaults_come_from_its_view_body(tmp_path, caplog, version):
    """Older line: 2000 / 100 held by the RateLimitHandler and reported in the view; the fallback in the config
    (the current line's 10000 / 1000) is not used, and the difference is logged once."""
    brokers = [LoopbackBroker("broker-a", "older", version=version)]
    brokers[0].traffic("%RETRY%g1", retry=True)
    sink, ns = make_cluster(tmp_path, brokers, defaults_refresh_seconds=0)  # GET_BROKER_CONFIG every publish
    try:
        with caplog.at_level(logging.WARNING, logger="rate_governor.sink.rocketmq"):
            sink.publish([], [rec("g1", 40.0)], now=NOW)
            sink.publish([], [], now=NOW)
            sink.publish([], [], now=NOW)
        assert brokers[0].rates["%RETRY%g1"] == 100.0 and sink.status == {}
        assert caplog.text.count("defaults to sendMsgRateLimitQps=2000.0") == 1
    finally:
        sink.close()
        ns.stop()
        brokers[0].stop()


def test_older_line_limiter_defaults_changed_at_run_time_win_over_its_broker_config(tmp_path, caplog):
    """On 4.9.3-sohu MQCloud changes the limiter's defaults with UPDATE (``sendMsgBackLimitQps``, which also sets
    every retry limiter): the view reports 150, GET_BROKER_CONFIG still 100. A lift restores the limiter's own."""
    broker = LoopbackBroker("broker-a", "older")
    broker.traffic("%RETRY%g1", retry=True)
    sink, ns = make_cluster(tmp_path, [broker])
    client = RemotingClient(timeout_s=2)
    try:
        sink.publish([], [rec("g1", 40.0)], now=NOW)
        reply = client.invoke(broker.addr, rm.UPDATE_SEND_MESSAGE_RATE_LIMIT, {"sendMsgBackLimitQps": "150.0"})
        assert reply.code == rm.SUCCESS and broker.rates["%RETRY%g1"] == 150.0
        assert b"sendRetryMsgRateLimitQps=100.0" in broker.config_body()
        assert sink.publish([], [rec("g1", 40.0)], now=NOW) == 1  # the governor's limit back
        assert sink.publish([], [], now=NOW) == 1 and broker.rates["%RETRY%g1"] == 150.0
        broker.disabled = True
        with caplog.at_level(logging.WARNING, logger="rate_governor.sink.rocketmq"):
            sink.publish([], [], now=NOW)
        assert "rate limiter disabled" in caplog.text
    finally:
        client.close()
        sink.close()
        ns.stop()
        broker.stop()


def test_old_request_codes_on_an_old_4x_broker(tmp_path):
    broker = LoopbackBroker(line="older", old_codes=True)  # 4.9.3-sohu before 2023-05-31
    broker.traffic("%RETRY%g1", retry=True)
    sink, ns = make_cluster(tmp_path, [broker], request_codes="330/329", default_topic_qps=2000.0,
                            default_retry_qps=100.0)
    try:
        assert sink.publish([], [rec("g1", 12.5)], now=NOW) == 1 and broker.rates["%RETRY%g1"] == 12.5
        assert sink.status == {}
    finally:
        sink.close()
        ns.stop()
        broker.stop()


def test_config_refuses_330_329_with_the_current_lines_defaults():
    with pytest.raises(ValueError, match="DELETE_EXPIRED_COMMITLOG"):
        RocketMQSinkConfig(request_codes="330/329")
    assert RocketMQSinkConfig(request_codes="330/329", default_topic_qps=2000, default_retry_qps=100)


def test_old_ledger_format_is_adopted_and_restored_to_the_default(cluster):
    sink, brokers, _, root = cluster
    for b in brokers:
        b.rates["%RETRY%g1"] = 40.0  # left by a governor of the old ledger format
    path = root / "control/rocketmq_owned.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"resources": ["%RETRY%g1"]}))
    sink = RocketMQAdminSink(sink.cfg, root)
    try:
        assert read_ledger(path) == {ANY_MASTER: {"%RETRY%g1": None}}
        assert sink.publish([], [], now=NOW) == 2
        assert [b.rates["%RETRY%g1"] for b in brokers] == [1000.0, 1000.0] and read_ledger(path) == {}
        path.write_text("{not json")
        unreadable = RocketMQAdminSink(sink.cfg, root)
        assert unreadable.owned == set()  # unreadable: empty, logged, no crash
        unreadable.close()
    finally:
        sink.close()


def test_last_rejections_per_master_and_resource(cluster):
    sink, brokers, _, _ = cluster
    sink.publish([], [rec("g1", 2.0)], now=NOW)
    assert sink.last_rejections[("broker-a", "%RETRY%g1")] == -1
    started = int(time.time() * 1000)
    assert not all([brokers[0].traffic("%RETRY%g1") for _ in range(5)])  # over 2 per second: rejected
    sink.publish([], [rec("g1", 2.0)], now=NOW)
    assert sink.last_rejections[("broker-a", "%RETRY%g1")] >= started
    assert sink.last_rejections[("broker-b", "%RETRY%g1")] == -1
    assert sink.last_rejections[("broker-b", "orders")] == -1  # every limiter of the master, not only ours


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
    sink, brokers, ns, root = cluster
    brokers[0].garbage = True
    assert sink.publish([], [rec("g1", 40.0)], now=NOW) == 1  # broker-b still served
    assert "not JSON" in sink.status[brokers[0].addr]
    dead = RocketMQAdminSink(RocketMQSinkConfig(enabled=True, namesrv_addr=("127.0.0.1:1",), timeout_ms=200), root)
    assert dead.publish([], [rec("g1", 40.0)], now=NOW) == 0 and "no name server" in dead.status["namesrv"]
    dead.close()


def test_twenty_stalled_masters_do_not_stall_a_publish(tmp_path):
    """One publish talks to the masters in parallel under a deadline: 20 masters that accept and never answer
    cost the deadline, not 20 x timeout_ms (20 s here) as master by master did, and the healthy master, last in
    name order, is still served within it."""
    healthy = LoopbackBroker("broker-99")
    healthy.traffic("%RETRY%g1", retry=True)
    stalled = [LoopbackBroker(f"broker-{i:02d}") for i in range(1, 21)]
    for b in stalled:
        b.stall = True
    sink, ns = make_cluster(tmp_path, [*stalled, healthy], timeout_ms=1000, publish_deadline_ms=1500)
    try:
        started = time.monotonic()
        assert sink.publish([], [rec("g1", 40.0)], now=NOW) == 1
        took = time.monotonic() - started
        print(f"publish with 20 stalled masters of 21: {took:.2f} s (timeout_ms 1000, deadline 1500 ms)")
        assert took < 3.0, took
        assert healthy.rates["%RETRY%g1"] == 40.0 and set(sink.status) == {b.addr for b in stalled}
    finally:
        sink.close()
        ns.stop()
        for b in [healthy, *stalled]:
            b.stop()


def test_acl_cluster_refuses_unsigned_and_accepts_signed_requests(tmp_path, monkeypatch):
    brokers = [LoopbackBroker("broker-a", acl=ACL)]
    brokers[0].traffic("%RETRY%g1", retry=True)
    sink, ns = make_cluster(tmp_path, brokers, ns_kwargs={"acl": ACL})
    try:
        sink.publish([], [rec("g1", 40.0)], now=NOW)  # no keys configured: unsigned
        assert "AclException: No accessKey is configured" in sink.status["namesrv"]
    finally:
        sink.close()
    monkeypatch.setenv("RATE_GOVERNOR_ROCKETMQ_ACCESS_KEY", "rocketmq2")
    monkeypatch.setenv("RATE_GOVERNOR_ROCKETMQ_SECRET_KEY", "wrong-secret")
    wrong = RocketMQAdminSink(sink.cfg, tmp_path)
    wrong.publish([], [rec("g1", 40.0)], now=NOW)
    assert "Check signature failed for accessKey=rocketmq2" in wrong.status["namesrv"]
    wrong.close()
    monkeypatch.delenv("RATE_GOVERNOR_ROCKETMQ_ACCESS_KEY")
    monkeypatch.delenv("RATE_GOVERNOR_ROCKETMQ_SECRET_KEY")
    key_file = tmp_path / "rocketmq.key"
    key_file.write_text("# SessionCredentials key file\nAccessKey=rocketmq2\nSecretKey=12345678\n")
    signed = RocketMQAdminSink(sink.cfg.model_copy(update={"acl_key_file": str(key_file)}), tmp_path)
    try:
        assert signed.publish([], [rec("g1", 40.0)], now=NOW) == 1 and signed.status == {}
        assert brokers[0].rates["%RETRY%g1"] == 40.0
    finally:
        signed.close()
        ns.stop()
        brokers[0].stop()


def test_unusable_acl_keys_are_a_config_error(tmp_path, monkeypatch):
    cfg = RocketMQSinkConfig(enabled=True, namesrv_addr=("127.0.0.1:1",), acl_key_file=str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="ACL key file not found"):
        RocketMQAdminSink(cfg, tmp_path)
    monkeypatch.setenv("RATE_GOVERNOR_ROCKETMQ_ACCESS_KEY", "rocketmq2")
    with pytest.raises(ConfigError, match="RATE_GOVERNOR_ROCKETMQ_SECRET_KEY is not set"):
        RocketMQAdminSink(cfg.model_copy(update={"acl_key_file": ""}), tmp_path)


def test_restore_command_sets_governor_rates_back_and_leaves_others(cluster, capsys):
    sink, brokers, ns, root = cluster
    sink.publish([], [rec("g1", 40.0)], now=NOW)
    brokers[0].traffic("payments")
    brokers[0].rates["payments"] = 300.0  # set by an operator in MQCloud, not by the governor
    conf = root / "rmq.toml"
    conf.write_text(f'[lake]\npath = "{root}"\n[sink.rocketmq]\nnamesrv_addr = ["{ns.addr}"]\ncluster = "c1"\n')
    assert main(["show", "--conf", str(conf)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[2:4] for line in shown] == [["%RETRY%g1", "40.0"], ["payments", "300.0"],
                                                          ["%RETRY%g1", "40.0"]]
    assert shown[0].endswith("governor (before: default)") and shown[1].endswith("not the governor")
    assert main(["restore", "--conf", str(conf)]) == 0
    out = capsys.readouterr().out
    assert out.count("setting ") == 2 and "restored 2 rates" in out  # says what it changes, then does it
    assert [b.rates["%RETRY%g1"] for b in brokers] == [1000.0, 1000.0] and brokers[0].rates["payments"] == 300.0
    assert read_ledger(root / "control/rocketmq_owned.json") == {}
    assert main(["restore", "--resource", "payments", "--conf", str(conf)]) == 0
    assert brokers[0].rates["payments"] == 10000.0


def test_restore_command_fails_with_one_line(tmp_path):
    conf = tmp_path / "x.toml"
    conf.write_text('[sink.rocketmq]\nnamesrv_addr = ["127.0.0.1:1"]\ntimeout_ms = 200\n')
    done = subprocess.run([sys.executable, "-m", "pipelines.writeback.rocketmq_sink", "restore", "--conf", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "no name server answered" in done.stderr
    missing = subprocess.run([sys.executable, "-m", "pipelines.writeback.rocketmq_sink", "restore", "--conf", "nope.toml"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and missing.stderr.strip().count("\n") == 0 and "not found" in missing.stderr


def test_config_and_build_sinks(tmp_path):
    with pytest.raises(ValueError, match="namesrv_addr"):
        RocketMQSinkConfig(enabled=True)
    cfg = GovernorConfig.model_validate({"lake": {"path": str(tmp_path)},
                                         "sink": {"rocketmq": {"enabled": True, "namesrv_addr": ["127.0.0.1:1"]}}})
    sinks = build_sinks(cfg)
    assert [s.name for s in sinks] == ["rocketmq"]
    assert sinks[0].ledger.path == tmp_path / "control/rocketmq_owned.json"
    sinks[0].close()
    assert read_ledger(tmp_path / "absent.json") == {}
