"""Progress lines from Spark's StreamingQueryProgress: the line format on progress dicts (pyspark 4's progress
objects are dicts), then a real listener on real streaming queries of the test session."""

from __future__ import annotations

import logging

from pyspark.sql import functions as F

from pipelines.ops import progress
from pipelines.ops.progress import ProgressListener, describe, offsets_behind

KAFKA_SOURCE = {
    "description": "KafkaV2[Subscribe[rmq-broker-stats]]",
    "endOffset": '{"rmq-broker-stats":{"0":100,"1":50}}',
    "latestOffset": '{"rmq-broker-stats":{"0":160,"1":70}}',
    "numInputRows": 30,
}
FILE_SOURCE = {"description": "FileStreamSource[file:/landing]", "endOffset": '{"logOffset":3}', "latestOffset": None}


def event(name="rate-governor-ingest", batch=2, rows=1200, seconds=4.0, rate=300.0, watermark=None, state=None,
          sources=(FILE_SOURCE,)):
    return {
        "name": name, "batchId": batch, "numInputRows": rows, "processedRowsPerSecond": rate,
        "batchDuration": int(seconds * 1000), "eventTime": {"watermark": watermark} if watermark else {},
        "stateOperators": state or [], "sources": list(sources),
    }


def test_ingest_line_with_trigger_and_backlog():
    line = describe(event(), trigger_seconds=30, rows_done=2400, backlog_rows=4800)
    assert line == "ingest batch 2: 1,200 rows, 300 rows/s, 4.0 s of 30 s trigger, backlog 50% (2,400 of 4,800 rows)"


def test_batch_longer_than_trigger_says_falling_behind():
    assert "40.0 s of 30 s trigger (falling behind)" in describe(event(seconds=40), trigger_seconds=30)


def test_gold_line_has_watermark_and_state_but_no_row_count():
    ev = event(name="rate-governor-gold", seconds=6.9, watermark="2026-11-23T10:41:00.000Z",
               state=[{"numRowsTotal": 310, "numRowsDroppedByWatermark": 0}])
    line = describe(ev, trigger_seconds=None, rows_done=1, backlog_rows=2, counts_records=False)
    assert line == "gold batch 2: 6.9 s (availableNow), watermark 2026-11-23 10:41:00, 310 window aggregates in state"
    assert "watermark not yet" in describe(event(watermark=progress.NO_WATERMARK), trigger_seconds=None)


def test_kafka_offsets_behind_from_the_progress_itself():
    assert offsets_behind(KAFKA_SOURCE) == 80
    assert offsets_behind(FILE_SOURCE) is None
    assert "80 records behind" in describe(event(sources=[KAFKA_SOURCE]), trigger_seconds=5)


def test_availablenow_over_kafka_backlog_is_read_plus_behind():
    listener = ProgressListener(trigger_seconds=None)
    line = listener.on_progress(event(rows=120, sources=[KAFKA_SOURCE]))
    assert line.endswith("backlog 60% (120 of 200 rows)")


def test_count_lines_counts_a_last_line_without_newline(tmp_path):
    (tmp_path / "broker_stats" / "b").mkdir(parents=True)
    (tmp_path / "broker_stats" / "b" / "stats.log").write_bytes(b"a\nb\nc")
    (tmp_path / "send_failures").mkdir()
    (tmp_path / "send_failures" / "f.jsonl").write_bytes(b"{}\n{}\n")
    (tmp_path / "send_failures" / ".hidden").write_bytes(b"x\n" * 10)
    assert progress.landing_lines(tmp_path) == 5


