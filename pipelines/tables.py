"""The names of the lake's Delta tables: their paths under the lake root (docs/contracts.md §2).

Plain constants with no Spark import, so that Spark-free code (the Data Docs builder, the control plane's tools)
can name a table too. The registry of schemas and time columns is :data:`pipelines.dataplane.lake.registry.TABLES`,
keyed by these; every module names a table through these constants, never a literal.
"""

from __future__ import annotations

BRONZE_BROKER_STATS = "bronze/broker_stats"
BRONZE_SEND_FAILURES = "bronze/send_failures"
SILVER_BROKER_STATS = "silver/broker_stats"
SILVER_SEND_FAILURES = "silver/send_failures"
QUARANTINE = "quarantine"
GOLD_TOPIC_TPS = "gold/topic_tps"
GOLD_GROUP_TPS = "gold/group_tps"
GOLD_BROKER_TPS = "gold/broker_tps"
GOLD_ANOMALIES = "gold/anomalies"
GOLD_LIMITS = "gold/limits"
STATE_POLICY = "state/policy"
BACKTEST_RESULTS = "backtest/results"
#: Data quality (:mod:`pipelines.dataplane.quality`): one row per expectation per GX validation of a micro-batch.
QUALITY_VALIDATION_RESULTS = "quality/validation_results"
#: Data quality: GX's whole result per suite validation (what the Data Docs render).
QUALITY_VALIDATION_RUNS = "quality/validation_runs"
#: Data quality: per ingest micro-batch and input, records read = silver + late + quarantine rows.
QUALITY_RECONCILIATION = "quality/reconciliation"
#: The write-back sinks' outcome per publish (:class:`pipelines.writeback.sinks.SinkSet`).
CONTROL_SINK_STATUS = "control/sink_status"
#: When each in-broker limiter last rejected a send, as the RocketMQ admin sink's views report it (demand evidence
#: of a limited resource, :mod:`pipelines.decide.rules.evidence`).
CONTROL_LIMITER_REJECTIONS = "control/limiter_rejections"
#: Operators' overrides (pin, exempt, release), append-only: creation and release are rows
#: (:mod:`pipelines.decide.paths.overrides`, written by :mod:`pipelines.ops.override`).
CONTROL_OVERRIDES = "control/overrides"


def sql_name(table: str) -> str:
    """The name a table has in SQL over the lake (:func:`pipelines.ops.query.run_sql`): its path with ``/`` replaced by
    ``_``, e.g. ``gold_limits`` for :data:`GOLD_LIMITS`."""
    return table.replace("/", "_")
