"""Limit policy: candidates from anomalies, and the per-resource fold (set, hysteresis, refresh, lift)."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from pyspark.sql import functions as F

from pipelines.transforms import fold as fl
from pipelines.transforms import policy, policy_fold
from pipelines import schemas
from pipelines.config import LimitsConfig
from tests.helpers import ts

L = LimitsConfig()
T0 = ts("2022-02-08 07:00:00")


def end(i: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=i)


def anomalies(spark, rows):
    """(minute, resource_type, resource, anomaly, observed, baseline)"""
    data = [(end(i - 1), end(i), rt, r, a, o, b, "critical", f"{a} on {r}") for i, rt, r, a, o, b in rows]
    return spark.createDataFrame(data, schemas.GOLD_ANOMALIES)


def carriers(spark, rows):
    return spark.createDataFrame([(end(i - 1), end(i), t, b) for i, t, b in rows],
                                 "window_start timestamp, window_end timestamp, topic string, broker string")


def test_runaway_retry_limits_group_retry_traffic_to_share_of_consume(spark):
    a = anomalies(spark, [(1, "group", "get-pugc-to-ai-consumer", "RUNAWAY_RETRY", 785.32, 790.0)])
    got = policy.candidate_limits(a, carriers(spark, []), L).collect()
    assert got[0]["lift_at_qps"] == 790.0 and got[0]["critical"] and got[0]["mode"] == "enforce"
    assert [(r["resource_type"], r["resource"]) for r in got] == [("group", "get-pugc-to-ai-consumer")]
    assert got[0]["target_qps"] == pytest.approx(79.0)
    assert got[0]["reason"].startswith("RUNAWAY_RETRY: RUNAWAY_RETRY on get-pugc-to-ai-consumer")


def test_limit_is_never_zero_or_nan(spark):
    a = anomalies(spark, [(1, "group", "g", "RUNAWAY_RETRY", 300.0, 0.0), (1, "group", "h", "RUNAWAY_RETRY", 300.0, None)])
    targets = [r["target_qps"] for r in policy.candidate_limits(a, carriers(spark, []), L).collect()]
    assert targets == [L.min_limit_qps, L.min_limit_qps]


def test_surge_enforced_only_with_a_busy_broker_carrying_it(spark):
    a = anomalies(spark, [
        (1, "topic", "flash-sale", "TRAFFIC_SURGE", 900.0, 100.0),       # healthy brokers: advisory at >= peak
        (1, "topic", "noisy", "TRAFFIC_SURGE", 3000.0, 200.0),          # on busy broker-a: enforced
        (1, "broker", "broker-a", "BROKER_BUSY", 4.0, 3750.0),
        (1, "topic", "%RETRY%g", "TRAFFIC_SURGE", 785.0, 1.0),          # retry topic: via its group only
    ])
    c = carriers(spark, [(1, "flash-sale", "broker-b"), (1, "noisy", "broker-a"), (1, "%RETRY%g", "broker-a")])
    got = {r["resource"]: r for r in policy.candidate_limits(a, c, L).collect()}
    assert set(got) == {"flash-sale", "noisy"}
    assert (got["noisy"]["mode"], got["noisy"]["target_qps"]) == ("enforce", 400.0)
    assert "broker-a busy" in got["noisy"]["reason"]
    legit = got["flash-sale"]
    assert legit["mode"] == "advisory" and legit["target_qps"] >= 900.0 and legit["floor_qps"] >= 900.0


def test_protected_topic_never_gets_a_candidate(spark):
    a = anomalies(spark, [(1, "topic", "RMQ_SYS_TRACE_TOPIC", "TRAFFIC_SURGE", 3000.0, 200.0),
                          (1, "broker", "broker-a", "BROKER_BUSY", 4.0, 3750.0)])
    c = carriers(spark, [(1, "RMQ_SYS_TRACE_TOPIC", "broker-a")])
    assert policy.candidate_limits(a, c, L).count() == 0
    operator_listed = LimitsConfig(protected=("payments",))
    a2 = anomalies(spark, [(1, "group", "payments", "RUNAWAY_RETRY", 300.0, 300.0)])
    assert policy.candidate_limits(a2, c, operator_listed).count() == 0


def test_advisory_deployment_and_per_resource_shadow_mode(spark):
    a = anomalies(spark, [(1, "group", "g", "RUNAWAY_RETRY", 300.0, 300.0), (1, "group", "h", "RUNAWAY_RETRY", 300.0, 300.0)])
    modes = {r["resource"]: r["mode"] for r in policy.candidate_limits(a, carriers(spark, []), LimitsConfig(advisory_resources=("h",))).collect()}
    assert modes == {"g": "enforce", "h": "advisory"}
    modes = {r["resource"]: r["mode"] for r in policy.candidate_limits(a, carriers(spark, []), LimitsConfig(mode="advisory")).collect()}
    assert modes == {"g": "advisory", "h": "advisory"}


# --- the fold --------------------------------------------------------------------------------------------------

def cand(i, qps, **kw):
    kw.setdefault("lift_at_qps", 790.0)
    return fl.Candidate(end(i), qps, f"storm at {i}", **kw)


def fold(cands, horizon, state=None, cfg=L, obs=(), resource_type="group"):
    state = state or fl.ResourceState(resource_type, "g")
    decisions, after, _ = fl.fold_resource(state, cands, end(horizon), cfg, 60, observations=obs)
    return decisions, after


def seen(i, observed, rejected=0, healthy=True):
    return fl.Observation(end(i), observed, rejected, healthy)


def changes(decisions):
    """The decisions that are not refreshes (a refresh re-issues the same limit with a new expiry)."""
    return [(d.action, d.window_end, round(d.limit_qps, 3)) for d in decisions if not d.reason.startswith("refresh")]


def state_row(resource_type, resource, limit, version, last, lift_at, mode="enforce", **kw):
    """A POLICY_STATE row (batch_id 0) by name: the newer columns default to null."""
    row = dict(resource_type=resource_type, resource=resource, limit_qps=limit, version=version,
               last_candidate_end=last, last_decision_end=last, last_change_end=last, lift_at_qps=lift_at, mode=mode,
               batch_id=0)
    row.update(kw)
    return tuple(row.get(f.name) for f in schemas.POLICY_STATE.fields)


def fold_row(**values):
    """A POLICY_FOLD row by name, the other columns null."""
    return tuple(values.get(f.name) for f in schemas.POLICY_FOLD.fields)


def actions(decisions):
    return [(d.action, d.window_end, round(d.limit_qps, 3), d.previous_qps and round(d.previous_qps, 3), d.version) for d in decisions]


def test_fold_sets_once_then_hysteresis_suppresses_a_3_percent_change():
    decisions, state = fold([cand(1, 79.0), cand(2, 76.7), cand(3, 81.5)], horizon=3)
    assert actions(decisions) == [("set", end(1), 79.0, None, 1)]
    assert state.limit_qps == 79.0 and state.last_candidate_end == end(3)


def test_fold_neither_tightens_below_nor_loosens_above_its_frozen_target_while_the_anomaly_lasts():
    """Windows after the first set are under the limit: their targets (40: the consume rate fell; 90: it rose)
    come from capped traffic, so the frozen target of the pre-limit window stands."""
    decisions, state = fold([cand(1, 79.0), cand(2, 40.0), cand(3, 90.0)], horizon=3)
    assert actions(decisions) == [("set", end(1), 79.0, None, 1)]
    assert state.target_qps == 79.0


def test_fold_cooldown_and_max_cut_for_non_critical_anomalies():
    warn = dict(critical=False, observed_tps=200.0)
    decisions, _ = fold([cand(1, 20.0, **warn), cand(2, 10.0, **warn), cand(3, 10.0, **warn), cand(4, 10.0, **warn)], horizon=4)
    # first cut at most 50 % of the observed 200/s; no change in the cool-down (2 windows); then the anomaly has
    # outlived the first cut: down to the target frozen on window 1 in one step (one change after the first limit)
    assert actions(decisions) == [("set", end(1), 100.0, None, 1), ("set", end(3), 20.0, 100.0, 2)]
    assert "outlived the first cut: down to the target of 20.0 msg/s" in decisions[1].reason


def test_a_group_limit_bound_above_its_frozen_target_goes_down_to_it_once_after_the_cool_down():
    """The storm's first window was partial (not critical): the first limit cut 50 % of the observed 200/s. Under
    it the rule falls silent (the cap shows), but the demand runs into the cap: once the cool-down is over the
    limit goes to the frozen target in one step, then holds (refreshes only)."""
    decisions, state = fold([cand(1, 20.0, critical=False, observed_tps=200.0)], horizon=8,
                            obs=[seen(i, 99.0) for i in range(2, 9)])
    assert changes(decisions) == [("set", end(1), 100.0), ("set", end(3), 20.0)]
    assert "limit-bound: 99.0 of 100.0 msg/s" in decisions[1].reason
    assert state.limit_qps == 20.0 and state.target_qps == 20.0


def test_fold_critical_cuts_at_once():
    decisions, _ = fold([cand(1, 20.0, critical=True, observed_tps=785.0)], horizon=1)
    assert actions(decisions) == [("set", end(1), 20.0, None, 1)]


def test_fold_refreshes_while_anomaly_lasts():
    decisions, _ = fold([cand(i, 79.0) for i in range(1, 8)], horizon=7, cfg=LimitsConfig(refresh_seconds=180))
    assert [(d.action, d.window_end) for d in decisions] == [("set", end(1)), ("set", end(4)), ("set", end(7))]


def test_fold_lifts_once_the_anomaly_and_the_cap_are_gone_for_recovery_windows():
    """3 clear windows (recovery_windows) and the limit is doing nothing: lifted at once, no x1.5 ramp."""
    decisions, state = fold([cand(1, 100.0, lift_at_qps=300.0)], horizon=10,
                            obs=[seen(i, 3.0) for i in range(2, 11)])
    assert actions(decisions) == [("set", end(1), 100.0, None, 1), ("lift", end(4), 100.0, 100.0, 2)]
    assert "at most 50% of the 100.0 msg/s limit" in decisions[1].reason
    assert state.limit_qps is None and state.target_qps is None and state.broker_shares == {}


def test_fold_does_not_recover_before_recovery_windows():
    decisions, state = fold([cand(1, 79.0)], horizon=3)
    assert [d.action for d in decisions] == ["set"] and state.limit_qps == 79.0


def test_fold_sets_again_if_the_anomaly_returns_after_a_lift():
    decisions, _ = fold([cand(1, 100.0, lift_at_qps=1000.0), cand(6, 100.0, lift_at_qps=1000.0)], horizon=6)
    assert [(d.action, d.window_end, round(d.limit_qps, 1)) for d in decisions] == [
        ("set", end(1), 100.0), ("lift", end(4), 100.0), ("set", end(6), 100.0)]


def test_fold_raises_an_advisory_surge_limit_that_falls_below_a_growing_peak():
    legit = dict(mode="advisory", critical=False)
    decisions, _ = fold([cand(1, 1800.0, floor_qps=1800.0, observed_tps=900.0, **legit),
                         cand(2, 3000.0, floor_qps=3000.0, observed_tps=1500.0, **legit)], horizon=2)
    assert [(d.action, d.limit_qps, d.mode) for d in decisions] == [("set", 1800.0, "advisory"), ("set", 3000.0, "advisory")]


def test_fold_is_the_same_in_one_batch_or_split_across_batches():
    cands = [cand(1, 79.0, lift_at_qps=100.0), cand(2, 79.0, lift_at_qps=100.0), cand(9, 50.0, lift_at_qps=100.0)]
    whole, _ = fold(cands, horizon=16)
    first, mid = fold(cands[:2], horizon=3)
    second, mid2 = fold([], horizon=6, state=mid)
    third, _ = fold(cands[2:], horizon=16, state=mid2)
    assert actions(whole) == actions(first + second + third)
    assert [d.action for d in whole] == ["set", "lift", "set", "lift"]


def test_fold_rejects_non_finite_target():
    with pytest.raises(ValueError, match="finite"):
        fold([cand(1, math.nan)], horizon=1)


def test_decide_runs_the_fold_per_resource(spark):
    cands = spark.createDataFrame(
        [("group", "g", end(1), 79.0, 1.0, 790.0, 785.0, True, "enforce", "storm"),
         ("topic", "noisy", end(1), 400.0, 1.0, 3000.0, 3000.0, True, "enforce", "surge")],
        "resource_type string, resource string, window_end timestamp, target_qps double, floor_qps double, "
        "lift_at_qps double, observed_tps double, critical boolean, mode string, reason string")
    saved = spark.createDataFrame([state_row("topic", "old", 10.0, 4, end(-10), 12.0)], schemas.POLICY_STATE).drop("batch_id")
    out = policy_fold.decide(cands, saved, end(1), L, 60)
    decisions = sorted((r["resource"], r["action"], r["version"]) for r in out.where(F.col("row_kind") == "decision").collect())
    assert decisions == [("g", "set", 1), ("noisy", "set", 1), ("old", "lift", 5)]
    states = {r["resource"]: r["limit_qps"] for r in out.where(F.col("row_kind") == "state").collect()}
    assert states == {"g": 79.0, "noisy": 400.0, "old": None}


def test_finish_decisions_adds_expiry_burst_and_mode(spark):
    rows = spark.createDataFrame(
        [fold_row(row_kind="decision", resource_type="group", resource="g", window_end=end(1), limit_qps=79.5,
                  action="set", mode="advisory", reason="r", version=1)], schemas.POLICY_FOLD)
    now = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
    got = policy.finish_decisions(rows, L, now).first()
    assert got["burst"] == 80 and got["mode"] == "advisory"
    assert got["expires_at"] - got["decided_at"] == dt.timedelta(seconds=L.ttl_seconds)


def test_decide_with_only_state_rows_and_null_times(spark):
    """A batch where the only input is a saved state whose optional times are null (Arrow needs typed columns)."""
    cands = spark.createDataFrame([], "resource_type string, resource string, window_end timestamp, target_qps double, "
                                      "floor_qps double, lift_at_qps double, observed_tps double, critical boolean, "
                                      "mode string, reason string")
    saved = spark.createDataFrame([state_row("group", "g", 10.0, 1, end(0), None, last_change_end=None)],
                                  schemas.POLICY_STATE).drop("batch_id")
    out = policy_fold.decide(cands, saved, end(1), L, 60).collect()
    assert [(r["row_kind"], r["last_change_end"]) for r in out] == [("state", None)]


def test_versions_come_from_event_time_so_they_grow_across_lakes_and_restarts(spark):
    """The same window decided by two governors (a new lake, another processing time) has the same version; a
    later window has a higher one; a window's final decision outranks its preliminary one."""
    def version(window_end, basis, now):
        rows = spark.createDataFrame(
            [fold_row(row_kind="decision", resource_type="group", resource="g", window_end=window_end, limit_qps=79.5,
                      action="set", mode="enforce", reason="r", version=1)], schemas.POLICY_FOLD)
        return policy.finish_decisions(rows, L, now, basis).first()

    first_lake = version(end(1), policy.BASIS_FINAL, dt.datetime(2026, 11, 22, 10, 0))
    new_lake = version(end(1), policy.BASIS_FINAL, dt.datetime(2026, 11, 23, 9, 0))  # version counter restarted
    assert first_lake["version"] == new_lake["version"] == int(end(1).replace(tzinfo=dt.timezone.utc).timestamp()) * 10 + 5
    assert version(end(2), policy.BASIS_PRELIMINARY, dt.datetime(2026, 11, 22))["version"] > first_lake["version"]
    prelim = version(end(1), policy.BASIS_PRELIMINARY, dt.datetime(2026, 11, 22))
    assert prelim["version"] < first_lake["version"]
    assert (prelim["basis"], first_lake["basis"]) == ("preliminary", "final")
    assert prelim["reason"] == "[preliminary] r" and first_lake["reason"] == "[final] r"


