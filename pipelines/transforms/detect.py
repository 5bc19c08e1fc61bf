"""Anomaly rules over the gold TPS tables → ``gold/anomalies`` rows (:data:`~pipelines.schemas.GOLD_ANOMALIES`); the
kinds, their evidence and their settings are catalogued in :mod:`pipelines.transforms.anomalies`.

Rules (thresholds from ``[detection]`` in ``conf/``):

* ``RUNAWAY_RETRY`` (group): the group's retry TPS (SNDBCK_PUT_NUMS, summed over topics) is at least
  ``retry_ratio_threshold`` of its consume TPS on non-retry topics and at least ``retry_floor_tps``. Article 001:
  a consumer that never acknowledged re-sent every message, ``%RETRY%get-pugc-to-ai-consumer`` at 785 TPS.
* ``TRAFFIC_SURGE`` (topic, broker): put TPS at least ``surge_factor`` × the resource's own baseline (the
  ``baseline_quantile`` of its put TPS over the previous ``baseline_windows`` windows, needing
  ``baseline_min_windows`` of them) and at least ``surge_floor_tps``. Article 001: one broker's writes rose ~8x.
* ``BROKER_BUSY`` (broker): at least ``busy_failures_floor`` busy failures (``[TIMEOUT_CLEAN_QUEUE]`` …) in a window.
* ``FAILURE_SPIKE`` (topic): failure rate at least ``failure_rate_threshold`` with at least ``failure_floor``
  failures in a window; rejections by the in-broker limiter (``RATE_LIMITED``) are the governor's own limits at
  work and never count (a limited topic would otherwise flag itself).

Windows in which a topic was under an enforced limit (``gold/topic_tps.limit_qps``) show the cap, not the demand:
they are kept out of the topic's surge baseline (:func:`unlimited_history`).

Severity is ``critical`` when the observed value is at least ``critical_factor`` × the rule's floor, else ``warning``.
"""

from __future__ import annotations

import datetime as dt
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.transforms.anomalies import Anomaly
from pipelines.transforms.types import WINDOW_KEYS, Transform


def _severity(observed: Column, floor: float, cfg: DetectionConfig) -> Column:
    return F.when(observed >= F.lit(floor * cfg.critical_factor), F.lit("critical")).otherwise(F.lit("warning"))


def _anomaly(
    df: DataFrame,
    resource_type: str,
    resource: Column,
    anomaly: str,
    observed: Column,
    baseline: Column,
    severity: Column,
    detail: Column,
) -> DataFrame:
    return df.select(
        *WINDOW_KEYS,
        F.lit(resource_type).alias("resource_type"),
        resource.alias("resource"),
        F.lit(anomaly).alias("anomaly"),
        observed.cast("double").alias("observed_tps"),
        baseline.cast("double").alias("baseline_tps"),
        severity.alias("severity"),
        detail.alias("detail"),
    )


def group_retry(group_tps: DataFrame) -> DataFrame:
    """gold/group_tps → one row per consumer group × window: ``consumer_group``, ``retry_tps`` (all topics),
    ``consume_tps`` (non-retry topics: what the group really consumes), ``retry_ratio`` (null when consume is 0)."""
    is_retry_topic = F.col("topic").startswith(rmq.RETRY_TOPIC_PREFIX)
    sums = group_tps.groupBy(*WINDOW_KEYS, "consumer_group").agg(
        F.sum("retry_tps").alias("retry_tps"),
        F.sum(F.when(~is_retry_topic, F.col("consume_tps")).otherwise(F.lit(0.0))).alias("consume_tps"),
    )
    return sums.select(
        *WINDOW_KEYS,
        "consumer_group",
        "retry_tps",
        "consume_tps",
        F.when(F.col("consume_tps") > 0, F.col("retry_tps") / F.col("consume_tps")).alias("retry_ratio"),
    )


def runaway_retry(cfg: DetectionConfig) -> Transform:
    """:func:`group_retry` rows → RUNAWAY_RETRY anomalies (resource_type ``group``; observed = retry TPS,
    baseline = consume TPS). A group retrying at or above the floor with nothing consumed fires too."""

    def transform(groups: DataFrame) -> DataFrame:
        ratio_ok = F.coalesce(F.col("retry_ratio") >= cfg.retry_ratio_threshold, F.col("consume_tps") == 0)
        firing = groups.where((F.col("retry_tps") >= cfg.retry_floor_tps) & ratio_ok)
        detail = F.format_string(
            "consumer group %s sent %.1f msg/s back to %s (SNDBCK_PUT_NUMS) against %.1f msg/s consumed: "
            "retry ratio %s (rule: ratio >= %.2f and retry >= %.1f msg/s)",
            F.col("consumer_group"),
            F.col("retry_tps"),
            F.concat(F.lit(rmq.RETRY_TOPIC_PREFIX), F.col("consumer_group")),
            F.col("consume_tps"),
            F.coalesce(F.format_number(F.col("retry_ratio"), 2), F.lit("n/a (nothing consumed)")),
            F.lit(cfg.retry_ratio_threshold),
            F.lit(cfg.retry_floor_tps),
        )
        return _anomaly(
            firing,
            "group",
            F.col("consumer_group"),
            Anomaly.RUNAWAY_RETRY.value,
            F.col("retry_tps"),
            F.col("consume_tps"),
            _severity(F.col("retry_tps"), cfg.retry_floor_tps, cfg),
            detail,
        )

    return transform


