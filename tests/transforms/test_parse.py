"""Parsing of every stats.log line kind and of send failures (docs/rocketmq-formats.md §2-7)."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality

from pipelines.dataplane.transforms import parse, parse_failures
from pipelines import schemas
from pipelines.config import BrokersConfig, StatsConfig
from tests.helpers import raw_records, stats_line, ts

COLS = ["event_time", "broker", "cluster", "stat_name", "period", "stats_key", "topic", "consumer_group",
        "queue_id", "sum", "tps", "avgpt", "value"]


def silver(spark, lines, broker_hint="broker-a"):
    parsed = raw_records(spark, "broker_stats", lines, broker_hint).transform(parse.parse_broker_stats(StatsConfig()))
    return parsed.transform(parse.silver_broker_stats).select(*COLS)


def reasons(spark, lines, broker_hint="broker-a"):
    parsed = raw_records(spark, "broker_stats", lines, broker_hint).transform(parse.parse_broker_stats(StatsConfig()))
    return [r["reason"] for r in parsed.transform(parse.quarantine_rows("broker_stats")).collect()]


def expected(spark, rows):
    schema = schemas.SILVER_BROKER_STATS
    return spark.createDataFrame(rows, schema.__class__([schema[c] for c in COLS]))


def test_article_line_minute_topic_key_gmt8_to_utc(spark):
    line = ("2022-02-08 15:40:00 INFO - [TOPIC_PUT_NUMS] [%RETRY%get-pugc-to-ai-consumer] "
            "Stats In One Minute, SUM: 47119 TPS: 785.32 AVGPT: 1.00")
    want = expected(spark, [(ts("2022-02-08 07:40:00"), "broker-a", None, "TOPIC_PUT_NUMS", "minute",
                             "%RETRY%get-pugc-to-ai-consumer", "%RETRY%get-pugc-to-ai-consumer", None, None,
                             47119, 785.32, 1.0, None)])
    assert_df_equality(silver(spark, [line]), want, ignore_nullable=True)


def test_key_shapes_topic_group_queue_cluster(spark):
    lines = [
        stats_line("2022-02-08 15:40:00", "GROUP_GET_NUMS", "orders@g1", "SUM: 600 TPS: 10.00 AVGPT: 2.00"),
        stats_line("2022-02-08 15:40:00", "SNDBCK_PUT_NUMS", "orders@g1", "SUM: 6 TPS: 0.10 AVGPT: 1.00"),
        stats_line("2022-02-08 15:40:00", "GROUP_GET_LATENCY", "3@orders@g1", "SUM: 12 TPS: 0.20 AVGPT: 4.00"),
        stats_line("2022-02-08 15:40:00", "BROKER_PUT_NUMS", "DefaultCluster", "SUM: 1290 TPS: 21.50 AVGPT: 0.00"),
        stats_line("2022-02-08 15:40:00", "QUEUE_PUT_NUMS", "orders@7", "SUM: 60 TPS: 1.00 AVGPT: 1.00"),
        stats_line("2022-02-08 15:40:00", "TOPIC_PUT_LATENCY", "2@orders", "SUM: 60 TPS: 1.00 AVGPT: 1.00"),
    ]
    got = silver(spark, lines).select("stat_name", "topic", "consumer_group", "queue_id", "cluster")
    want = spark.createDataFrame(
        [("GROUP_GET_NUMS", "orders", "g1", None, None), ("SNDBCK_PUT_NUMS", "orders", "g1", None, None),
         ("GROUP_GET_LATENCY", "orders", "g1", 3, None), ("BROKER_PUT_NUMS", None, None, None, "DefaultCluster"),
         ("QUEUE_PUT_NUMS", "orders", None, 7, None), ("TOPIC_PUT_LATENCY", "orders", None, 2, None)],
        "stat_name string, topic string, consumer_group string, queue_id int, cluster string")
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_hour_day_5min_times_nan_lines(spark):
    lines = [
        stats_line("2022-02-09 00:00:00", "TOPIC_PUT_NUMS", "orders", "SUM: 36000 TPS: 10.00 AVGPT: 1.00", "In One Hour"),
        stats_line("2022-02-09 00:00:00", "TOPIC_PUT_NUMS", "orders", "SUM: 0 TPS: NaN AVGPT: 0.00", "In One Day"),
        stats_line("2022-02-08 15:40:00", "GROUP_GET_FALL_SIZE", "0@orders@g1", "Value: 1024", "Every 5 Minutes"),
        stats_line("2022-02-08 15:40:00", "GROUP_GET_LATENCY", "0@orders@g1", "TIMES: 12 AVGRT: 3.50"),
        stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 0 TPS: NaN AVGPT: 0.00"),
    ]
    got = silver(spark, lines).select("period", "sum", "tps", "avgpt", "value")
    want = spark.createDataFrame(
        [("hour", 36000, 10.0, 1.0, None), ("day", 0, None, 0.0, None), ("5min", None, None, None, 1024),
         ("minute", None, None, 3.5, 12), ("minute", 0, None, 0.0, None)],
        "period string, sum long, tps double, avgpt double, value long")
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_json_envelope_gives_broker_and_cluster(spark):
    line = stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 60 TPS: 1.00 AVGPT: 1.00")
    envelope = '{"broker": "broker-c", "cluster": "C1", "line": "%s", "shipper": "filebeat"}' % line
    got = silver(spark, [envelope], broker_hint="shipper").select("broker", "cluster", "topic", "sum")
    want = spark.createDataFrame([("broker-c", "C1", "orders", 60)], "broker string, cluster string, topic string, sum long")
    assert_df_equality(got, want, ignore_nullable=True)


def test_seconds_after_jvm_pause_and_configured_zone(spark):
    line = stats_line("2022-02-08 00:47:43", "TOPIC_PUT_NUMS", "orders", "SUM: 60 TPS: 1.00 AVGPT: 1.00")
    parsed = raw_records(spark, "broker_stats", [line]).transform(parse.parse_broker_stats(StatsConfig(timezone="UTC")))
    assert parsed.first()["event_time"] == ts("2022-02-08 00:47:43")


def test_the_pure_python_classifier_reads_the_table_as_spark_does(spark):
    """``rocketmq.classify_failure_text`` (the simulator's) and the data plane's Spark expression give the same
    class for every message of the test above and for the lines the simulator's clients write."""
    from pipelines import rocketmq as rmq
    from pipelines.sim import failures as fl

    cases = [
        ("CODE: 2  DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while BROKER: 10.0.0.1:10911", None),
        ("CODE: 2, DESC: [PCBUSY_CLEAN_QUEUE]broker busy", None), ("[OVERLOAD]system busy", 2),
        ("CODE: 1  DESC: [PC_SYNCHRONIZED]broker busy", 1), ("CODE: 2  DESC: rateLimit", 2),
        ("CODE: 2, DESC: " + fl.rate_limit_remark("%RETRY%g", 12), None), (fl.busy_remark(230, 12), 2),
        ("RemotingTooMuchRequestException: sendDefaultImpl call timeout", None), ("request timeout", None),
        (None, 14), ("CODE: 17  DESC: topic not exist", 17), ("[REJECTREQUEST]system busy", None),
        ("the [RateLimit] for x and [TIMEOUT_CLEAN_QUEUE] both", 2), ("nothing known", None),
    ]
    frame = spark.createDataFrame(cases, "message string, code int")
    got = [r["c"] for r in frame.select(parse_failures.classify_failure(frame["message"], frame["code"]).alias("c"))
           .collect()]
    assert got == [rmq.classify_failure_text(m, c) for m, c in cases]


@pytest.mark.parametrize(
    "line, reason",
    [
        ("", "empty line"),
        ("INFO - [GROUP_GET_NUMS] [orders@g1] Stats In One Minute, SUM: 1 TPS: 0.02 AVGPT: 1.00", "missing timestamp prefix"),
        (stats_line("2022-02-08 15:40:00", "FOO_NUMS", "orders", "SUM: 1 TPS: 0.02 AVGPT: 1.00"), "unknown stat name: FOO_NUMS"),
        (stats_line("2022-02-08 15:40:00", "GROUP_GET_NUMS", "orders", "SUM: 1 TPS: 0.02 AVGPT: 1.00"),
         "key 'orders' has 1 '@'-separated parts, not a shape of GROUP_GET_NUMS"),
        (stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: abc TPS: 0.02 AVGPT: 1.00"), "non-numeric SUM"),
        (stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: -5 TPS: 0.02 AVGPT: 1.00"), "negative SUM, TPS or value"),
        (stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: Infinity AVGPT: 1.00"), "non-finite TPS"),
        (stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: 9,57 AVGPT: 1,00"), "decimal comma in TPS or AVGPT"),
        ("2022-02-08 15:40:00 INFO - [TOPIC_PUT_NUMS] [orders] Stats In One Min", "not a stats.log line"),
        (stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: 0.0"),
         "stats detail cut or unrecognised (expected SUM/TPS/AVGPT, TIMES/AVGRT or Value)"),
        (stats_line("2022-13-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: 0.08 AVGPT: 1.00"), "invalid timestamp"),
        (stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "bad topic!", "SUM: 5 TPS: 0.08 AVGPT: 1.00"), "invalid topic name: bad topic!"),
        (stats_line("2099-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 5 TPS: 0.08 AVGPT: 1.00"), "event time more than 60 s after ingestion"),
        ('{"broker": "b"}', "envelope missing field: line"),
        ('{"line": "x"', "envelope is not valid JSON"),
    ],
)
def test_bad_lines_go_to_quarantine_with_reason(spark, line, reason):
    assert reasons(spark, [line]) == [reason]


def test_raw_line_outside_broker_folder_is_quarantined(spark):
    line = stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 60 TPS: 1.00 AVGPT: 1.00")
    assert reasons(spark, [line], broker_hint=None) == ["no broker: not in a broker folder or envelope"]


def test_every_record_is_silver_or_quarantine(spark):
    lines = [stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 60 TPS: 1.00 AVGPT: 1.00"), "junk", ""]
    parsed = raw_records(spark, "broker_stats", lines).transform(parse.parse_broker_stats(StatsConfig()))
    assert parsed.transform(parse.silver_broker_stats).count() == 1
    assert parsed.transform(parse.quarantine_rows("broker_stats")).count() == 2


# --- send failures ---------------------------------------------------------------------------------------------

def failures(spark, lines, brokers=BrokersConfig()):
    raw = raw_records(spark, "send_failures", lines, broker_hint=None)
    return raw.transform(parse_failures.parse_send_failures(StatsConfig(), brokers))


def test_send_failure_code_from_java_and_go_messages_and_class(spark):
    lines = [
        '{"ts": 1644306000000, "topic": "orders", "broker": "broker-a", "code": null, "message": '
        '"CODE: 2  DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: 205ms, size of queue: 5 BROKER: 10.0.0.1:10911"}',
        '{"ts": "2022-02-08T15:40:00+08:00", "topic": "orders", "broker": "10.0.0.1:10911", "message": '
        '"CODE: 2, DESC: [PCBUSY_CLEAN_QUEUE]broker busy, start flow control for a while"}',
        '{"ts": "2022-02-08T07:40:00Z", "topic": "orders", "code": 2, "message": "[OVERLOAD]system busy, start flow control for a while"}',
        '{"ts": "2022-02-08T07:40:00Z", "topic": "orders", "code": 1, "message": "CODE: 1  DESC: [PC_SYNCHRONIZED]broker busy"}',
        '{"ts": "2022-02-08T07:40:00Z", "topic": "orders", "code": 2, "message": "CODE: 2  DESC: rateLimit"}',
        '{"ts": "2022-02-08T07:40:00Z", "topic": "orders", "code": 2, "message": "CODE: 2  DESC: [RateLimit] for '
        'orders need wait:23809microsecs, BROKER: 10.0.0.1:10911"}',
        '{"ts": "2022-02-08T07:40:00Z", "topic": "orders", "message": "RemotingTooMuchRequestException: sendDefaultImpl call timeout"}',
        '{"ts": "2022-02-08T07:40:00Z", "topic": "orders", "message": "request timeout"}',
        '{"ts": "2022-02-08T07:40:00Z", "topic": "orders", "code": 14, "message": null}',
        '{"ts": "2022-02-08T07:40:00Z", "topic": "orders", "code": 17, "message": "CODE: 17  DESC: topic not exist"}',
        '{"ts": "2022-02-08T07:40:00Z", "topic": "orders", "code": null, "message": "[REJECTREQUEST]system busy"}',
    ]
    got = failures(spark, lines, BrokersConfig(addresses={"10.0.0.1:10911": "broker-a"})).select(
        "event_time", "broker", "code", "failure_class", "reject_reason")
    t = ts("2022-02-08 07:40:00")
    want = spark.createDataFrame(
        [(t, "broker-a", 2, "TIMEOUT_CLEAN_QUEUE", None), (t, "broker-a", 2, "PCBUSY_CLEAN_QUEUE", None),
         (t, None, 2, "OVERLOAD", None), (t, None, 1, "PC_SYNCHRONIZED", None), (t, None, 2, "RATE_LIMITED", None),
         (t, None, 2, "RATE_LIMITED", None), (t, None, None, "CLIENT_TIMEOUT", None), (t, None, None, "CLIENT_TIMEOUT", None),
         (t, None, 14, "SERVICE_NOT_AVAILABLE", None), (t, None, 17, "OTHER", None), (t, None, None, "REJECTREQUEST", None)],
        "event_time timestamp, broker string, code int, failure_class string, reject_reason string")
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


@pytest.mark.parametrize(
    "line, reason",
    [
        ("not json", "not a JSON object"),
        ('{"ts": "yesterday", "topic": "orders"}', "ts is neither epoch milliseconds nor an ISO-8601 date"),
        ('{"ts": 1644306000000, "topic": "orders", "code": "2"}', "malformed JSON or a field of the wrong type (e.g. code as a string)"),
        ('{"topic": "orders"}', "missing field: ts"),
        ('{"ts": 1644306000000}', "missing field: topic"),
        ('{"ts": 1644306000000, "topic": "a b"}', "invalid topic name: a b"),
        ("", "empty line"),
    ],
)
def test_bad_send_failures_are_quarantined(spark, line, reason):
    got = failures(spark, [line]).transform(parse.quarantine_rows("send_failures"))
    assert [r["reason"] for r in got.collect()] == [reason]
    assert got.first()["source"] == "send_failures"


def test_broker_hint_with_replaced_bytes_is_quarantined(spark):
    """A folder name or Kafka key whose invalid bytes the source replaced with U+FFFD is no broker name."""
    line = stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 60 TPS: 1.00 AVGPT: 1.00")
    assert reasons(spark, [line], broker_hint="broker-\ufffd") == ["broker name is not valid UTF-8"]


def test_quarantine_rows_keep_the_raw_bytes(spark):
    raw = raw_records(spark, "broker_stats", ["junk"])
    got = raw.transform(parse.parse_broker_stats(StatsConfig())).transform(parse.quarantine_rows("broker_stats"))
    assert got.schema.names == schemas.QUARANTINE.names
    assert [(r["raw"], bytes(r["raw_bytes"])) for r in got.collect()] == [("junk", b"junk")]
