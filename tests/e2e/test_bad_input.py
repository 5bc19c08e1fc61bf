"""The catalogue of bad input: each item ends in quarantine with a reason (or, for late data, is counted as late),
never crashes the stream and is never silently dropped.

Items already covered by tests/transforms/test_parse.py (not repeated here): empty line; line cut mid-way
(``not a stats.log line``, ``stats detail cut …``); unknown stat name; key with the wrong number of ``@`` parts;
non-numeric SUM; negative SUM; ``TPS: Infinity``; decimal comma; timestamp far in the future; missing timestamp
prefix; invalid topic name (characters); envelope missing line; envelope not JSON; send failure with ``ts`` as
non-date text; ``code`` as a string. Expectation-level rejects (negative AVGPT, negative queue id, AVGPT out of
range) and late rows in the reconciliation: tests/quality/test_quality.py. Here: the missing items, then all of them
together through the streaming job on one mixed landing directory, with input that is not valid UTF-8 (bytes from
Latin-1, a cut multi-byte character, 0xFF inside JSON fields, JSON escapes of a lone surrogate and NUL): afterwards
every table of the lake reads with pyarrow (full validation), pandas, Spark and SQL, and bronze and quarantine keep
each record's exact bytes in ``raw_bytes``.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from pipelines import governor
from pipelines.dataplane.transforms import parse
from pipelines.dataplane import sources
from pipelines import tables
from pipelines.config import StatsConfig, parse_config
from pipelines.dataplane.lake import TABLES, open_lake
from tests.helpers import assert_every_table_readable, raw_records, stats_line

OK = "SUM: 600 TPS: 10.00 AVGPT: 1.00"
LONG_TOPIC = "t" * 128
INVALID_UTF8 = b"2022-02-08 18:01:00 INFO - [TOPIC_PUT_NUMS] [ord\xff\xfeers] Stats In One Minute, SUM: 60 TPS: 1.00 AVGPT: 1.00"


def _reasons(spark, lines, broker_hint="broker-a"):
    parsed = raw_records(spark, "broker_stats", lines, broker_hint).transform(parse.parse_broker_stats(StatsConfig()))
    return [r["reason"] for r in parsed.transform(parse.quarantine_rows("broker_stats")).collect()]


@pytest.mark.parametrize(
    "line, reason",
    [
        (stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: -0.08 AVGPT: 1.00"),
         "negative SUM, TPS or value"),
        (stats_line("1990-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", OK), "event time more than 3650 days before ingestion"),
        (stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", LONG_TOPIC, OK), f"invalid topic name: {LONG_TOPIC}"),
        (stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", OK) + " " + "x" * 100_000,
         "line longer than 4096 characters"),
        ('{"line": "%s"}' % stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", OK),
         "envelope missing field: broker"),
        ("2022-02-08 15:40:00 INFO - [TOPIC_PUT_NU", "not a stats.log line"),
    ],
    ids=["negative-tps", "far-past", "topic-128-chars", "100kb-line", "envelope-no-broker", "cut-in-name"],
)
def test_missing_catalogue_items_are_quarantined(spark, line, reason):
    assert _reasons(spark, [line]) == [reason]


def test_invalid_utf8_bytes_read_by_the_text_source_are_quarantined(spark, tmp_path):
    """Spark's text source keeps invalid bytes as they are: the source's columns (sources.record_text) keep them in
    raw_bytes and make raw valid UTF-8 (U+FFFD), and the parse quarantines the line."""
    path = tmp_path / "broker-a" / "stats.log"
    path.parent.mkdir()
    path.write_bytes(INVALID_UTF8 + b"\n")
    text = sources.record_text(F.col("value").cast("binary"))
    raw = spark.read.text(str(path)).select(
        F.lit("broker_stats").alias("source"), text["raw"].alias("raw"), text["raw_bytes"].alias("raw_bytes"),
        F.lit(str(path)).alias("origin"), F.lit("broker-a").alias("broker_hint"),
        F.lit(dt.datetime(2022, 2, 9)).alias("ingested_at"))
    parsed = raw.transform(parse.parse_broker_stats(StatsConfig()))
    rows = parsed.transform(parse.quarantine_rows("broker_stats")).collect()
    assert [r["reason"] for r in rows] == ["line is not valid UTF-8"]
    assert bytes(rows[0]["raw_bytes"]) == INVALID_UTF8
    assert rows[0]["raw"] == INVALID_UTF8.decode("utf-8", "replace") != INVALID_UTF8.decode("latin-1")


# --- everything together, through the streaming job ----------------------------------------------------------

ON_TIME = [stats_line(f"2022-02-08 18:{m:02d}:00", "TOPIC_PUT_NUMS", "orders", OK) for m in range(11)]
DUPLICATE = ON_TIME[3]
ENVELOPES = [
    json.dumps({"broker": "broker-b", "cluster": "C1", "line": ON_TIME[5]}),
    json.dumps({"broker": "broker-b"}),
    json.dumps({"line": ON_TIME[5]}),
    "{not json",
]
BAD_STATS = {
    "": "empty line",
    "2022-02-08 18:04:00 INFO - [TOPIC_PUT_NUMS] [ord": "not a stats.log line",
    stats_line("2022-02-08 18:04:00", "FOO_NUMS", "orders", OK): "unknown stat name: FOO_NUMS",
    stats_line("2022-02-08 18:04:00", "GROUP_GET_NUMS", "a@b@c@d", OK):
        "key 'a@b@c@d' has 4 '@'-separated parts, not a shape of GROUP_GET_NUMS",
    stats_line("2022-02-08 18:04:00", "TOPIC_PUT_NUMS", "orders", "SUM: x TPS: 1.00 AVGPT: 1.00"): "non-numeric SUM",
    stats_line("2022-02-08 18:04:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: -1.00 AVGPT: 1.00"):
        "negative SUM, TPS or value",
    stats_line("2022-02-08 18:04:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: Infinity AVGPT: 1.00"): "non-finite TPS",
    stats_line("2022-02-08 18:04:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: 9,57 AVGPT: 1,00"):
        "decimal comma in TPS or AVGPT",
    stats_line("2099-02-08 18:04:00", "TOPIC_PUT_NUMS", "orders", OK): "event time more than 60 s after ingestion",
    stats_line("1990-02-08 18:04:00", "TOPIC_PUT_NUMS", "orders", OK): "event time more than 3650 days before ingestion",
    "INFO - [TOPIC_PUT_NUMS] [orders] Stats In One Minute, " + OK: "missing timestamp prefix",
    stats_line("2022-02-08 18:04:00", "TOPIC_PUT_NUMS", "bad topic!", OK): "invalid topic name: bad topic!",
    stats_line("2022-02-08 18:04:00", "TOPIC_PUT_NUMS", LONG_TOPIC, OK): f"invalid topic name: {LONG_TOPIC}",
    ON_TIME[4] + " " + "x" * 100_000: "line longer than 4096 characters",
    stats_line("2022-02-08 18:04:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: 1.00 AVGPT: -1.00"):
        "expectation failed: expect_column_values_to_be_between(avgpt)",
    stats_line("2022-13-08 18:04:00", "TOPIC_PUT_NUMS", "orders", OK): "invalid timestamp",
    stats_line("2022-02-08 18:04:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: 0.0"):
        "stats detail cut or unrecognised (expected SUM/TPS/AVGPT, TIMES/AVGRT or Value)",
}
#: Stats records that are not valid UTF-8 (or decode to odd text), as bytes: each is quarantined, its bytes kept.
BAD_BYTES_STATS = {
    INVALID_UTF8: "line is not valid UTF-8",
    stats_line("2022-02-08 18:04:00", "TOPIC_PUT_NUMS", "caf\xe9", OK).encode("latin-1"): "line is not valid UTF-8",
    ON_TIME[6].encode() + b"\xe2\x82": "line is not valid UTF-8",  # a multi-byte character cut at the end
    b'{"broker": "broker-\xff", "cluster": "C1", "line": "%s"}' % ON_TIME[7].encode(): "line is not valid UTF-8",
    b'{"broker": \xff\xfe': "envelope is not valid JSON",
    ON_TIME[8].encode() + b" " + b"\xff" * 5000: "line longer than 4096 characters",
    # valid UTF-8, but JSON escapes for a lone surrogate (Spark turns it into '?') and a NUL character
    b'{"broker": "b\\ud800", "line": "x\\u0000y"}': "not a stats.log line",
}
LATE = [stats_line(f"2022-02-08 17:0{m}:00", "TOPIC_PUT_NUMS", "orders", OK) for m in range(2)]
FAILURES = {
    '{"ts": "2022-02-08T10:05:00Z", "topic": "orders", "broker": "broker-a", "code": 2, "message": "[OVERLOAD]system busy"}': None,
    '{"ts": "yesterday", "topic": "orders"}': "ts is neither epoch milliseconds nor an ISO-8601 date",
    '{"ts": 1644314700000, "topic": "orders", "code": "2"}': "malformed JSON or a field of the wrong type (e.g. code as a string)",
    "not json": "not a JSON object",
    "": "empty line",
    '{"topic": "orders"}': "missing field: ts",
    '{"ts": 1644314700000}': "missing field: topic",
    '{"ts": 1644314700000, "topic": "a b"}': "invalid topic name: a b",
}
BAD_BYTES_FAILURES = {
    b'{"ts": "2022-02-08T10:05:00Z", "topic": "orders", "code": 2, "message": "[OVERLOAD]system busy \xff"}':
        "line is not valid UTF-8",
    b'{"ts": "2022-02-08T10:05:00Z", "topic": "ord\xc3\x28ers"}': "line is not valid UTF-8",
    b"caf\xe9": "line is not valid UTF-8",
}
#: A raw stats line straight in the landing's broker_stats folder: no broker folder, no envelope.
NO_BROKER = ON_TIME[9]


@pytest.fixture(scope="module")
def mixed_run(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    landing, lake = root / "landing", root / "lake"
    files = [  # written in this order, one file per micro-batch and input (max_files_per_trigger = 1)
        (landing / "broker_stats" / "broker-a" / "1-on-time.log", "\n".join(ON_TIME + [DUPLICATE]).encode()),
        (landing / "broker_stats" / "shipper" / "2-envelopes.jsonl", "\n".join(ENVELOPES).encode()),
        (landing / "broker_stats" / "broker-a" / "3-bad.log",
         b"\n".join([*map(str.encode, BAD_STATS), *BAD_BYTES_STATS])),
        (landing / "broker_stats" / "broker-a" / "4-late.log", "\n".join(LATE).encode()),
        (landing / "broker_stats" / "5-no-broker.log", NO_BROKER.encode()),
        (landing / "send_failures" / "1-failures.jsonl",
         b"\n".join([*map(str.encode, FAILURES), *BAD_BYTES_FAILURES])),
    ]
    base = 1_700_000_000
    for i, (path, data) in enumerate(files):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data + b"\n")
        os.utime(path, (base + i * 10, base + i * 10))
    # GX validation on, so that its tables are among those checked for readability; appends of more than 3 rows
    # are written by Spark's executors and committed by delta-rs, smaller ones through the driver: both paths
    # meet every check below
    cfg = parse_config({"source": {"max_files_per_trigger": 1}, "lake": {"executor_write_rows": 3}}).with_paths(
        str(landing), str(lake))
    governor.run(spark, cfg, once=True)
    return open_lake(spark, str(lake), "delta-rs")


@pytest.mark.slow
def test_mixed_landing_every_record_accounted_for(mixed_run):
    stats_lines = len(ON_TIME) + 1 + len(ENVELOPES) + len(BAD_STATS) + len(BAD_BYTES_STATS) + len(LATE) + 1
    rec = mixed_run.read(tables.QUALITY_RECONCILIATION)
    totals = {
        r["source"]: r
        for r in rec.groupBy("source").agg(
            *[F.sum(c).alias(c) for c in ("records_read", "silver_rows", "late_rows", "quarantine_rows")],
            F.min(F.col("balanced").cast("int")).alias("balanced"),
        ).collect()
    }
    s, f = totals["broker_stats"], totals["send_failures"]
    assert s["records_read"] == stats_lines == mixed_run.read("bronze/broker_stats").count()
    assert f["records_read"] == len(FAILURES) + len(BAD_BYTES_FAILURES)
    assert s["balanced"] == 1 and f["balanced"] == 1
    assert s["late_rows"] == len(LATE)
    assert s["silver_rows"] == len(ON_TIME) + 1 + 1  # + the duplicate + the good envelope
    assert s["quarantine_rows"] == len(BAD_STATS) + len(BAD_BYTES_STATS) + 3 + 1  # + three bad envelopes, no broker
    assert (f["silver_rows"], f["quarantine_rows"]) == (1, len(FAILURES) - 1 + len(BAD_BYTES_FAILURES))
    assert mixed_run.read("silver/broker_stats").count() == s["silver_rows"] + s["late_rows"]
    # what the reconciliation counts as quarantined is in the table: a quarantine row lost on the way would balance
    assert mixed_run.read("quarantine").count() == s["quarantine_rows"] + f["quarantine_rows"]


@pytest.mark.slow
def test_mixed_landing_each_bad_record_has_its_reason(mixed_run):
    got = sorted(r["reason"] for r in mixed_run.read("quarantine").collect())
    want = sorted(
        list(BAD_STATS.values()) + list(BAD_BYTES_STATS.values())
        + ["envelope missing field: line", "envelope missing field: broker", "envelope is not valid JSON",
           "no broker: not in a broker folder or envelope"]
        + [reason for reason in FAILURES.values() if reason] + list(BAD_BYTES_FAILURES.values())
    )
    assert got == want


@pytest.mark.slow
def test_mixed_landing_duplicate_kept_in_silver_counted_once_in_gold(mixed_run):
    """Decision: silver keeps both copies of a duplicate stats line (it mirrors the input, one row per accepted
    record, which keeps the reconciliation exact); the gold windows count it once (tps.window_metrics)."""
    silver = mixed_run.read("silver/broker_stats")
    assert silver.where(F.col("event_time") == dt.datetime(2022, 2, 8, 10, 3)).count() == 2
    topic = mixed_run.read("gold/topic_tps").where(F.col("topic") == "orders")
    assert topic.count() > 0
    dup_window = topic.where(F.col("window_start") == dt.datetime(2022, 2, 8, 10, 2)).first()
    assert dup_window["put_tps"] == pytest.approx(10.0)


@pytest.mark.slow
def test_mixed_landing_every_table_reads_with_pyarrow_pandas_and_spark(spark, mixed_run):
    """Invalid bytes in the input never reach a string column: every table of the lake is valid Arrow
    (``validate(full=True)`` checks UTF-8), reads into pandas, through Spark's Parquet reader and through the SQL
    of ``python -m pipelines.ops.query``."""
    existing = [t for t in TABLES if DeltaTable.is_deltatable(mixed_run.path(t))]
    assert {tables.BRONZE_BROKER_STATS, tables.BRONZE_SEND_FAILURES, tables.QUARANTINE, tables.SILVER_BROKER_STATS,
            tables.GOLD_TOPIC_TPS, tables.QUALITY_RECONCILIATION, tables.QUALITY_VALIDATION_RUNS} <= set(existing)
    spark_written = [t for t in existing if any(
        p.startswith("data/") for p in pa.table(DeltaTable(mixed_run.path(t)).get_add_actions()).column("path").to_pylist())]
    assert {tables.BRONZE_BROKER_STATS, tables.SILVER_BROKER_STATS, tables.QUARANTINE} <= set(spark_written)
    assert assert_every_table_readable(spark, mixed_run) == existing


@pytest.mark.slow
def test_mixed_landing_keeps_the_exact_bytes_of_every_record(mixed_run):
    """Quarantine and bronze keep each record's exact bytes in raw_bytes; raw is their valid-UTF-8 text."""
    quarantined = {bytes(r["raw_bytes"]): r for r in mixed_run.read(tables.QUARANTINE).collect()}
    for data, reason in {**BAD_BYTES_STATS, **BAD_BYTES_FAILURES}.items():
        row = quarantined[data]
        assert row["reason"] == reason
        assert row["raw"] == data.decode("utf-8", "replace")
    bronze_inputs = {tables.BRONZE_BROKER_STATS: BAD_BYTES_STATS, tables.BRONZE_SEND_FAILURES: BAD_BYTES_FAILURES}
    for table, lines in bronze_inputs.items():
        bronze = {bytes(r["raw_bytes"]): r["raw"] for r in mixed_run.read(table).collect()}
        assert all(bronze[data] == data.decode("utf-8", "replace") for data in lines)
        assert all(raw == data.decode("utf-8") for data, raw in bronze.items() if data not in lines)
