"""Demand evidence of limitable resources: what each broker admitted of a resource's limited traffic, what its
limiter rejected, and whether the brokers carrying it were healthy, per finalized window.

A limit changes the traffic the governor reads next (closed loop): under a limit the stats show the cap, not the
demand. The policy fold (:mod:`pipelines.transforms.fold`) judges a limited resource on this evidence instead of on
its rule alone. Per rule (the resource a rule limits and the traffic its limiter counts):

* ``RUNAWAY_RETRY`` limits a consumer group's retry traffic: one limiter per broker keyed ``%RETRY%<group>``
  (sohutv/rocketmq 5.3.1-sohu-01 ``RateLimitHandler``) counts the group's send-backs (``CONSUMER_SEND_MSG_BACK``,
  ``SNDBCK_PUT_NUMS``) *and* the plain sends to ``%RETRY%<group>`` a consumer falls back to when a send-back is
  rejected (``TOPIC_PUT_NUMS`` of the retry topic). A broker's retry traffic is the larger of the two (the retry
  topic's puts also carry the re-puts of admitted send-backs); rejections are ``RATE_LIMITED`` failures whose topic
  is ``%RETRY%<group>``.
* ``TRAFFIC_SURGE`` limits a topic's puts: its ``TOPIC_PUT_NUMS`` per broker; rejections are ``RATE_LIMITED``
  failures of the topic.

Where the RocketMQ admin sink is on, the views it reads at every publish carry each limiter's last rejection
(:func:`limiter_traffic`): a limiter that rejected in a window is evidence too.

Units: ``tps`` and ``observed_tps`` are messages per second (per broker, or summed over brokers: cluster-wide);
``rejected`` counts failed send attempts in the window (a producer that retries a rejected send on another broker,
RocketMQ 5.3.0+, leaves one failure line per attempt, each on the broker it went to).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.transforms.detect import broker_writes, group_retry
from pipelines.transforms.tps import FAILURE_METRIC_PREFIX
from pipelines.transforms.types import WINDOW_KEYS

RATE_LIMITED_METRIC = FAILURE_METRIC_PREFIX + rmq.RATE_LIMITED
#: Columns of :func:`resource_traffic` and :func:`demand`.
TRAFFIC_COLUMNS = (*WINDOW_KEYS, "resource_type", "resource", "broker", "tps", "rejected")
DEMAND_COLUMNS = (*WINDOW_KEYS, "resource_type", "resource", "observed_tps", "rejected", "broker_tps", "healthy",
                  "carrier_load", "busy_brokers", "consume_tps")
#: Columns of :func:`observations` (the fold's :class:`pipelines.transforms.fold.Observation`).
OBSERVATION_COLUMNS = ("window_end", "resource_type", "resource", "observed_tps", "rejected", "healthy", "consume_tps",
                       "carrier_load", "busy_brokers")


def _group_of_retry_topic(topic: Column) -> Column:
    return F.substring(topic, len(rmq.RETRY_TOPIC_PREFIX) + 1, 1 << 16)


def resource_traffic(metrics: DataFrame, windows: WindowsConfig) -> DataFrame:
    """WINDOW_METRIC rows (:data:`~pipelines.schemas.WINDOW_METRIC`) → one row per window × resource × broker
    (:data:`TRAFFIC_COLUMNS`): ``tps`` the limited traffic the broker admitted (msg/s, module docstring) and
    ``rejected`` its limiter's rejections of the resource (failed sends in the window)."""
    per_s = lambda c: F.col(c).cast("double") / F.lit(float(windows.length_seconds))  # noqa: E731
    on_broker = metrics.where(F.col("broker").isNotNull())
    metric, topic = F.col("metric"), F.col("topic")
    is_retry_topic = topic.startswith(rmq.RETRY_TOPIC_PREFIX)
    rejected = F.when(metric == RATE_LIMITED_METRIC, F.col("amount")).otherwise(F.lit(0))
    topics = on_broker.where(((metric == rmq.TOPIC_PUT_NUMS) | (metric == RATE_LIMITED_METRIC)) & topic.isNotNull())
    topic_rows = topics.groupBy(*WINDOW_KEYS, topic.alias("resource"), "broker").agg(
        F.sum(F.when(metric == rmq.TOPIC_PUT_NUMS, F.col("amount")).otherwise(F.lit(0))).alias("puts"),
        F.sum(rejected).alias("rejected"),
    ).select(*WINDOW_KEYS, F.lit("topic").alias("resource_type"), "resource", "broker",
             per_s("puts").alias("tps"), "rejected")
    group = F.when(metric == rmq.SNDBCK_PUT_NUMS, F.col("consumer_group")).when(is_retry_topic,
                                                                                 _group_of_retry_topic(topic))
    retry = on_broker.where(
        (metric == rmq.SNDBCK_PUT_NUMS) | (is_retry_topic & metric.isin(rmq.TOPIC_PUT_NUMS, RATE_LIMITED_METRIC))
    ).where(group.isNotNull())
    group_rows = retry.groupBy(*WINDOW_KEYS, group.alias("resource"), "broker").agg(
        F.sum(F.when(metric == rmq.SNDBCK_PUT_NUMS, F.col("amount")).otherwise(F.lit(0))).alias("sent_back"),
        F.sum(F.when(metric == rmq.TOPIC_PUT_NUMS, F.col("amount")).otherwise(F.lit(0))).alias("retry_puts"),
        F.sum(rejected).alias("rejected"),
    ).select(*WINDOW_KEYS, F.lit("group").alias("resource_type"), "resource", "broker",
             per_s("sent_back").alias("sb"), per_s("retry_puts").alias("rp"), "rejected")
    group_rows = group_rows.select(*WINDOW_KEYS, "resource_type", "resource", "broker",
                                   F.greatest("sb", "rp").alias("tps"), "rejected")
    return topic_rows.unionByName(group_rows).select(
        *WINDOW_KEYS, "resource_type", "resource", "broker", "tps", F.col("rejected").cast("long").alias("rejected")
    )


