"""What every streaming flow shares: the report of a micro-batch and the tagged, idempotent writes of its tables."""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from pipelines.config import GovernorConfig
from pipelines.faults import crash_point
from pipelines.job.flows.store import DecisionStore
from pipelines import tables
from pipelines.dataplane.lake import Lake
from pipelines.writeback.publish import Publisher
from pipelines.ops import metrics

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("rate_governor")


@dataclass
class BatchReport:
    """What one micro-batch wrote (for logs, the summary and tests): rows and seconds per table."""

    query: str
    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def write_outputs(lake: Lake, query: str, app_id: str, batch_id: int, outputs: dict[str, DataFrame],
                  rows: dict[str, int] | None = None) -> BatchReport:
    """Append each table of ``outputs`` to the lake, tagged with (``app_id``, ``batch_id``) so that a replayed
    micro-batch writes nothing twice; names the Spark jobs of each write ``<query> batch <id>: <table>`` (Spark UI,
    event log). The tables the lake writes from the driver are collected first by one Spark job
    (:meth:`pipelines.dataplane.lake.Lake.collect`), then committed one by one. ``rows``: the row count per table when
    known (an empty one is skipped without a job; a large one is written from the executors,
    :meth:`pipelines.dataplane.lake.Lake.append`). What was appended feeds the metrics
    (:func:`pipelines.ops.metrics.observe_outputs`). Returns the batch's report (also logged)."""
    report = BatchReport(query, batch_id)
    context = next(iter(outputs.values())).sparkSession.sparkContext if outputs else None
    try:
        if context is not None:
            context.setJobDescription(f"{query} batch {batch_id}: {len(outputs)} tables")
        collected = lake.collect(outputs, rows)  # one Spark job for the tables written through the driver
        for table, df in outputs.items():
            started = time.monotonic()
            context.setJobDescription(f"{query} batch {batch_id}: {table}")
            if table in collected:
                report.rows[table] = lake.append_arrow(collected[table], table, app_id=app_id, version=batch_id)
            else:
                report.rows[table] = lake.append(df, table, app_id=app_id, version=batch_id,
                                                 rows=(rows or {}).get(table))
            report.seconds[table] = round(time.monotonic() - started, 2)
            crash_point(f"{query}:after:{table}")
        metrics.observe_outputs(collected, report.rows, others=outputs)  # quarantine, brokers' newest minutes
    finally:
        if context is not None:
            context.setJobDescription(None)
    log.debug("%s batch %d: rows %s, seconds %s", query, batch_id, report.rows, report.seconds)
    return report


Clock = Callable[[], dt.datetime]


def release(query: str, batch_id: int, *cached: DataFrame) -> None:
    """Unpersist a micro-batch's cached DataFrames, in the handler's ``finally``.

    When the micro-batch is already failing (its error is propagating: a lost lease, or the query being stopped,
    which interrupts the unpersist's RPC to the block manager), a failed release is logged at DEBUG and never
    replaces that error; otherwise it raises as the unpersist did."""
    pending = sys.exc_info()[1]
    for df in cached:
        try:
            df.unpersist()
        except Exception as exc:  # noqa: BLE001 (re-raised unless the batch is already failing)
            if pending is None:
                raise
            log.debug("%s batch %d: cached data not released (%s) while failing with %r", query, batch_id,
                      type(exc).__name__, pending)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def write_arrow(lake: Lake, query: str, app_id: str, batch_id: int, outputs: dict[str, "pa.Table"],
                report: BatchReport | None = None) -> BatchReport:
    """Append each Arrow table of ``outputs`` to the lake (from the driver, no Spark job), tagged with (``app_id``,
    ``batch_id``) so that a replayed micro-batch writes nothing twice; a crash point after each table
    (``<query>:after:<table>``). What was appended feeds the metrics (:func:`pipelines.ops.metrics.observe_outputs`).
    Returns the batch's report (``report`` extended when given; also logged)."""
    report = report or BatchReport(query, batch_id)
    for table, data in outputs.items():
        started = time.monotonic()
        report.rows[table] = lake.append_arrow(data, table, app_id=app_id, version=batch_id)
        report.seconds[table] = round(time.monotonic() - started, 2)
        crash_point(f"{query}:after:{table}")
    metrics.observe_outputs(outputs, report.rows)  # decisions, anomalies, held limits, refused decisions
    log.debug("%s batch %d: rows %s, seconds %s", query, batch_id, report.rows, report.seconds)
    return report


class DecisionFlow:
    """What the two deciding flows share (:class:`pipelines.job.flows.gold.GoldFlow`, the final path, and
    :class:`pipelines.job.flows.fast.FastFlow`, the fast path): both read the Spark-reduced windows of their micro-batch
    once as Arrow and decide on the driver (:mod:`pipelines.decide`), sharing the decisions' memory
    (:class:`pipelines.job.flows.store.DecisionStore`) under one lock.

    Args:
        cfg: the governor's config; lake: the lake (reads history, appends outputs);
        publisher: :class:`pipelines.writeback.publish.Publisher`; clock: processing time (UTC);
        decision_lock: shared by both flows, so that they decide one at a time (one policy state, one version
            order); store: the decisions' memory, shared by both flows.
    """

    def __init__(self, cfg: GovernorConfig, lake: Lake, publisher: Publisher, clock: Clock = utc_now,
                 decision_lock: threading.Lock | None = None, store: DecisionStore | None = None) -> None:
        self.cfg = cfg
        self.lake = lake
        self.publisher = publisher
        self.clock = clock
        self.decision_lock = decision_lock or threading.Lock()
        self.store = store or DecisionStore(lake)
        self.reports: list[BatchReport] = []
        #: Seconds spent holding the decision lock, per micro-batch (``bench/batch_profile.py`` prints them).
        self.locked_seconds: list[float] = []

    def history(self, first_window: dt.datetime, before: dt.datetime | None = None) -> tuple["pa.Table", "pa.Table"]:
        """The finalized ``gold/topic_tps`` and ``gold/broker_tps`` rows the baselines of windows from
        ``first_window`` need (``detection.baseline_windows`` windows before it), before ``before`` when given."""
        since = first_window - dt.timedelta(
            seconds=self.cfg.detection.baseline_windows * self.cfg.windows.length_seconds)
        return (self.lake.read_arrow(tables.GOLD_TOPIC_TPS, since=since, before=before),
                self.lake.read_arrow(tables.GOLD_BROKER_TPS, since=since, before=before))

    def group_history(self, first_window: dt.datetime,
                      before: dt.datetime | None = None) -> Callable[[], "pa.Table"]:
        """A function reading the finalized ``gold/group_tps`` rows of the ``detection.baseline_windows`` windows
        before ``first_window`` (before ``before`` when given): a retry limit's consume basis, read only when a
        storm fires (:func:`pipelines.decide.rules.anomalies.consume_basis`)."""
        since = first_window - dt.timedelta(
            seconds=self.cfg.detection.baseline_windows * self.cfg.windows.length_seconds)
        return lambda: self.lake.read_arrow(tables.GOLD_GROUP_TPS, since=since, before=before)

    def publish(self, now: dt.datetime, batch_id: int, query: str) -> None:
        started = time.monotonic()
        self.publisher.publish(now, batch_id, query)
        log.info("%s batch %d: limits published in %.2f s", query, batch_id, time.monotonic() - started)
