"""Limit candidates from anomalies (pipelines/decide/rules/candidates.py)."""

from __future__ import annotations

import pytest

from pipelines import columns
from pipelines.config import LimitsConfig
from pipelines.decide.rules.candidates import candidate_limits
from tests.decide.rows import frame, win

L = LimitsConfig()


def anomalies(rows):
    """(minute, resource_type, resource, anomaly, observed, baseline)"""
    return frame(columns.GOLD_ANOMALIES,
                 [(*win(i - 1), rt, r, a, o, b, "critical", f"{a} on {r}") for i, rt, r, a, o, b in rows])


def carriers(rows):
    out = {}
    for i, t, b in rows:
        out.setdefault((win(i - 1)[0], t), []).append(b)
    return out


def by_resource(keyed):
    return {k.resource: k.candidate for k in keyed}


def test_runaway_retry_limits_group_retry_traffic_to_share_of_consume():
    got = candidate_limits(anomalies([(1, "group", "get-pugc-to-ai-consumer", "RUNAWAY_RETRY", 785.32, 790.0)]), {}, L)
    assert [(k.resource_type, k.resource) for k in got] == [("group", "get-pugc-to-ai-consumer")]
    c = got[0].candidate
    assert c.critical and c.mode == "enforce" and c.baseline_tps == 790.0
    assert c.lift_at_qps is None  # a retry limit is lifted by clear windows only, never by a probe reaching a rate
    assert c.target_qps == pytest.approx(79.0)
    assert c.reason == ("RUNAWAY_RETRY: RUNAWAY_RETRY on get-pugc-to-ai-consumer; retry traffic limited to 10% of the "
                        "group's consume rate")


def test_limit_is_never_zero_or_nan():
    got = candidate_limits(anomalies([(1, "group", "g", "RUNAWAY_RETRY", 300.0, 0.0),
                                      (1, "group", "h", "RUNAWAY_RETRY", 300.0, None)]), {}, L)
    assert [k.candidate.target_qps for k in got] == [L.min_limit_qps, L.min_limit_qps]


def test_surge_enforced_only_with_a_busy_broker_carrying_it():
    a = anomalies([
        (1, "topic", "flash-sale", "TRAFFIC_SURGE", 900.0, 100.0),       # healthy brokers: advisory at >= peak
        (1, "topic", "noisy", "TRAFFIC_SURGE", 3000.0, 200.0),          # on busy broker-a: enforced
        (1, "broker", "broker-a", "BROKER_BUSY", 4.0, 3750.0),
        (1, "topic", "%RETRY%g", "TRAFFIC_SURGE", 785.0, 1.0),          # retry topic: via its group only
    ])
    got = by_resource(candidate_limits(a, carriers([(1, "flash-sale", "broker-b"), (1, "noisy", "broker-a"),
                                                    (1, "%RETRY%g", "broker-a")]), L))
    assert set(got) == {"flash-sale", "noisy"}
    assert (got["noisy"].mode, got["noisy"].target_qps, got["noisy"].baseline_tps) == ("enforce", 400.0, 200.0)
    assert got["noisy"].reason == ("TRAFFIC_SURGE on a distressed broker (broker-a busy): TRAFFIC_SURGE on noisy; "
                                   "limited to 2.0x baseline")
    legit = got["flash-sale"]
    assert legit.mode == "advisory" and legit.target_qps >= 900.0 and legit.floor_qps >= 900.0
    # the busy carrier's writes (its BROKER_BUSY row's put rate): the first limit's burst bound (sweep cases 66, 186)
    assert got["noisy"].busy_load == {"broker-a": 3750.0} and legit.busy_load == {}


def test_protected_topic_never_gets_a_candidate():
    a = anomalies([(1, "topic", "RMQ_SYS_TRACE_TOPIC", "TRAFFIC_SURGE", 3000.0, 200.0),
                   (1, "broker", "broker-a", "BROKER_BUSY", 4.0, 3750.0)])
    assert candidate_limits(a, carriers([(1, "RMQ_SYS_TRACE_TOPIC", "broker-a")]), L) == []
    operator_listed = LimitsConfig(protected=("payments",))
    assert candidate_limits(anomalies([(1, "group", "payments", "RUNAWAY_RETRY", 300.0, 300.0)]), {},
                            operator_listed) == []


