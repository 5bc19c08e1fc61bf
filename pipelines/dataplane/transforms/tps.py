"""Windowed TPS: from silver rows to the gold TPS tables.

The streaming part is one event-time aggregation with a watermark (:func:`window_metrics`) at the finest grain
(window × broker × topic × consumer group × metric). The gold micro-batch collects its finalized windows once as
Arrow, and the driver derives the gold TPS tables and the decisions' per-broker traffic from them
(:func:`pipelines.decide.rules.windows.reduce_windows`), so one stateful operator serves all of them.

A minute line stamped ``T`` covers the minute before ``T`` (``StatsItem`` snapshots every 10 s, 7 kept, so a
minute line's SUM spans the last ~60 s; docs/rocketmq-formats.md §2), so its event time for windowing is ``T - 60 s``.
TPS in a window = sum of the SUMs in the window / window length in seconds.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.columns import FAILURE_METRIC_PREFIX
from pipelines.config import WindowsConfig
from pipelines.dataplane.transforms.types import Transform


#: Seconds covered by a ``Stats In One Minute`` line.
MINUTE_LINE_SECONDS = 60


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
