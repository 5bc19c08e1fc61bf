"""Demand evidence of limitable resources (pipelines/transforms/demand.py): what each broker admitted of a
resource's limited traffic, its limiter's rejections, the carriers' health, and the observation grid."""

from __future__ import annotations

from chispa import assert_df_equality

from pipelines import schemas
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.transforms import demand
from tests.helpers import ts

W, D = WindowsConfig(), DetectionConfig()
T0, T1, T2 = ts("2022-02-08 07:39:00"), ts("2022-02-08 07:40:00"), ts("2022-02-08 07:41:00")
TRAFFIC = "window_start timestamp, window_end timestamp, resource_type string, resource string, broker string, " \
          "tps double, rejected long"


def metrics(spark, rows):
    """(broker, topic, group, metric, amount) in window [T0, T1)."""
    return spark.createDataFrame([(T0, T1, *r) for r in rows], schemas.WINDOW_METRIC)


def test_retry_traffic_is_the_larger_of_send_backs_and_fallback_sends_into_the_same_bucket(spark):
    """Per broker, the limiter keyed %RETRY%g counts send-backs (SNDBCK_PUT_NUMS) and the plain sends a consumer
    falls back to (TOPIC_PUT_NUMS of %RETRY%g, which also carry the re-puts of admitted send-backs): the larger of
    the two. A topic's traffic is its puts; RATE_LIMITED failures are its limiter's rejections."""
    m = metrics(spark, [
        ("broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 1200),   # 20 msg/s sent back ...
        ("broker-a", "%RETRY%g", None, "TOPIC_PUT_NUMS", 2400),   # ... 40 msg/s into the retry topic
        ("broker-b", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 1800),
        ("broker-b", "%RETRY%g", None, "failure:RATE_LIMITED", 7),
        ("broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
        ("broker-a", "orders", None, "failure:RATE_LIMITED", 3),
        ("broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 5),  # the broker's fault, not the limiter's
    ])
    got = demand.resource_traffic(m, W).where("resource in ('g', 'orders')")
    want = spark.createDataFrame([
        (T0, T1, "group", "g", "broker-a", 40.0, 0), (T0, T1, "group", "g", "broker-b", 30.0, 7),
        (T0, T1, "topic", "orders", "broker-a", 10.0, 3),
    ], TRAFFIC)
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_demand_sums_brokers_keeps_the_per_broker_traffic_and_judges_the_carriers_health(spark):
    traffic = spark.createDataFrame([
        (T0, T1, "topic", "orders", "broker-a", 30.0, 2), (T0, T1, "topic", "orders", "broker-b", 10.0, 0),
        (T0, T1, "topic", "quiet", "broker-b", 5.0, 0),
        (T0, T1, "topic", "orders", "broker-c", 0.0, 1),  # a limiter's rejection seen on a broker without puts
    ], TRAFFIC)
    brokers = spark.createDataFrame([(T0, T1, "broker-a", 40.0, None, 2, 30, 30, {"TIMEOUT_CLEAN_QUEUE": 30}),
                                     (T0, T1, "broker-b", 15.0, None, 2, 0, 0, None)], schemas.GOLD_BROKER_TPS)
    got = {r["resource"]: r for r in demand.demand(traffic, brokers, D).collect()}
    assert (got["orders"]["observed_tps"], got["orders"]["rejected"]) == (40.0, 3)
    assert got["orders"]["broker_tps"] == {"broker-a": 30.0, "broker-b": 10.0}
    assert got["orders"]["healthy"] is False and got["quiet"]["healthy"] is True   # broker-a is busy (30 >= 10)
    # each carrier's writes (a surge probe's bound) and the busy carriers; no consume rate without group windows
    assert got["orders"]["carrier_load"] == {"broker-a": 40.0, "broker-b": 15.0}
    assert got["orders"]["busy_brokers"] == ["broker-a"] and got["quiet"]["busy_brokers"] == []
    assert got["orders"]["consume_tps"] is None


def test_demand_of_a_group_carries_its_consume_rate_on_non_retry_topics(spark):
    """Under a retry limit the rule judges the visible retry traffic against the group's consume rate of the same
    window (tests/transforms/test_fold.py): its GROUP_GET_NUMS on non-retry topics, summed over topics and brokers."""
    traffic = spark.createDataFrame([(T0, T1, "group", "g", "broker-a", 24.0, 0)], TRAFFIC)
    brokers = spark.createDataFrame([(T0, T1, "broker-a", 500.0, 900.0, 2, 0, 0, None)], schemas.GOLD_BROKER_TPS)
    groups = spark.createDataFrame([(T0, T1, "g", "orders", 300.0, 20.0, 0.07), (T0, T1, "g", "payments", 100.0, 4.0, 0.04),
                                    (T0, T1, "g", "%RETRY%g", 50.0, 0.0, 0.0)], schemas.GOLD_GROUP_TPS)
    got = demand.demand(traffic, brokers, D, groups).collect()
    assert [(r["consume_tps"], r["carrier_load"]) for r in got] == [(400.0, {"broker-a": 900.0})]


def test_observations_cover_every_window_of_the_batch_for_every_resource_to_observe(spark):
    rows = spark.createDataFrame([
        (T0, T1, "group", "g", 40.0, 0, {"broker-a": 40.0}, True, {"broker-a": 800.0}, [], 400.0),
        (T1, T2, "topic", "other", 5.0, 0, {"broker-a": 5.0}, True, {"broker-a": 900.0}, [], None),
    ], "window_start timestamp, window_end timestamp, resource_type string, resource string, observed_tps double, "
       "rejected long, broker_tps map<string,double>, healthy boolean, carrier_load map<string,double>, "
       "busy_brokers array<string>, consume_tps double")
    limited = spark.createDataFrame([("group", "g")], "resource_type string, resource string")
    got = demand.observations(rows, limited)
    assert got.columns == list(demand.OBSERVATION_COLUMNS)
    assert sorted(tuple(r) for r in got.collect()) == [  # maps cannot be sorted by chispa: compared as rows
        (T1, "group", "g", 40.0, 0, True, 400.0, {"broker-a": 800.0}, []),
        (T2, "group", "g", 0.0, 0, True, None, None, None)]


def test_limiter_views_are_rejection_evidence_of_the_window_they_fall_in(spark):
    """The RocketMQ admin sink's views report when each limiter last rejected a send: one row per window ×
    resource × broker; %RETRY%<group> is the group's retry traffic."""
    seen = ts("2022-02-08 07:42:00")
    rejections = spark.createDataFrame([
        (seen, "rocketmq", "broker-a", "%RETRY%g", ts("2022-02-08 07:39:20"), 3),
        (seen, "rocketmq", "broker-a", "%RETRY%g", ts("2022-02-08 07:39:50"), 4),   # same window and broker: once
        (seen, "rocketmq", "broker-b", "orders", ts("2022-02-08 07:40:10"), 4),
    ], schemas.LIMITER_REJECTIONS)
    got = demand.limiter_traffic(rejections, W)
    want = spark.createDataFrame([(T0, T1, "group", "g", "broker-a", 0.0, 1),
                                  (T1, T2, "topic", "orders", "broker-b", 0.0, 1)], TRAFFIC)
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)
