"""Column checks shared by the parses of both inputs (:mod:`pipelines.dataplane.transforms.parse`,
:mod:`pipelines.dataplane.transforms.parse_failures`): the reason of the first failing check, invalid UTF-8, RocketMQ
names, event-time bounds, and two column helpers. Built-in Spark functions only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.config import StatsConfig

#: U+FFFD, what a decoder upstream (e.g. a log shipper) puts in place of invalid UTF-8 bytes.
REPLACEMENT_CHAR = "\ufffd"


def lit_map(mapping: Mapping[str, object]) -> Column:
    """A literal map column of ``mapping`` (for ``try_element_at`` look-ups)."""
    return F.create_map(*[F.lit(item) for pair in mapping.items() for item in pair])


def extract(column: Column, pattern: str, group: int) -> Column:
    """``regexp_extract`` that yields null instead of "" when the pattern or group does not match."""
    return F.nullif(F.regexp_extract(column, pattern, group), F.lit(""))


@dataclass(frozen=True, eq=False)
class Check:
    """One quarantine check of a parse: a record for which ``condition`` (a boolean column) is true is rejected with
    ``reason`` (a sentence, or a string column that names the offending value)."""

    condition: Column
    reason: Column | str


def first_reason(*checks: Check) -> Column:
    """The reason of the first check whose condition is true, else null. Conditions that are null count as false."""
    return F.coalesce(
        *[F.when(c.condition, c.reason if isinstance(c.reason, Column) else F.lit(c.reason)) for c in checks]
    )


def not_utf8(text: Column) -> Column:
    """True when ``text`` holds invalid UTF-8 bytes or U+FFFD. The sources turn invalid bytes into U+FFFD
    (:func:`pipelines.dataplane.sources.record_text`, the exact bytes stay in ``raw_bytes``), as a decoder upstream (a
    log shipper) does; ``is_valid_utf8`` catches text that reached a RAW_RECORD some other way."""
    return ~F.is_valid_utf8(text) | text.contains(REPLACEMENT_CHAR)


def valid_name(name: Column, max_length: int) -> Column:
    """True when ``name`` is a valid RocketMQ topic or group name (``TopicValidator``'s pattern) of at most
    ``max_length`` characters."""
    return name.rlike(rmq.NAME_PATTERN) & (F.length(name) <= max_length)


def time_checks(event_time: Column, ingested_at: Column, cfg: StatsConfig) -> list[Check]:
    """The checks of an event time against its ingestion time: more than ``cfg.max_future_seconds`` ahead, or (when
    ``cfg.max_age_days``) more than that many days behind."""
    checks = [
        Check(
            event_time > ingested_at + F.make_dt_interval(secs=F.lit(cfg.max_future_seconds)),
            f"event time more than {cfg.max_future_seconds} s after ingestion",
        )
    ]
    if cfg.max_age_days:
        checks.append(
            Check(
                event_time < ingested_at - F.make_dt_interval(days=F.lit(cfg.max_age_days)),
                f"event time more than {cfg.max_age_days} days before ingestion",
            )
        )
    return checks
