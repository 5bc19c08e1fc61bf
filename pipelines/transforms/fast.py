"""The fast path: evidence from *open* windows, before the watermark finalizes them.

RocketMQ prints a broker's minute lines at the end of the minute they cover, all keys at once
(docs/rocketmq-formats.md §2), so a broker's SUM for a window is final when its line lands; lines of other brokers
only add to the window's sums, and send failures count as they land. A rule whose evidence only grows with more
input (a floor on a sum or a count) therefore cannot be undone by the lines still to come: it may act on partial
windows. A rule whose evidence is a ratio may act early only where the partial numbers already prove it.

* :func:`resource_events` + :func:`open_window_sums`: one streaming aggregation per window × resource (topic,
  consumer group, broker, and one ``cluster`` row whose ``brokers`` list is the census of brokers that reported).
  In Spark's ``update`` output mode each micro-batch emits the windows its input touched, with their running sums
  from Spark's state store (the state is dropped once the watermark passes the window).
* :func:`preliminary_anomalies`: the rules of :mod:`pipelines.transforms.detect` over those running sums:

  - ``BROKER_BUSY`` (a count floor) and ``TRAFFIC_SURGE`` (a floor and a factor of a baseline taken from finalized
    windows only) act on any partial window: more lines can only raise the sums;
  - ``RUNAWAY_RETRY`` (retry ÷ consume) and ``FAILURE_SPIKE`` (failures ÷ attempts) act early only when the window
    is *complete by census*: every broker that reported in the newest finalized window has reported in this one, so
    the consume and put sums are final and later input can only add retries or failures (which strengthen the
    rule). Otherwise they wait for the final window.

A preliminary decision that the final window does not confirm is reversed by the final path
(:func:`pipelines.transforms.reconcile.reconcile_preliminary`).
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.schemas import RESOURCE_KEYS
from pipelines.transforms import detect
from pipelines.transforms.tps import FAILURE_METRIC_PREFIX
from pipelines.transforms.types import WINDOW_KEYS, Transform

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
        _target("group", F.col("consumer_group"), RETRY, (metric == rmq.SNDBCK_PUT_NUMS) & F.col("consumer_group").isNotNull()),
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

    As in :func:`pipelines.transforms.tps.window_metrics`, a stats line shipped twice counts once (stats amounts are
    a set of (role, broker, topic, minute, SUM)); failures count as they come.
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


def census(open_windows: DataFrame, expected_brokers: list[str]) -> DataFrame:
    """Census rows → ``window_start``, ``reported`` (int), ``expected`` (int), ``complete`` (boolean): whether every
    broker of ``expected_brokers`` (those of the newest finalized window) has reported in the window. With no
    expected broker (a new lake) no window is complete."""
    expected = F.array(*[F.lit(b) for b in sorted(expected_brokers)]) if expected_brokers else F.array().cast("array<string>")
    rows = open_windows.where(F.col("resource_type") == CLUSTER)
    return rows.select(
        "window_start",
        F.size("brokers").alias("reported"),
        F.lit(len(expected_brokers)).alias("expected"),
        ((F.lit(len(expected_brokers)) > 0) & (F.size(F.array_except(expected, F.col("brokers"))) == 0)).alias("complete"),
    )


def with_rows_of_completed_windows(current: DataFrame, remembered: DataFrame, expected_brokers: list[str]) -> DataFrame:
    """This micro-batch's open-window rows (:func:`open_window_sums`) → the same, plus the ``remembered`` rows of
    earlier micro-batches (same columns) of each window whose census is complete in ``current``, where ``current``
    has no newer row of the same window × resource.

    In ``update`` mode Spark emits only the rows the micro-batch's input touched. When the last expected broker's
    lines complete a window (:func:`census`) but carry nothing of a resource (a consumer group served by another
    broker), that resource's row is not emitted, and a ratio rule could not act on the complete window: whether
    the fast path acted would depend on how the brokers' files fell into micro-batches. With the remembered rows, a
    window completed in this micro-batch is judged on all its resources, as if its files had come at once."""
    keys = ["window_start", *RESOURCE_KEYS]
    completed = census(current, expected_brokers).where("complete").select("window_start")
    older = remembered.join(current.select(*keys), keys, "left_anti").join(completed, "window_start", "left_semi")
    return current.unionByName(older.select(*current.columns))


def _per_second(amount: Column, cfg: WindowsConfig) -> Column:
    return amount.cast("double") / F.lit(float(cfg.length_seconds))


def _failures_by_class(busy: Column, failures: Column) -> Column:
    """The fast path counts failures as busy / other (the final window has them by class)."""
    return F.map_from_arrays(F.array(F.lit("busy"), F.lit("other")), F.array(busy, failures - busy))


def _with_census_note(anomalies: DataFrame, counts: DataFrame) -> DataFrame:
    note = F.format_string(" [preliminary: open window, %d of %d expected brokers reported]",
                           F.col("reported"), F.col("expected"))
    joined = anomalies.join(counts.select("window_start", "reported", "expected"), "window_start", "left")
    return joined.select(
        *[F.concat(F.col(c), F.coalesce(note, F.lit(" [preliminary: open window]"))).alias(c) if c == "detail"
          else F.col(c) for c in anomalies.columns]
    )


def preliminary_anomalies(
    open_windows: DataFrame,
    topic_history: DataFrame,
    broker_history: DataFrame,
    expected_brokers: list[str],
    windows: WindowsConfig,
    cfg: DetectionConfig,
    first_open: dt.datetime | None = None,
) -> DataFrame:
    """Running sums of open windows (:func:`open_window_sums`) → ``gold/anomalies``-shaped rows that the partial
    evidence already proves (rules and reasons above), ``detail`` ending with the census of the window.

    Args:
        topic_history, broker_history: finalized ``gold/topic_tps`` / ``gold/broker_tps`` rows before the open
            windows (the baselines of TRAFFIC_SURGE).
        expected_brokers: brokers of the newest finalized window (:func:`census`).
        first_open: the earliest ``window_start`` of ``open_windows`` when the caller knows it (else one Spark job).
    """
    counts = census(open_windows, expected_brokers)
    complete = counts.where("complete").select("window_start")
    of = lambda kind: open_windows.where(F.col("resource_type") == kind)  # noqa: E731
    per_s = lambda c: _per_second(F.col(c), windows)  # noqa: E731

    topics = of("topic").select(
        *WINDOW_KEYS, F.col("resource").alias("topic"), per_s("puts").alias("put_tps"), "failures", "busy_failures",
        F.lit(0).cast("long").alias("rate_limited"),  # the open-window failures leave the limiter's out already
        _failures_by_class(F.col("busy_failures"), F.col("failures")).alias("failures_by_class"),
        F.when(F.col("puts") + F.col("failures") > 0,
               F.col("failures") / (F.col("puts") + F.col("failures"))).otherwise(0.0).alias("failure_rate"),
    )
    brokers = of("broker").select(
        *WINDOW_KEYS, F.col("resource").alias("broker"), per_s("puts").alias("put_tps"),
        per_s("broker_puts").alias("broker_put_tps"), "failures", "busy_failures",
        _failures_by_class(F.col("busy_failures"), F.col("failures")).alias("failures_by_class"),
    )
    groups = of("group").select(
        *WINDOW_KEYS, F.col("resource").alias("consumer_group"), per_s("retried").alias("retry_tps"),
        per_s("consumed").alias("consume_tps"),
        F.when(F.col("consumed") > 0, F.col("retried") / F.col("consumed")).alias("retry_ratio"),
    )
    if first_open is None:
        first_open = open_windows.agg(F.min("window_start")).first()[0]
    surge_topics = (
        detect.unlimited_history(topic_history).select("window_start", "topic", "put_tps")
        .unionByName(topics.select("window_start", "topic", "put_tps"))
        .transform(detect.with_baseline("topic", "put_tps", windows, cfg))
        .transform(detect.current_only(first_open))
    )
    surge_brokers = (
        broker_history.select("window_start", "broker", detect.broker_writes())
        .unionByName(brokers.select("window_start", "broker", detect.broker_writes()))
        .transform(detect.with_baseline("broker", "put_tps", windows, cfg))
        .transform(detect.current_only(first_open))
    )
    window_ends = open_windows.select(*WINDOW_KEYS).distinct()
    parts = [
        # MONOTONE rules (pipelines/transforms/anomalies.py): a count floor, or a floor and a factor of a baseline
        brokers.transform(detect.broker_busy(windows, cfg)),
        surge_topics.join(window_ends, "window_start").transform(detect.traffic_surge("topic", "topic", cfg)),
        surge_brokers.join(window_ends, "window_start").transform(detect.traffic_surge("broker", "broker", cfg)),
        # RATIO rules: only where the census proves the denominator final
        groups.join(complete, "window_start", "left_semi").transform(detect.runaway_retry(cfg)),
        topics.join(complete, "window_start", "left_semi").transform(detect.failure_spike(windows, cfg)),
    ]
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result.transform(lambda df: _with_census_note(df, counts))


def topic_carriers(open_windows: DataFrame) -> DataFrame:
    """Which brokers carry which topic in an open window: ``window_start``, ``window_end``, ``topic``, ``broker``
    (the shape of :func:`pipelines.transforms.tps.topic_brokers`)."""
    topics = open_windows.where(F.col("resource_type") == "topic")
    return topics.select(*WINDOW_KEYS, F.col("resource").alias("topic"), F.explode("carriers").alias("broker"))


def cut_bounded_by_final_rates(candidates: DataFrame, open_windows: DataFrame, expected_brokers: list[str],
                               cfg: WindowsConfig) -> DataFrame:
    """Limit candidates of open windows → those the fast path may act on: a non-critical candidate's first cut is
    bounded by ``max_cut_pct`` of the observed rate (:func:`pipelines.transforms.fold.fold_resource`), and a partial
    window's rate is below the true one, so a non-critical candidate waits until its window is complete by census
    (its observed rate final); critical ones act at once."""
    complete = census(open_windows, expected_brokers).where("complete").select(
        (F.col("window_start") + F.make_dt_interval(secs=F.lit(cfg.length_seconds))).alias("window_end"))
    settled = candidates.where(~F.col("critical")).join(complete, "window_end", "left_semi")
    return candidates.where(F.col("critical")).unionByName(settled)


def open_broker_tps(open_windows: DataFrame, cfg: WindowsConfig) -> DataFrame:
    """Open windows → ``window_end``, ``resource_type``, ``resource``, ``broker_tps`` (map broker → msg/s of the
    resource's limited traffic so far: the shares of a preliminary limit, the shape of
    :func:`pipelines.transforms.demand.demand`'s column)."""
    rows = open_windows.where(F.col("resource_type").isin("topic", "group"))
    per_s = F.transform_values("broker_amounts", lambda _, v: v.cast("double") / F.lit(float(cfg.length_seconds)))
    return rows.select("window_end", "resource_type", "resource", per_s.alias("broker_tps"))


def newest_final_window(broker_history: DataFrame) -> tuple[dt.datetime | None, list[str]]:
    """``gold/broker_tps`` rows → (start of the newest finalized window, the brokers in it)."""
    rows = broker_history.groupBy("window_start").agg(F.collect_set("broker").alias("brokers")) \
        .orderBy(F.col("window_start").desc()).limit(1).collect()
    return (rows[0]["window_start"], sorted(rows[0]["brokers"])) if rows else (None, [])
