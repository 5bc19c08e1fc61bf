"""GX expectations as Spark ``Column`` conditions: row-level enforcement of the suites at stream speed, no GX run.

:func:`row_condition` turns one expectation of a suite (:mod:`pipelines.dataplane.quality.suites`) into the condition a
row meets when it passes, with GX's null semantics; :func:`failed_expectation` gives the reason
``expectation failed: <expectation type>(<columns>)`` of the first expectation a row fails; :func:`enforce` applies a
table's suite to the parsed rows of the ingest query, so failing rows go to ``quarantine`` with that reason.

Example:
    >>> checked = parsed.transform(enforce(tables.SILVER_BROKER_STATS))
    >>> checked.where(F.col("reject_reason").startswith(REASON_PREFIX))
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import tables
from pipelines.dataplane.quality import data_docs
from pipelines.dataplane.quality.suites import SUITES

#: Start of the quarantine reason of a row rejected by an expectation (the parse's reasons never start with it).
REASON_PREFIX = "expectation failed: "

#: Column renames from the silver tables to the parsed DataFrames the ingest query enforces on.
PARSED_COLUMNS = {tables.SILVER_BROKER_STATS: {"cluster": "cluster_name"}, tables.SILVER_SEND_FAILURES: {}}


class UnsupportedExpectation(ValueError):
    """A suite holds an expectation type that :func:`row_condition` cannot turn into a row predicate."""


def _config(expectation) -> tuple[str, dict]:
    conf = expectation.configuration
    return conf.type, {k: v for k, v in conf.kwargs.items() if v is not None}


def expectation_name(expectation) -> str:
    """``expect_column_values_to_be_between(tps)``: the expectation type and its column(s)."""
    return data_docs.configuration_name(expectation.configuration)


def _between(col: Column, kw: dict) -> Column:
    cond = F.lit(True)
    if "min_value" in kw:
        cond = cond & ((col > kw["min_value"]) if kw.get("strict_min") else (col >= kw["min_value"]))
    if "max_value" in kw:
        cond = cond & ((col < kw["max_value"]) if kw.get("strict_max") else (col <= kw["max_value"]))
    return cond


def row_condition(expectation, rename: dict[str, str] | None = None) -> Column:
    """The Spark condition a row meets when it passes ``expectation`` (never null).

    GX semantics are kept: column-map expectations other than not-null ignore null values, pair expectations
    ignore rows where a value is missing. ``rename`` maps table columns to the DataFrame's column names.

    Raises:
        UnsupportedExpectation: the expectation type has no row predicate here.
    """
    kind, kw = _config(expectation)
    rename = rename or {}

    def col(key: str) -> Column:
        return F.col(rename.get(kw[key], kw[key]))

    if kind == "expect_column_values_to_not_be_null":
        return col("column").isNotNull()
    if kind == "expect_column_values_to_be_between":
        cond = _between(col("column"), kw)
    elif kind == "expect_column_values_to_be_in_set":
        cond = col("column").isin(list(kw["value_set"]))
    elif kind == "expect_column_values_to_not_be_in_set":
        cond = ~col("column").isin(list(kw["value_set"]))
    elif kind == "expect_column_values_to_match_regex":
        cond = col("column").rlike(kw["regex"])
    elif kind == "expect_column_values_to_not_match_regex":
        cond = ~col("column").rlike(kw["regex"])
    elif kind == "expect_column_value_lengths_to_be_between":
        cond = _between(F.length(col("column")), kw)
    elif kind == "expect_column_pair_values_a_to_be_greater_than_b":
        if kw.get("ignore_row_if") != "either_value_is_missing":
            raise UnsupportedExpectation(
                f"{kind} needs ignore_row_if='either_value_is_missing' (the only rule both GX engines and the row "
                "predicate apply alike)"
            )
        a, b = col("column_A"), col("column_B")
        cond = (a >= b) if kw.get("or_equal") else (a > b)
    else:
        raise UnsupportedExpectation(f"no row predicate for {kind}")
    return F.coalesce(cond, F.lit(True))


def failed_expectation(suite, rename: dict[str, str] | None = None) -> Column:
    """``expectation failed: <name>`` of the first expectation of ``suite`` the row fails, else null (a string
    ``Column``)."""
    return F.coalesce(
        *[
            F.when(~row_condition(e, rename), F.lit(REASON_PREFIX + expectation_name(e)))
            for e in suite.expectations
        ]
    )


def enforce(table: str, suite=None) -> Callable[[DataFrame], DataFrame]:
    """Parsed rows (with ``reject_reason``) → the same rows where parse-accepted rows failing an expectation of
    the table's suite get that expectation as ``reject_reason``; the parse's own reason is kept in
    ``parse_reason`` (string, null when the parse accepted the row)."""
    suite = suite if suite is not None else SUITES[table]()
    reason = failed_expectation(suite, PARSED_COLUMNS.get(table))

    def transform(parsed: DataFrame) -> DataFrame:
        return parsed.withColumn("parse_reason", F.col("reject_reason")).withColumn(
            "reject_reason", F.coalesce(F.col("reject_reason"), reason)
        )

    return transform


def not_enforced(parsed: DataFrame) -> DataFrame:
    """Parsed rows with ``parse_reason`` added as in :func:`enforce`, no expectation applied
    (``[quality] enforce = false``)."""
    return parsed.withColumn("parse_reason", F.col("reject_reason"))


def candidates(parsed: DataFrame, silver: Callable[[DataFrame], DataFrame]) -> DataFrame:
    """The rows the parse accepted (before expectations), in the silver table's shape: what GX validates."""
    return parsed.withColumn("reject_reason", F.col("parse_reason")).transform(silver)
