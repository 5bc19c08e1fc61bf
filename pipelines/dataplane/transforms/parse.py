"""Parsing of raw input records into silver rows or quarantine rows, with built-in Spark functions only.

Both transports (files and Kafka) yield :data:`pipelines.schemas.RAW_RECORD` rows; everything below is shared.
Every record ends either in silver (``reject_reason`` null) or in quarantine with the first failing check as its
reason (:mod:`pipelines.dataplane.transforms.checks`); nothing is dropped. This module parses broker statistics and
gives the quarantine rows of either parse; send failures are :mod:`pipelines.dataplane.transforms.parse_failures`.

Example:
    >>> parsed = raw.transform(parse_broker_stats(cfg.stats))
    >>> silver = parsed.transform(silver_broker_stats)
    >>> rejected = parsed.transform(quarantine_rows("broker_stats"))
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines import schemas
from pipelines.config import StatsConfig
from pipelines.dataplane.transforms.checks import (
    REPLACEMENT_CHAR, Check, first_reason, lit_map, not_utf8, time_checks, valid_name,
)
from pipelines.dataplane.transforms.types import Transform


#: ``<yyyy-MM-dd HH:mm:ss>[,SSS] <LEVEL> - [<name>] [<key>] Stats <period>, <detail>`` (logback pattern
#: ``%d{yyy-MM-dd HH:mm:ss,GMT+8} %p - %m%n``, docs/rocketmq-formats.md §1-2) in one regex whose groups give every
#: field: 1 timestamp (optional, so that a line without it is recognised and quarantined with its own reason), 2 stat
#: name, 3 key, 4 period, 5 detail (trimmed), 6-8 SUM/TPS/AVGPT (``SUM: %d TPS: %.2f AVGPT: %.2f``,
#: StatsItem.statPrintDetail), 9-10 TIMES/AVGRT (``TIMES: %d AVGRT: %.2f``, RTStatsItem, 4.7.1+; GROUP_GET_LATENCY
#: from 4.9.3), 11 Value (``Value: %d``, MomentStatsItem, ``Stats Every 5 Minutes``). The look-ahead keeps the rule
#: that the detail holds no line break (``.``), which the ``\s+`` of the alternatives would otherwise cross; a detail
#: matching no alternative is group 5 alone (``.*?``). tests/transforms/test_parse_one_regex.py checks it against the
#: same grammar written as four separate patterns.
STATS_LINE_GROUPS = (
    r"^(?:(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:,\d{1,3})?\s+)?(?:[A-Z]+\s+)?-\s+"
    r"\[([^\]]*)\]\s+\[([^\]]*)\]\s+Stats (In One Minute|In One Hour|In One Day|Every 5 Minutes),\s*(?=.*?\s*$)"
    r"((?:SUM:\s*(\S+)\s+TPS:\s*(\S+)\s+AVGPT:\s*(\S+)|TIMES:\s*(\S+)\s+AVGRT:\s*(\S+)|Value:\s*(\S+))|.*?)\s*$"
)
#: What a line matching :data:`STATS_LINE_GROUPS` is rewritten to (an unmatched group gives "").
MATCHED = "="
STATS_LINE_REWRITE = MATCHED + "$1]$2]$3]$4]$6 $7 $8 $9 $10 $11 $5"
STATS_TIME_FORMAT = "yyyy-MM-dd HH:mm:ss"


def settled(df: DataFrame) -> DataFrame:
    """The same rows and columns, each column computed once per row before any later filter (an optimizer barrier).

    Spark's optimizer pushes a filter on a computed column (``reject_reason IS NULL`` in :func:`silver_broker_stats`)
    below the projection that computes it by substituting the column's expression; with the parse's chained
    aliases the filter of a stats line then holds 263 ``regexp_extract`` calls instead of 24, and silver rows cost
    several times more to produce (measured: docs/performance-history.md). A one-row ``inline`` (a Generate node) is not
    something filters are pushed through, so everything above it reads the computed columns.
    """
    return df.select(F.inline(F.array(F.struct(*[F.col(c) for c in df.columns]))))


# --- broker statistics -----------------------------------------------------------------------------------------


def unwrap_envelopes(df: DataFrame) -> DataFrame:
    """Take the stats line and broker out of JSON envelopes; raw lines keep the folder-name broker.

    Input: :data:`~pipelines.schemas.RAW_RECORD`. Output adds ``line``, ``broker``, ``cluster`` (strings) and
    ``envelope_reason`` (null, or why the envelope is unusable). A record is an envelope when it starts with ``{``
    (docs/contracts.md §1.1); unknown extra envelope fields are ignored.
    """
    is_envelope = F.ltrim(F.col("raw")).startswith("{")
    env = F.from_json(
        F.col("raw"),
        schemas.STATS_ENVELOPE,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"},
    )
    with_env = df.withColumn("_env", F.when(is_envelope, env))
    reason = first_reason(
        Check(is_envelope & F.col("_env._corrupt_record").isNotNull(), "envelope is not valid JSON"),
        Check(is_envelope & F.col("_env.line").isNull(), "envelope missing field: line"),
        Check(is_envelope & F.col("_env.broker").isNull(), "envelope missing field: broker"),
    )
    return with_env.select(
        *df.columns,
        F.when(is_envelope, F.col("_env.line")).otherwise(F.col("raw")).alias("line"),
        F.when(is_envelope, F.col("_env.broker")).otherwise(F.col("broker_hint")).alias("broker"),
        F.when(is_envelope, F.col("_env.cluster")).alias("cluster"),
        reason.alias("envelope_reason"),
    )


def _key_shape_columns(stat_name: Column, stats_key: Column) -> dict[str, Column]:
    """Split a stats key by ``@`` according to the shapes its stats name allows (docs/rocketmq-formats.md §3)."""
    shape_by_stat_and_parts = {
        f"{stat}#{len(rmq.KEY_SHAPES[shape])}": shape
        for stat, shapes in rmq.STAT_KEY_SHAPES.items()
        for shape in shapes
    }
    parts = F.split(stats_key, "@")
    shape = F.try_element_at(
        lit_map(shape_by_stat_and_parts), F.concat_ws("#", stat_name, F.size(parts).cast("string"))
    )

    def part(role: str) -> Column:
        positions = {name: roles.index(role) + 1 for name, roles in rmq.KEY_SHAPES.items() if role in roles}
        return F.try_element_at(parts, F.try_element_at(lit_map(positions), shape))

    return {
        "key_shape": shape,
        "key_parts": F.size(parts),
        "topic": part("topic"),
        "consumer_group": part("group"),
        "queue_raw": part("queue"),
        "cluster_key": part("cluster"),
    }


def parse_stats_lines(cfg: StatsConfig) -> Transform:
    """Parse ``line`` (a stats.log line) into the silver columns and a ``reject_reason``.

    Input: the output of :func:`unwrap_envelopes`. Output adds the columns of
    :data:`~pipelines.schemas.SILVER_BROKER_STATS` plus ``reject_reason``. ``event_time`` is UTC, converted from
    ``cfg.timezone`` (RocketMQ renders GMT+8 whatever the host zone). ``TPS: NaN`` (a window with one snapshot,
    docs/rocketmq-formats.md §2) becomes a null ``tps`` with its SUM kept; ``TIMES/AVGRT`` lines put TIMES in ``value``
    and AVGRT (the item's avgpt, in ms) in ``avgpt``; ``Every 5 Minutes`` lines put their value in ``value``.
    """

    def transform(df: DataFrame) -> DataFrame:
        parsed = df.transform(split_stats_line).transform(typed_stats_fields(cfg.timezone))
        return parsed.select(
            "*",
            F.when(F.isnan("tps_num"), F.lit(None)).otherwise(F.col("tps_num")).alias("tps"),
            F.coalesce(F.col("cluster"), F.col("cluster_key")).alias("cluster_name"),
            stats_reject_reason(cfg).alias("reject_reason"),
        )

    return transform


def split_stats_line(df: DataFrame) -> DataFrame:
    """The fields of ``line`` as text, with one regex evaluation per line (:data:`STATS_LINE_GROUPS`).

    Output adds, as strings, null where the line has no such field (and all null, ``stats_key`` and ``detail``
    "", for a line that is not a stats line): ``ts_text`` (the local timestamp), ``stat_name``, ``stats_key``,
    ``period`` (the ``Stats`` period's name in :data:`pipelines.rocketmq.PERIODS`), ``detail``, ``sum_text``,
    ``tps_text``, ``avgpt_text`` (AVGPT or AVGRT) and ``value_text`` (TIMES or Value).
    """
    line = F.col("line")
    # STATS_LINE_GROUPS rewrites a matching line into its groups, "]"-separated (the timestamp, stat name, key and
    # period cannot hold "]"), then the six number groups, " "-separated (\S+ cannot hold " "), then the detail, which
    # may hold anything and comes last. A line the regex does not match is left as it is; it cannot start with
    # MATCHED (the regex needs a digit, A-Z or "-" first).
    # Each helper column is its own projection: the optimizer inlines a column into the next projection only
    # when it is used once there, so the regex and the two splits run once per line.
    rewritten = df.select("*", F.regexp_replace(line, STATS_LINE_GROUPS, STATS_LINE_REWRITE).alias("_rewritten"))
    matched = F.col("_rewritten").startswith(MATCHED) & ~line.startswith(MATCHED)
    split_head = F.split(F.substr(F.col("_rewritten"), F.lit(len(MATCHED) + 1)), "]", 5)
    with_head = rewritten.select(*df.columns, F.when(matched, split_head).alias("_head"))
    grouped = with_head.select("*", F.split(F.element_at("_head", 5), " ", 7).alias("_tail"))
    head, tail = F.col("_head"), F.col("_tail")

    def group(parts: Column, i: int) -> Column:
        return F.nullif(F.element_at(parts, i), F.lit(""))

    return grouped.select(
        *df.columns,
        group(head, 1).alias("ts_text"),
        group(head, 2).alias("stat_name"),
        F.coalesce(F.element_at(head, 3), F.lit("")).alias("stats_key"),
        F.try_element_at(lit_map(rmq.PERIODS), group(head, 4)).alias("period"),
        F.coalesce(F.element_at(tail, 7), F.lit("")).alias("detail"),
        group(tail, 1).alias("sum_text"),
        group(tail, 2).alias("tps_text"),
        F.coalesce(group(tail, 3), group(tail, 5)).alias("avgpt_text"),
        F.coalesce(group(tail, 4), group(tail, 6)).alias("value_text"),
    )


def typed_stats_fields(timezone: str) -> Transform:
    """The text fields of :func:`split_stats_line` as values; null where a text is absent or not a number.

    Output adds ``event_time`` (timestamp, UTC, from ``ts_text`` read in ``timezone``), ``sum`` (long), ``tps_num``
    (double, NaN kept), ``avgpt`` (double, ms), ``value`` (long), the key's parts (:func:`_key_shape_columns`:
    ``key_shape``, ``key_parts``, ``topic``, ``consumer_group``, ``queue_raw``, ``cluster_key``) and ``queue_id``
    (int).
    """

    def transform(split: DataFrame) -> DataFrame:
        local_time = F.try_to_timestamp(F.col("ts_text"), F.lit(STATS_TIME_FORMAT))
        key = _key_shape_columns(F.col("stat_name"), F.col("stats_key"))
        return split.select(
            "*",
            F.to_utc_timestamp(local_time, timezone).alias("event_time"),
            F.col("sum_text").try_cast("long").alias("sum"),
            F.col("tps_text").try_cast("double").alias("tps_num"),
            F.col("avgpt_text").try_cast("double").alias("avgpt"),
            F.col("value_text").try_cast("long").alias("value"),
            *[col.alias(name) for name, col in key.items()],
        ).withColumn("queue_id", F.col("queue_raw").try_cast("int"))

    return transform


def stats_reject_reason(cfg: StatsConfig) -> Column:
    """Why a record of :func:`typed_stats_fields` is quarantined: the reason of its first failing check, in this
    order: the record (:func:`_record_checks`), the line's grammar (:func:`_line_checks`), its numbers
    (:func:`_number_checks`), its key's names (:func:`_name_checks`), its event time
    (:func:`pipelines.dataplane.transforms.checks.time_checks`); null for a record that passes them all."""
    return first_reason(
        *_record_checks(cfg),
        *_line_checks(),
        *_number_checks(),
        *_name_checks(),
        *time_checks(F.col("event_time"), F.col("ingested_at"), cfg),
    )


def _record_checks(cfg: StatsConfig) -> list[Check]:
    """The record as it came: a usable envelope, a line (not empty, at most ``cfg.max_line_chars`` characters,
    valid UTF-8) and a broker name (valid UTF-8, not empty)."""
    return [
        Check(F.col("envelope_reason").isNotNull(), F.col("envelope_reason")),
        Check(F.col("line").isNull() | (F.trim(F.col("line")) == ""), "empty line"),
        Check(F.length("line") > cfg.max_line_chars, f"line longer than {cfg.max_line_chars} characters"),
        Check(not_utf8(F.col("raw")) | F.col("line").contains(REPLACEMENT_CHAR), "line is not valid UTF-8"),
        # a folder name or Kafka key with invalid bytes (the sources replaced them with U+FFFD)
        Check(not_utf8(F.col("broker")), "broker name is not valid UTF-8"),
        Check(F.col("broker").isNull() | (F.col("broker") == ""), "no broker: not in a broker folder or envelope"),
    ]


def _line_checks() -> list[Check]:
    """The line's grammar (docs/rocketmq-formats.md §1-3): a stats line, with a valid timestamp, a known stat name,
    a detail of a known form and a key of a shape its stat name allows."""
    is_line = F.col("stat_name").isNotNull()
    known_stat = F.try_element_at(
        lit_map({name: True for name in rmq.STAT_KEY_SHAPES}), F.col("stat_name")
    ).isNotNull()
    has_detail = F.col("sum_text").isNotNull() | F.col("value_text").isNotNull()
    return [
        Check(~is_line, "not a stats.log line"),
        Check(F.col("ts_text").isNull(), "missing timestamp prefix"),
        Check(F.col("event_time").isNull(), "invalid timestamp"),
        Check(~known_stat, F.concat(F.lit("unknown stat name: "), F.col("stat_name"))),
        Check(~has_detail, "stats detail cut or unrecognised (expected SUM/TPS/AVGPT, TIMES/AVGRT or Value)"),
        Check(
            F.col("key_shape").isNull(),
            F.format_string(
                "key '%s' has %d '@'-separated parts, not a shape of %s",
                F.col("stats_key"),
                F.col("key_parts"),
                F.col("stat_name"),
            ),
        ),
    ]


def _number_checks() -> list[Check]:
    """The detail's numbers: each present one a number (a decimal point, not a comma), TPS finite, none negative."""
    return [
        Check(F.col("sum_text").isNotNull() & F.col("sum").isNull(), "non-numeric SUM"),
        Check(F.col("value_text").isNotNull() & F.col("value").isNull(), "non-numeric TIMES or Value"),
        Check(F.col("tps_text").contains(",") | F.col("avgpt_text").contains(","), "decimal comma in TPS or AVGPT"),
        Check(F.col("tps_text").isNotNull() & F.col("tps_num").isNull(), "non-numeric TPS"),
        Check(F.col("avgpt_text").isNotNull() & F.col("avgpt").isNull(), "non-numeric AVGPT"),
        Check(F.col("tps_num").isin(float("inf"), float("-inf")), "non-finite TPS"),
        Check((F.col("sum") < 0) | (F.col("tps_num") < 0) | (F.col("value") < 0), "negative SUM, TPS or value"),
    ]


def _name_checks() -> list[Check]:
    """The key's parts: a valid topic and consumer group name
    (:func:`~pipelines.dataplane.transforms.checks.valid_name`) and a numeric queue id, where the key has them."""
    return [
        Check(
            F.col("topic").isNotNull() & ~valid_name(F.col("topic"), rmq.TOPIC_MAX_LENGTH),
            F.concat(F.lit("invalid topic name: "), F.col("topic")),
        ),
        Check(
            F.col("consumer_group").isNotNull() & ~valid_name(F.col("consumer_group"), rmq.GROUP_MAX_LENGTH),
            F.concat(F.lit("invalid consumer group name: "), F.col("consumer_group")),
        ),
        Check(F.col("queue_raw").isNotNull() & F.col("queue_id").isNull(), "non-numeric queue id"),
    ]


def parse_broker_stats(cfg: StatsConfig) -> Transform:
    """RAW_RECORD rows of ``broker_stats`` → parsed rows with ``reject_reason`` (see :func:`parse_stats_lines`)."""

    def transform(raw: DataFrame) -> DataFrame:
        return raw.transform(unwrap_envelopes).transform(parse_stats_lines(cfg))

    return transform


def silver_broker_stats(parsed: DataFrame) -> DataFrame:
    """Accepted rows of :func:`parse_broker_stats` in the shape of ``silver/broker_stats``."""
    accepted = parsed.where(F.col("reject_reason").isNull())
    return accepted.select(
        F.col("event_time"),
        F.col("broker"),
        F.col("cluster_name").alias("cluster"),
        F.col("stat_name"),
        F.col("period"),
        F.col("stats_key"),
        F.col("topic"),
        F.col("consumer_group"),
        F.col("queue_id"),
        F.col("sum"),
        F.col("tps"),
        F.col("avgpt"),
        F.col("value"),
        F.col("origin"),
        F.col("ingested_at"),
    )


# --- quarantine ------------------------------------------------------------------------------------------------


def quarantine_rows(source: str) -> Transform:
    """Rejected rows of a parse, in the shape of the ``quarantine`` table (``source`` is the input's name;
    ``raw`` and ``raw_bytes`` as the source gave them)."""

    def transform(parsed: DataFrame) -> DataFrame:
        rejected = parsed.where(F.col("reject_reason").isNotNull())
        return rejected.select(
            F.lit(source).alias("source"),
            F.col("raw"),
            F.col("raw_bytes"),
            F.col("reject_reason").alias("reason"),
            F.col("origin"),
            F.col("ingested_at"),
        )

    return transform
