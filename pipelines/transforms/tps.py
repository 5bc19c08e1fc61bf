"""Windowed TPS: from silver rows to the gold TPS tables.

The streaming part is one event-time aggregation with a watermark (:func:`window_metrics`) at the finest grain
(window × broker × topic × consumer group × metric); the gold tables are derived from its finalized windows in each
micro-batch (:func:`topic_tps`, :func:`group_tps`, :func:`broker_tps`), so one stateful operator serves all three.

A minute line stamped ``T`` covers the minute before ``T`` (``StatsItem`` snapshots every 10 s, 7 kept, so a
minute line's SUM spans the last ~60 s; docs/rocketmq-formats.md §2), so its event time for windowing is ``T - 60 s``.
TPS in a window = sum of the SUMs in the window / window length in seconds.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.config import WindowsConfig
from pipelines.transforms.types import WINDOW_KEYS, Transform


#: Seconds covered by a ``Stats In One Minute`` line.
MINUTE_LINE_SECONDS = 60
FAILURE_METRIC_PREFIX = "failure:"


def stats_metric_events(silver_stats: DataFrame) -> DataFrame:
    """silver/broker_stats rows → :data:`~pipelines.schemas.METRIC_EVENT` rows for the windowed stats.

    Only minute lines of :data:`pipelines.rocketmq.WINDOWED_STATS` feed the windows (docs/contracts.md §1.1); the
    event time is the start of the minute the line covers.
    """
    minute_lines = silver_stats.where(
        (F.col("period") == "minute") & F.col("stat_name").isin(*rmq.WINDOWED_STATS) & F.col("sum").isNotNull()
    )
    return minute_lines.select(
        (F.col("event_time") - F.make_dt_interval(secs=F.lit(MINUTE_LINE_SECONDS))).alias("event_time"),
        F.col("broker"),
        F.col("topic"),
        F.col("consumer_group"),
        F.col("stat_name").alias("metric"),
        F.col("sum").alias("amount"),
    )


def failure_metric_events(silver_failures: DataFrame) -> DataFrame:
    """silver/send_failures rows → METRIC_EVENT rows: one ``failure:<failure_class>`` event of amount 1 each."""
    return silver_failures.select(
        F.col("event_time"),
        F.col("broker"),
        F.col("topic"),
        F.lit(None).cast("string").alias("consumer_group"),
        F.concat(F.lit(FAILURE_METRIC_PREFIX), F.col("failure_class")).alias("metric"),
        F.lit(1).cast("long").alias("amount"),
    )


def window_metrics(cfg: WindowsConfig) -> Transform:
    """METRIC_EVENT rows → :data:`~pipelines.schemas.WINDOW_METRIC` rows: amounts summed per tumbling window of
    ``cfg.length_seconds`` × broker × topic × consumer group × metric.

    A stats line shipped twice is counted once: within a group a stats line is identified by its minute and SUM
    (broker, stat and key are the group; the windowed stats have one line per key and minute), so the stats
    amounts are kept as a set of ``(event_time, amount)`` and summed when the window is emitted. Failure events
    are counted as they come (each record is one failed send; the sources are replayed exactly once from the
    checkpoint). The set lives in the aggregation's state, one row per group and window, where a separate
    de-duplication operator would keep one state row per event (1.7 million for a 2-million-event backlog).

    On a stream the input must carry a watermark on ``event_time``; in append mode each window is emitted once,
    when the watermark passes its end.
    """

    def transform(events: DataFrame) -> DataFrame:
        window = F.window(F.col("event_time"), f"{cfg.length_seconds} seconds")
        is_failure = F.col("metric").startswith(FAILURE_METRIC_PREFIX)
        grouped = events.groupBy(
            window.alias("window"), F.col("broker"), F.col("topic"), F.col("consumer_group"), F.col("metric")
        )
        collected = grouped.agg(
            F.sum(F.when(is_failure, F.col("amount"))).alias("failures"),
            F.collect_set(F.when(~is_failure, F.struct(F.col("event_time"), F.col("amount")))).alias("lines"),
        )
        line_sum = F.aggregate(F.col("lines"), F.lit(0).cast("long"), lambda total, line: total + line["amount"])
        return collected.select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            F.col("broker"),
            F.col("topic"),
            F.col("consumer_group"),
            F.col("metric"),
            (F.coalesce(F.col("failures"), F.lit(0).cast("long")) + line_sum).alias("amount"),
        )

    return transform


def _per_second(amount: Column, cfg: WindowsConfig) -> Column:
    return amount.cast("double") / F.lit(float(cfg.length_seconds))


def _failure_counts(metrics: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Failures per ``keys`` × window: ``failures``, ``busy_failures``, ``rate_limited`` (rejections by the
    in-broker limiter: the governor's own limits at work, not a fault of the broker or the topic) and
    ``failures_by_class`` (map, entries in class order, so the same counts give the same map whatever order the
    rows came in)."""
    failures = metrics.where(F.col("metric").startswith(FAILURE_METRIC_PREFIX)).select(
        *WINDOW_KEYS, *keys, F.substring_index(F.col("metric"), ":", -1).alias("failure_class"), F.col("amount")
    )
    per_class = failures.groupBy(*WINDOW_KEYS, *keys, "failure_class").agg(F.sum("amount").alias("n"))
    is_busy = F.col("failure_class").isin(*rmq.BUSY_FAILURE_CLASSES)
    return per_class.groupBy(*WINDOW_KEYS, *keys).agg(
        F.sum("n").alias("failures"),
        F.sum(F.when(is_busy, F.col("n")).otherwise(F.lit(0))).alias("busy_failures"),
        F.sum(F.when(F.col("failure_class") == rmq.RATE_LIMITED, F.col("n")).otherwise(F.lit(0))).alias("rate_limited"),
        F.map_from_entries(F.array_sort(F.collect_list(F.struct("failure_class", "n")))).alias("failures_by_class"),
    )


