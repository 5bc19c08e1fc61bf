"""Each anomaly rule firing and not firing."""

from __future__ import annotations

import datetime as dt

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines.transforms import detect
from pipelines import schemas
from pipelines.config import DetectionConfig, WindowsConfig
from tests.helpers import ts

W, D = WindowsConfig(), DetectionConfig()
T0 = ts("2022-02-08 07:00:00")


def win(i: int):
    start = T0 + dt.timedelta(minutes=i)
    return start, start + dt.timedelta(minutes=1)


def groups(spark, rows):
    """(minute, group, topic, consume_tps, retry_tps)"""
    data = [(*win(i), g, t, c, r, (r / c if c else None)) for i, g, t, c, r in rows]
    return spark.createDataFrame(data, schemas.GOLD_GROUP_TPS)


def fired(df):
    return sorted((r["resource"], r["anomaly"], r["severity"]) for r in df.collect())


def test_runaway_retry_fires_for_article_storm_not_for_normal_retries(spark):
    g = groups(spark, [
        (0, "get-pugc-to-ai-consumer", "pugc-content", 790.0, 785.32),
        (0, "get-pugc-to-ai-consumer", "%RETRY%get-pugc-to-ai-consumer", 700.0, 0.0),
        (0, "steady", "orders", 100.0, 1.0),            # ratio 1%: normal
        (0, "tiny", "pay", 10.0, 9.0),                  # ratio 90% but 9 TPS: under the floor
    ])
    got = g.transform(detect.group_retry).transform(detect.runaway_retry(D))
    assert fired(got) == [("get-pugc-to-ai-consumer", "RUNAWAY_RETRY", "critical")]
    row = got.first()
    assert row["observed_tps"] == 785.32 and row["baseline_tps"] == 790.0
    assert "retry ratio 0.99" in row["detail"] and "%RETRY%get-pugc-to-ai-consumer" in row["detail"]


def test_group_retry_ignores_consumption_of_the_retry_topic(spark):
    g = groups(spark, [(0, "g", "t", 100.0, 60.0), (0, "g", "%RETRY%g", 900.0, 0.0)])
    got = g.transform(detect.group_retry).select("consumer_group", "consume_tps", "retry_tps", "retry_ratio")
    want = spark.createDataFrame([("g", 100.0, 60.0, 0.6)], "consumer_group string, consume_tps double, retry_tps double, retry_ratio double")
    assert_df_equality(got, want, ignore_nullable=True)


def topic_series(spark, topic, values, limits=None):
    """gold/topic_tps rows of one topic, window i putting values[i] msg/s (``limits[i]``: the limit in force)."""
    limits = limits or [None] * len(values)
    rows = [(*win(i), topic, v, 1, 0, 0, None, 0.0, 0, q) for i, (v, q) in enumerate(zip(values, limits))]
    return spark.createDataFrame(rows, schemas.GOLD_TOPIC_TPS)


def surges(spark, current, history):
    empty_brokers = spark.createDataFrame([], schemas.GOLD_BROKER_TPS)
    empty_groups = spark.createDataFrame([], schemas.GOLD_GROUP_TPS)
    got = detect.detect_anomalies(current, empty_groups, empty_brokers, history, empty_brokers, W, D)
    return got.where(F.col("anomaly") == "TRAFFIC_SURGE")


def test_traffic_surge_fires_against_own_baseline_from_history(spark):
    series = topic_series(spark, "orders", [100.0] * 10 + [800.0])
    history, current = series.where(F.col("put_tps") < 800), series.where(F.col("put_tps") >= 800)
    got = surges(spark, current, history)
    assert fired(got) == [("orders", "TRAFFIC_SURGE", "warning")]
    assert got.first()["baseline_tps"] == 100.0


def test_traffic_surge_does_not_fire_on_noise_small_topics_or_without_baseline(spark):
    noisy = topic_series(spark, "orders", [100.0, 120.0, 90.0, 110.0, 100.0, 130.0, 150.0])
    small = topic_series(spark, "tiny", [1.0] * 6 + [40.0])          # 40x but under the 50 TPS floor
    young = topic_series(spark, "new", [100.0, 100.0, 900.0])          # only 2 windows of baseline
    current = noisy.unionByName(small).unionByName(young)
    empty = spark.createDataFrame([], schemas.GOLD_TOPIC_TPS)
    assert fired(surges(spark, current, empty)) == []


def test_traffic_surge_baseline_computed_within_one_batch(spark):
    series = topic_series(spark, "orders", [100.0] * 6 + [900.0])
    empty = spark.createDataFrame([], schemas.GOLD_TOPIC_TPS)
    got = surges(spark, series, empty)
    assert [(r["resource"], r["window_start"]) for r in got.collect()] == [("orders", win(6)[0])]


def brokers(spark, rows):
    """(broker, put_tps, busy_failures, by_class)"""
    data = [(*win(0), b, p, None, 3, f, busy, by) for b, p, f, busy, by in rows]
    return spark.createDataFrame(data, schemas.GOLD_BROKER_TPS)


