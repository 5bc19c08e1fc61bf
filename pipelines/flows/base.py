"""What every streaming flow shares: the report of a micro-batch and the tagged, idempotent writes of its tables."""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame

from pipelines.config import GovernorConfig
from pipelines.faults import crash_point
from pipelines.io import tables
from pipelines.schemas import RESOURCE_KEYS
from pipelines.io.lake import Lake
from pipelines.io.publish import Publisher, latest_per_resource
from pipelines.ops import metrics
from pipelines.quality.gate import QualityGate
from pipelines.transforms import gold

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
    (:meth:`pipelines.io.lake.Lake.collect`), then committed one by one. ``rows``: the row count per table when
    known (an empty one is skipped without a job; a large one is written from the executors,
    :meth:`pipelines.io.lake.Lake.append`). What was appended feeds the metrics
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
        metrics.observe_outputs(outputs, collected, report.rows)  # decisions, anomalies, quarantine, brokers' minutes
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


class DecisionFlow:
    """What the two deciding flows share (:class:`pipelines.flows.gold.GoldFlow`, the final path, and
    :class:`pipelines.flows.fast.FastFlow`, the fast path).

    Args:
        cfg: the governor's config; lake: the lake (reads history and state, appends outputs);
        gate: :class:`pipelines.quality.gate.QualityGate` (the ``gold/limits`` expectations);
        publisher: :class:`pipelines.io.publish.Publisher`; clock: processing time (UTC);
        decision_lock: shared by both flows, so that they decide one at a time (one policy state, one version
            order).
    """

    def __init__(self, cfg: GovernorConfig, lake: Lake, gate: QualityGate, publisher: Publisher,
                 clock: Clock = utc_now, decision_lock: threading.Lock | None = None) -> None:
        self.cfg = cfg
        self.lake = lake
        self.gate = gate
        self.publisher = publisher
        self.clock = clock
        self.decision_lock = decision_lock or threading.Lock()
        self.reports: list[BatchReport] = []
        self._single = gold.partitioning(cfg.spark.gold_single_partition)

    def latest_limits(self) -> DataFrame:
        """The newest ``gold/limits`` row per resource (:func:`pipelines.io.publish.latest_per_resource`), picked
        on the driver where the lake can (:meth:`pipelines.io.lake.Lake.latest`): not the whole table every batch."""
        return self.lake.latest(tables.GOLD_LIMITS, list(RESOURCE_KEYS), "version",
                                lambda df: latest_per_resource(df.transform(self._single)))

    def saved_state(self, before_batch: int | None = None) -> DataFrame:
        """The saved policy state per resource (:func:`pipelines.transforms.gold.latest_state`) of the batches
        before ``before_batch`` when given, picked like :meth:`latest_limits`."""
        return self.lake.latest(tables.STATE_POLICY, list(RESOURCE_KEYS), "batch_id",
                                lambda df: gold.latest_state(df.transform(self._single)), below=before_batch)
