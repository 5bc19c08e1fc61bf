"""Limit policy in Spark: candidates from anomalies, the fold run per resource (``policy_fold.decide``) and the
``gold/limits`` rows; the fold itself is tested in plain Python (tests/transforms/test_fold.py)."""

from __future__ import annotations

import datetime as dt

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

