"""The five findings of "safe write-back into real Sohu brokers", each a test against loopback brokers of the fork
line it concerns (tests/rocketmq_loopback.py, real sockets).

These tests use only what the sink offered before the fix (``RocketMQAdminSink(cfg, root)``, ``publish``,
``status``, ``owned``, ``main`` and the settings it had) and a loopback with its own codec, so they also run
against the code before the fix, where each of them fails.
"""

from __future__ import annotations

import time

import pytest

from pipelines.config import RocketMQSinkConfig
from pipelines.writeback.rocketmq_sink import RocketMQAdminSink, main
from tests.rocketmq_loopback import RC, LoopbackBroker, LoopbackNameServer

LATER = "2099-11-22T10:10:00Z"


def rec(resource, qps, rtype="group"):
    return {"resource_type": rtype, "resource": resource, "limit_qps": qps, "burst": int(qps), "mode": "enforce",
            "breaker_open_ms": 1000, "expires_at": LATER, "version": 1, "reason": "test"}


@pytest.fixture()
def servers():
    started = []

    def start(server):
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_finding1_lift_restores_the_current_forks_own_default_and_persists_no_throttle(servers, tmp_path):
    """5.3.1-sohu-01 defaults to 10000 / 1000 and persists every other rate. A sink configured with the older
    line's 2000 / 100 must still lift to the broker's own 1000, so nothing survives a broker restart."""
    broker = servers(LoopbackBroker("broker-a", "current"))
    ns = servers(LoopbackNameServer("c1", [broker]))
    broker.traffic("%RETRY%g1", retry=True)
    cfg = RocketMQSinkConfig(enabled=True, namesrv_addr=(ns.addr,), cluster="c1", timeout_ms=1000,
                             default_topic_qps=2000.0, default_retry_qps=100.0)
    sink = RocketMQAdminSink(cfg, tmp_path)
    try:
        sink.publish([], [rec("g1", 40.0)])
        assert broker.rates["%RETRY%g1"] == 40.0 and broker.persisted == {"%RETRY%g1": 40.0}
        sink.publish([rec("g1", 40.0)], [])  # lift
        assert broker.rates["%RETRY%g1"] == 1000.0  # the broker's sendRetryMsgRateLimitQps, not the configured 100
        assert broker.persisted == {}  # a default is not persisted: no permanent throttle
        broker.restart()
        assert broker.rates == {}  # nothing came back at a rate of the governor's
    finally:
        sink.close()


def test_finding2_restore_all_on_an_untouched_current_cluster_lowers_nothing(servers, tmp_path, capsys):
    """A current cluster the governor never touched: ``show`` lists only the rate set by hand, ``restore --all``
    prints its plan and changes nothing without ``--yes``, and with it raises only rates below their restore
    rate (never pushes a topic down to 2000 or a retry topic to 100)."""
    brokers = [servers(LoopbackBroker("broker-a")), servers(LoopbackBroker("broker-b"))]
    ns = servers(LoopbackNameServer("c1", brokers))
    for b in brokers:
        for topic in ("orders", "payments", "%RETRY%g1", "%RETRY%g2"):
            b.traffic(topic)
    brokers[0].rates["payments"] = 500.0  # set by hand in MQCloud
    brokers[1].rates["orders"] = 20000.0  # raised by hand above the default
    conf = tmp_path / "rmq.toml"
    conf.write_text(f'[lake]\npath = "{tmp_path}"\n[sink.rocketmq]\nnamesrv_addr = ["{ns.addr}"]\ncluster = "c1"\n')
    before = [dict(b.rates) for b in brokers]

    assert main(["show", "--conf", str(conf)]) == 0
    shown = [line.split("\t")[:4] for line in capsys.readouterr().out.splitlines()]
    assert shown == [["broker-a", brokers[0].addr, "payments", "500.0"],
                     ["broker-b", brokers[1].addr, "orders", "20000.0"]]
    assert main(["restore", "--all", "--conf", str(conf)]) == 0  # a dry run: prints the plan only
    out = capsys.readouterr().out
    assert "payments" in out and "--yes" in out and [dict(b.rates) for b in brokers] == before
    assert main(["restore", "--all", "--yes", "--conf", str(conf)]) == 0
    assert brokers[0].rates == {**before[0], "payments": 10000.0}  # raised to the broker's own default
    assert brokers[1].rates == before[1]  # 20000 not lowered, defaults untouched


