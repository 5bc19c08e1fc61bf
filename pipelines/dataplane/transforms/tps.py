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
from pipelines.dataplane.transforms.types import WINDOW_KEYS, Transform


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
    (:func:`pipelines.decide.final.with_limit_in_force`); null here.
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


RATE_LIMITED_METRIC = FAILURE_METRIC_PREFIX + rmq.RATE_LIMITED
#: ``resource_type`` of a window marker row of :func:`resource_traffic` (``resource`` ``metrics`` or ``traffic``);
#: the decision plane's :data:`pipelines.decide.final.MARKER`.
MARKER = "*"


def _group_of_retry_topic(topic: Column) -> Column:
    return F.substring(topic, len(rmq.RETRY_TOPIC_PREFIX) + 1, 1 << 16)


def per_broker_traffic(metrics: DataFrame, cfg: WindowsConfig) -> DataFrame:
    """WINDOW_METRIC rows → one row per window × limitable resource × broker: ``tps`` the limited traffic the broker
    admitted (msg/s), ``rejected`` its limiter's rejections of the resource (failed sends in the window) and
    ``carries`` (the broker printed a put line of the topic: a topic's carriers).

    * a topic (``TRAFFIC_SURGE`` limits its puts): its ``TOPIC_PUT_NUMS``; rejections its ``RATE_LIMITED`` failures;
    * a consumer group (``RUNAWAY_RETRY`` limits its retry traffic, one limiter per broker keyed ``%RETRY%<group>``,
      sohutv/rocketmq 5.3.1-sohu-01 ``RateLimitHandler``): the larger of its send-backs (``SNDBCK_PUT_NUMS``) and
      the plain sends to ``%RETRY%<group>`` a consumer falls back to (``TOPIC_PUT_NUMS`` of the retry topic, which
      also carry the re-puts of admitted send-backs); rejections the ``RATE_LIMITED`` failures of ``%RETRY%<group>``.
    """
    per_s = lambda c: F.col(c).cast("double") / F.lit(float(cfg.length_seconds))  # noqa: E731
    on_broker = metrics.where(F.col("broker").isNotNull())
    metric, topic = F.col("metric"), F.col("topic")
    is_retry_topic = topic.startswith(rmq.RETRY_TOPIC_PREFIX)
    is_put = metric == rmq.TOPIC_PUT_NUMS
    rejected = F.when(metric == RATE_LIMITED_METRIC, F.col("amount")).otherwise(F.lit(0))
    topics = on_broker.where((is_put | (metric == RATE_LIMITED_METRIC)) & topic.isNotNull())
    topic_rows = topics.groupBy(*WINDOW_KEYS, topic.alias("resource"), "broker").agg(
        F.sum(F.when(is_put, F.col("amount")).otherwise(F.lit(0))).alias("puts"),
        F.sum(rejected).alias("rejected"),
        F.max(is_put).alias("carries"),
    ).select(*WINDOW_KEYS, F.lit("topic").alias("resource_type"), "resource", "broker",
             per_s("puts").alias("tps"), "rejected", "carries")
    group = F.when(metric == rmq.SNDBCK_PUT_NUMS, F.col("consumer_group")).when(is_retry_topic,
                                                                                 _group_of_retry_topic(topic))
    retry = on_broker.where(
        (metric == rmq.SNDBCK_PUT_NUMS) | (is_retry_topic & metric.isin(rmq.TOPIC_PUT_NUMS, RATE_LIMITED_METRIC))
    ).where(group.isNotNull())
    group_rows = retry.groupBy(*WINDOW_KEYS, group.alias("resource"), "broker").agg(
        F.sum(F.when(metric == rmq.SNDBCK_PUT_NUMS, F.col("amount")).otherwise(F.lit(0))).alias("sent_back"),
        F.sum(F.when(is_put, F.col("amount")).otherwise(F.lit(0))).alias("retry_puts"),
        F.sum(rejected).alias("rejected"),
    ).select(*WINDOW_KEYS, F.lit("group").alias("resource_type"), "resource", "broker",
             F.greatest(per_s("sent_back"), per_s("retry_puts")).alias("tps"), "rejected",
             F.lit(False).alias("carries"))
    return topic_rows.unionByName(group_rows).select(
        *WINDOW_KEYS, "resource_type", "resource", "broker", "tps", F.col("rejected").cast("long").alias("rejected"),
        "carries")


def resource_traffic(cfg: WindowsConfig, detection, limited: tuple[str, ...] = ()) -> Transform:
    """WINDOW_METRIC rows → :func:`per_broker_traffic` rows reduced to what the decisions need, plus window markers.

    Kept: the rows of a resource whose cluster-wide traffic in the window reaches its rule's floor (a topic at
    ``surge_floor_tps``, a group at ``retry_floor_tps``: only those can be candidates), whose limiter rejected
    sends, or that is under a limit (``limited``: ``"<resource_type>\\x1f<resource>"`` keys; its windows are its
    demand evidence). What reaches the driver per window grows with the resources near a rule, not with the
    cluster. Markers (``resource_type`` :data:`MARKER`, other columns null): ``metrics`` for every window of the
    micro-batch, ``traffic`` for every window with any resource traffic (the decisions' observation grid)."""

    def transform(metrics: DataFrame) -> DataFrame:
        rows = per_broker_traffic(metrics, cfg)
        key = [*WINDOW_KEYS, "resource_type", "resource"]
        totals = rows.groupBy(*key).agg(F.sum("tps").alias("total"), F.sum("rejected").alias("refused"))
        floor = F.when(F.col("resource_type") == "topic", F.lit(detection.surge_floor_tps)).otherwise(
            F.lit(detection.retry_floor_tps))
        keep = (F.col("total") >= floor * (1.0 - 1e-9)) | (F.col("refused") > 0)
        if limited:
            keep = keep | F.concat_ws("\x1f", "resource_type", "resource").isin(*limited)
        kept = rows.join(totals.where(keep).select(*key), key, "left_semi")
        marks = [df.select(*WINDOW_KEYS).distinct().select(
            *WINDOW_KEYS, F.lit(MARKER).alias("resource_type"), F.lit(name).alias("resource"),
            F.lit(None).cast("string").alias("broker"), F.lit(None).cast("double").alias("tps"),
            F.lit(None).cast("long").alias("rejected"), F.lit(None).cast("boolean").alias("carries"))
            for df, name in ((metrics, "metrics"), (rows, "traffic"))]
        return kept.unionByName(marks[0]).unionByName(marks[1])

    return transform
