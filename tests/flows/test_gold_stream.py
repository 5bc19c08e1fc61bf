"""The finalized-window stream of the gold query (pipelines/job/flows/gold.py metric_event_stream + window_stream), in
the style of Spark's own streaming tests: one query on a tiny source (the events files the ingest query hands
over), ``processAllAvailable()``, a memory sink in ``append`` mode, ``stop()`` in ``finally``. A window is emitted
once, when the watermark (``windows.watermark_seconds`` = 120 s) has passed its end, with a stats line shipped
twice counted once."""

from __future__ import annotations

import datetime as dt

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.config import load_config
from pipelines.job.flows.gold import metric_event_stream, window_stream
from pipelines.dataplane import events
from tests.helpers import ts


def _events(spark, rows):
    return spark.createDataFrame([(ts(t), b, tp, g, m, a) for t, b, tp, g, m, a in rows], schemas.METRIC_EVENT)


def test_a_window_is_emitted_once_after_the_watermark_passes_it(spark, tmp_path):
    cfg = load_config("conf/local.toml").with_paths(str(tmp_path / "landing"), str(tmp_path / "lake"))
    directory = events.events_dir(cfg)
    stream = window_stream(metric_event_stream(spark, cfg), cfg).where(F.col("metric") == "TOPIC_PUT_NUMS")
    query = (stream.select("window_start", "window_end", "broker", "topic", "amount").writeStream.format("memory")
             .queryName("final_windows").outputMode("append").start())
    emitted = lambda: spark.sql("select * from final_windows")  # noqa: E731
    try:
        events.write_batch(_events(spark, [("2022-02-08 10:00:00", "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
                                           ("2022-02-08 10:00:00", "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600)]),
                           directory, 0)  # the line shipped twice
        query.processAllAvailable()
        events.write_batch(_events(spark, [("2022-02-08 10:01:00", "broker-a", "orders", None, "TOPIC_PUT_NUMS", 900)]),
                           directory, 1)
        query.processAllAvailable()
        assert emitted().count() == 0  # the watermark (max event time - 120 s) has not passed 10:01 yet
        events.write_batch(_events(spark, [("2022-02-08 10:03:30", "broker-a", "orders", None, "TOPIC_PUT_NUMS", 60)]),
                           directory, 2)  # watermark -> 10:01:30: the window 10:00-10:01 is final
        query.processAllAvailable()
        events.write_batch(_events(spark, [("2022-02-08 10:03:40", "broker-a", "orders", None, "TOPIC_PUT_NUMS", 60)]),
                           directory, 3)  # the micro-batch after the one that moved the watermark emits it
        query.processAllAvailable()
        got = emitted()
        expected = spark.createDataFrame([(ts("2022-02-08 10:00"), ts("2022-02-08 10:01"), "broker-a", "orders", 600)],
                                         got.schema)
        assert_df_equality(got, expected, ignore_nullable=True)
    finally:
        query.stop()
