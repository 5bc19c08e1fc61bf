"""Parsing of ``send_failures`` records (JSON lines, docs/contracts.md §1.2) into silver rows or quarantine rows, with
built-in Spark functions only; the quarantine rows come from
:func:`pipelines.dataplane.transforms.parse.quarantine_rows`.

Example:
    >>> parsed = raw.transform(parse_send_failures(cfg.stats, cfg.brokers))
    >>> silver = parsed.transform(silver_send_failures)
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines import schemas
from pipelines.config import BrokersConfig, StatsConfig
from pipelines.dataplane.transforms.checks import (
    Check, extract, first_reason, lit_map, not_utf8, time_checks, valid_name,
)
from pipelines.dataplane.transforms.types import Transform

def classify_failure(message: Column, code: Column) -> Column:
    """``failure_class`` of a failed send: the first pattern of :data:`pipelines.rocketmq.FAILURE_PATTERNS` found
    in the message, else ``SERVICE_NOT_AVAILABLE`` for code 14, else ``OTHER`` (docs/contracts.md §1.2)."""
    text = F.coalesce(message, F.lit(""))
    result = F.when(code == rmq.SERVICE_NOT_AVAILABLE_CODE, F.lit("SERVICE_NOT_AVAILABLE")).otherwise(
        F.lit(rmq.OTHER_FAILURE)
    )
    for name, pattern in reversed(rmq.FAILURE_PATTERNS):
        result = F.when(text.rlike(pattern), F.lit(name)).otherwise(result)
    return result


def parse_send_failures(stats_cfg: StatsConfig, brokers: BrokersConfig) -> Transform:
    """RAW_RECORD rows of ``send_failures`` (JSON lines) → parsed rows with ``reject_reason``.

    ``ts`` is epoch milliseconds or an ISO-8601 string (UTC unless it carries an offset). A null ``code`` is read
    from the message (Java ``CODE: 2  DESC:``, Go ``CODE: 2, DESC:``, docs/rocketmq-formats.md §6-7). ``broker`` given
    as ``ip:port`` is mapped to a broker name through ``brokers.addresses`` when listed. Output adds the columns of
    :data:`~pipelines.schemas.SILVER_SEND_FAILURES` plus ``reject_reason``.
    """

    def transform(raw: DataFrame) -> DataFrame:
        j = F.from_json(
            F.col("raw"),
            schemas.SEND_FAILURE_JSON,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"},
        )
        step = raw.select("*", j.alias("j"))
        ts = F.col("j.ts")
        is_epoch = ts.rlike(r"^-?\d+(\.\d+)?$")
        event_time = F.when(is_epoch, F.timestamp_millis(ts.try_cast("double").cast("long"))).otherwise(
            ts.try_cast("timestamp")
        )
        code = F.coalesce(F.col("j.code"), extract(F.col("j.message"), rmq.CODE_IN_MESSAGE, 1).try_cast("int"))
        broker_raw = F.col("j.broker")
        broker = (
            F.coalesce(F.try_element_at(lit_map(brokers.addresses), broker_raw), broker_raw)
            if brokers.addresses
            else broker_raw
        )
        parsed = step.select(
            "*",
            event_time.alias("event_time"),
            F.col("j.topic").alias("topic"),
            broker.alias("broker"),
            F.col("j.producer_group").alias("producer_group"),
            F.col("j.client").alias("client"),
            code.alias("code"),
            F.col("j.message").alias("message"),
            F.col("j.latency_ms").alias("latency_ms"),
        )
        corrupt = F.col("j._corrupt_record").isNotNull()
        reason = first_reason(
            Check(F.col("raw").isNull() | (F.trim(F.col("raw")) == ""), "empty line"),
            Check(not_utf8(F.col("raw")), "line is not valid UTF-8"),
            Check(corrupt & ~F.ltrim(F.col("raw")).startswith("{"), "not a JSON object"),
            Check(corrupt, "malformed JSON or a field of the wrong type (e.g. code as a string)"),
            Check(ts.isNull(), "missing field: ts"),
            Check(F.col("event_time").isNull(), "ts is neither epoch milliseconds nor an ISO-8601 date"),
            Check(F.col("topic").isNull(), "missing field: topic"),
            Check(
                ~valid_name(F.col("topic"), rmq.TOPIC_MAX_LENGTH),
                F.concat(F.lit("invalid topic name: "), F.col("topic")),
            ),
            Check(F.col("latency_ms") < 0, "negative latency_ms"),
            *time_checks(F.col("event_time"), F.col("ingested_at"), stats_cfg),
        )
        return parsed.select(
            "*",
            classify_failure(F.col("message"), F.col("code")).alias("failure_class"),
            reason.alias("reject_reason"),
        )

    return transform


def silver_send_failures(parsed: DataFrame) -> DataFrame:
    """Accepted rows of :func:`parse_send_failures` in the shape of ``silver/send_failures``."""
    accepted = parsed.where(F.col("reject_reason").isNull())
    return accepted.select(*[F.col(field.name) for field in schemas.SILVER_SEND_FAILURES.fields])
