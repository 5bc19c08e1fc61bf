"""The final path's gold outputs (pipelines/transforms/gold.py): the limiters' own evidence wired in."""

from __future__ import annotations

import datetime as dt

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.config import GovernorConfig
from pipelines.transforms import gold
from tests.helpers import ts

CFG = GovernorConfig()
NOW = dt.datetime(2026, 11, 22, 10, 0)
#: the saved policy state as gold_outputs reads it (without the writing batch's id)
STATE = schemas.POLICY_STATE.__class__([f for f in schemas.POLICY_STATE.fields if f.name != "batch_id"])


def _empty(spark, schema):
    return spark.createDataFrame([], schema)


def test_a_limited_group_whose_limiter_rejected_in_the_window_is_still_bound(spark):
    """The final path's wiring of the limiters' own evidence: a group limited to 40 msg/s shows only 10 msg/s of
    retry traffic in the window (below the 90 % bound), but the RocketMQ admin sink saw its %RETRY% limiter reject
    sends in that window: the anomaly persists (a limit-bound row), the limit is not lifted."""
    from pipelines.transforms.fold import ResourceState  # noqa: F401 (the state row's meaning)

    t0, t1 = ts("2022-02-08 07:00"), ts("2022-02-08 07:01")
    windows = [(t0 + dt.timedelta(minutes=i), t0 + dt.timedelta(minutes=i + 1)) for i in range(4)]
    metrics = spark.createDataFrame(
        [(s, e, "broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 600) for s, e in windows]
        + [(s, e, "broker-a", "orders", "g", "GROUP_GET_NUMS", 24_000) for s, e in windows], schemas.WINDOW_METRIC)
    state = spark.createDataFrame([("group", "g", 40.0, 3, t0, t0, t0, 400.0, "enforce", 40.0, t0,
                                    {"broker-a": 1.0}, None, None, None, None) + (None,) * 7],
                                  STATE)
    rejections = spark.createDataFrame(
        [(windows[-1][1], "rocketmq", "broker-a", "%RETRY%g", s + dt.timedelta(seconds=30), 7) for s, _ in windows],
        schemas.LIMITER_REJECTIONS)
    def outputs(limiter_rejections):
        inputs = gold.GoldInputs(metrics, _empty(spark, schemas.GOLD_TOPIC_TPS), _empty(spark, schemas.GOLD_BROKER_TPS),
                                 state, _empty(spark, schemas.GOLD_LIMITS), limiter_rejections)
        return gold.gold_outputs(inputs, CFG, NOW, check=lambda d: (d, d.limit(0)), batch_id=1,
                                 first_window=windows[0][0], horizon_end=windows[-1][1])
    with_views = outputs(rejections)
    bound = with_views.anomalies.where("resource = 'g'").collect()
    assert len(bound) == 4 and all("limit-bound: 10.0 of 40.0 msg/s, rejecting" in r["detail"] for r in bound)
    assert with_views.limits.where("action = 'lift'").count() == 0
    without = outputs(None)   # the same traffic with no view of the limiter: 10 of 40 msg/s is clear: lifted
    assert [r["action"] for r in without.limits.collect()] == ["lift"]


def test_collected_leaf_rows_are_the_same_rows_in_a_leaf_without_lineage(spark):
    built = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "n long, s string") \
        .where(F.col("n") > 1).select("n", F.upper("s").alias("s"))
    leaf = built.transform(gold.collected_leaf)
    assert_df_equality(leaf, built, ignore_row_order=True)
    plan = leaf._jdf.queryExecution().analyzed()
    assert plan.children().size() == 0  # no Filter/Project of the built plan left to analyse again


def test_gold_outputs_read_windows_of_any_partitioning_in_one_partition(spark):
    """The flow hands over the micro-batch as Spark's stateful aggregation emits it (several partitions);
    with ``spark.gold_single_partition`` the gold tables are computed in one partition, without a shuffle."""
    t0 = ts("2022-02-08 07:00")
    metrics = spark.createDataFrame(
        [(t0 + dt.timedelta(minutes=i), t0 + dt.timedelta(minutes=i + 1), "broker-a", "orders", "g", "GROUP_GET_NUMS",
          600) for i in range(4)], schemas.WINDOW_METRIC).repartition(3)
    inputs = gold.GoldInputs(metrics, _empty(spark, schemas.GOLD_TOPIC_TPS), _empty(spark, schemas.GOLD_BROKER_TPS),
                             _empty(spark, STATE), _empty(spark, schemas.GOLD_LIMITS), None)
    out = gold.gold_outputs(inputs, CFG, NOW, check=lambda d: (d, d.limit(0)), batch_id=1,
                            first_window=t0, horizon_end=t0 + dt.timedelta(minutes=4))
    assert CFG.spark.gold_single_partition
    assert out.group_tps.rdd.getNumPartitions() == 1
    assert out.group_tps.count() == 4
