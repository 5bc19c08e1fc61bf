"""The quality gate: what the streaming flows call to apply the data-quality rules (:mod:`pipelines.dataplane.quality`).

* Ingest: :meth:`QualityGate.enforce_stats` / :meth:`QualityGate.enforce_failures` on the parsed rows (the
  suites' expectations as row conditions, :mod:`pipelines.dataplane.quality.rules`), then
  :meth:`QualityGate.after_ingest` once the micro-batch is written: GX validation of the candidate silver rows every
  ``[quality] validate_every_n_batches`` batches (``quality/validation_results``, ``quality/validation_runs``) and
  the reconciliation with the late-row count (``quality/reconciliation``, :mod:`pipelines.dataplane.quality.reconcile`).
* Gold: the decision plane applies the ``gold/limits`` expectations to its decisions row by row
  (:func:`pipelines.decide.records.limit_rows.check`, from
  :data:`pipelines.dataplane.quality.suites.GOLD_LIMITS_EXPECTATIONS`).

The gate is built explicitly, ``QualityGate(cfg, lake)``; methods that need Spark take it from the DataFrame they
are given (``df.sparkSession``).
"""

from __future__ import annotations

import datetime as dt
import logging

from pyspark.sql import DataFrame

from pipelines.config import GovernorConfig
from pipelines import tables
from pipelines.dataplane.lake import Lake
from pipelines.dataplane.sources import BROKER_STATS, SEND_FAILURES
from pipelines.dataplane.quality import data_docs, rules
from pipelines.dataplane.quality.reconcile import Reconciler
from pipelines.dataplane.quality.validation import Validator, result_rows, shared_validator
from pipelines.dataplane.transforms import parse, parse_failures

log = logging.getLogger("rate_governor.quality")

#: Delta app id of the quality tables' commits (one per ingest micro-batch).
QUALITY_APP_ID = "rate-governor-quality"


class QualityGate:
    """The data-quality rules of one governor run: ``cfg`` is the :class:`~pipelines.config.GovernorConfig`
    (``[quality]``, ``[windows] watermark_seconds``), ``lake`` the lake the quality
    tables are written to. The GX context is created on the first validation (it costs seconds) and shared by every
    gate of the process with the same ``[quality] pandas_max_rows``."""

    def __init__(self, cfg: GovernorConfig, lake: Lake) -> None:
        self.cfg = cfg
        self.q = cfg.quality
        self.lake = lake
        self.reconciler = Reconciler(cfg.windows.watermark_seconds, lake, QUALITY_APP_ID)
        self.last_reconciliation: list[dict] = []
        self._validator: Validator | None = None
        self._enforce = {t: rules.enforce(t) for t in (tables.SILVER_BROKER_STATS, tables.SILVER_SEND_FAILURES)}

    @property
    def validator(self) -> Validator:
        if self._validator is None:
            self._validator = shared_validator(self.q.pandas_max_rows)
        return self._validator

    # --- ingest: per row

    def enforce_stats(self, parsed: DataFrame) -> DataFrame:
        """Parsed stats rows (:func:`pipelines.dataplane.transforms.parse.parse_broker_stats`) → the same rows with
        the ``silver/broker_stats`` suite applied to ``reject_reason`` and the parse's own reason in ``parse_reason``
        (:func:`pipelines.dataplane.quality.rules.enforce`); with ``[quality] enforce = false`` only ``parse_reason`` is
        added."""
        return self._enforced(parsed, tables.SILVER_BROKER_STATS)

    def enforce_failures(self, parsed: DataFrame) -> DataFrame:
        """As :meth:`enforce_stats`, for parsed send failures and the ``silver/send_failures`` suite."""
        return self._enforced(parsed, tables.SILVER_SEND_FAILURES)

    def _enforced(self, parsed: DataFrame, table: str) -> DataFrame:
        return parsed.transform(self._enforce[table] if self.q.enforce else rules.not_enforced)

    # --- ingest: after the batch is written

    def measure(self, batch_id: int, raw: DataFrame, stats: DataFrame, failures: DataFrame) -> dict[str, dict]:
        """The micro-batch's counts per source, in one Spark job (:meth:`Reconciler.measure`); arguments as for
        :meth:`after_ingest`."""
        return self.reconciler.measure(batch_id, raw, {BROKER_STATS: stats, SEND_FAILURES: failures})

    def after_ingest(self, batch_id: int, raw: DataFrame, stats: DataFrame, failures: DataFrame,
                     measured: dict[str, dict] | None = None) -> list[dict]:
        """GX validation (every Nth batch) and the reconciliation of ``batch_id``: ``raw`` is the micro-batch's
        RAW_RECORD rows, ``stats`` / ``failures`` the outputs of :meth:`enforce_stats` / :meth:`enforce_failures`,
        ``measured`` their :meth:`measure` when the caller has it (else measured here). Returns the reconciliation
        rows (also kept in :attr:`last_reconciliation`)."""
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        parsed = {BROKER_STATS: stats, SEND_FAILURES: failures}
        if measured is None:
            measured = self.reconciler.measure(batch_id, raw, parsed)
        n = self.q.validate_every_n_batches
        if n and batch_id % n == 0:
            counts = {table: measured[source]["candidates"] for table, source in (
                (tables.SILVER_BROKER_STATS, BROKER_STATS), (tables.SILVER_SEND_FAILURES, SEND_FAILURES))}
            self.validate_batch(batch_id, stats, failures, now, counts)
        self.last_reconciliation = self.reconciler.reconcile(batch_id, raw, parsed, now, measured)
        return self.last_reconciliation

    def validate_batch(self, batch_id: int, stats: DataFrame, failures: DataFrame, at: dt.datetime,
                       counts: dict[str, int] | None = None) -> list[tuple]:
        """GX validation of the candidate silver rows of ``batch_id`` (each non-empty input against its suite) at
        ``at`` (naive UTC); ``counts`` maps a silver table to its candidate rows when the caller knows them (else
        they are counted). Appends one row per expectation to ``quality/validation_results`` and GX's result per
        suite to ``quality/validation_runs`` (each append idempotent per ``batch_id``, written from the driver
        without a Spark job); returns the former rows."""
        rows: list[tuple] = []
        runs: list[tuple] = []
        for table, parsed, silver in (
            (tables.SILVER_BROKER_STATS, stats, parse.silver_broker_stats),
            (tables.SILVER_SEND_FAILURES, failures, parse_failures.silver_send_failures),
        ):
            data = rules.candidates(parsed, silver)
            count = counts[table] if counts is not None else data.count()
            if not count:
                continue
            result = self.validator.validate(table, data, count)
            rows += result_rows(batch_id, table, result, at)
            runs.append(data_docs.run_row(batch_id, table, result, at))
        if rows:
            self.lake.append_rows(rows, tables.QUALITY_VALIDATION_RESULTS, app_id=QUALITY_APP_ID, version=batch_id)
            self.lake.append_rows(runs, tables.QUALITY_VALIDATION_RUNS, app_id=QUALITY_APP_ID, version=batch_id)
            failed = [r[2] for r in rows if not r[3]]
            log.info("quality batch %d: %d expectations validated by GX, failed: %s", batch_id, len(rows), failed)
        return rows

    def watermark(self, batch_id: int) -> dt.datetime | None:
        """The gold query's watermark at the start of ``batch_id`` (:meth:`Reconciler.watermark`)."""
        return self.reconciler.watermark(batch_id)

    # --- gold
