"""The ingest → gold events files: one per ingest batch, atomic, deterministic, read once, deleted once committed."""

from __future__ import annotations

import datetime as dt

from chispa import assert_df_equality

from pipelines.config import parse_config
from pipelines.dataplane import events
from pipelines.schemas import METRIC_EVENT

T0 = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)


def _events(spark, n: int, metric: str = "TOPIC_PUT_NUMS"):
    rows = [(T0 + dt.timedelta(seconds=i), "broker-a", f"topic-{i}", None, metric, i) for i in range(n)]
    return spark.createDataFrame(rows, METRIC_EVENT)


def _cfg(tmp_path, max_files: int = 0):
    return parse_config({"source": {"max_files_per_trigger": max_files}}).with_paths(
        str(tmp_path / "landing"), str(tmp_path / "lake"))


def test_batch_file_is_named_by_batch_and_replaced_by_a_replay(spark, tmp_path):
    directory = tmp_path / "events"
    assert events.write_batch(_events(spark, 3), directory, 42) == 3
    path = events.batch_file(directory, 42)
    assert path.name == "batch-000000042.parquet"
    first = path.read_bytes()
    assert events.write_batch(_events(spark, 3), directory, 42) == 3  # a replayed batch: same path, same bytes
    assert path.read_bytes() == first
    assert sorted(p.name for p in directory.iterdir()) == ["batch-000000042.parquet"]  # no temporary left
    assert_df_equality(spark.read.schema(METRIC_EVENT).parquet(str(path)), _events(spark, 3), ignore_row_order=True)


def test_a_batch_without_events_gets_an_empty_file(spark, tmp_path):
    assert events.write_batch(_events(spark, 0), tmp_path, 0) == 0
    assert spark.read.schema(METRIC_EVENT).parquet(str(events.batch_file(tmp_path, 0))).count() == 0


def test_stream_reads_each_batch_once_one_per_micro_batch_and_deletes_what_is_committed(spark, tmp_path):
    cfg = _cfg(tmp_path, max_files=4)
    directory = events.events_dir(cfg)
    for batch_id, n in enumerate((2, 3, 4)):
        events.write_batch(_events(spark, n), directory, batch_id)
    seen: list[tuple[int, int]] = []

    def run() -> None:
        query = (
            events.read_stream(spark, cfg).writeStream.trigger(availableNow=True)
            .foreachBatch(lambda df, batch_id: seen.append((batch_id, df.count())))
            .option("checkpointLocation", str(tmp_path / "checkpoint")).start()
        )
        query.awaitTermination()

    run()
    assert seen == [(0, 2), (1, 3), (2, 4)]  # one ingest batch per gold micro-batch, in batch order
    remaining = {p.name for p in directory.glob("batch-*")}
    assert "batch-000000000.parquet" not in remaining and "batch-000000001.parquet" not in remaining

    events.write_batch(_events(spark, 5), directory, 1)  # an ingest batch replayed after the gold query read it
    events.write_batch(_events(spark, 6), directory, 3)
    run()
    assert seen[3:] == [(3, 6)]  # the rewritten path is not read again