def test_finding3_codes_330_329_are_never_sent_to_a_5x_broker(servers, tmp_path):
    """On 5.x, 329 is DELETE_EXPIRED_COMMITLOG: the sink must not send it, and must say so for that broker."""
    broker = servers(LoopbackBroker("broker-a", "current"))  # 5.3.1-sohu-01
    ns = servers(LoopbackNameServer("c1", [broker]))
    broker.traffic("%RETRY%g1", retry=True)
    cfg = RocketMQSinkConfig(enabled=True, namesrv_addr=(ns.addr,), cluster="c1", timeout_ms=1000,
                             request_codes="330/329", default_topic_qps=2000.0, default_retry_qps=100.0)
    sink = RocketMQAdminSink(cfg, tmp_path)
    try:
        sink.publish([], [rec("g1", 40.0)])
        sink.publish([rec("g1", 40.0)], [])
        assert broker.commitlog_cleanups == 0
        assert not [r for r in broker.requests if r.code in (RC.VIEW_OLD, RC.UPDATE_OLD)]
        assert "DELETE_EXPIRED_COMMITLOG" in sink.status[broker.addr]
    finally:
        sink.close()


def test_finding3_an_empty_view_body_is_an_error_not_no_limiters(servers, tmp_path):
    broker = servers(LoopbackBroker("broker-a", "current"))
    ns = servers(LoopbackNameServer("c1", [broker]))
    broker.traffic("%RETRY%g1", retry=True)
    cfg = RocketMQSinkConfig(enabled=True, namesrv_addr=(ns.addr,), cluster="c1", timeout_ms=1000)
    sink = RocketMQAdminSink(cfg, tmp_path)
    try:
        sink.publish([], [rec("g1", 40.0)])
        broker.empty_view = True
        sink.publish([rec("g1", 40.0)], [])  # the lift cannot be confirmed
        assert "empty" in sink.status[broker.addr]
        assert "%RETRY%g1" in sink.owned  # still the governor's: retried when the broker answers again
        broker.empty_view = False
        sink.publish([rec("g1", 40.0)], [])
        assert sink.status == {} and broker.rates["%RETRY%g1"] == 1000.0 and "%RETRY%g1" not in sink.owned
    finally:
        sink.close()


def test_finding4_publish_survives_restarts_and_idle_timeouts(servers, tmp_path):
    """After the name server and a broker restart, and after the servers closed idle connections, the very next
    publish succeeds (NettyRemotingClient reconnects; so must we)."""
    brokers = [servers(LoopbackBroker("broker-a", idle_close_s=0.3)), servers(LoopbackBroker("broker-b"))]
    ns = servers(LoopbackNameServer("c1", brokers, idle_close_s=0.3))
    for b in brokers:
        b.traffic("%RETRY%g1", retry=True)
    cfg = RocketMQSinkConfig(enabled=True, namesrv_addr=(ns.addr,), cluster="c1", timeout_ms=1000)
    sink = RocketMQAdminSink(cfg, tmp_path)
    try:
        sink.publish([], [rec("g1", 40.0)])
        assert sink.status == {}
        ns.restart()
        brokers[1].restart()  # persisted 40 comes back (current line)
        assert sink.publish([rec("g1", 40.0)], [rec("g1", 30.0)]) == 2
        assert sink.status == {} and [b.rates["%RETRY%g1"] for b in brokers] == [30.0, 30.0]
        time.sleep(0.6)  # the name server and broker-a close their idle connections
        assert ns.idle_closed >= 1 and brokers[0].idle_closed >= 1
        assert sink.publish([rec("g1", 30.0)], [rec("g1", 20.0)]) == 2
        assert sink.status == {} and [b.rates["%RETRY%g1"] for b in brokers] == [20.0, 20.0]
    finally:
        sink.close()


def test_finding5_a_cluster_with_binary_headers(servers, tmp_path):
    """``rocketmq.serialize.type=ROCKETMQ``: every answer has a RocketMQSerializable header."""
    brokers = [servers(LoopbackBroker(n, serialize="ROCKETMQ")) for n in ("broker-a", "broker-b")]
    ns = servers(LoopbackNameServer("c1", brokers, serialize="ROCKETMQ"))
    for b in brokers:
        b.traffic("%RETRY%g1", retry=True)
    cfg = RocketMQSinkConfig(enabled=True, namesrv_addr=(ns.addr,), cluster="c1", timeout_ms=1000)
    sink = RocketMQAdminSink(cfg, tmp_path)
    try:
        assert sink.publish([], [rec("g1", 40.0)]) == 2
        assert sink.status == {} and [b.rates["%RETRY%g1"] for b in brokers] == [40.0, 40.0]
        assert brokers[0].requests[-1].serialize_type == RC.ROCKETMQ  # answered in kind once it was learnt
    finally:
        sink.close()