def test_broker_busy_fires_on_busy_failures_only(spark):
    b = brokers(spark, [
        ("broker-a", 3750.0, 240, 200, {"TIMEOUT_CLEAN_QUEUE": 200, "CLIENT_TIMEOUT": 40}),
        ("broker-b", 500.0, 50, 0, {"CLIENT_TIMEOUT": 50}),
        ("broker-c", 500.0, 9, 9, {"OVERLOAD": 9}),
    ])
    got = b.transform(detect.broker_busy(W, D))
    assert fired(got) == [("broker-a", "BROKER_BUSY", "critical")]
    assert "CLIENT_TIMEOUT: 40, TIMEOUT_CLEAN_QUEUE: 200" in got.first()["detail"]


def test_failure_spike_needs_rate_and_count(spark):
    rows = [(*win(0), "orders", 100.0, 1, 600, 600, {"TIMEOUT_CLEAN_QUEUE": 600}, 600 / 6600, 0, None),
            (*win(0), "pay", 1.0, 1, 10, 0, {"OTHER": 10}, 10 / 70, 0, None),           # rate high, count low
            (*win(0), "big", 10000.0, 1, 100, 0, {"OTHER": 100}, 100 / 600100, 0, None),  # count high, rate low
            # a limited topic's own rejections are its demand at the cap, not a failure spike
            (*win(0), "limited", 40.0, 2, 6000, 0, {"RATE_LIMITED": 6000}, 0.0, 6000, 40.0)]
    t = spark.createDataFrame(rows, schemas.GOLD_TOPIC_TPS)
    assert fired(t.transform(detect.failure_spike(W, D))) == [("orders", "FAILURE_SPIKE", "critical")]


def test_windows_under_a_limit_are_kept_out_of_the_surge_baseline(spark):
    """A topic capped at 200 msg/s for 20 windows: a baseline fed with the cap (200) would make 800 msg/s only
    4x; the windows under the limit are left out, so the baseline stays the pre-limit 100 msg/s."""
    values = [100.0] * 10 + [200.0] * 20 + [700.0]
    limits = [None] * 10 + [200.0] * 20 + [None]
    series = topic_series(spark, "orders", values, limits)
    history, current = series.where(F.col("put_tps") < 700), series.where(F.col("put_tps") >= 700)
    got = surges(spark, current, history)
    assert [(r["resource"], r["baseline_tps"]) for r in got.collect()] == [("orders", 100.0)]
    assert fired(surges(spark, current, history.withColumn("limit_qps", F.lit(None).cast("double")))) == []


def test_surge_baseline_is_the_median_not_the_mean_or_the_max(spark):
    """Histories that tell the three apart: with a few high windows the median stays low (mean and max would hide
    the surge); with a few low windows the median stays high (the mean would fire on a normal window)."""
    spiky = topic_series(spark, "spiky", [100.0] * 6 + [1000.0] * 4 + [500.0])   # median 100, mean 460, max 1000
    dippy = topic_series(spark, "dippy", [10.0] * 4 + [100.0] * 6 + [350.0])     # median 100, mean 64
    series = spiky.unionByName(dippy)
    last = win(10)[0]
    got = surges(spark, series.where(F.col("window_start") == last), series.where(F.col("window_start") < last))
    assert [(r["resource"], r["baseline_tps"]) for r in got.collect()] == [("spiky", 100.0)]


def test_a_broker_baseline_prefers_its_own_broker_put_nums(spark):
    """Article 001: a broker's writes rose 8x while the topics it prints stayed flat (retry re-puts and schedule
    writes are in BROKER_PUT_NUMS only). The broker's surge is measured on its own BROKER_PUT_NUMS; a broker that
    prints none falls back to the sum of its topics."""
    def broker_rows(broker, topic_sum, own):
        return [(*win(i), broker, t, o, 3, 0, 0, None) for i, (t, o) in enumerate(zip(topic_sum, own))]
    rows = broker_rows("broker-a", [100.0] * 11, [100.0] * 10 + [800.0]) \
        + broker_rows("broker-b", [100.0] * 10 + [800.0], [None] * 11)
    all_brokers = spark.createDataFrame(rows, schemas.GOLD_BROKER_TPS)
    last = win(10)[0]
    empty_topics = spark.createDataFrame([], schemas.GOLD_TOPIC_TPS)
    empty_groups = spark.createDataFrame([], schemas.GOLD_GROUP_TPS)
    got = detect.detect_anomalies(empty_topics, empty_groups, all_brokers.where(F.col("window_start") == last),
                                  empty_topics, all_brokers.where(F.col("window_start") < last), W, D)
    surged = sorted((r["resource"], r["observed_tps"], r["baseline_tps"])
                    for r in got.where(F.col("anomaly") == "TRAFFIC_SURGE").collect())
    assert surged == [("broker-a", 800.0, 100.0), ("broker-b", 800.0, 100.0)]
