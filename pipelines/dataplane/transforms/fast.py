"""The fast path's running sums: evidence from *open* windows, before the watermark finalizes them (Spark's state
store); the driver judges them (:mod:`pipelines.decide.rules.preliminary`).

RocketMQ prints a broker's minute lines at the end of the minute they cover, all keys at once
(docs/rocketmq-formats.md §2), so a broker's SUM for a window is final when its line lands; lines of other brokers
only add to the window's sums, and send failures count as they land. A rule whose evidence only grows with more
input (a floor on a sum or a count) therefore cannot be undone by the lines still to come: it may act on partial
windows. A rule whose evidence is a ratio may act early only where the partial numbers already prove it.

* :func:`resource_events` + :func:`open_window_sums`: one streaming aggregation per window × resource (topic,
  consumer group, broker, and one ``cluster`` row whose ``brokers`` list is the census of brokers that reported).
  In Spark's ``update`` output mode each micro-batch emits the windows its input touched, with their running sums
  from Spark's state store (the state is dropped once the watermark passes the window).
* :mod:`pipelines.decide.rules.preliminary` applies the rules to those running sums on the driver; which rules act on
  a partial window, which wait for a window complete by census, and how a preliminary decision is reversed are
  said there, once.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.config import WindowsConfig
from pipelines.columns import FAILURE_METRIC_PREFIX
from pipelines.dataplane.transforms.types import Transform

#: ``resource_type`` of the census row of a window (``resource`` is :data:`CENSUS`).
CLUSTER = "cluster"
CENSUS = "*"
#: Roles of an event for a resource.
PUT, BROKER_PUT, CONSUME, RETRY, FAILURE, SEEN = "put", "broker_put", "consume", "retry", "failure", "seen"
#: Role of a rejection by the in-broker limiter (``RATE_LIMITED``) for the topic it names: the demand evidence of a
#: limited resource, never a failure.
LIMITED = "limited"


def _target(resource_type: str, resource: Column, role: str, when: Column) -> Column:
    return F.when(when, F.struct(F.lit(resource_type).alias("resource_type"), resource.alias("resource"),
                                 F.lit(role).alias("role")))


def resource_events(events: DataFrame) -> DataFrame:
    """METRIC_EVENT rows → one row per event and resource it counts for: ``event_time``, ``broker``, ``topic``,
    ``resource_type`` (topic, group, broker, cluster), ``resource``, ``role`` (put, broker_put, consume, retry,
    failure, limited, seen), ``busy`` (a busy failure class, docs/rocketmq-formats.md §5) and ``amount``.

    A topic's put lines count for the topic and its broker; a group's GROUP_GET_NUMS on non-retry topics is its
    consume, its SNDBCK_PUT_NUMS its retry; a failure counts for its topic and broker, except a rejection by the
    in-broker limiter (``RATE_LIMITED``: the governor's own limit at work, never a failure spike nor a busy broker),
    which counts for its topic as ``limited`` (demand evidence: the final path's lift veto); every stats line marks
    its broker as reported in the window's census.
    """
    metric = F.col("metric")
    is_failure = metric.startswith(FAILURE_METRIC_PREFIX)
    fault = is_failure & (metric != F.lit(FAILURE_METRIC_PREFIX + rmq.RATE_LIMITED))
    is_put = metric == rmq.TOPIC_PUT_NUMS
    consumed = (metric == rmq.GROUP_GET_NUMS) & ~F.col("topic").startswith(rmq.RETRY_TOPIC_PREFIX)
    targets = F.array(
        _target("topic", F.col("topic"), PUT, is_put),
        _target("broker", F.col("broker"), PUT, is_put & F.col("broker").isNotNull()),
        _target("broker", F.col("broker"), BROKER_PUT, metric == rmq.BROKER_PUT_NUMS),
        _target("group", F.col("consumer_group"), CONSUME, consumed & F.col("consumer_group").isNotNull()),
        _target("group", F.col("consumer_group"), RETRY,
                (metric == rmq.SNDBCK_PUT_NUMS) & F.col("consumer_group").isNotNull()),
        _target("topic", F.col("topic"), FAILURE, fault & F.col("topic").isNotNull()),
        _target("broker", F.col("broker"), FAILURE, fault & F.col("broker").isNotNull()),
        _target("topic", F.col("topic"), LIMITED, is_failure & ~fault & F.col("topic").isNotNull()),
        _target(CLUSTER, F.lit(CENSUS), SEEN, ~is_failure & F.col("broker").isNotNull()),
    )
    busy = is_failure & F.substring_index(metric, ":", -1).isin(*rmq.BUSY_FAILURE_CLASSES)
    exploded = events.select(
        "event_time", "broker", "topic", "amount", busy.alias("busy"),
        F.explode(F.filter(targets, lambda t: t.isNotNull())).alias("t"),
    )
    return exploded.select(
        "event_time", "broker", "topic", "t.resource_type", "t.resource", "t.role", "busy", "amount"
    )


def broker_amounts(lines: Column) -> Column:
    """The lines of a window × resource → map broker → messages of the resource's limited traffic: a topic's puts
    (role ``put``) or a group's send-backs (role ``retry``); other roles contribute nothing."""
    counted = F.filter(lines, lambda x: x["role"].isin(PUT, RETRY))
    brokers = F.array_sort(F.array_distinct(F.transform(counted, lambda x: x["broker"])))
    amounts = F.transform(brokers, lambda b: F.aggregate(F.filter(counted, lambda x: x["broker"] == b),
                                                         F.lit(0).cast("long"), lambda t, x: t + x["amount"]))
    return F.map_from_arrays(brokers, amounts)


def _line_sum(lines: Column, role: str) -> Column:
    return F.aggregate(F.filter(lines, lambda x: x["role"] == role), F.lit(0).cast("long"),
                       lambda total, x: total + x["amount"])


def open_window_sums(cfg: WindowsConfig) -> Transform:
    """:func:`resource_events` rows (with a watermark on ``event_time``) → running sums per window × resource:
    ``window_start``, ``window_end``, ``resource_type``, ``resource``, ``puts``, ``broker_puts`` (null when the
    broker printed none), ``consumed``, ``retried``, ``failures``, ``busy_failures``, ``rate_limited`` (longs,
    messages in the window so far; ``rate_limited`` a topic's sends rejected by the in-broker limiter), ``brokers``
    (sorted array of the brokers whose stats lines are in the window; census rows only) and
    ``carriers`` (brokers with a put line; topic rows).

    As in :func:`pipelines.dataplane.transforms.tps.window_metrics`, a stats line shipped twice counts once (stats
    amounts are a set of (role, broker, topic, minute, SUM)); failures count as they come.
    """

    def transform(events: DataFrame) -> DataFrame:
        window = F.window(F.col("event_time"), f"{cfg.length_seconds} seconds")
        is_failure = F.col("role") == FAILURE
        is_limited = F.col("role") == LIMITED
        grouped = events.groupBy(window.alias("window"), "resource_type", "resource").agg(
            F.collect_set(F.when(~is_failure & ~is_limited, F.struct("role", "broker", "topic", "event_time",
                                                                    "amount"))).alias("lines"),
            F.sum(F.when(is_failure, F.col("amount"))).alias("failures"),
            F.sum(F.when(is_failure & F.col("busy"), F.col("amount"))).alias("busy_failures"),
            F.sum(F.when(is_limited, F.col("amount"))).alias("rate_limited"),
        )
        lines = F.col("lines")
        has_broker_put = F.exists(lines, lambda x: x["role"] == BROKER_PUT)
        return grouped.select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "resource_type",
            "resource",
            _line_sum(lines, PUT).alias("puts"),
            F.when(has_broker_put, _line_sum(lines, BROKER_PUT)).alias("broker_puts"),
            _line_sum(lines, CONSUME).alias("consumed"),
            _line_sum(lines, RETRY).alias("retried"),
            F.coalesce(F.col("failures"), F.lit(0).cast("long")).alias("failures"),
            F.coalesce(F.col("busy_failures"), F.lit(0).cast("long")).alias("busy_failures"),
            F.coalesce(F.col("rate_limited"), F.lit(0).cast("long")).alias("rate_limited"),
            broker_amounts(lines).alias("broker_amounts"),
            F.array_sort(F.array_distinct(F.transform(F.filter(lines, lambda x: x["role"] == SEEN),
                                                      lambda x: x["broker"]))).alias("brokers"),
            F.array_sort(F.array_distinct(F.transform(F.filter(lines, lambda x: x["role"] == PUT),
                                                      lambda x: x["broker"]))).alias("carriers"),
        )

    return transform