def with_baseline(resource_col: str, value_col: str, windows: WindowsConfig, cfg: DetectionConfig) -> Transform:
    """Add ``baseline_tps`` (the ``baseline_quantile`` of ``value_col`` over the resource's previous
    ``baseline_windows`` windows, by time) and ``baseline_windows`` (how many windows it saw).

    The input holds the history windows and the current ones; the frame excludes the window itself.
    """

    def transform(df: DataFrame) -> DataFrame:
        span = cfg.baseline_windows * windows.length_seconds
        frame = (
            Window.partitionBy(resource_col)
            .orderBy(F.col("window_start").cast("long"))
            .rangeBetween(-span, -1)
        )
        return df.select(
            "*",
            F.percentile_approx(F.col(value_col), cfg.baseline_quantile).over(frame).alias("baseline_tps"),
            F.count(F.col(value_col)).over(frame).cast("int").alias("baseline_windows"),
        )

    return transform


def traffic_surge(resource_type: str, resource_col: str, cfg: DetectionConfig) -> Transform:
    """Rows with ``put_tps`` and :func:`with_baseline` columns → TRAFFIC_SURGE anomalies."""

    def transform(df: DataFrame) -> DataFrame:
        firing = df.where(
            (F.col("baseline_windows") >= cfg.baseline_min_windows)
            & (F.col("put_tps") >= cfg.surge_floor_tps)
            & (F.col("put_tps") >= F.col("baseline_tps") * cfg.surge_factor)
        )
        factor = F.when(F.col("baseline_tps") > 0, F.format_number(F.col("put_tps") / F.col("baseline_tps"), 1))
        detail = F.format_string(
            "%s %s put %.1f msg/s, %sx its baseline of %.1f msg/s (p%d of the previous %d windows; "
            "rule: >= %.1fx and >= %.1f msg/s)",
            F.lit(resource_type),
            F.col(resource_col),
            F.col("put_tps"),
            F.coalesce(factor, F.lit("inf")),
            F.col("baseline_tps"),
            F.lit(int(round(cfg.baseline_quantile * 100))),
            F.col("baseline_windows"),
            F.lit(cfg.surge_factor),
            F.lit(cfg.surge_floor_tps),
        )
        return _anomaly(
            firing,
            resource_type,
            F.col(resource_col),
            Anomaly.TRAFFIC_SURGE.value,
            F.col("put_tps"),
            F.col("baseline_tps"),
            _severity(F.col("put_tps") / F.greatest(F.col("baseline_tps"), F.lit(1e-9)), cfg.surge_factor, cfg),
            detail,
        )

    return transform


def _class_counts(failures_by_class: Column) -> Column:
    entries = F.map_entries(failures_by_class)
    sorted_entries = F.sort_array(entries)
    return F.array_join(F.transform(sorted_entries, lambda e: F.concat(e["key"], F.lit(": "), e["value"].cast("string"))), ", ")


def broker_busy(windows: WindowsConfig, cfg: DetectionConfig) -> Transform:
    """gold/broker_tps → BROKER_BUSY anomalies (observed = busy failures per second, baseline = put TPS)."""

    def transform(brokers: DataFrame) -> DataFrame:
        firing = brokers.where(F.col("busy_failures") >= cfg.busy_failures_floor)
        detail = F.format_string(
            "broker %s rejected %d sends as busy in the window (%s) while writing %.1f msg/s "
            "(rule: >= %d busy failures per window)",
            F.col("broker"),
            F.col("busy_failures"),
            _class_counts(F.col("failures_by_class")),
            F.col("put_tps"),
            F.lit(cfg.busy_failures_floor),
        )
        return _anomaly(
            firing,
            "broker",
            F.col("broker"),
            Anomaly.BROKER_BUSY.value,
            F.col("busy_failures") / F.lit(float(windows.length_seconds)),
            F.col("put_tps"),
            _severity(F.col("busy_failures"), cfg.busy_failures_floor, cfg),
            detail,
        )

    return transform