def test_fast_fold_does_not_recover_and_an_older_window_does_not_move_the_last_candidate_back():
    state = fl.ResourceState("group", "g")
    decisions, after, _ = fl.fold_resource(state, [cand(5, 79.0)], end(20), L, 60, recover_windows=False)
    assert [d.action for d in decisions] == ["set"] and after.limit_qps == 79.0   # no relax/lift on open windows
    _, older, _ = fl.fold_resource(after, [cand(3, 79.0)], end(5), L, 60)
    assert older.last_candidate_end == end(5)


# --- closed loop: demand evidence under a limit, frozen basis, per-broker shares, surge probing -------------------

def test_a_capped_storm_keeps_its_limit_refreshed_never_relaxed_then_a_fix_lifts_it():
    """The storm goes on behind the limit: the retry rule falls silent (the stats show the cap, 38-40 of 40 msg/s),
    but the windows are limit-bound, so the limit is refreshed and never relaxed; once the consumer is fixed the
    retry traffic drops to nothing and 3 clear windows lift it."""
    cfg = LimitsConfig(refresh_seconds=300)
    storm = [cand(1, 40.0, broker_tps={"broker-a": 300.0, "broker-b": 300.0})]
    capped = [seen(i, 38.5 + (i % 2)) for i in range(2, 17)]          # at the cap for 15 windows
    fixed = [seen(i, 0.4) for i in range(17, 25)]
    decisions, state = fold(storm, horizon=24, cfg=cfg, obs=capped + fixed)
    assert [(d.action, d.window_end, d.limit_qps) for d in decisions] == [
        ("set", end(1), 40.0), ("set", end(6), 40.0), ("set", end(11), 40.0), ("set", end(16), 40.0),
        ("lift", end(19), 40.0)]
    assert all(d.reason.startswith("refresh (anomaly persists, limit-bound: ") for d in decisions[1:4])
    assert "limit-bound: 39.5 of 40.0 msg/s" in decisions[2].reason or "limit-bound: 38.5 of 40.0" in decisions[2].reason
    assert state.limit_qps is None


