"""The catalogue of bad input: each item ends in quarantine with a reason (or, for late data, is counted as late),
never crashes the stream and is never silently dropped.

Items already covered by tests/test_parse.py (not repeated here): empty line; line cut mid-way
(``not a stats.log line``, ``stats detail cut …``); unknown stat name; key with the wrong number of ``@`` parts;
non-numeric SUM; negative SUM; ``TPS: Infinity``; decimal comma; timestamp far in the future; missing timestamp
prefix; invalid topic name (characters); envelope missing line; envelope not JSON; send failure with ``ts`` as
non-date text; ``code`` as a string. Expectation-level rejects (negative AVGPT, negative queue id, AVGPT out of
range) and late rows in the reconciliation: tests/test_quality.py. Here: the missing items, then all of them
together through the streaming job on one mixed landing directory.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest
from pyspark.sql import functions as F

from pipelines import governor
from pipelines.transforms import parse
from pipelines.quality import gate as quality
from pipelines.config import StatsConfig, parse_config
from pipelines.io.lake import open_lake
from tests.helpers import raw_records, stats_line

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
    """Spark's text source keeps invalid bytes as they are (no U+FFFD): the parse must see them itself."""
    path = tmp_path / "broker-a" / "stats.log"
    path.parent.mkdir()
    path.write_bytes(INVALID_UTF8 + b"\n")
    raw = spark.read.text(str(path)).select(
        F.lit("broker_stats").alias("source"), F.col("value").alias("raw"), F.lit(str(path)).alias("origin"),
        F.lit("broker-a").alias("broker_hint"), F.lit(dt.datetime(2022, 2, 9)).alias("ingested_at"))
    assert not raw.first()["raw"].isascii()
    parsed = raw.transform(parse.parse_broker_stats(StatsConfig()))
    assert [r["reason"] for r in parsed.transform(parse.quarantine_rows("broker_stats")).collect()] == [
        "line is not valid UTF-8"]


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
}
LATE = [stats_line(f"2022-02-08 17:0{m}:00", "TOPIC_PUT_NUMS", "orders", OK) for m in range(2)]
FAILURES = {
    '{"ts": "2022-02-08T10:05:00Z", "topic": "orders", "broker": "broker-a", "code": 2, "message": "[OVERLOAD]system busy"}': None,
    '{"ts": "yesterday", "topic": "orders"}': "ts is neither epoch milliseconds nor an ISO-8601 date",
    '{"ts": 1644314700000, "topic": "orders", "code": "2"}': "malformed JSON or a field of the wrong type (e.g. code as a string)",
    "not json": "not a JSON object",
    "": "empty line",
}


@pytest.fixture(scope="module")
def mixed_run(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    landing, lake = root / "landing", root / "lake"
    files = [  # written in this order, one file per micro-batch and input (max_files_per_trigger = 1)
        (landing / "broker_stats" / "broker-a" / "1-on-time.log", "\n".join(ON_TIME + [DUPLICATE]).encode()),
        (landing / "broker_stats" / "shipper" / "2-envelopes.jsonl", "\n".join(ENVELOPES).encode()),
        (landing / "broker_stats" / "broker-a" / "3-bad.log", "\n".join(BAD_STATS).encode() + b"\n" + INVALID_UTF8),
        (landing / "broker_stats" / "broker-a" / "4-late.log", "\n".join(LATE).encode()),
        (landing / "send_failures" / "1-failures.jsonl", "\n".join(FAILURES).encode()),
    ]
    base = 1_700_000_000
    for i, (path, data) in enumerate(files):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data + b"\n")
        os.utime(path, (base + i * 10, base + i * 10))
    cfg = parse_config(
        {"source": {"max_files_per_trigger": 1}, "quality": {"validate_every_n_batches": 0}}
    ).with_paths(str(landing), str(lake))
    governor.run(spark, cfg, once=True)
    return open_lake(spark, str(lake), "delta-rs")


@pytest.mark.slow
def test_mixed_landing_every_record_accounted_for(mixed_run):
    stats_lines = len(ON_TIME) + 1 + len(ENVELOPES) + len(BAD_STATS) + 1 + len(LATE)
    rec = mixed_run.read(quality.RECONCILIATION)
    totals = {
        r["source"]: r
        for r in rec.groupBy("source").agg(
            *[F.sum(c).alias(c) for c in ("records_read", "silver_rows", "late_rows", "quarantine_rows")],
            F.min(F.col("balanced").cast("int")).alias("balanced"),
        ).collect()
    }
    s, f = totals["broker_stats"], totals["send_failures"]
    assert s["records_read"] == stats_lines == mixed_run.read("bronze/broker_stats").count()
    assert f["records_read"] == len(FAILURES)
    assert s["balanced"] == 1 and f["balanced"] == 1
    assert s["late_rows"] == len(LATE)
    assert s["silver_rows"] == len(ON_TIME) + 1 + 1  # + the duplicate + the good envelope
    assert s["quarantine_rows"] == len(BAD_STATS) + 1 + 3  # + invalid UTF-8 + three bad envelopes
    assert (f["silver_rows"], f["quarantine_rows"]) == (1, len(FAILURES) - 1)
    assert mixed_run.read("silver/broker_stats").count() == s["silver_rows"] + s["late_rows"]


@pytest.mark.slow
def test_mixed_landing_each_bad_record_has_its_reason(mixed_run):
    got = sorted(r["reason"] for r in mixed_run.read("quarantine").collect())
    want = sorted(
        list(BAD_STATS.values())
        + ["line is not valid UTF-8", "envelope missing field: line", "envelope missing field: broker",
           "envelope is not valid JSON"]
        + [reason for reason in FAILURES.values() if reason]
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