def test_warnings_for_late_rows_and_quarantine(caplog):
    reports = {("ingest", 4): {"bronze/broker_stats": 90, "bronze/send_failures": 10, "quarantine": 7}}
    listener = ProgressListener(trigger_seconds=30, batch_rows=lambda q, b: reports.get((q, b)))
    with caplog.at_level(logging.INFO, logger="rate_governor.progress"):
        listener.on_progress(event(batch=4))
        listener.on_progress(event(name="rate-governor-gold", batch=4,
                                   state=[{"numRowsTotal": 5, "numRowsDroppedByWatermark": 12}]))
        listener.on_progress(event(name="someone-elses-query"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0].startswith("ingest batch 4: 7 of 100 records quarantined")
    assert warnings[1].startswith("gold batch 4: 12 rows arrived behind the watermark")
    assert len(listener.lines) == 2  # other queries are not ours


def test_listener_on_real_queries(spark, tmp_path):
    """availableNow over three files, one per micro-batch: the backlog moves 1/3 at a time; a windowed query with a
    watermark reports it."""
    landing = tmp_path / "landing"
    (landing / "broker_stats").mkdir(parents=True)
    (landing / "send_failures").mkdir()
    for i in range(3):
        lines = [f"2026-11-23 10:0{i}:{s:02d} {i}" for s in range(0, 60, 6)]  # 10 lines per file
        (landing / "broker_stats" / f"part-{i}.log").write_text("\n".join(lines) + "\n")
    listener = ProgressListener(trigger_seconds=None, backlog_rows=progress.landing_lines(landing))
    spark.streams.addListener(listener)
    try:
        raw = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(landing / "broker_stats"))
        ingest = (raw.writeStream.queryName("rate-governor-ingest").foreachBatch(lambda df, i: df.count())
                  .option("checkpointLocation", str(tmp_path / "ck-ingest")).trigger(availableNow=True).start())
        events = raw.select(F.to_timestamp(F.substring("value", 1, 19)).alias("event_time"))
        windows = events.withWatermark("event_time", "1 minute").groupBy(F.window("event_time", "1 minute")).count()
        gold = (windows.writeStream.queryName("rate-governor-gold").outputMode("append")
                .foreachBatch(lambda df, i: df.count()).option("checkpointLocation", str(tmp_path / "ck-gold"))
                .trigger(availableNow=True).start())
        ingest.awaitTermination()
        gold.awaitTermination()
    finally:
        progress.detach(spark, listener)
    ingest_lines = [line for line in listener.lines if line.startswith("ingest")]
    assert [line.split(", ")[-1] for line in ingest_lines] == [
        "backlog 33% (10 of 30 rows)", "backlog 67% (20 of 30 rows)", "backlog 100% (30 of 30 rows)"
    ]
    assert all(line.split(": ")[1].startswith("10 rows") for line in ingest_lines)
    gold_lines = [line for line in listener.lines if line.startswith("gold")]
    assert "watermark 2026-11-23 10:01:54" in gold_lines[-1]  # max event 10:02:54 minus 1 minute
    n = len(listener.lines)  # detach removed the listener: a later query does not reach it
    raw.writeStream.queryName("rate-governor-ingest").foreachBatch(lambda df, i: df.count()).option(
        "checkpointLocation", str(tmp_path / "ck-after")).trigger(availableNow=True).start().awaitTermination()
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    assert len(listener.lines) == n


def test_attach_replaces_a_listener_an_earlier_run_left_registered(spark):
    from types import SimpleNamespace

    cfg = SimpleNamespace(source=SimpleNamespace(kind="kafka"), windows=SimpleNamespace(trigger_seconds=5))
    from pipelines.job.flows.base import BatchReport

    governor = SimpleNamespace(cfg=cfg, reports=[BatchReport("ingest", 3, rows={"quarantine": 2}),
                                                 BatchReport("gold", 3, rows={"gold/limits": 1})])
    first = progress.attach(spark, governor, once=False)  # a run that raised before detach
    second = progress.attach(spark, governor, once=False)
    try:
        assert [listener for session, listener in progress._ATTACHED if session is spark] == [second]
        assert first is not second and second.trigger_seconds == 5.0 and second.backlog_rows is None
        # the quarantine warning reads the governor's own report of the same query and batch
        assert second.batch_rows("ingest", 3) == {"quarantine": 2} and second.batch_rows("ingest", 4) is None
    finally:
        progress.detach(spark, second)
    assert progress._ATTACHED == []