def test_limiter_rejections_keep_the_anomaly_even_below_the_bound_share():
    decisions, state = fold([cand(1, 40.0)], horizon=8, obs=[seen(i, 12.0, rejected=30) for i in range(2, 9)])
    assert changes(decisions) == [("set", end(1), 40.0)] and state.limit_qps == 40.0
    _, _, evidence = fl.fold_resource(fl.ResourceState("group", "g"), [cand(1, 40.0)], end(3), L, 60,
                                      observations=[seen(2, 12.0, rejected=30)])
    assert (evidence[0].status, evidence[0].detail) == (
        "bound", "limit-bound: 12.0 of 40.0 msg/s, rejecting (30 sends rejected by the limiter)")


def test_windows_near_the_cap_neither_recover_nor_escalate():
    """Between clear_share (50 %) and bound_share (90 %) of the limit: held, neither lifted nor relaxed."""
    decisions, state = fold([cand(1, 40.0)], horizon=9, obs=[seen(i, 28.0) for i in range(2, 10)])
    assert changes(decisions) == [("set", end(1), 40.0)] and state.limit_qps == 40.0
    assert decisions[1].reason.startswith("refresh (anomaly persists, near the cap: 28.0 of 40.0 msg/s")
    decisions, state = fold([cand(1, 40.0)], horizon=9, obs=[seen(i, 19.0) for i in range(2, 10)])
    assert [(d.action, d.window_end) for d in decisions] == [("set", end(1)), ("lift", end(4))]


