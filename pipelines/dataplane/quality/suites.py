"""The data-quality rule set: one Great Expectations 1.x suite per checked table, the single source of truth.

:data:`SUITES` maps a table name (:mod:`pipelines.tables`) to a factory of its suite: ``silver/broker_stats``,
``silver/send_failures`` and ``gold/limits``. The same suites are enforced row by row as Spark conditions
(:mod:`pipelines.dataplane.quality.rules`) and validated by GX (:mod:`pipelines.dataplane.quality.validation`). The
allowed values come from :mod:`pipelines.rocketmq` (stat names, periods, name pattern and lengths of RocketMQ's
``TopicValidator``, failure classes) and docs/contracts.md §2 (the limit decisions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelines import rocketmq as rmq
from pipelines import tables
from pipelines.tables import sql_name

#: ``failure_class`` values of ``silver/send_failures``: the classes of the message patterns and of code 14.
FAILURE_CLASSES = sorted({*rmq.FAILURE_CLASSES, "SERVICE_NOT_AVAILABLE"})


def _gxe():
    import great_expectations.expectations as gxe

    return gxe


def silver_broker_stats_suite():
    """Expectations every ``silver/broker_stats`` row must meet."""
    import great_expectations as gx

    gxe = _gxe()
    return gx.ExpectationSuite(
        name=sql_name(tables.SILVER_BROKER_STATS),
        expectations=[
            gxe.ExpectColumnValuesToNotBeNull(column="event_time"),
            gxe.ExpectColumnValuesToNotBeNull(column="broker"),
            gxe.ExpectColumnValuesToBeInSet(column="stat_name", value_set=sorted(rmq.STAT_KEY_SHAPES)),
            gxe.ExpectColumnValuesToBeInSet(column="period", value_set=sorted(set(rmq.PERIODS.values()))),
            gxe.ExpectColumnValuesToBeBetween(column="sum", min_value=0),
            gxe.ExpectColumnValuesToBeBetween(column="tps", min_value=0, max_value=1e9),
            gxe.ExpectColumnValuesToBeBetween(column="avgpt", min_value=0, max_value=1e12),
            gxe.ExpectColumnValuesToBeBetween(column="value", min_value=0),
            gxe.ExpectColumnValuesToBeBetween(column="queue_id", min_value=0),
            gxe.ExpectColumnValuesToMatchRegex(column="topic", regex=rmq.NAME_PATTERN),
            gxe.ExpectColumnValueLengthsToBeBetween(column="topic", min_value=1, max_value=rmq.TOPIC_MAX_LENGTH),
            gxe.ExpectColumnValuesToMatchRegex(column="consumer_group", regex=rmq.NAME_PATTERN),
            gxe.ExpectColumnValueLengthsToBeBetween(
                column="consumer_group", min_value=1, max_value=rmq.GROUP_MAX_LENGTH
            ),
        ],
    )


def silver_send_failures_suite():
    """Expectations every ``silver/send_failures`` row must meet."""
    import great_expectations as gx

    gxe = _gxe()
    return gx.ExpectationSuite(
        name=sql_name(tables.SILVER_SEND_FAILURES),
        expectations=[
            gxe.ExpectColumnValuesToNotBeNull(column="event_time"),
            gxe.ExpectColumnValuesToNotBeNull(column="topic"),
            gxe.ExpectColumnValuesToMatchRegex(column="topic", regex=rmq.NAME_PATTERN),
            gxe.ExpectColumnValueLengthsToBeBetween(column="topic", min_value=1, max_value=rmq.TOPIC_MAX_LENGTH),
            gxe.ExpectColumnValuesToNotBeNull(column="failure_class"),
            gxe.ExpectColumnValuesToBeInSet(column="failure_class", value_set=FAILURE_CLASSES),
            gxe.ExpectColumnValuesToBeBetween(column="latency_ms", min_value=0, max_value=1e9),
        ],
    )


#: The ``gold/limits`` expectations (docs/contracts.md §2): (GX expectation type, its keyword arguments). Plain data,
#: so the decision plane applies them row by row without importing GX
#: (:func:`pipelines.decide.records.limit_rows.check`), and :func:`gold_limits_suite` builds the GX suite from the same
#: list.
GOLD_LIMITS_EXPECTATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("expect_column_values_to_not_be_null", {"column": "limit_qps"}),
    # strictly positive and finite: +inf and NaN are above any finite max_value
    ("expect_column_values_to_be_between", {"column": "limit_qps", "min_value": 0, "max_value": 1e12,
                                            "strict_min": True}),
    ("expect_column_values_to_not_be_null", {"column": "decided_at"}),
    ("expect_column_values_to_not_be_null", {"column": "expires_at"}),
    # a row missing either time is the not-null expectations' business (and GX's engines disagree on it by default:
    # Spark skips the row, pandas counts it), so both engines and the row predicate skip it
    ("expect_column_pair_values_a_to_be_greater_than_b", {"column_A": "expires_at", "column_B": "decided_at",
                                                          "ignore_row_if": "either_value_is_missing"}),
    ("expect_column_values_to_be_in_set", {"column": "resource_type", "value_set": ["topic", "group"]}),
    ("expect_column_values_to_be_in_set", {"column": "mode", "value_set": ["enforce", "advisory"]}),
    ("expect_column_values_to_be_in_set", {"column": "action", "value_set": ["set", "relax", "lift"]}),
    # override: a row an operator's override caused (pipelines/decide/paths/overrides.py)
    ("expect_column_values_to_be_in_set", {"column": "basis", "value_set": ["preliminary", "final", "override"]}),
    ("expect_column_values_to_not_be_null", {"column": "resource"}),
)


def _gx_class(kind: str):
    """``expect_column_values_to_not_be_null`` → GX's ``ExpectColumnValuesToNotBeNull``."""
    return getattr(_gxe(), "".join(part.capitalize() for part in kind.split("_")))


def gold_limits_suite():
    """Expectations every ``gold/limits`` decision must meet (:data:`GOLD_LIMITS_EXPECTATIONS`)."""
    import great_expectations as gx

    return gx.ExpectationSuite(
        name=sql_name(tables.GOLD_LIMITS),
        expectations=[_gx_class(kind)(**kwargs) for kind, kwargs in GOLD_LIMITS_EXPECTATIONS],
    )


#: table → suite factory (a fresh suite object per call: GX binds suites to one context).
SUITES: dict[str, Callable[[], Any]] = {
    tables.SILVER_BROKER_STATS: silver_broker_stats_suite,
    tables.SILVER_SEND_FAILURES: silver_send_failures_suite,
    tables.GOLD_LIMITS: gold_limits_suite,
}
