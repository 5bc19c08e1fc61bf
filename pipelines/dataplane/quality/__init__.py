"""Data quality: one rule set (Great Expectations 1.x suites), enforced per row at stream speed, validated by GX,
reconciled per micro-batch and shown as GX Data Docs.

* :mod:`~pipelines.dataplane.quality.suites`: the GX expectation suites (``SUITES``), the single source of truth.
* :mod:`~pipelines.dataplane.quality.rules`: each expectation as a Spark ``Column`` condition; failing rows go to
  ``quarantine`` with the reason ``expectation failed: <expectation type>(<columns>)``.
* :mod:`~pipelines.dataplane.quality.validation`: GX itself validates the candidate silver rows (pandas engine for small
  micro-batches, Spark engine for large ones); one row per expectation for ``quality/validation_results``.
* :mod:`~pipelines.dataplane.quality.reconcile`: ``records_read = silver_rows + late_rows + quarantine_rows`` per
  micro-batch and source (``quality/reconciliation``), late rows judged against the gold query's watermark.
* :mod:`~pipelines.dataplane.quality.gate`: :class:`~pipelines.dataplane.quality.gate.QualityGate`, what the streaming
  flows call.
* :mod:`~pipelines.dataplane.quality.data_docs` and :mod:`~pipelines.dataplane.quality.cli`: GX Data Docs of the stored
  results, ``python -m pipelines.dataplane.quality docs --lake LAKE [--out DIR] [--last N]`` (no Spark).
"""