def topic_tps(cfg: WindowsConfig) -> Transform:
    """WINDOW_METRIC rows → ``gold/topic_tps`` (:data:`~pipelines.schemas.GOLD_TOPIC_TPS`).

    ``put_tps`` is TOPIC_PUT_NUMS summed over brokers per second; ``brokers_reporting`` counts brokers with a put
    line for the topic in the window; ``failures`` are the topic's failed send attempts (one per failure line: a
    producer retrying on another broker leaves one per attempt) by class; ``rate_limited`` those rejected by the
    in-broker limiter (``RATE_LIMITED``); ``failure_rate`` = other failures / (other failures + messages put), 0
    when both are 0: a limited topic's own rejections are its demand at the cap, never a failure spike.
    ``limit_qps`` (the cluster-wide limit in force in the window) is filled by the final path
    (:func:`pipelines.transforms.gold.gold_outputs`); null here.
    """

    def transform(metrics: DataFrame) -> DataFrame:
        puts = (
            metrics.where(F.col("metric") == rmq.TOPIC_PUT_NUMS)
            .groupBy(*WINDOW_KEYS, "topic")
            .agg(F.sum("amount").alias("puts"), F.countDistinct("broker").alias("brokers_reporting"))
        )
        failures = _failure_counts(metrics.where(F.col("topic").isNotNull()), ("topic",))
        joined = puts.join(failures, on=[*WINDOW_KEYS, "topic"], how="full")
        puts_n = F.coalesce(F.col("puts"), F.lit(0))
        failures_n = F.coalesce(F.col("failures"), F.lit(0))
        limited_n = F.coalesce(F.col("rate_limited"), F.lit(0))
        faults = failures_n - limited_n
        attempts = puts_n + faults
        return joined.select(
            *WINDOW_KEYS,
            F.col("topic"),
            _per_second(puts_n, cfg).alias("put_tps"),
            F.coalesce(F.col("brokers_reporting"), F.lit(0)).cast("int").alias("brokers_reporting"),
            failures_n.alias("failures"),
            F.coalesce(F.col("busy_failures"), F.lit(0)).alias("busy_failures"),
            F.col("failures_by_class"),
            F.when(attempts > 0, faults.cast("double") / attempts).otherwise(F.lit(0.0)).alias("failure_rate"),
            limited_n.cast("long").alias("rate_limited"),
            F.lit(None).cast("double").alias("limit_qps"),
        )

    return transform


