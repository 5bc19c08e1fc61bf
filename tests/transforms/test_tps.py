"""Windowed TPS in Spark: stats lines → metric events, and the stateful windowed sums (a line shipped twice counted
once). What the driver derives from the sums: tests/decide/test_windows.py."""

from __future__ import annotations

from chispa import assert_df_equality

from pipelines import schemas
from pipelines.dataplane.transforms import tps
from pipelines.config import WindowsConfig
from tests.helpers import ts

W = WindowsConfig()
T0, T1 = ts("2022-02-08 07:39:00"), ts("2022-02-08 07:40:00")


def metrics(spark, rows):
    """(broker, topic, group, metric, amount) in window [T0, T1)."""
    return spark.createDataFrame([(T0, T1, *r) for r in rows], schemas.WINDOW_METRIC)


def test_stats_events_cover_the_minute_before_the_line(spark):
    silver = spark.createDataFrame(
        [(T1, "broker-a", None, "TOPIC_PUT_NUMS", "minute", "orders", "orders", None, None, 600, 10.0, 1.0, None, "f", T1),
         (T1, "broker-a", None, "TOPIC_PUT_NUMS", "hour", "orders", "orders", None, None, 36000, 10.0, 1.0, None, "f", T1),
         (T1, "broker-a", None, "TOPIC_PUT_SIZE", "minute", "orders", "orders", None, None, 6000, 100.0, 10.0, None, "f", T1)],
        schemas.SILVER_BROKER_STATS)
    got = silver.transform(tps.stats_metric_events)
    want = spark.createDataFrame([(T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600)], schemas.METRIC_EVENT)
    assert_df_equality(got, want, ignore_nullable=True)


def test_window_metrics_sums_events_per_window(spark):
    events = spark.createDataFrame(
        [(ts("2022-02-08 07:39:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
         (ts("2022-02-08 07:39:30"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 60),
         (ts("2022-02-08 07:40:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 1)],
        schemas.METRIC_EVENT)
    got = events.transform(tps.window_metrics(W))
    want = spark.createDataFrame(
        [(T0, T1, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 660),
         (T1, ts("2022-02-08 07:41:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 1)], schemas.WINDOW_METRIC)
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_window_metrics_count_a_stats_line_shipped_twice_once_and_every_failure(spark):
    line = (ts("2022-02-08 07:39:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600)
    failure = (ts("2022-02-08 07:39:10"), "broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 1)
    rows = [line, line, (ts("2022-02-08 07:39:00"), "broker-b", "orders", None, "TOPIC_PUT_NUMS", 600), failure,
            failure]
    events = spark.createDataFrame(rows, schemas.METRIC_EVENT)
    got = events.transform(tps.window_metrics(W))
    # the simulator's model of the same stateful sums (pipelines/sim/windows.py) counts them the same
    from pipelines.sim.windows import FinalWindows

    final = FinalWindows(W.length_seconds, W.watermark_seconds)
    utc = [(t.replace(tzinfo=__import__("datetime").timezone.utc), *rest) for t, *rest in rows]
    final.batch(utc[:3])
    final.batch(utc[3:] + [(utc[0][0].replace(hour=9), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 1)])
    modelled = {k[1:]: v for k, v in (final.batch([]) or {}).items() if k[0] == utc[0][0]}
    assert modelled == {(r["broker"], r["topic"], r["consumer_group"], r["metric"]): r["amount"] for r in got.collect()}
    want = spark.createDataFrame(
        [(T0, T1, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
         (T0, T1, "broker-b", "orders", None, "TOPIC_PUT_NUMS", 600),
         (T0, T1, "broker-a", "orders", None, "failure:TIMEOUT_CLEAN_QUEUE", 2)], schemas.WINDOW_METRIC)
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)


def test_a_late_row_is_dropped_by_its_windows_end_not_its_event_time_in_spark_and_in_the_simulator(spark, tmp_path):
    """The gold query's rule for late rows, pinned in Spark and in the simulator's model of it
    (:class:`pipelines.sim.windows.FinalWindows`): a first micro-batch's newest event at 07:45:30 moves the
    watermark (120 s) to 07:43:30. In the second micro-batch a stats line of minute 07:43 (event time 07:43:00,
    before the watermark) still counts, its window [07:43, 07:44) not yet passed; one of minute 07:42 (window end
    07:43, passed) is dropped as late."""
    import datetime as dt

    from pipelines.sim.windows import FinalWindows

    source = tmp_path / "events"
    source.mkdir()
    first = [(ts("2022-02-08 07:41:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 60),
             (ts("2022-02-08 07:45:30"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 1)]
    second = [(ts("2022-02-08 07:43:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 120),
              (ts("2022-02-08 07:42:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
              (ts("2022-02-08 07:50:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 1)]
    spark.createDataFrame(first, schemas.METRIC_EVENT).write.parquet(str(source / "b1"))
    stream = (spark.readStream.schema(schemas.METRIC_EVENT).option("maxFilesPerTrigger", 1)
              .parquet(str(source / "*")).withWatermark("event_time", f"{W.watermark_seconds} seconds")
              .transform(tps.window_metrics(W)))
    query = (stream.writeStream.outputMode("append").format("memory").queryName("late_rows")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        query.processAllAvailable()
        spark.createDataFrame(second, schemas.METRIC_EVENT).write.parquet(str(source / "b2"))
        query.processAllAvailable()
        spark.createDataFrame([(ts("2022-02-08 08:30:00"), "broker-a", "orders", None, "TOPIC_PUT_NUMS", 1)],
                              schemas.METRIC_EVENT).write.parquet(str(source / "b3"))
        query.processAllAvailable()
        got = {(r["window_start"].strftime("%H:%M"), r["amount"]) for r in spark.sql("SELECT * FROM late_rows").collect()}
    finally:
        query.stop()
    assert ("07:43", 120) in got and not any(start == "07:42" for start, _ in got), got
    utc = lambda rows: [(t.replace(tzinfo=dt.timezone.utc), *rest) for t, *rest in rows]  # noqa: E731
    final = FinalWindows(W.length_seconds, W.watermark_seconds)
    emitted = {}
    for rows in (utc(first), utc(second), [], []):
        emitted.update({k[0].strftime("%H:%M"): v for k, v in (final.batch(rows) or {}).items()})
    assert emitted.get("07:43") == 120 and "07:42" not in emitted, emitted