def failure_spike(windows: WindowsConfig, cfg: DetectionConfig) -> Transform:
    """gold/topic_tps → FAILURE_SPIKE anomalies (observed = failures per second, baseline = put TPS); failures
    rejected by the limiter (``rate_limited``) do not count."""

    def transform(topics: DataFrame) -> DataFrame:
        faults = F.col("failures") - F.coalesce(F.col("rate_limited"), F.lit(0))
        firing = topics.where((F.col("failure_rate") >= cfg.failure_rate_threshold) & (faults >= cfg.failure_floor))
        detail = F.format_string(
            "topic %s had %d failed sends besides the limiter's (%s), %.1f%% of attempts, while %.1f msg/s were put "
            "(rule: rate >= %.1f%% and >= %d failures per window)",
            F.col("topic"),
            faults,
            _class_counts(F.col("failures_by_class")),
            F.col("failure_rate") * 100,
            F.col("put_tps"),
            F.lit(cfg.failure_rate_threshold * 100),
            F.lit(cfg.failure_floor),
        )
        return _anomaly(
            firing,
            "topic",
            F.col("topic"),
            Anomaly.FAILURE_SPIKE.value,
            faults / F.lit(float(windows.length_seconds)),
            F.col("put_tps"),
            _severity(faults, cfg.failure_floor, cfg),
            detail,
        )

    return transform


def broker_writes() -> Column:
    """A broker's writes per second for its ``TRAFFIC_SURGE`` baseline (``gold/broker_tps`` or the fast path's
    broker rows → the column ``put_tps``, msg/s per broker): its own ``BROKER_PUT_NUMS`` (``broker_put_tps``) when
    it prints one, since it counts every write (retry re-puts and schedule writes too: article 001's 8x while the
    topics it printed stayed flat); the sum of its topics' puts (``put_tps``) otherwise. Both paths use this."""
    return F.coalesce(F.col("broker_put_tps"), F.col("put_tps")).alias("put_tps")


def unlimited_history(topic_history: DataFrame) -> DataFrame:
    """``gold/topic_tps`` history rows → those of windows without an enforced limit in force (``limit_qps`` null):
    a capped window shows the limit, and a baseline fed with it would hold the limit up (closed loop)."""
    return topic_history.where(F.col("limit_qps").isNull())


def current_only(first_window_start: dt.datetime | None) -> Transform:
    """Keep the rows whose window starts at or after ``first_window_start`` (UTC; the micro-batch's first window),
    dropping the history rows once a baseline is computed; None (no current window) keeps nothing."""

    def transform(df: DataFrame) -> DataFrame:
        if first_window_start is None:
            return df.limit(0)
        return df.where(F.col("window_start") >= F.lit(first_window_start))

    return transform


def first_window_start(*current: DataFrame) -> dt.datetime | None:
    """The earliest ``window_start`` of the current windows (one Spark job; callers that know it pass it)."""
    starts = reduce(DataFrame.unionByName, [df.select("window_start") for df in current])
    return starts.agg(F.min("window_start")).first()[0]


def detect_anomalies(
    topic_windows: DataFrame,
    group_windows: DataFrame,
    broker_windows: DataFrame,
    topic_history: DataFrame,
    broker_history: DataFrame,
    windows: WindowsConfig,
    cfg: DetectionConfig,
    first_window: dt.datetime | None = None,
) -> DataFrame:
    """All rules over one micro-batch of finalized windows.

    Args:
        topic_windows, group_windows, broker_windows: this batch's gold/topic_tps, gold/group_tps, gold/broker_tps.
        topic_history, broker_history: earlier windows of gold/topic_tps and gold/broker_tps (for baselines);
            only windows before this batch's first window are used.
        first_window: start of this batch's first window (UTC) when the caller knows it (the governor does: the
            earliest window of the batch's metrics); else computed from ``topic_windows`` and ``broker_windows``.
    Returns:
        gold/anomalies rows of this batch's windows.
    """
    if first_window is None:
        first_window = first_window_start(topic_windows, broker_windows)
    first = current_only(first_window)
    topic_all = unlimited_history(topic_history).select("window_start", "topic", "put_tps").unionByName(
        topic_windows.select("window_start", "topic", "put_tps")
    )
    broker_all = broker_history.select("window_start", "broker", broker_writes()).unionByName(
        broker_windows.select("window_start", "broker", broker_writes())
    )
    topic_base = (
        topic_all.transform(with_baseline("topic", "put_tps", windows, cfg))
        .transform(first)
        .join(topic_windows.select(*WINDOW_KEYS, "topic"), on=["window_start", "topic"])
    )
    broker_base = (
        broker_all.transform(with_baseline("broker", "put_tps", windows, cfg))
        .transform(first)
        .join(broker_windows.select(*WINDOW_KEYS, "broker"), on=["window_start", "broker"])
    )
    parts = [
        group_windows.transform(group_retry).transform(runaway_retry(cfg)),
        topic_base.transform(traffic_surge("topic", "topic", cfg)),
        broker_base.transform(traffic_surge("broker", "broker", cfg)),
        broker_windows.transform(broker_busy(windows, cfg)),
        topic_windows.transform(failure_spike(windows, cfg)),
    ]
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result
