"""The ingest flow: every raw record → ``bronze/*``, parsed → ``silver/*`` or ``quarantine`` (nothing is dropped;
records of unknown brokers are quarantined, judged with the known set recorded for the micro-batch,
:mod:`pipelines.dataplane.known_brokers`), the batch's metric events → its events file for the gold query
(:mod:`pipelines.dataplane.events`, parse once), then the quality gate's validation and reconciliation of the
micro-batch."""

from __future__ import annotations

import time

from pyspark.sql import DataFrame

from pipelines.config import GovernorConfig
from pipelines.faults import crash_point
from pipelines.job.flows.base import BatchReport, release, write_outputs
from pipelines.dataplane import events
from pipelines.dataplane.known_brokers import BatchRecords, KnownBrokers, KnownBrokerSource, known_dir
from pipelines.dataplane.lake import Lake
from pipelines.dataplane.quality.gate import QualityGate
from pipelines.dataplane.transforms import silver

#: Delta transaction app id of the ingest query's writes (with the micro-batch id as version).
INGEST_APP_ID = "rate-governor-ingest"
QUERY = "ingest"
#: Report key of the events file's rows, and the crash point once it is in place (``ingest:after:events``).
EVENTS = "events"


class IngestFlow:
    """The ``foreachBatch`` handler of the ingest query, bound to a lake and a quality gate.

    Example:
        >>> flow = IngestFlow(cfg, lake, gate)
        >>> flow.handle(raw_batch, 0)       # RAW_RECORD rows of micro-batch 0
    """

    def __init__(self, cfg: GovernorConfig, lake: Lake, gate: QualityGate,
                 known: KnownBrokerSource | None = None, fast_events: bool = False) -> None:
        self.cfg = cfg
        self.lake = lake
        self.gate = gate
        self.events_dir = events.events_dir(cfg)
        #: the fast query's copy of each events file (None: no fast path)
        self.fast_events_dir = events.fast_events_dir(cfg) if fast_events else None
        self.known = BatchRecords(known_dir(cfg), known or KnownBrokerSource(cfg))
        self.reports: list[BatchReport] = []

    def parse(self, raw: DataFrame, known: KnownBrokers | None = None) -> tuple[DataFrame, DataFrame]:
        """RAW_RECORD rows → (parsed stats, parsed failures), records of brokers not in ``known`` rejected (None:
        every broker trusted), with the expectations applied."""
        stats = raw.transform(silver.parsed_stats(self.cfg, self.gate.enforce_stats, known))
        failures = raw.transform(silver.parsed_failures(self.cfg, self.gate.enforce_failures, known))
        return stats, failures

    def handle(self, raw: DataFrame, batch_id: int) -> None:
        """One micro-batch of raw records → bronze, silver and quarantine, the events file, then the quality gate.
        The known brokers are the set recorded for ``batch_id`` (:meth:`BatchRecords.for_batch`: the same on a
        replay)."""
        known = self.known.for_batch(batch_id)
        raw = raw.persist()
        try:
            stats, failures = (df.persist() for df in self.parse(raw, known))
            measured = self.gate.measure(batch_id, raw, stats, failures)   # one job, fills the caches
            # the events first: the deciding queries wait for them, not for the lake's tables
            started = time.monotonic()
            written = events.write_batch(silver.metric_events(stats, failures), self.events_dir, batch_id,
                                         self.fast_events_dir)
            seconds = round(time.monotonic() - started, 2)
            crash_point(f"{QUERY}:after:{EVENTS}")
            outputs = silver.ingest_outputs(raw, stats, failures)
            report = write_outputs(self.lake, QUERY, INGEST_APP_ID, batch_id, outputs, silver.ingest_rows(measured))
            report.rows[EVENTS], report.seconds[EVENTS] = written, seconds
            self.reports.append(report)
            self.gate.after_ingest(batch_id, raw, stats, failures, measured)
            stats.unpersist()
            failures.unpersist()
        finally:
            release(QUERY, batch_id, raw)
