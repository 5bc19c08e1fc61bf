"""The ingest flow: every raw record → ``bronze/*``, parsed → ``silver/*`` or ``quarantine`` (nothing is dropped),
then the quality gate's validation and reconciliation of the micro-batch."""

from __future__ import annotations

from pyspark.sql import DataFrame

from pipelines.config import GovernorConfig
from pipelines.flows.base import BatchReport, write_outputs
from pipelines.transforms import silver

#: Delta transaction app id of the ingest query's writes (with the micro-batch id as version).
INGEST_APP_ID = "rate-governor-ingest"
QUERY = "ingest"


class IngestFlow:
    """The ``foreachBatch`` handler of the ingest query, bound to a lake and a quality gate.

    Example:
        >>> flow = IngestFlow(cfg, lake, gate)
        >>> flow.handle(raw_batch, 0)       # RAW_RECORD rows of micro-batch 0
    """

    def __init__(self, cfg: GovernorConfig, lake, gate) -> None:
        self.cfg = cfg
        self.lake = lake
        self.gate = gate
        self.reports: list[BatchReport] = []

    def parse(self, raw: DataFrame) -> tuple[DataFrame, DataFrame]:
        """RAW_RECORD rows → (parsed stats, parsed failures) with the expectations applied."""
        stats = raw.transform(silver.parsed_stats(self.cfg, self.gate.enforce_stats))
        failures = raw.transform(silver.parsed_failures(self.cfg, self.gate.enforce_failures))
        return stats, failures

    def handle(self, raw: DataFrame, batch_id: int) -> None:
        """One micro-batch of raw records → bronze, silver and quarantine, then the quality gate."""
        raw = raw.persist()
        try:
            stats, failures = (df.persist() for df in self.parse(raw))
            outputs = silver.ingest_outputs(raw, stats, failures)
            self.reports.append(write_outputs(self.lake, QUERY, INGEST_APP_ID, batch_id, outputs))
            self.gate.after_ingest(batch_id, raw, stats, failures)
            stats.unpersist()
            failures.unpersist()
        finally:
            raw.unpersist()
