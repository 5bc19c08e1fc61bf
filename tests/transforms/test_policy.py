"""Limit policy: candidates from anomalies, and the per-resource fold (set, hysteresis, refresh, lift)."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from pyspark.sql import functions as F

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
    return policy.Candidate(end(i), qps, f"storm at {i}", **kw)


def fold(cands, horizon, state=None, cfg=L):
    state = state or policy.ResourceState("group", "g")
    return policy.fold_resource(state, cands, end(horizon), cfg, 60)


def actions(decisions):
    return [(d.action, d.window_end, round(d.limit_qps, 3), d.previous_qps and round(d.previous_qps, 3), d.version) for d in decisions]


def test_fold_sets_once_then_hysteresis_suppresses_a_3_percent_change():
    decisions, state = fold([cand(1, 79.0), cand(2, 76.7), cand(3, 81.5)], horizon=3)
    assert actions(decisions) == [("set", end(1), 79.0, None, 1)]
    assert state.limit_qps == 79.0 and state.last_candidate_end == end(3)


def test_fold_tightens_beyond_hysteresis_but_never_loosens_while_anomaly_lasts():
    decisions, _ = fold([cand(1, 79.0), cand(2, 40.0), cand(3, 90.0)], horizon=3)
    assert actions(decisions) == [("set", end(1), 79.0, None, 1), ("set", end(2), 40.0, 79.0, 2)]


def test_fold_cooldown_and_max_cut_for_non_critical_anomalies():
    warn = dict(critical=False, observed_tps=200.0)
    decisions, _ = fold([cand(1, 20.0, **warn), cand(2, 10.0, **warn), cand(3, 10.0, **warn), cand(4, 10.0, **warn)], horizon=4)
    # first cut at most 50 % of the observed 200/s; no change in the cool-down (2 windows); then at most 50 % again
    assert actions(decisions) == [("set", end(1), 100.0, None, 1), ("set", end(3), 50.0, 100.0, 2)]


def test_fold_critical_cuts_at_once():
    decisions, _ = fold([cand(1, 20.0, critical=True, observed_tps=785.0)], horizon=1)
    assert actions(decisions) == [("set", end(1), 20.0, None, 1)]


def test_fold_refreshes_while_anomaly_lasts():
    decisions, _ = fold([cand(i, 79.0) for i in range(1, 8)], horizon=7, cfg=LimitsConfig(refresh_seconds=180))
    assert [(d.action, d.window_end) for d in decisions] == [("set", end(1)), ("set", end(4)), ("set", end(7))]


def test_fold_recovers_x1_5_per_window_then_lifts():
    decisions, state = fold([cand(1, 100.0, lift_at_qps=300.0)], horizon=10)
    assert actions(decisions) == [
        ("set", end(1), 100.0, None, 1),
        ("relax", end(4), 150.0, 100.0, 2),     # 3 clear windows (recovery_windows), then x1.5 per window
        ("relax", end(5), 225.0, 150.0, 3),
        ("lift", end(6), 225.0, 225.0, 4),      # 337.5 would pass the normal rate 300: lift (tombstone)
    ]
    assert state.limit_qps is None


def test_fold_does_not_recover_before_recovery_windows():
    decisions, state = fold([cand(1, 79.0)], horizon=3)
    assert [d.action for d in decisions] == ["set"] and state.limit_qps == 79.0


def test_fold_tightens_again_if_the_anomaly_returns_during_recovery():
    decisions, _ = fold([cand(1, 100.0, lift_at_qps=1000.0), cand(6, 100.0, lift_at_qps=1000.0)], horizon=6)
    assert [(d.action, round(d.limit_qps, 1)) for d in decisions] == [("set", 100.0), ("relax", 150.0), ("relax", 225.0), ("set", 100.0)]


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
    assert [d.action for d in whole] == ["set", "lift", "set", "relax", "lift"]


def test_fold_rejects_non_finite_target():
    with pytest.raises(ValueError, match="finite"):
        fold([cand(1, math.nan)], horizon=1)


def test_decide_runs_the_fold_per_resource(spark):
    cands = spark.createDataFrame(
        [("group", "g", end(1), 79.0, 1.0, 790.0, 785.0, True, "enforce", "storm"),
         ("topic", "noisy", end(1), 400.0, 1.0, 3000.0, 3000.0, True, "enforce", "surge")],
        "resource_type string, resource string, window_end timestamp, target_qps double, floor_qps double, "
        "lift_at_qps double, observed_tps double, critical boolean, mode string, reason string")
    saved = spark.createDataFrame(
        [("topic", "old", 10.0, 4, end(-10), end(-10), end(-10), 12.0, "enforce", 0)], schemas.POLICY_STATE).drop("batch_id")
    out = policy_fold.decide(cands, saved, end(1), L, 60)
    decisions = sorted((r["resource"], r["action"], r["version"]) for r in out.where(F.col("row_kind") == "decision").collect())
    assert decisions == [("g", "set", 1), ("noisy", "set", 1), ("old", "lift", 5)]
    states = {r["resource"]: r["limit_qps"] for r in out.where(F.col("row_kind") == "state").collect()}
    assert states == {"g": 79.0, "noisy": 400.0, "old": None}


def test_finish_decisions_adds_expiry_burst_and_mode(spark):
    rows = spark.createDataFrame(
        [("decision", "group", "g", end(1), None, None, None, None, 79.5, None, "set", "advisory", "r", 1, None, None, None, None)],
        schemas.POLICY_FOLD)
    now = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
    got = policy.finish_decisions(rows, L, now).first()
    assert got["burst"] == 80 and got["mode"] == "advisory"
    assert got["expires_at"] - got["decided_at"] == dt.timedelta(seconds=L.ttl_seconds)


def test_decide_with_only_state_rows_and_null_times(spark):
    """A batch where the only input is a saved state whose optional times are null (Arrow needs typed columns)."""
    cands = spark.createDataFrame([], "resource_type string, resource string, window_end timestamp, target_qps double, "
                                      "floor_qps double, lift_at_qps double, observed_tps double, critical boolean, "
                                      "mode string, reason string")
    saved = spark.createDataFrame([("group", "g", 10.0, 1, end(0), end(0), None, None, "enforce", 0)],
                                  schemas.POLICY_STATE).drop("batch_id")
    out = policy_fold.decide(cands, saved, end(1), L, 60).collect()
    assert [(r["row_kind"], r["last_change_end"]) for r in out] == [("state", None)]


def test_versions_come_from_event_time_so_they_grow_across_lakes_and_restarts(spark):
    """The same window decided by two governors (a new lake, another processing time) has the same version; a
    later window has a higher one; a window's final decision outranks its preliminary one."""
    def version(window_end, basis, now):
        rows = spark.createDataFrame(
            [("decision", "group", "g", window_end, None, None, None, None, 79.5, None, "set", "enforce", "r", 1,
              None, None, None, None)], schemas.POLICY_FOLD)
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
    state = policy.ResourceState("group", "g")
    decisions, after = policy.fold_resource(state, [cand(5, 79.0)], end(20), L, 60, recover_windows=False)
    assert [d.action for d in decisions] == ["set"] and after.limit_qps == 79.0   # no relax/lift on open windows
    _, older = policy.fold_resource(after, [cand(3, 79.0)], end(5), L, 60)
    assert older.last_candidate_end == end(5)
