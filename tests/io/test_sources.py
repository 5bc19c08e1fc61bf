"""The sources' RAW_RECORD columns: exact bytes in raw_bytes, valid UTF-8 text in raw and broker_hint."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.config import BrokersConfig, StatsConfig
from pipelines.dataplane import sources
from pipelines.dataplane.transforms import parse, parse_failures
from tests.helpers import stats_line

KAFKA = "key binary, value binary, topic string, partition int, offset long"
GOOD = stats_line("2022-02-08 18:00:00", "TOPIC_PUT_NUMS", "orders", "SUM: 60 TPS: 1.00 AVGPT: 1.00").encode()
BAD = GOOD.replace(b"orders", b"ord\xff\xfeers")
BAD_FAILURE = b'{"ts": 1644314700000, "topic": "orders", "message": "busy \xe2\x82"}'


def test_record_text_keeps_the_bytes_and_replaces_invalid_sequences(spark):
    values = [GOOD, BAD, b"caf\xe9", b"cut \xe2\x82", b"", "caf\u00e9 \U0001f600".encode()]
    df = spark.createDataFrame([(v,) for v in values], "data binary")
    text = sources.record_text(F.col("data"))
    rows = df.select(text["raw"].alias("raw"), text["raw_bytes"].alias("raw_bytes")).collect()
    assert [bytes(r["raw_bytes"]) for r in rows] == values
    assert [r["raw"] for r in rows] == [v.decode("utf-8", "replace") for v in values]
    pa.array([r["raw"] for r in rows], pa.string()).validate(full=True)


def test_kafka_records_with_invalid_bytes_are_quarantined_with_their_bytes(spark):
    messages = [
        (b"broker-a", GOOD, "stats", 0, 1),
        (b"broker-a", BAD, "stats", 0, 2),
        (b"broker-\xff", GOOD, "stats", 0, 3),  # the key, not the line, is broken
        (None, BAD_FAILURE, "failures", 1, 7),
    ]
    raw = sources.from_kafka(spark.createDataFrame(messages, KAFKA), "stats")
    assert raw.schema.names == schemas.RAW_RECORD.names
    rows = raw.collect()
    assert [bytes(r["raw_bytes"]) for r in rows] == [m[1] for m in messages]
    assert [r["raw"] for r in rows] == [m[1].decode("utf-8", "replace") for m in messages]
    assert [r["broker_hint"] for r in rows] == ["broker-a", "broker-a", "broker-\ufffd", None]
    assert [r["origin"] for r in rows] == [f"kafka:{m[2]}:{m[3]}:{m[4]}" for m in messages]
    stats = raw.where(F.col("source") == sources.BROKER_STATS).transform(parse.parse_broker_stats(StatsConfig()))
    failures = raw.where(F.col("source") == sources.SEND_FAILURES).transform(
        parse_failures.parse_send_failures(StatsConfig(), BrokersConfig()))
    quarantined = stats.transform(parse.quarantine_rows(sources.BROKER_STATS)).unionByName(
        failures.transform(parse.quarantine_rows(sources.SEND_FAILURES)))
    assert quarantined.schema.names == schemas.QUARANTINE.names
    got = sorted((r["origin"], r["reason"], bytes(r["raw_bytes"])) for r in quarantined.collect())
    assert got == [
        ("kafka:failures:1:7", "line is not valid UTF-8", BAD_FAILURE),
        ("kafka:stats:0:2", "line is not valid UTF-8", BAD),
        ("kafka:stats:0:3", "broker name is not valid UTF-8", GOOD),
    ]
    assert stats.transform(parse.silver_broker_stats).count() == 1
