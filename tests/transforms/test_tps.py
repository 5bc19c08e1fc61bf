"""Windowed TPS: window sums across brokers, retry ratio, broker TPS, failures per class."""

from __future__ import annotations

from chispa import assert_df_equality

from pipelines import schemas
from pipelines.dataplane.transforms import tps
from pipelines.config import WindowsConfig
from tests.helpers import ts

W = WindowsConfig()
T0, T1 = ts("2022-02-08 07:39:00"), ts("2022-02-08 07:40:00")


def metrics(spark, rows):
    """(broker, topic, group, metric, amount) in window [T0, T1)."""
    return spark.createDataFrame([(T0, T1, *r) for r in rows], schemas.WINDOW_METRIC)


def test_stats_events_cover_the_minute_before_the_line(spark):
    silver = spark.createDataFrame(
        [(T1, "broker-a", None, "TOPIC_PUT_NUMS", "minute", "orders", "orders", None, None, 600, 10.0, 1.0, None, "f", T1),
         (T1, "broker-a", None, "TOPIC_PUT_NUMS", "hour", "orders", "orders", None, None, 36000, 10.0, 1.0, None, "f", T1),
         (T1, "broker-a", None, "TOPIC_PUT_SIZE", "minute", "orders", "orders", None, None, 6000, 100.0, 10.0, None, "f", T1)],
        schemas.SILVER_BROKER_STATS)
    got = silver.transform(tps.stats_metric_events)
    want = spark.createDataFrame([(T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600)], schemas.METRIC_EVENT)
    assert_df_equality(got, want, ignore_nullable=True)