def test_the_target_is_frozen_at_the_pre_limit_rate():
    """A throttled consumer's consume rate falls, and with it the rule's target: the limit must not ratchet down."""
    falling = [cand(1, 40.0, observed_tps=600.0)] + [cand(i, 40.0 * 0.6 ** (i - 1), observed_tps=300.0)
                                                       for i in range(2, 8)]
    decisions, state = fold(falling, horizon=7)
    assert {(d.action, d.limit_qps) for d in decisions} == {("set", 40.0)}
    assert state.target_qps == 40.0


def test_per_broker_shares_add_up_to_the_decision_and_stay_frozen():
    """Shares come from the window that set the limit (75/25 here); the capped windows after it (where broker-b
    now carries more) do not move them: a capped share must not feed on itself."""
    capped = [cand(i, 40.0, broker_tps={"broker-a": 20.0, "broker-b": 30.0}) for i in range(2, 7)]
    decisions, state = fold([cand(1, 40.0, broker_tps={"broker-a": 450.0, "broker-b": 150.0})] + capped, horizon=6)
    first, refresh = decisions
    assert first.broker_limits == {"broker-a": 30.0, "broker-b": 10.0, "*": 10.0}
    assert sum(v for b, v in first.broker_limits.items() if b != "*") == pytest.approx(first.limit_qps)
    assert refresh.reason.startswith("refresh") and refresh.broker_limits == first.broker_limits
    assert state.broker_shares == {"broker-a": 0.75, "broker-b": 0.25}