def group_tps(cfg: WindowsConfig) -> Transform:
    """WINDOW_METRIC rows → ``gold/group_tps`` (:data:`~pipelines.schemas.GOLD_GROUP_TPS`), per consumer group ×
    topic × window.

    ``consume_tps`` from GROUP_GET_NUMS, ``retry_tps`` from SNDBCK_PUT_NUMS (messages the group sent back to its
    retry topic ``%RETRY%group``), both summed over brokers; ``retry_ratio`` = retry / consume, null when nothing
    was consumed.
    """

    def transform(metrics: DataFrame) -> DataFrame:
        group_metrics = metrics.where(
            F.col("metric").isin(rmq.GROUP_GET_NUMS, rmq.SNDBCK_PUT_NUMS) & F.col("consumer_group").isNotNull()
        )
        sums = group_metrics.groupBy(*WINDOW_KEYS, "consumer_group", "topic").agg(
            F.sum(F.when(F.col("metric") == rmq.GROUP_GET_NUMS, F.col("amount")).otherwise(F.lit(0))).alias("got"),
            F.sum(F.when(F.col("metric") == rmq.SNDBCK_PUT_NUMS, F.col("amount")).otherwise(F.lit(0))).alias("sent_back"),
        )
        return sums.select(
            *WINDOW_KEYS,
            F.col("consumer_group"),
            F.col("topic"),
            _per_second(F.col("got"), cfg).alias("consume_tps"),
            _per_second(F.col("sent_back"), cfg).alias("retry_tps"),
            F.when(F.col("got") > 0, F.col("sent_back").cast("double") / F.col("got")).alias("retry_ratio"),
        )

    return transform


def broker_tps(cfg: WindowsConfig) -> Transform:
    """WINDOW_METRIC rows → ``gold/broker_tps`` (:data:`~pipelines.schemas.GOLD_BROKER_TPS`), per broker × window.

    ``put_tps`` sums the broker's TOPIC_PUT_NUMS (retry topics included); ``broker_put_tps`` is its own
    BROKER_PUT_NUMS line (null when the broker printed none); ``topics`` counts topics with a put line;
    ``busy_failures`` counts fast-failure / flow-control rejections (docs/rocketmq-formats.md §5) of sends to the broker.
    """

    def transform(metrics: DataFrame) -> DataFrame:
        on_broker = metrics.where(F.col("broker").isNotNull())
        is_put = F.col("metric") == rmq.TOPIC_PUT_NUMS
        is_broker_put = F.col("metric") == rmq.BROKER_PUT_NUMS
        puts = on_broker.where(is_put | is_broker_put).groupBy(*WINDOW_KEYS, "broker").agg(
            F.sum(F.when(is_put, F.col("amount")).otherwise(F.lit(0))).alias("puts"),
            F.sum(F.when(is_broker_put, F.col("amount"))).alias("broker_puts"),
            F.countDistinct(F.when(is_put, F.col("topic"))).alias("topics"),
        )
        failures = _failure_counts(on_broker, ("broker",))
        joined = puts.join(failures, on=[*WINDOW_KEYS, "broker"], how="full")
        return joined.select(
            *WINDOW_KEYS,
            F.col("broker"),
            _per_second(F.coalesce(F.col("puts"), F.lit(0)), cfg).alias("put_tps"),
            _per_second(F.col("broker_puts"), cfg).alias("broker_put_tps"),
            F.coalesce(F.col("topics"), F.lit(0)).cast("int").alias("topics"),
            F.coalesce(F.col("failures"), F.lit(0)).alias("failures"),
            F.coalesce(F.col("busy_failures"), F.lit(0)).alias("busy_failures"),
            F.col("failures_by_class"),
        )

    return transform


def topic_brokers(metrics: DataFrame) -> DataFrame:
    """Which brokers carry which topic in a window: ``window_start``, ``window_end``, ``topic``, ``broker``."""
    return (
        metrics.where((F.col("metric") == rmq.TOPIC_PUT_NUMS) & F.col("broker").isNotNull())
        .select(*WINDOW_KEYS, "topic", "broker")
        .distinct()
    )