def test_window_metrics_sums_events_per_window(spark):
    events = spark.createDataFrame(
        [(ts("2022-02-08 07:39:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
         (ts("2022-02-08 07:39:30"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 60),
         (ts("2022-02-08 07:40:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 1)],
        schemas.METRIC_EVENT)
    got = events.transform(tps.window_metrics(W))
    want = spark.createDataFrame(
        [(T0, T1, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 660),
         (T1, ts("2022-02-08 07:41:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 1)], schemas.WINDOW_METRIC)
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_window_metrics_count_a_stats_line_shipped_twice_once_and_every_failure(spark):
    line = (ts("2022-02-08 07:39:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600)
    failure = (ts("2022-02-08 07:39:10"), "broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 1)
    events = spark.createDataFrame(
        [line, line, (ts("2022-02-08 07:39:00"), "broker-b", "orders", None, "TOPIC_PUT_NUMS", 600), failure, failure],
        schemas.METRIC_EVENT)
    got = events.transform(tps.window_metrics(W))
    want = spark.createDataFrame(
        [(T0, T1, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
         (T0, T1, "broker-b", "orders", None, "TOPIC_PUT_NUMS", 600),
         (T0, T1, "broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 2)], schemas.WINDOW_METRIC)
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_topic_tps_sums_over_brokers_with_failures(spark):
    m = metrics(spark, [
        ("broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
        ("broker-b", "orders", None, "TOPIC_PUT_NUMS", 1200),
        ("broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 150),
        ("broker-a", "orders", None, "failure:CLIENT_TIMEOUT", 50),
        ("broker-a", "pay", None, "failure:OTHER", 3),
        ("broker-b", "limited", None, "TOPIC_PUT_NUMS", 2400),
        ("broker-b", "limited", None, "failure:RATE_LIMITED", 900),
        ("broker-b", "limited", None, "failure:OTHER", 10),
    ])
    got = m.transform(tps.topic_tps(W)).orderBy("topic")
    want = spark.createDataFrame(
        [(T0, T1, "limited", 40.0, 1, 910, 0, {"OTHER": 10, "RATE_LIMITED": 900}, 10 / 2410, 900, None),
         (T0, T1, "orders", 30.0, 2, 200, 150, {"TIMEOUT_CLEAN_QUEUE": 150, "CLIENT_TIMEOUT": 50}, 0.1, 0, None),
         (T0, T1, "pay", 0.0, 0, 3, 0, {"OTHER": 3}, 1.0, 0, None)], schemas.GOLD_TOPIC_TPS)
    assert_df_equality(got, want, ignore_nullable=True)


def test_failures_by_class_entries_are_in_class_order_whatever_the_row_order(spark):
    rows = [("broker-a", "orders", None, f"failure:{c}", n) for c, n in (("TIMEOUT_CLEAN_QUEUE", 5), ("CLIENT_TIMEOUT", 1),
                                                                        ("OTHER", 2))]
    for ordered in (rows, rows[::-1]):
        got = metrics(spark, ordered).repartition(3).transform(tps.topic_tps(W)).first()["failures_by_class"]
        assert list(got) == ["CLIENT_TIMEOUT", "OTHER", "TIMEOUT_CLEAN_QUEUE"]


def test_group_tps_consume_retry_and_ratio(spark):
    m = metrics(spark, [
        ("broker-a", "pugc", "g", "GROUP_GET_NUMS", 47400),
        ("broker-b", "pugc", "g", "GROUP_GET_NUMS", 600),
        ("broker-a", "pugc", "g", "SNDBCK_PUT_NUMS", 47119),
        ("broker-a", "other", "g2", "SNDBCK_PUT_NUMS", 60),
        ("broker-a", "pugc", None, "TOPIC_PUT_NUMS", 60),
    ])
    got = m.transform(tps.group_tps(W))
    want = spark.createDataFrame(
        [(T0, T1, "g", "pugc", 800.0, 47119 / 60, 47119 / 48000), (T0, T1, "g2", "other", 0.0, 1.0, None)],
        schemas.GOLD_GROUP_TPS)
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True, allow_nan_equality=True)


def test_broker_tps_puts_topics_and_busy_failures(spark):
    m = metrics(spark, [
        ("broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
        ("broker-a", "%RETRY%g", None, "TOPIC_PUT_NUMS", 47119),
        ("broker-a", None, None, "BROKER_PUT_NUMS", 47700),
        ("broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 40),
        ("broker-b", "pay", None, "TOPIC_PUT_NUMS", 60),
    ])
    got = m.transform(tps.broker_tps(W)).orderBy("broker")
    want = spark.createDataFrame(
        [(T0, T1, "broker-a", 47719 / 60, 47700 / 60, 2, 40, 40, {"TIMEOUT_CLEAN_QUEUE": 40}),
         (T0, T1, "broker-b", 1.0, None, 1, 0, 0, None)], schemas.GOLD_BROKER_TPS)
    assert_df_equality(got, want, ignore_nullable=True)


def _shuffles(df) -> int:
    """Hash-partitioning exchanges in ``df``'s executed plan (the shuffles an aggregation or join adds)."""
    df.collect()  # adaptive execution settles the final plan on execution
    return df._jdf.queryExecution().executedPlan().toString().count("Exchange hashpartitioning")


def _rows(df) -> list:
    """Rows in key order (chispa cannot order rows by a map column)."""
    return sorted(df.collect(), key=lambda row: str(row[:4]))


def test_gold_windows_in_one_partition_need_fewer_shuffles_and_give_the_same_rows(spark, tmp_path):
    """spark.gold_single_partition (pipelines.job.flows.gold.partitioning): over one partition the gold tables' aggregations
    need no shuffle (a full join of two aggregates still shuffles both sides), and the rows are the same."""
    from pipelines.job.flows import gold
    from pipelines.config import GovernorConfig, SparkConfig

    m = metrics(spark, [
        ("broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
        ("broker-b", "orders", None, "TOPIC_PUT_NUMS", 1200),
        ("broker-a", "orders", "g", "GROUP_GET_NUMS", 600),
        ("broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 60),
        ("broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 150),
    ]).repartition(3)
    shuffles = {}
    for single in (True, False):
        cfg = GovernorConfig(spark=SparkConfig(gold_single_partition=single)).with_paths(str(tmp_path), str(tmp_path))
        gold_side = m.transform(gold.partitioning(cfg.spark.gold_single_partition))
        for name, gold_table in (("topic", tps.topic_tps(W)), ("group", tps.group_tps(W)),
                                 ("broker", tps.broker_tps(W))):
            got = gold_side.transform(gold_table)
            shuffles[name, single] = _shuffles(got)
            assert _rows(got) == _rows(m.transform(gold_table))
    assert shuffles["group", True] == 0
    for name in ("topic", "group", "broker"):
        assert shuffles[name, True] < shuffles[name, False], name


def test_retry_traffic_is_the_larger_of_send_backs_and_fallback_sends_into_the_same_bucket(spark):
    """Per broker, the limiter keyed %RETRY%g counts send-backs (SNDBCK_PUT_NUMS) and the plain sends a consumer
    falls back to (TOPIC_PUT_NUMS of %RETRY%g, which also carry the re-puts of admitted send-backs): the larger of
    the two. A topic's traffic is its puts; RATE_LIMITED failures are its limiter's rejections; a topic's carriers
    are the brokers with a put line."""
    t0, t1 = ts("2022-02-08 07:39:00"), ts("2022-02-08 07:40:00")
    m = spark.createDataFrame([(t0, t1, *r) for r in [
        ("broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 1200),   # 20 msg/s sent back ...
        ("broker-a", "%RETRY%g", None, "TOPIC_PUT_NUMS", 2400),   # ... 40 msg/s into the retry topic
        ("broker-b", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 1800),
        ("broker-b", "%RETRY%g", None, "failure:RATE_LIMITED", 7),
        ("broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
        ("broker-a", "orders", None, "failure:RATE_LIMITED", 3),
        ("broker-c", "orders", None, "failure:RATE_LIMITED", 2),         # rejected there, no put line: no carrier
        ("broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 5),  # the broker's fault, not the limiter's
    ]], schemas.WINDOW_METRIC)
    got = tps.per_broker_traffic(m, W).where("resource in ('g', 'orders')")
    want = spark.createDataFrame([
        (t0, t1, "group", "g", "broker-a", 40.0, 0, False), (t0, t1, "group", "g", "broker-b", 30.0, 7, False),
        (t0, t1, "topic", "orders", "broker-a", 10.0, 3, True), (t0, t1, "topic", "orders", "broker-c", 0.0, 2, False),
    ], schemas.WINDOW_TRAFFIC)
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_spark_reduces_the_traffic_to_the_resources_a_decision_can_need(spark):
    """Kept: resources at their rule's floor, rejecting, or under a limit; the rest stays on the executors. The
    markers name every window of the batch and those with any traffic."""
    from pipelines.config import DetectionConfig

    t0, t1 = ts("2022-02-08 07:39:00"), ts("2022-02-08 07:40:00")
    m = spark.createDataFrame([(t0, t1, *r) for r in [
        ("broker-a", "big", None, "TOPIC_PUT_NUMS", 60 * 60),        # 60 msg/s >= surge_floor_tps (50)
        ("broker-a", "small", None, "TOPIC_PUT_NUMS", 60 * 10),      # 10 msg/s: dropped
        ("broker-a", "limited", None, "TOPIC_PUT_NUMS", 60 * 5),     # under a limit: kept
        ("broker-a", "refused", None, "failure:RATE_LIMITED", 1),    # rejecting: kept
        ("broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 60 * 49),   # 49 msg/s < retry_floor_tps (50): dropped
    ]], schemas.WINDOW_METRIC)
    got = m.transform(tps.resource_traffic(W, DetectionConfig(), ("topic\x1flimited",))).collect()
    assert sorted((r["resource_type"], r["resource"]) for r in got) == [
        ("*", "metrics"), ("*", "traffic"), ("topic", "big"), ("topic", "limited"), ("topic", "refused")]