def test_a_surge_limit_at_its_cap_on_healthy_brokers_is_probed_upward_then_lifted():
    """A topic limited on a busy broker keeps hitting its cap, but the brokers stay healthy: every recovery_windows
    windows the limit is raised x1.5, and lifted once the next step would reach the normal rate."""
    surge = cand(1, 200.0, lift_at_qps=600.0, broker_tps={"broker-a": 800.0})
    capped = [seen(i, 0.95 * 200.0 * 1.5 ** ((i - 1) // 3)) for i in range(2, 12)]
    decisions, state = fold([surge], horizon=11, obs=capped, resource_type="topic")
    assert [(d.action, d.window_end, round(d.limit_qps, 1)) for d in decisions] == [
        ("set", end(1), 200.0), ("relax", end(4), 300.0), ("relax", end(7), 450.0), ("lift", end(10), 450.0)]
    assert decisions[1].reason.startswith("probe: limit-bound: ")
    assert state.limit_qps is None


def test_a_probe_that_makes_a_broker_busy_again_steps_back():
    surge = cand(1, 200.0, lift_at_qps=6000.0)
    obs = [seen(2, 195.0), seen(3, 195.0), seen(4, 196.0), seen(5, 290.0), seen(6, 295.0, healthy=False)]
    decisions, state = fold([surge], horizon=6, obs=obs, resource_type="topic")
    assert [(d.action, round(d.limit_qps, 1)) for d in decisions] == [("set", 200.0), ("relax", 300.0), ("set", 200.0)]
    assert decisions[-1].reason.startswith("probe undone: ")
    assert state.last_distress_end == end(6)


def test_a_retry_limit_at_its_cap_is_never_probed():
    decisions, state = fold([cand(1, 40.0)], horizon=12, obs=[seen(i, 39.0) for i in range(2, 13)])
    assert changes(decisions) == [("set", end(1), 40.0)] and len(decisions) == 3
    assert state.limit_qps == 40.0


def test_decide_folds_observations_and_returns_the_evidence(spark):
    cands = spark.createDataFrame(
        [("group", "g", end(1), 40.0, 1.0, 400.0, 600.0, True, "enforce", "storm", {"broker-a": 300.0, "broker-b": 300.0})],
        "resource_type string, resource string, window_end timestamp, target_qps double, floor_qps double, "
        "lift_at_qps double, observed_tps double, critical boolean, mode string, reason string, "
        "broker_tps map<string,double>")
    obs = spark.createDataFrame([(end(i), "group", "g", 39.0, 0, True) for i in (2, 3)],
                                "window_end timestamp, resource_type string, resource string, observed_tps double, "
                                "rejected long, healthy boolean")
    saved = spark.createDataFrame([], schemas.POLICY_STATE).drop("batch_id")
    out = policy_fold.decide(cands, saved, end(3), L, 60, observations=obs)
    decision = out.where(F.col("row_kind") == "decision").first()
    assert decision["broker_limits"] == {"broker-a": 20.0, "broker-b": 20.0, "*": 20.0}
    evidence = [(r["window_end"], r["status"], r["limit_qps"]) for r in out.where(F.col("row_kind") == "evidence")
                .orderBy("window_end").collect()]
    assert evidence == [(end(2), "bound", 40.0), (end(3), "bound", 40.0)]
    state = out.where(F.col("row_kind") == "state").first()
    assert (state["target_qps"], state["limited_since"], state["broker_shares"]) == (
        40.0, end(1), {"broker-a": 0.5, "broker-b": 0.5})


# --- recurrence memory (flap damping) ------------------------------------------------------------------------------

def test_an_intermittent_storm_keeps_its_limit_through_its_quiet_spells_from_its_second_storm_on():
    """4 storm minutes, 4 quiet, again and again (limit 40 msg/s, frozen). The first quiet spell lifts the limit after
    recovery_windows (3) clear windows; the second storm is a recurrence: straight to the remembered target, and
    the next lift needs 6 clear windows, more than the 4-minute quiet spell, so the third storm finds it in force."""
    storm = lambda i: seen(i, 39.0)  # noqa: E731 (at the cap)
    quiet = lambda i: seen(i, 0.3)   # noqa: E731
    obs = ([storm(i) for i in range(2, 5)] + [quiet(i) for i in range(5, 9)]
           + [quiet(i) for i in range(9, 10)] + [storm(i) for i in range(10, 13)] + [quiet(i) for i in range(13, 17)]
           + [storm(i) for i in range(17, 21)] + [quiet(i) for i in range(21, 40)])
    # the second storm's first window fires the rule, against a lower (throttled) consume rate
    decisions, state = fold([cand(1, 40.0), cand(9, 25.0, critical=False, observed_tps=300.0)], horizon=40, obs=obs)
    assert changes(decisions) == [
        ("set", end(1), 40.0), ("lift", end(7), 40.0),    # first quiet spell: 3 clear windows (5, 6, 7)
        ("set", end(9), 40.0),                            # recurrence: the remembered 40, not 25, no max-cut step
        ("lift", end(26), 40.0)]                          # held through 13-16; lifted after 6 clear windows (21-26)
    assert "recurrence 1 within 30 windows of the lift at" in decisions[2].reason
    assert "(6 windows, doubled for each of 1 recurrences)" in decisions[-1].reason
    assert (state.recurrences, state.last_lift_end, state.lifted_target_qps) == (1, end(26), 40.0)


def test_recurrences_double_the_clear_windows_up_to_the_memory_and_a_quiet_memory_is_forgotten():
    cfg = LimitsConfig()
    assert [fl.recovery_needed(n, cfg) for n in range(6)] == [3, 6, 12, 24, 30, 30]
    assert [fl.recovery_needed(n, LimitsConfig(recurrence_windows=0)) for n in range(3)] == [3, 3, 3]
    remembered = fl.ResourceState("group", "g", version=4, last_lift_end=end(10), lifted_target_qps=40.0,
                                  recurrences=2)
    decisions, later = fold([cand(41, 60.0)], horizon=41, state=remembered)   # 31 windows after the lift: forgotten
    assert changes(decisions) == [("set", end(41), 60.0)] and "recurrence" not in decisions[0].reason
    assert (later.recurrences, later.last_lift_end, later.lifted_target_qps) == (0, None, None)
    decisions, again = fold([cand(40, 60.0)], horizon=40, state=remembered)   # 30 windows after: a recurrence
    assert changes(decisions) == [("set", end(40), 40.0)] and again.recurrences == 3
    decisions, off = fold([cand(12, 60.0)], horizon=12, state=remembered, cfg=LimitsConfig(recurrence_windows=0))
    assert changes(decisions) == [("set", end(12), 60.0)] and off.recurrences == 0


def test_a_surge_limit_probed_up_to_its_normal_rate_is_not_remembered():
    """A probe-lift means the demand was legitimate: a later surge starts afresh (max-cut step, 3-window recovery)."""
    probed = fl.ResourceState("topic", "g", limit_qps=600.0, version=3, target_qps=400.0, lift_at_qps=800.0,
                              last_candidate_end=end(1), last_decision_end=end(1), last_change_end=end(1),
                              limited_since=end(1), last_lift_end=end(0), lifted_target_qps=300.0, recurrences=1)
    decisions, state = fold([], horizon=5, state=probed, obs=[seen(i, 599.0) for i in range(2, 6)])
    assert [d.action for d in decisions][-1] == "lift"
    assert (state.recurrences, state.last_lift_end, state.lifted_target_qps) == (0, None, None)
