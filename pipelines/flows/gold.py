"""The gold flow (final path): windows finalized by the watermark → gold TPS tables, anomalies, limit decisions,
saved policy state and the published limits. Each window is written exactly once, when the watermark passes it."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.io import events, tables
from pipelines.config import GovernorConfig
from pipelines.flows.base import BatchReport, Clock, DecisionFlow, release, utc_now, write_outputs
from pipelines.flows.fast import OpenRows
from pipelines.io.lake import Lake
from pipelines.io.publish import Publisher
from pipelines.quality.gate import QualityGate
from pipelines.transforms import gold, tps

log = logging.getLogger("rate_governor")

#: Delta transaction app id of the gold query's writes (with the micro-batch id as version).
GOLD_APP_ID = "rate-governor-gold"
QUERY = "gold"

def metric_event_stream(spark: SparkSession, cfg: GovernorConfig) -> DataFrame:
    """The gold query's input, streaming :data:`~pipelines.schemas.METRIC_EVENT` rows: the events files the ingest
    query writes per micro-batch (:mod:`pipelines.io.events`), so a record is parsed once. The one place to choose
    another source: on a cluster with delta-spark, a Delta stream of ``silver/*`` through
    :func:`pipelines.transforms.silver.metric_events` would serve the same rows."""
    return events.read_stream(spark, cfg)


def window_stream(metric_events: DataFrame, cfg: GovernorConfig) -> DataFrame:
    """Streaming METRIC_EVENT rows → windowed metric sums (:data:`~pipelines.schemas.WINDOW_METRIC`) with the
    watermark ``windows.watermark_seconds``; a stats line shipped twice counts once
    (:func:`pipelines.transforms.tps.window_metrics`).

    One watermark over the events of both inputs (a single event-time operator: after a restart Spark restores one
    watermark, where several per-input watermarks would stay stuck until every input brought data).
    """
    return (
        metric_events
        .withWatermark("event_time", f"{cfg.windows.watermark_seconds} seconds")
        .transform(tps.window_metrics(cfg.windows))
    )


class GoldFlow(DecisionFlow):
    """The ``foreachBatch`` handler of the gold query (constructor: :class:`pipelines.flows.base.DecisionFlow`)."""

    def __init__(self, cfg: GovernorConfig, lake: Lake, gate: QualityGate, publisher: Publisher,
                 clock: Clock = utc_now, decision_lock: threading.Lock | None = None,
                 open_rows: OpenRows | None = None) -> None:
        super().__init__(cfg, lake, gate, publisher, clock, decision_lock)
        self._held_warned: set[tuple] = set()  # (resource_type, resource, limited_since) already logged
        #: the fast flow's open windows (the lift veto); None without a fast path
        self.open_rows = open_rows

    def warn_held_too_long(self, state: DataFrame, horizon_end: dt.datetime) -> None:
        """Log a WARNING, once per limit, for each limit in force since longer than ``limits.max_held_seconds`` of
        event time (up to ``horizon_end``, UTC): a person should look at it (the status page flags it too)."""
        cutoff = horizon_end - dt.timedelta(seconds=self.cfg.limits.max_held_seconds)
        held = state.where(F.col("limit_qps").isNotNull() & (F.col("limited_since") < F.lit(cutoff)))
        for row in held.select("resource_type", "resource", "limit_qps", "limited_since").collect():
            key = (row["resource_type"], row["resource"], row["limited_since"])
            if key not in self._held_warned:
                self._held_warned.add(key)
                log.warning("%s %s has been limited to %.1f msg/s since the window ending %s UTC, longer than "
                            "limits.max_held_seconds = %d s: look at it (the cause may have changed, or the limit "
                            "may be holding legitimate demand)", row["resource_type"], row["resource"],
                            row["limit_qps"], f"{row['limited_since']:%Y-%m-%d %H:%M}",
                            self.cfg.limits.max_held_seconds)

    def inputs(self, metrics: DataFrame, batch_id: int, first_window: dt.datetime,
               horizon_end: dt.datetime | None = None) -> gold.GoldInputs:
        """The batch's windows with the history and saved state it reads from the lake, and the limiters'
        rejections the write-back sinks saw in the batch's windows."""
        since = gold.baseline_since(first_window, self.cfg)
        rejections = None
        if self.lake.exists(tables.CONTROL_LIMITER_REJECTIONS):
            rejections = self.lake.read(tables.CONTROL_LIMITER_REJECTIONS, since=first_window, before=horizon_end)
        return gold.GoldInputs(
            metrics=metrics,
            topic_history=self.lake.read(tables.GOLD_TOPIC_TPS, since=since, before=first_window),
            broker_history=self.lake.read(tables.GOLD_BROKER_TPS, since=since, before=first_window),
            policy_state=self.saved_state(before_batch=batch_id),
            latest_limits=self.latest_limits(),
            limiter_rejections=rejections,
            open_evidence=(self.open_rows.evidence(horizon_end, self.cfg.windows.length_seconds)
                           if self.open_rows is not None and horizon_end is not None else None),
        )

    def handle(self, metrics: DataFrame, batch_id: int) -> None:
        """One micro-batch of finalized windows → gold tables, anomalies, limit decisions, published limits."""
        # cached as Spark emits it: the first job (the window bounds) runs the stateful aggregation in its own
        # partitions and fills the cache; coalescing before it ran that whole stage in one task (docs/performance.md)
        metrics = metrics.persist()
        out = None
        try:
            first_window, horizon_end = gold.window_bounds(metrics)
            if first_window is None:
                self.reports.append(BatchReport(QUERY, batch_id))
                if self.publisher.sinks.behind:  # a sink that was down catches up without a new decision
                    with self.decision_lock:
                        self.publisher.publish(self.clock(), batch_id, QUERY)
                return
            with self.decision_lock:
                now = self.clock()
                out = gold.gold_outputs(
                    self.inputs(metrics, batch_id, first_window, horizon_end), self.cfg, now,
                    check=lambda d: self.gate.check_limits(d, origin=f"{GOLD_APP_ID}:{batch_id}", at=now),
                    batch_id=batch_id,
                    first_window=first_window, horizon_end=horizon_end,
                )
                self.reports.append(write_outputs(self.lake, QUERY, GOLD_APP_ID, batch_id, out.tables()))
                started = time.monotonic()
                self.publisher.publish(now, batch_id, QUERY)
                log.info("gold batch %d: limits published in %.2f s", batch_id, time.monotonic() - started)
                self.warn_held_too_long(out.state, horizon_end)
        finally:
            release(QUERY, batch_id, metrics, *(out.cached if out is not None else ()))
