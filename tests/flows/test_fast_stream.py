"""The open-window stream of the fast query (pipelines/job/flows/fast.py open_window_stream), in the style of Spark's own
streaming tests: one query on a tiny source, ``processAllAvailable()``, a memory sink, ``stop()`` in ``finally``.
The source is what the fast query reads in the product: the ingest query's events files (parse once,
pipelines/dataplane/events.py), each written from the ingest flow's own parse of a batch of raw records. Two
micro-batches: broker-a's minute line, then broker-b's line of the same minute and broker-a's line shipped again;
in ``update`` mode each micro-batch emits the running sums of the windows its input touched."""

from __future__ import annotations

import datetime as dt

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines.config import load_config
from pipelines.job.flows.fast import open_window_stream
from pipelines.job.flows.ingest import IngestFlow
from pipelines.dataplane import events
from pipelines.dataplane.quality.gate import QualityGate
from pipelines.dataplane.transforms import silver
from tests.helpers import raw_records, stats_line

# 18:00 in GMT+8 (stats.timezone) is 10:00 UTC; a line stamped 18:01:00 covers the minute 10:00-10:01 UTC
LOCAL = "2022-02-08 18:01:00"
START, END = dt.datetime(2022, 2, 8, 10, 0), dt.datetime(2022, 2, 8, 10, 1)


def puts(tps_sum: int) -> str:
    return stats_line(LOCAL, "TOPIC_PUT_NUMS", "orders", f"SUM: {tps_sum} TPS: {tps_sum / 60:.2f} AVGPT: 1.00")


def test_open_window_sums_grow_per_micro_batch_and_count_a_reshipped_line_once(spark, tmp_path):
    cfg = load_config("conf/local.toml").with_paths(str(tmp_path / "landing"), str(tmp_path / "lake"))
    flow = IngestFlow(cfg, lake=None, gate=QualityGate(cfg, lake=None))
    directory = tmp_path / "events"
    directory.mkdir()

    def ingest(batch_id, *lines):   # what the ingest query writes for the fast query, one file per micro-batch
        raw = raw_records(spark, "broker_stats", [line for line, _ in lines[:1]], lines[0][1])
        for line, broker in lines[1:]:
            raw = raw.unionByName(raw_records(spark, "broker_stats", [line], broker))
        stats, failures = flow.parse(raw)
        events.write_batch(silver.metric_events(stats, failures), directory, batch_id)

    stream = open_window_stream(events.read_stream(spark, cfg, directory), cfg)
    orders = stream.where((F.col("resource_type") == "topic") & (F.col("resource") == "orders"))
    query = (orders.select("window_start", "window_end", "puts", "carriers").writeStream.format("memory")
             .queryName("open_windows").outputMode("update").start())
    try:
        ingest(0, (puts(600), "broker-a"))
        query.processAllAvailable()
        ingest(1, (puts(1200), "broker-b"), (puts(600), "broker-a"))  # broker-a's line shipped twice
        query.processAllAvailable()
        got = spark.sql("select * from open_windows")
        expected = spark.createDataFrame(
            [(START, END, 600, ["broker-a"]), (START, END, 1800, ["broker-a", "broker-b"])],
            got.schema)
        assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)
    finally:
        query.stop()