def limiter_traffic(rejections: DataFrame, windows: WindowsConfig) -> DataFrame:
    """``control/limiter_rejections`` rows (the in-broker limiters' last rejections as the RocketMQ admin sink's views
    report them) → :data:`TRAFFIC_COLUMNS` rows: one per window × resource × broker whose limiter rejected a send in
    the window, ``tps`` 0 and ``rejected`` 1 (the view tells that it rejected, not how much). The limiter key
    ``%RETRY%<group>`` is the group's retry traffic; any other key is a topic. This is the one rejection evidence of a
    retry limit: send-backs a broker refuses never reach the producers' failure logs."""
    window = F.window(F.col("last_rejected_at"), f"{windows.length_seconds} seconds")
    key = F.col("resource")
    is_retry = key.startswith(rmq.RETRY_TOPIC_PREFIX)
    return rejections.select(
        window.start.alias("window_start"), window.end.alias("window_end"),
        F.when(is_retry, F.lit("group")).otherwise(F.lit("topic")).alias("resource_type"),
        F.when(is_retry, _group_of_retry_topic(key)).otherwise(key).alias("resource"),
        "broker",
    ).distinct().select(*WINDOW_KEYS, "resource_type", "resource", "broker", F.lit(0.0).alias("tps"),
                        F.lit(1).cast("long").alias("rejected"))


def demand(traffic: DataFrame, broker_windows: DataFrame, cfg: DetectionConfig,
           group_windows: DataFrame | None = None) -> DataFrame:
    """:func:`resource_traffic` rows + ``gold/broker_tps`` rows of the same windows (+ ``gold/group_tps`` rows for a
    group's consume rate) → one row per window × resource (:data:`DEMAND_COLUMNS`): ``observed_tps`` cluster-wide
    (sum over brokers, msg/s), ``rejected`` (sum), ``broker_tps`` (map broker → msg/s, brokers with traffic only:
    the shares of a new limit), ``healthy`` (no broker carrying the resource had ``busy_failures_floor`` busy
    failures in the window), ``carrier_load`` (map carrier → the broker's writes, msg/s:
    :func:`pipelines.transforms.detect.broker_writes`), ``busy_brokers`` (the busy carriers, sorted) and
    ``consume_tps`` (a group's consume rate on its non-retry topics, msg/s; null for topics and without
    ``group_windows``)."""
    busy = broker_windows.select(
        "window_start", "broker", (F.col("busy_failures") >= cfg.busy_failures_floor).alias("busy"),
        broker_writes().alias("load"),
    )
    joined = traffic.join(busy, ["window_start", "broker"], "left")
    carrying = F.col("tps") > 0
    rows = joined.groupBy(*WINDOW_KEYS, "resource_type", "resource").agg(
        F.sum("tps").alias("observed_tps"),
        F.sum("rejected").alias("rejected"),
        F.map_from_entries(F.array_sort(F.collect_list(F.when(carrying, F.struct("broker", "tps"))))).alias(
            "broker_tps"),
        (~F.coalesce(F.max(F.when(carrying, F.col("busy"))), F.lit(False))).alias("healthy"),
        F.map_from_entries(F.array_sort(F.collect_list(F.when(carrying & F.col("load").isNotNull(),
                                                             F.struct("broker", "load"))))).alias("carrier_load"),
        F.array_sort(F.collect_list(F.when(carrying & F.coalesce(F.col("busy"), F.lit(False)), F.col("broker"))))
        .alias("busy_brokers"),
    )
    if group_windows is None:
        return rows.withColumn("consume_tps", F.lit(None).cast("double"))
    consume = group_windows.transform(group_retry).select(
        "window_start", F.lit("group").alias("resource_type"), F.col("consumer_group").alias("resource"),
        "consume_tps")
    return rows.join(consume, ["window_start", "resource_type", "resource"], "left").select(*DEMAND_COLUMNS)


def observations(demand_rows: DataFrame, limited: DataFrame) -> DataFrame:
    """:func:`demand` rows + the resources to observe (``resource_type``, ``resource``: those with a limit in
    force or a candidate in the micro-batch) → one row per window of the micro-batch × such resource
    (:data:`OBSERVATION_COLUMNS`); a resource without traffic in a window has ``observed_tps`` 0 (its limit is doing
    nothing there), no rejection, healthy carriers and no consume rate."""
    window_ends = demand_rows.select("window_end").distinct()
    grid = window_ends.crossJoin(limited.select("resource_type", "resource").distinct())
    keys = ["window_end", "resource_type", "resource"]
    return grid.join(demand_rows.select(*OBSERVATION_COLUMNS), keys, "left").select(
        *keys,
        F.coalesce(F.col("observed_tps"), F.lit(0.0)).alias("observed_tps"),
        F.coalesce(F.col("rejected"), F.lit(0).cast("long")).alias("rejected"),
        F.coalesce(F.col("healthy"), F.lit(True)).alias("healthy"),
        "consume_tps", "carrier_load", "busy_brokers",
    )


def with_broker_tps(candidates: DataFrame, demand_rows: DataFrame) -> DataFrame:
    """Limit candidates (:data:`pipelines.transforms.policy.CANDIDATE_COLUMNS`) → the same with ``broker_tps``,
    the resource's traffic per broker in the candidate's window (null when none was seen)."""
    keys = ["window_end", "resource_type", "resource"]
    return candidates.join(demand_rows.select(*keys, "broker_tps"), keys, "left")
