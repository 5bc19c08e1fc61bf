"""Limit policy: candidates from anomalies, and the per-resource fold (set, hysteresis, refresh, lift)."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from pyspark.sql import functions as F

from pipelines import policy, schemas
from pipelines.config import LimitsConfig
from tests.helpers import ts
from udfs import policy_fold

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
    assert [(r["resource_type"], r["resource"]) for r in got] == [("group", "get-pugc-to-ai-consumer")]
    assert got[0]["target_qps"] == pytest.approx(79.0)
    assert got[0]["reason"].startswith("RUNAWAY_RETRY: RUNAWAY_RETRY on get-pugc-to-ai-consumer")


def test_limit_is_never_zero_or_nan(spark):
    a = anomalies(spark, [(1, "group", "g", "RUNAWAY_RETRY", 300.0, 0.0), (1, "group", "h", "RUNAWAY_RETRY", 300.0, None)])
    targets = [r["target_qps"] for r in policy.candidate_limits(a, carriers(spark, []), L).collect()]
    assert targets == [L.min_limit_qps, L.min_limit_qps]


def test_surge_limited_only_with_a_busy_broker_carrying_it(spark):
    a = anomalies(spark, [
        (1, "topic", "flash-sale", "TRAFFIC_SURGE", 900.0, 100.0),       # healthy brokers: no limit
        (1, "topic", "noisy", "TRAFFIC_SURGE", 3000.0, 200.0),          # on busy broker-a: limit
        (1, "broker", "broker-a", "BROKER_BUSY", 4.0, 3750.0),
        (1, "topic", "%RETRY%g", "TRAFFIC_SURGE", 785.0, 1.0),          # retry topic: via its group only
    ])
    c = carriers(spark, [(1, "flash-sale", "broker-b"), (1, "noisy", "broker-a"), (1, "%RETRY%g", "broker-a")])
    got = policy.candidate_limits(a, c, L).collect()
    assert [(r["resource"], r["target_qps"]) for r in got] == [("noisy", 400.0)]
    assert "broker-a busy" in got[0]["reason"]


def test_protected_topic_never_gets_a_candidate(spark):
    a = anomalies(spark, [(1, "topic", "RMQ_SYS_TRACE_TOPIC", "TRAFFIC_SURGE", 3000.0, 200.0),
                          (1, "broker", "broker-a", "BROKER_BUSY", 4.0, 3750.0)])
    c = carriers(spark, [(1, "RMQ_SYS_TRACE_TOPIC", "broker-a")])
    assert policy.candidate_limits(a, c, L).count() == 0


# --- the fold --------------------------------------------------------------------------------------------------

def cand(i, qps):
    return policy.Candidate(end(i), qps, f"storm at {i}")


def fold(cands, horizon, state=None, cfg=L):
    state = state or policy.ResourceState("group", "g")
    return policy.fold_resource(state, cands, end(horizon), cfg, 60)


def actions(decisions):
    return [(d.action, d.window_end, d.limit_qps, d.previous_qps, d.version) for d in decisions]


def test_fold_sets_once_then_hysteresis_suppresses_small_changes():
    decisions, state = fold([cand(1, 79.0), cand(2, 80.0), cand(3, 81.5)], horizon=3)
    assert actions(decisions) == [("set", end(1), 79.0, None, 1)]
    assert state.limit_qps == 79.0 and state.last_candidate_end == end(3)


def test_fold_tightens_beyond_hysteresis_but_never_loosens_while_anomaly_lasts():
    decisions, _ = fold([cand(1, 79.0), cand(2, 40.0), cand(3, 90.0)], horizon=3)
    assert actions(decisions) == [("set", end(1), 79.0, None, 1), ("set", end(2), 40.0, 79.0, 2)]


def test_fold_refreshes_while_anomaly_lasts():
    decisions, _ = fold([cand(i, 79.0) for i in range(1, 8)], horizon=7, cfg=LimitsConfig(refresh_seconds=180))
    assert [(d.action, d.window_end) for d in decisions] == [("set", end(1)), ("set", end(4)), ("set", end(7))]


def test_fold_lifts_after_recovery_windows_without_candidate():
    decisions, state = fold([cand(1, 79.0)], horizon=4)
    assert actions(decisions) == [("set", end(1), 79.0, None, 1), ("lift", end(4), 79.0, 79.0, 2)]
    assert state.limit_qps is None


def test_fold_does_not_lift_before_recovery_windows():
    decisions, state = fold([cand(1, 79.0)], horizon=3)
    assert [d.action for d in decisions] == ["set"] and state.limit_qps == 79.0


def test_fold_is_the_same_in_one_batch_or_split_across_batches():
    cands = [cand(1, 79.0), cand(2, 79.0), cand(8, 50.0), cand(9, 50.0)]
    whole, _ = fold(cands, horizon=14)
    first, mid = fold(cands[:2], horizon=3)
    second, mid2 = fold([], horizon=6, state=mid)
    third, _ = fold(cands[2:], horizon=14, state=mid2)
    assert actions(whole) == actions(first + second + third)
    assert [d.action for d in whole] == ["set", "lift", "set", "lift"]


def test_fold_rejects_non_finite_target():
    with pytest.raises(ValueError, match="finite"):
        fold([cand(1, math.nan)], horizon=1)


def test_decide_runs_the_fold_per_resource_in_spark(spark):
    cands = spark.createDataFrame(
        [("group", "g", end(1), 79.0, "storm"), ("topic", "noisy", end(1), 400.0, "surge")],
        "resource_type string, resource string, window_end timestamp, target_qps double, reason string")
    saved = spark.createDataFrame(
        [("topic", "old", 10.0, 4, end(-10), end(-10), 0)], schemas.POLICY_STATE).drop("batch_id")
    out = policy_fold.decide(cands, saved, end(1), L, 60)
    decisions = sorted((r["resource"], r["action"], r["version"]) for r in out.where(F.col("row_kind") == "decision").collect())
    assert decisions == [("g", "set", 1), ("noisy", "set", 1), ("old", "lift", 5)]
    states = {r["resource"]: r["limit_qps"] for r in out.where(F.col("row_kind") == "state").collect()}
    assert states == {"g": 79.0, "noisy": 400.0, "old": None}


def test_finish_decisions_adds_expiry_burst_and_mode(spark):
    rows = spark.createDataFrame([("decision", "group", "g", end(1), None, 79.5, None, "set", "r", 1, None, None)],
                                 schemas.POLICY_FOLD)
    now = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
    got = policy.finish_decisions(rows, L, now).first()
    assert got["burst"] == 80 and got["mode"] == "enforce"
    assert got["expires_at"] - got["decided_at"] == dt.timedelta(seconds=L.ttl_seconds)
