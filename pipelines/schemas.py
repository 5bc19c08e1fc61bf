"""Spark schemas of every DataFrame that crosses a module boundary and of every Delta table (docs/contracts.md §2),
built from their one definition in :mod:`pipelines.columns` (each schema's columns are documented there).

Times are ``TimestampType`` in UTC (the Spark session time zone is UTC). TPS columns are messages per second.

Text: every string column of every table holds valid UTF-8 (Arrow, Parquet readers and pandas refuse anything
else). An input record's exact bytes are kept beside its text in the binary column ``raw_bytes`` (``RAW_RECORD``,
``BRONZE``, ``QUARANTINE``); its ``raw`` is those bytes decoded as UTF-8 with every invalid sequence replaced by
U+FFFD (Spark's ``make_valid_utf8``, the same text as Python's ``raw_bytes.decode("utf-8", "replace")``). A record
whose ``raw`` differs from its bytes is quarantined (``line is not valid UTF-8``), so every other column, derived
from accepted records, holds text that was valid in the input.
"""

from __future__ import annotations

from pyspark.sql import types as T

from pipelines import columns
from pipelines.columns import RESOURCE_KEYS  # noqa: F401 (the key of a limited resource, importable from here)

_SIMPLE = {"string": T.StringType(), "long": T.LongType(), "int": T.IntegerType(), "double": T.DoubleType(),
           "boolean": T.BooleanType(), "binary": T.BinaryType(), "timestamp": T.TimestampType()}


def spark_type(name: str) -> T.DataType:
    """A :mod:`pipelines.columns` type name → Spark's type (``map<k,v>`` and ``array<x>`` of simple types)."""
    if name.startswith("map<"):
        key, value = name[4:-1].split(",")
        return T.MapType(_SIMPLE[key], _SIMPLE[value])
    if name.startswith("array<"):
        return T.ArrayType(_SIMPLE[name[6:-1]])
    return _SIMPLE[name]


def struct(spec: columns.Spec) -> T.StructType:
    """A :mod:`pipelines.columns` spec → a ``StructType`` of nullable fields."""
    return T.StructType([T.StructField(name, spark_type(kind), nullable=True) for name, kind in spec])


FAILURES_BY_CLASS = spark_type(columns.FAILURES_BY_CLASS)
BROKER_FIGURES = spark_type(columns.BROKER_FIGURES)
BACKTEST_RESULTS = struct(columns.BACKTEST_RESULTS)
BROKER_MODEL_OFFERED = struct(columns.BROKER_MODEL_OFFERED)
BROKER_MODEL_RESULT = struct(columns.BROKER_MODEL_RESULT)
BRONZE = struct(columns.BRONZE)
GOLD_ANOMALIES = struct(columns.GOLD_ANOMALIES)
GOLD_BROKER_TPS = struct(columns.GOLD_BROKER_TPS)
GOLD_GROUP_TPS = struct(columns.GOLD_GROUP_TPS)
GOLD_LIMITS = struct(columns.GOLD_LIMITS)
GOLD_TOPIC_TPS = struct(columns.GOLD_TOPIC_TPS)
LIMITER_REJECTIONS = struct(columns.LIMITER_REJECTIONS)
METRIC_EVENT = struct(columns.METRIC_EVENT)
OVERRIDES = struct(columns.OVERRIDES)
POLICY_STATE = struct(columns.POLICY_STATE)
QUALITY_RECONCILIATION = struct(columns.QUALITY_RECONCILIATION)
QUALITY_VALIDATION_RESULTS = struct(columns.QUALITY_VALIDATION_RESULTS)
QUALITY_VALIDATION_RUNS = struct(columns.QUALITY_VALIDATION_RUNS)
QUARANTINE = struct(columns.QUARANTINE)
RAW_RECORD = struct(columns.RAW_RECORD)
SEND_FAILURE_JSON = struct(columns.SEND_FAILURE_JSON)
SILVER_BROKER_STATS = struct(columns.SILVER_BROKER_STATS)
SILVER_SEND_FAILURES = struct(columns.SILVER_SEND_FAILURES)
SINK_STATUS = struct(columns.SINK_STATUS)
STATS_ENVELOPE = struct(columns.STATS_ENVELOPE)
WINDOW_METRIC = struct(columns.WINDOW_METRIC)
WINDOW_TRAFFIC = struct(columns.WINDOW_TRAFFIC)
