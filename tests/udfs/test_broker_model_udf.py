"""udfs/broker_model.py: the broker model as a grouped pandas UDF (one broker per group) gives the driver's result."""

from __future__ import annotations

import pandas as pd
import pytest
from chispa import assert_approx_df_equality
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.sim import broker_model as bm
from udfs.broker_model import simulate_per_broker

T0 = pd.Timestamp("2026-11-22 08:00", tz="UTC")
CFG = bm.BrokerModelConfig(capacity_tps={"b1": 400.0, "b2": 300.0})
CAPACITY = pd.Series({"b1": 400.0, "b2": 300.0})


def _offered() -> pd.DataFrame:
    """Two brokers, three minutes: ``t1`` on both (over its limit), a busy ``t2`` on b2, a quiet ``t3`` on b1."""
    rows = []
    for m in range(3):
        ms = T0 + pd.Timedelta(minutes=m)
        rows += [(ms, "b1", "topic", "t1", 200.0, 1.0), (ms, "b1", "topic", "t3", 20.0, 1.0),
                 (ms, "b2", "topic", "t1", 150.0, 1.0), (ms, "b2", "topic", "t2", 250.0 + 50 * m, 1.0)]
    return pd.DataFrame(rows, columns=list(bm.OFFERED_COLUMNS))


def _schedule() -> pd.DataFrame:
    """``t1`` limited to 50 msgs/s with a 10 s gap at 00:30-00:40 (its breaker is open when the gap starts), and
    ``t2`` limited throughout: a pair's breaker must not depend on other pairs' limits."""
    def row(resource, start_s, end_s, qps):
        return ("topic", resource, T0 + pd.Timedelta(seconds=start_s), T0 + pd.Timedelta(seconds=end_s), qps, qps,
                1, T0)
    return pd.DataFrame([row("t1", 0, 30, 50.0), row("t1", 40, 180, 50.0), row("t2", 0, 180, 200.0)],
                        columns=list(bm.SCHEDULE_COLUMNS))


def _per_broker_and_resource(resources: pd.DataFrame) -> pd.DataFrame:
    return (resources.groupby(["broker", "resource_type", "resource"], as_index=False)
            [["offered", "limited_rejected", "busy_rejected", "admitted"]].sum()
            .sort_values(["broker", "resource"]).reset_index(drop=True))


@pytest.mark.parametrize("group_by", ["broker", "bucket"])
def test_udf_equals_driver_simulate_on_two_brokers(spark, group_by):
    """One group per broker, or both brokers in one group (the backtest's buckets): the driver's result."""
    offered, schedule = _offered(), _schedule()
    minutes = pd.date_range(T0, periods=3, freq="min")
    driver = bm.simulate(offered, schedule, CFG, CAPACITY)

    fn = simulate_per_broker(schedule, CFG, CAPACITY, minutes)
    # a bucket column as the backtest groups (pyspark 4.2.0 fails to analyse groupBy(F.lit(0)).applyInPandas:
    # INTERNAL_ERROR, unresolved ordinal)
    df = spark.createDataFrame(offered, schema=schemas.BROKER_MODEL_OFFERED).withColumn("bucket", F.lit(0))
    rows = df.groupBy(group_by).applyInPandas(fn, schema=schemas.BROKER_MODEL_RESULT)
    got = rows.where("row_kind = 'resource'").groupBy("broker", "resource_type", "resource").sum(
        "offered", "limited_rejected", "busy_rejected", "admitted")
    got = got.toDF("broker", "resource_type", "resource", "offered", "limited_rejected", "busy_rejected",
                   "admitted").orderBy("broker", "resource")
    expected = spark.createDataFrame(_per_broker_and_resource(driver.resources), schema=got.schema).orderBy(
        "broker", "resource")

    # not a vacuous equality: the limiter and fast failure both reject something
    want = _per_broker_and_resource(driver.resources)
    assert want["limited_rejected"].sum() > 0 and want["busy_rejected"].sum() > 0
    assert_approx_df_equality(got, expected, precision=1e-6, ignore_nullable=True)

    brokers = rows.where("row_kind = 'broker'").select("broker", "reject_share", "max_wait_ms").orderBy(
        "broker", "minute_start")
    expected_brokers = spark.createDataFrame(driver.brokers[["broker", "reject_share", "max_wait_ms"]],
                                             schema=brokers.schema)
    assert_approx_df_equality(brokers, expected_brokers, precision=1e-9, ignore_nullable=True)


def test_udf_without_schedule_equals_driver(spark):
    offered = _offered()
    minutes = pd.date_range(T0, periods=3, freq="min")
    driver = bm.simulate(offered, None, CFG, CAPACITY)
    rows = (spark.createDataFrame(offered, schema=schemas.BROKER_MODEL_OFFERED)
            .groupBy("broker").applyInPandas(simulate_per_broker(None, CFG, CAPACITY, minutes),
                                             schema=schemas.BROKER_MODEL_RESULT))
    got = rows.where("row_kind = 'resource'").toPandas()
    got["minute_start"] = pd.to_datetime(got["minute_start"]).dt.tz_localize("UTC")
    got = got.sort_values(["minute_start", "broker", "resource"]).reset_index(drop=True)
    want = driver.resources.sort_values(["minute_start", "broker", "resource"]).reset_index(drop=True)
    assert want["busy_rejected"].sum() > 0 and want["limited_rejected"].sum() == 0
    pd.testing.assert_frame_equal(got[list(want.columns)], want, check_dtype=False, rtol=1e-9)
