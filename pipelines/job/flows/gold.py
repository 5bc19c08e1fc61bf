"""The gold flow (final path): windows finalized by the watermark → gold TPS tables, anomalies, limit decisions,
saved policy state and the published limits. Each window is written exactly once, when the watermark passes it.

Spark reduces: the stateful windowed sums (watermark, state store) of the finalized windows, one row per window ×
broker × topic × consumer group × metric, collected once as Arrow by one Spark job. The driver derives the gold TPS
tables and the per-broker traffic the decisions need (:func:`pipelines.decide.rules.windows.reduce_windows`) and decides
(:mod:`pipelines.decide.paths.final`): the anomalies and candidates outside the decision lock, the fold on the policy
state inside it; the tables are then appended from the driver and the limits published."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from pipelines.config import GovernorConfig
from pipelines.decide.rules.evidence import expected_brokers, open_evidence
from pipelines.decide.paths.fast import OpenRows
from pipelines.decide.paths.final import FinalOutputs, decide_final, decide_open, prepare_final, window_bounds
from pipelines.decide.records.inputs import FinalInputs, LockedInputs
from pipelines.decide.paths.reconcile import lift_reach_seconds, read_as_limited
from pipelines.decide.rules.windows import TRAFFIC, reduce_windows
from pipelines.job.flows.base import BatchReport, DecisionFlow, write_arrow
from pipelines.dataplane import events
from pipelines import tables
from pipelines.dataplane.transforms import tps

log = logging.getLogger("rate_governor")

#: Delta transaction app id of the gold query's writes (with the micro-batch id as version).
GOLD_APP_ID = "rate-governor-gold"
QUERY = "gold"
#: The probe tick's writes (:meth:`GoldFlow.probe_tick`; version: milliseconds since the epoch).
PROBE_APP_ID = "rate-governor-probes"
PROBE_QUERY = "probes"

def metric_event_stream(spark: SparkSession, cfg: GovernorConfig) -> DataFrame:
    """The gold query's input, streaming :data:`~pipelines.schemas.METRIC_EVENT` rows: the events files the ingest
    query writes per micro-batch (:mod:`pipelines.dataplane.events`), so a record is parsed once. The one place to
    choose another source: on a cluster with delta-spark, a Delta stream of ``silver/*`` through
    :func:`pipelines.dataplane.transforms.silver.metric_events` would serve the same rows."""
    return events.read_stream(spark, cfg)


def window_stream(metric_events: DataFrame, cfg: GovernorConfig) -> DataFrame:
    """Streaming METRIC_EVENT rows → windowed metric sums (:data:`~pipelines.schemas.WINDOW_METRIC`) with the
    watermark ``windows.watermark_seconds``; a stats line shipped twice counts once
    (:func:`pipelines.dataplane.transforms.tps.window_metrics`).

    One watermark over the events of both inputs (a single event-time operator: after a restart Spark restores one
    watermark, where several per-input watermarks would stay stuck until every input brought data).
    """
    return (
        metric_events
        .withWatermark("event_time", f"{cfg.windows.watermark_seconds} seconds")
        .transform(tps.window_metrics(cfg.windows))
    )


class GoldFlow(DecisionFlow):
    """The ``foreachBatch`` handler of the gold query (constructor: :class:`pipelines.job.flows.base.DecisionFlow`;
    ``open_rows``: the fast flow's memory of open windows, the lift veto's evidence, None without a fast path)."""

    def __init__(self, *args, open_rows: OpenRows | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._held_warned: set[tuple] = set()  # (resource_type, resource, limited_since) already logged
        self.open_rows = open_rows
        #: The newest finalized window's end (UTC) and its brokers (the census of the windows after it); None
        #: until this governor finalizes a window (after a restart too).
        self.horizon: tuple[dt.datetime, list[str]] | None = None
        self._tick_version = 0
        #: The operators' overrides now (:meth:`pipelines.job.overrides.OverrideSource.current`; () without).
        self.overrides: Callable[[], tuple] = tuple

    def opened(self):
        """The fast path's open windows after the newest finalized one, as demand evidence per resource
        (:func:`pipelines.decide.rules.evidence.open_evidence`); None without a fast path or a finalized window."""
        if self.open_rows is None or self.horizon is None:
            return None
        horizon_end, expected = self.horizon
        return open_evidence(self.open_rows.rows, horizon_end, self.cfg.windows.length_seconds, expected,
                             self.cfg.detection)

    def decide_open_windows(self, query: str, app_id: str, version: int, *, save_state: bool) -> int:
        """The limits in force decided on the open windows now (:func:`pipelines.decide.paths.final.decide_open`: a
        probe taken or at its deadline undone, a lift the open windows prove, a probe, a squeeze) → the
        ``gold/limits`` rows written and published (0: none). ``save_state``: the ``state/policy`` rows are written with
        them (tagged ``version``, a gold micro-batch's id); the probe tick leaves them to the next gold micro-batch,
        which saves every limited resource's state (the store holds them meanwhile; a restart before it decides
        the overdue undo again, at the same value)."""
        if self.horizon is None:
            return 0
        overrides = self.overrides()
        with self.decision_lock:
            now = self.clock()
            locked = LockedInputs(policy_state=self.store.state_before(version if save_state else None),
                                  latest_limits=self.store.latest_limits(), open_evidence=self.opened(),
                                  overrides=overrides)
            limits, refused, state = decide_open(self.horizon[0], locked, self.cfg, now, batch_id=version,
                                                 origin=f"{app_id}:{version}")
            if limits.num_rows:
                self.store.add_state(state)
                self.store.add_limits(limits)
        if not limits.num_rows:
            return 0
        outputs = {tables.GOLD_LIMITS: limits, tables.QUARANTINE: refused}
        if save_state:
            outputs[tables.STATE_POLICY] = state
        write_arrow(self.lake, query, app_id, version, outputs)
        for row in limits.to_pylist():
            log.info("%s %s: %s", row["resource_type"], row["resource"], row["reason"])
        self.publish(now, version, query)
        return limits.num_rows

    def probe_tick(self) -> int:
        """Every ``windows.fast_trigger_seconds``, input or not (the override tick's thread): while a probe is in
        flight, its undo when the open windows show it taken or its deadline has passed
        (:meth:`decide_open_windows`); 0 without one."""
        if not self.store.probing():
            return 0
        self._tick_version = max(self._tick_version + 1, int(self.clock().timestamp() * 1000))
        return self.decide_open_windows(PROBE_QUERY, PROBE_APP_ID, self._tick_version, save_state=False)

    def warn_held_too_long(self, out: FinalOutputs, horizon_end: dt.datetime) -> None:
        """Log a WARNING, once per limit, for each limit in force since longer than ``limits.max_held_seconds`` of
        event time (up to ``horizon_end``, UTC): a person should look at it (the status page flags it too)."""
        cutoff = horizon_end - dt.timedelta(seconds=self.cfg.limits.max_held_seconds)
        for s in out.folded.states:
            if s.limit_qps is None or s.limited_since is None:
                continue
            since = s.limited_since.replace(tzinfo=dt.timezone.utc)
            key = (s.resource_type, s.resource, since)
            if since < cutoff and key not in self._held_warned:
                self._held_warned.add(key)
                log.warning("%s %s has been limited to %.1f msg/s since the window ending %s UTC, longer than "
                            "limits.max_held_seconds = %d s: look at it (the cause may have changed, or the limit "
                            "may be holding legitimate demand)", s.resource_type, s.resource, s.limit_qps,
                            f"{since:%Y-%m-%d %H:%M}", self.cfg.limits.max_held_seconds)

    def reduce(self, metrics: DataFrame) -> dict:
        """The micro-batch's finalized windowed sums (:data:`~pipelines.schemas.WINDOW_METRIC`), collected as Arrow by
        one Spark job → the gold TPS tables and the decisions' traffic rows (:func:`reduce_windows`, on the
        driver)."""
        return reduce_windows(metrics.toArrow(), self.cfg.detection, read_as_limited(
            self.store.limited_keys(), self.store.lifted_at(), self.clock(), lift_reach_seconds(self.cfg.windows)))

    def handle(self, metrics: DataFrame, batch_id: int) -> None:
        """One micro-batch of finalized windows → gold tables, anomalies, limit decisions, published limits."""
        context = metrics.sparkSession.sparkContext
        try:
            context.setJobDescription(f"{QUERY} batch {batch_id}: windows")
            reduced = self.reduce(metrics)  # the one Spark job of the batch
        finally:
            context.setJobDescription(None)
        first_window, horizon_end = window_bounds(reduced[TRAFFIC])
        if first_window is None:  # no window finalized: what the open windows show of the limits in force
            written = self.decide_open_windows(QUERY, GOLD_APP_ID, batch_id, save_state=True)
            self.reports.append(BatchReport(QUERY, batch_id))
            if not written and self.publisher.sinks.behind:  # a sink that was down catches up without a decision
                with self.decision_lock:
                    self.publisher.publish(self.clock(), batch_id, QUERY)
            return
        topic_history, broker_history = self.history(first_window, before=first_window)
        rejections = None
        if self.lake.exists(tables.CONTROL_LIMITER_REJECTIONS):
            rejections = self.lake.read_arrow(tables.CONTROL_LIMITER_REJECTIONS, since=first_window,
                                              before=horizon_end)
        inputs = FinalInputs(topics=reduced[tables.GOLD_TOPIC_TPS], groups=reduced[tables.GOLD_GROUP_TPS],
                             brokers=reduced[tables.GOLD_BROKER_TPS], traffic=reduced[TRAFFIC],
                             topic_history=topic_history, broker_history=broker_history, limiter_rejections=rejections,
                             group_history=self.group_history(first_window, before=first_window))
        prepared = prepare_final(inputs, self.cfg, first_window, horizon_end)
        overrides = self.overrides()
        with self.decision_lock:
            locked = time.monotonic()
            now = self.clock()
            self.horizon = (horizon_end, expected_brokers(inputs.brokers))
            opened = self.opened()
            memory = LockedInputs(policy_state=self.store.state_before(batch_id),
                                  latest_limits=self.store.latest_limits(), open_evidence=opened,
                                  overrides=overrides)
            out = decide_final(prepared, memory, self.cfg, now, batch_id=batch_id, origin=f"{GOLD_APP_ID}:{batch_id}")
            self.store.add_state(out.state)
            self.store.add_limits(out.limits)
            self.locked_seconds.append(time.monotonic() - locked)
        self.reports.append(write_arrow(self.lake, QUERY, GOLD_APP_ID, batch_id, out.tables()))
        self.publish(now, batch_id, QUERY)
        self.warn_held_too_long(out, horizon_end)
