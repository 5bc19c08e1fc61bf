"""GX validation of DataFrames against the suites, with GX's pandas engine (small) or Spark engine (large).

:class:`Validator` holds one ephemeral GX context; :func:`shared_validator` is the process's one per setting.
:func:`result_rows` flattens a GX result into ``quality/validation_results`` rows
(:data:`pipelines.schemas.QUALITY_VALIDATION_RESULTS`); GX's whole result is stored by
:func:`pipelines.dataplane.quality.data_docs.run_row`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.config import DEFAULT_PANDAS_MAX_ROWS
from pipelines.dataplane.quality import data_docs
from pipelines.dataplane.quality.suites import SUITES


class Validator:
    """One ephemeral GX context (created once, reused for every validation) with two data sources, Spark and
    pandas, one dataframe asset per table in each, and the suites registered.

    A DataFrame of at most ``pandas_max_rows`` rows is validated by GX's pandas engine on the driver, a larger
    one by GX's Spark engine on the executors. Both run the same suites; the pandas engine is several times
    faster at micro-batch sizes because GX's Spark engine runs Spark jobs per metric (``bench/micro_batch_costs.py``;
    the figures are in docs/performance.md).
    """

    def __init__(self, pandas_max_rows: int = DEFAULT_PANDAS_MAX_ROWS) -> None:
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        logging.getLogger("great_expectations").setLevel(logging.WARNING)
        self.pandas_max_rows = pandas_max_rows
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        sources = {
            "spark": self.context.data_sources.add_spark(name="rate_governor"),
            "pandas": self.context.data_sources.add_pandas(name="rate_governor_pandas"),
        }
        self.batch_definitions = {}
        self.suites = {}
        for table, factory in SUITES.items():
            name = data_docs.gx_suite_name(table)
            for engine, source in sources.items():
                asset = source.add_dataframe_asset(name=name)
                self.batch_definitions[engine, table] = asset.add_batch_definition_whole_dataframe(name)
            self.suites[table] = self.context.suites.add(factory())

    def engine(self, rows: int) -> str:
        """``pandas`` for a DataFrame of ``rows`` rows up to ``pandas_max_rows``, else ``spark``."""
        return "pandas" if rows <= self.pandas_max_rows else "spark"

    def validate(self, table: str, df: DataFrame, rows: int | None = None):
        """GX validation of ``df`` against the table's suite: an ``ExpectationSuiteValidationResult``, not kept in
        the context (the caller stores it in the lake). ``rows`` is ``df``'s row count when the caller knows it
        (it picks the engine, :meth:`engine`).

        Raises:
            KeyError: ``table`` has no suite in :data:`pipelines.dataplane.quality.suites.SUITES`.
        """
        engine = self.engine(df.count() if rows is None else rows)
        data = spark_semantics_pandas(df) if engine == "pandas" else df
        batch = self.batch_definitions[engine, table].get_batch(batch_parameters={"dataframe": data})
        return batch.validate(self.suites[table])


def spark_semantics_pandas(df: DataFrame):
    """``df`` collected to the driver as a pandas DataFrame (through Arrow) that GX's pandas engine judges as
    GX's Spark engine judges ``df``.

    The one difference is NaN: Spark treats a floating-point NaN as a value that is not null and orders it
    above +infinity, while pandas calls NaN missing (so GX would skip it in range checks and count it under
    not-null). NaN becomes +infinity here, which fails every finite ``max_value`` and passes every
    ``min_value``, as in Spark; SQL nulls become pandas' missing values as usual.
    """
    floats = {f.name for f in df.schema.fields if isinstance(f.dataType, (T.DoubleType, T.FloatType))}
    columns = [
        F.when(F.isnan(F.col(name)), F.lit(float("inf"))).otherwise(F.col(name)).alias(name)
        if name in floats else F.col(name)
        for name in df.columns
    ]
    return df.select(*columns).toArrow().to_pandas()


_SHARED: dict[int, Validator] = {}


def shared_validator(pandas_max_rows: int = DEFAULT_PANDAS_MAX_ROWS) -> Validator:
    """The process's GX context for per-batch validation (creating a context and registering the suites
    costs seconds; every gate with the same settings reuses it)."""
    if pandas_max_rows not in _SHARED:
        _SHARED[pandas_max_rows] = Validator(pandas_max_rows)
    return _SHARED[pandas_max_rows]


def expectation_name_from_result(result) -> str:
    """The :func:`pipelines.dataplane.quality.rules.expectation_name` of one expectation's result in a GX validation
    result."""
    return data_docs.configuration_name(result.expectation_config)


def _observed(result: dict) -> str | None:
    value = result.get("observed_value")
    if value is None:
        return None
    return json.dumps(value, default=str)


def result_rows(batch_id: int, table: str, validation, at: dt.datetime) -> list[tuple]:
    """One ``quality/validation_results`` row per expectation of a GX validation result (tuples in the order of
    :data:`pipelines.schemas.QUALITY_VALIDATION_RESULTS`; ``at`` is naive UTC)."""
    rows = []
    for r in validation.results:
        res = r.result or {}
        unexpected = res.get("unexpected_count")
        rows.append(
            (
                batch_id,
                table,
                expectation_name_from_result(r),
                bool(r.success),
                res.get("element_count"),
                None if unexpected is None else int(unexpected),
                _observed(res),
                at,
            )
        )
    return rows