def test_advisory_deployment_and_per_resource_shadow_mode():
    a = anomalies([(1, "group", "g", "RUNAWAY_RETRY", 300.0, 300.0), (1, "group", "h", "RUNAWAY_RETRY", 300.0, 300.0)])
    modes = {k.resource: k.candidate.mode for k in candidate_limits(a, {}, LimitsConfig(advisory_resources=("h",)))}
    assert modes == {"g": "enforce", "h": "advisory"}
    modes = {k.resource: k.candidate.mode for k in candidate_limits(a, {}, LimitsConfig(mode="advisory"))}
    assert modes == {"g": "advisory", "h": "advisory"}


def test_a_candidate_carries_its_traffic_per_broker():
    a = anomalies([(1, "group", "g", "RUNAWAY_RETRY", 600.0, 400.0)])
    got = candidate_limits(a, {}, L, {(win(0)[1], "group", "g"): {"broker-a": 450.0, "broker-b": 150.0}})
    assert got[0].candidate.broker_tps == {"broker-a": 450.0, "broker-b": 150.0}


def test_a_retry_storm_on_a_busy_broker_is_critical():
    """Sweep case 29: a storm of 183 msg/s (a warning: under 4x the 50 msg/s floor) made its broker of little
    headroom busy; a first cut of half the storm kept it busy two more minutes (bystanders 1.1 % of before after
    containment). With a broker carrying its retry traffic busy in the window, its limit goes to the target at once;
    without one, the warning stays a warning (a max_cut_pct step)."""
    storm = (1, "group", "g", "RUNAWAY_RETRY", 183.4, 336.0)
    rows = anomalies([storm, (1, "broker", "broker-a", "BROKER_BUSY", 9.0, 400.0)])
    rows = rows.with_columns(rows["severity"].set(rows["resource_type"] == "group", "warning"))
    traffic = {(win(0)[1], "group", "g"): {"broker-a": 183.4}}
    busy = by_resource(candidate_limits(rows, {}, L, traffic))["g"]
    assert busy.critical and busy.reason.endswith("consume rate on a distressed broker (broker-a busy), at once")
    calm = by_resource(candidate_limits(rows.filter(rows["resource_type"] == "group"), {}, L, traffic))["g"]
    assert not calm.critical and calm.reason.endswith("consume rate")


def test_a_storm_or_a_surge_on_a_busy_broker_carries_its_writes_and_its_normal():
    """A storm's candidate, and a surge's, carries its busy carriers' writes (the ``BROKER_BUSY`` row's baseline)
    and their normal writes (``busy_normal``), its first limit's room (sweep cases 25, 131 and 809); a broker not
    busy carries neither."""
    rows = anomalies([(1, "group", "g", "RUNAWAY_RETRY", 3548.8, 700.5),
                      (1, "broker", "broker-a", "BROKER_BUSY", 9.0, 949.0)])
    traffic = {(win(0)[1], "group", "g"): {"broker-a": 346.3, "broker-b": 1.0}}
    normal = {(win(0)[0], "broker-a"): 843.0, (win(0)[0], "broker-b"): 500.0}
    c = by_resource(candidate_limits(rows, {}, L, traffic, normal))["g"]
    assert c.busy_load == {"broker-a": 949.0} and c.busy_normal == {"broker-a": 843.0}
    surge = anomalies([(1, "topic", "t", "TRAFFIC_SURGE", 494.9, 251.1),
                       (1, "broker", "broker-a", "BROKER_BUSY", 9.0, 319.4)])   # sweep case 809
    c = by_resource(candidate_limits(surge, {(win(0)[0], "t"): ["broker-a", "broker-b"]}, L, {},
                                     {(win(0)[0], "broker-a"): 269.0, (win(0)[0], "broker-b"): 220.4}))["t"]
    assert c.busy_load == {"broker-a": 319.4} and c.busy_normal == {"broker-a": 269.0}
