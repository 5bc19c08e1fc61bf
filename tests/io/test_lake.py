"""Delta writers: idempotent appends per (app id, micro-batch), range reads, identical tables from both writers."""

from __future__ import annotations

import datetime as dt

import pytest
from chispa import assert_df_equality

from pipelines import schemas
from pipelines.dataplane.lake import DeltaRsLake, DeltaSparkLake, UnknownTableError, open_lake, table_spec
from pipelines.dataplane.session import delta_spark_available
from tests.helpers import ts


def rows(spark):
    return spark.createDataFrame(
        [(ts("2022-02-08 07:39:00"), ts("2022-02-08 07:40:00"), "orders", 10.0, 2, 3, 1, {"OTHER": 3}, 0.1, 0, None),
         (ts("2022-02-08 08:39:00"), ts("2022-02-08 08:40:00"), "pay", 1.0, 1, 0, 0, None, 0.0, 0, 5.0)],
        schemas.GOLD_TOPIC_TPS)


def test_replayed_batch_writes_nothing_and_next_batch_appends(spark, tmp_path):
    lake = DeltaRsLake(spark, str(tmp_path))
    assert lake.append(rows(spark), "gold/topic_tps", app_id="q", version=0) == 2
    assert lake.append(rows(spark), "gold/topic_tps", app_id="q", version=0) == 0      # replay of batch 0
    assert lake.append(rows(spark), "gold/topic_tps", app_id="other", version=0) == 2  # another query
    assert lake.read("gold/topic_tps").count() == 4
    assert lake.committed_version("gold/topic_tps", "q") == 0


def test_driver_rows_append_as_the_same_table_as_a_dataframe(spark, tmp_path):
    records = [tuple(r) for r in rows(spark).collect()]
    records[1] = records[1][:7] + (None,) + records[1][8:]
    aware = dt.datetime(2022, 2, 8, 9, 39, tzinfo=dt.timezone(dt.timedelta(hours=1)))   # = 08:39 UTC
    records[1] = (aware,) + records[1][1:]
    by_rows, by_frame = DeltaRsLake(spark, str(tmp_path / "rows")), DeltaRsLake(spark, str(tmp_path / "frame"))
    assert by_rows.append_rows(records, "gold/topic_tps", app_id="q", version=3) == 2
    assert by_rows.append_rows(records, "gold/topic_tps", app_id="q", version=3) == 0     # replay of batch 3
    assert by_rows.append_rows([], "gold/topic_tps", app_id="q", version=4) == 0
    by_frame.append(spark.createDataFrame(records, schemas.GOLD_TOPIC_TPS), "gold/topic_tps", app_id="q", version=3)
    assert_df_equality(by_rows.read("gold/topic_tps").orderBy("topic"), by_frame.read("gold/topic_tps").orderBy("topic"))
    assert by_rows.read("gold/topic_tps").where("topic = 'pay'").first()["window_start"] == dt.datetime(2022, 2, 8, 8, 39)


def test_empty_batch_and_missing_table(spark, tmp_path):
    lake = DeltaRsLake(spark, str(tmp_path))
    assert lake.append(rows(spark).limit(0), "gold/topic_tps", app_id="q", version=0) == 0
    missing = lake.read("gold/limits")
    assert missing.count() == 0
    assert missing.schema == table_spec("gold/limits").schema
    assert missing.rdd.getNumPartitions() == 0  # no task (and no Python worker) when a job reads it
    with pytest.raises(UnknownTableError, match="unknown table 'gold/nope'"):
        lake.read("gold/nope")


def test_range_read_by_time_column(spark, tmp_path):
    lake = DeltaRsLake(spark, str(tmp_path))
    lake.append(rows(spark), "gold/topic_tps", app_id="q", version=0)
    got = lake.read("gold/topic_tps", since=dt.datetime(2022, 2, 8, 8, 0), before=dt.datetime(2022, 2, 8, 9, 0))
    assert [r["topic"] for r in got.collect()] == ["pay"]


def test_auto_writer_is_delta_rs_without_delta_jars(spark, tmp_path):
    lake = open_lake(spark, str(tmp_path), "auto")
    assert isinstance(lake, DeltaSparkLake if delta_spark_available(spark) else DeltaRsLake)


@pytest.mark.skipif("not __import__('pipelines.dataplane.session').dataplane.session._delta_jars_on_classpath()",
                    reason="Delta jars not on the Spark classpath (no Maven repository here)")
def test_delta_spark_and_delta_rs_write_identical_tables(spark, tmp_path):
    rs, native = DeltaRsLake(spark, str(tmp_path / "rs")), DeltaSparkLake(spark, str(tmp_path / "spark"))
    for lake in (rs, native):
        assert lake.append(rows(spark), "gold/topic_tps", app_id="q", version=3) == 2
        lake.append(rows(spark), "gold/topic_tps", app_id="q", version=3)  # replay: Delta skips it on delta-spark
        assert lake.read("gold/topic_tps").count() == 2
    assert_df_equality(rs.read("gold/topic_tps").orderBy("topic").drop("failures_by_class"),
                       native.read("gold/topic_tps").orderBy("topic").drop("failures_by_class"))


def test_replay_is_skipped_after_log_cleanup_keeps_only_the_checkpoint(spark, tmp_path):
    """The app transaction lives in the checkpoint once the JSON commits it was written in are cleaned up."""
    from deltalake import DeltaTable

    lake = DeltaRsLake(spark, str(tmp_path))
    for version in range(3):
        lake.append(rows(spark), "gold/topic_tps", app_id="q", version=version)
    table = DeltaTable(lake.path("gold/topic_tps"))
    table.create_checkpoint()
    log_dir = tmp_path / "gold" / "topic_tps" / "_delta_log"
    for commit in log_dir.glob("*.json"):  # what log retention does to old commits, all at once
        if not commit.name.startswith("_"):
            commit.unlink()
    assert not list(log_dir.glob("0*.json")) and list(log_dir.glob("*.checkpoint.parquet"))
    assert lake.committed_version("gold/topic_tps", "q") == 2
    assert lake.append(rows(spark), "gold/topic_tps", app_id="q", version=1) == 0
    assert lake.read("gold/topic_tps").count() == 6


def test_disk_full_append_is_retried_then_succeeds_once(spark, tmp_path, monkeypatch):
    from pipelines import faults
    from pipelines.dataplane.lake import retry as lake_module

    monkeypatch.setattr(lake_module, "APPEND_BACKOFF", (0.01, 0.02))
    monkeypatch.setattr(faults, "_fail_hits", {})
    monkeypatch.setenv(faults.FAIL_AT_ENV, faults.APPEND_FAULT)
    monkeypatch.setenv(faults.FAIL_COUNT_ENV, "2")
    lake = DeltaRsLake(spark, str(tmp_path))
    assert lake.append(rows(spark), "gold/topic_tps", app_id="q", version=0) == 2   # 2 failures, then written
    assert lake.read("gold/topic_tps").count() == 2
    monkeypatch.setattr(faults, "_fail_hits", {})
    monkeypatch.setenv(faults.FAIL_COUNT_ENV, str(lake_module.APPEND_ATTEMPTS))
    with pytest.raises(OSError, match="No space left on device"):                    # full for too long
        lake.append(rows(spark), "gold/topic_tps", app_id="q", version=1)
    assert lake.read("gold/topic_tps").count() == 2


def test_latest_row_per_resource_is_the_same_picked_on_the_driver_or_ranked_by_spark(spark, tmp_path):
    from pipelines.dataplane.lake.base import LakeBase as Lake, newest_per_key
    from pipelines.schemas import RESOURCE_KEYS

    lake = DeltaRsLake(spark, str(tmp_path))
    at = ts("2022-02-08 07:40:00")
    state = [  # (resource, limit, batch): orders' newest row below batch 3 is batch 1's, pay has only batch 2's
        ("topic", "orders", 10.0, 0), ("topic", "orders", 20.0, 1), ("topic", "orders", 30.0, 3),
        ("group", "pay", 5.0, 2),
    ]
    for batch, group in ((0, state[:2]), (1, state[2:])):
        fields = schemas.POLICY_STATE.fieldNames()
        lake.append(spark.createDataFrame(
            [tuple({"resource_type": t, "resource": r, "limit_qps": q, "version": 1, "last_candidate_end": at,
                    "mode": "enforce", "target_qps": q, "limited_since": at, "broker_shares": {"broker-a": 1.0},
                    "batch_id": b}.get(f) for f in fields) for t, r, q, b in group],
            schemas.POLICY_STATE),
            "state/policy", app_id="q", version=batch)
    rank = lambda df: newest_per_key(df, list(RESOURCE_KEYS), "batch_id")  # noqa: E731 (the Spark definition)
    driver = lake.latest("state/policy", list(RESOURCE_KEYS), "batch_id", rank, below=3)
    by_spark = Lake.latest(lake, "state/policy", list(RESOURCE_KEYS), "batch_id", rank, below=3)
    assert_df_equality(driver.orderBy("resource"), by_spark.orderBy("resource"))
    assert {(r["resource"], r["limit_qps"]) for r in driver.collect()} == {("orders", 20.0), ("pay", 5.0)}
    assert lake.latest("state/policy", list(RESOURCE_KEYS), "batch_id", rank, below=0).count() == 0  # none below
    assert lake.latest("gold/limits", list(RESOURCE_KEYS), "version", lambda df: df).count() == 0   # no table yet


def test_large_append_written_by_the_executors_is_the_same_table_and_readable_everywhere(spark, tmp_path):
    import pyarrow as pa
    from deltalake import DeltaTable

    by_executors = DeltaRsLake(spark, str(tmp_path / "executors"), executor_write_rows=1)
    by_driver = DeltaRsLake(spark, str(tmp_path / "driver"), executor_write_rows=1)
    assert by_executors.append(rows(spark), "gold/topic_tps", app_id="q", version=0, rows=2) == 2
    assert by_executors.append(rows(spark), "gold/topic_tps", app_id="q", version=0, rows=2) == 0   # replay
    assert by_driver.append(rows(spark), "gold/topic_tps", app_id="q", version=0, rows=1) == 2       # under the bar
    assert_df_equality(by_executors.read("gold/topic_tps").orderBy("topic"),
                       by_driver.read("gold/topic_tps").orderBy("topic"))
    table = DeltaTable(by_executors.path("gold/topic_tps"))
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert adds and all(a["path"].startswith("data/") for a in adds)                            # Spark's files
    assert table.transaction_version("q") == 0
    assert sorted(table.to_pandas()["topic"]) == ["orders", "pay"]                               # pandas, pyarrow
    assert sum(a["num_records"] for a in adds) == 2
    assert min(a["min.window_start"] for a in adds) == dt.datetime(2022, 2, 8, 7, 39, tzinfo=dt.timezone.utc)
    in_range = by_executors.read("gold/topic_tps", since=dt.datetime(2022, 2, 8, 8, 0))
    assert [r["topic"] for r in in_range.collect()] == ["pay"]


def test_a_table_written_before_a_column_was_added_reads_the_column_as_null_and_takes_it_on_append(spark, tmp_path):
    """A lake of an older release: gold/topic_tps without rate_limited and limit_qps. Reads give them as nulls (Spark
    and the driver path); the next append adds the columns (schema merge) and every reader sees all rows."""
    from deltalake import DeltaTable, write_deltalake

    from pipelines.dataplane.lake import DeltaRsLake
    from pipelines.schemas import RESOURCE_KEYS

    old = rows(spark).drop("rate_limited", "limit_qps").toArrow()
    path = tmp_path / "gold" / "topic_tps"
    write_deltalake(str(path), old)
    lake = DeltaRsLake(spark, str(tmp_path))
    read = lake.read("gold/topic_tps").orderBy("topic").collect()
    assert [(r["topic"], r["rate_limited"], r["limit_qps"]) for r in read] == [("orders", None, None), ("pay", None, None)]
    lake.append(rows(spark), "gold/topic_tps", app_id="new", version=0)
    assert {f.name for f in DeltaTable(str(path)).schema().to_arrow()} >= {"rate_limited", "limit_qps"}
    both = lake.read("gold/topic_tps").collect()
    assert sorted(((r["topic"], r["limit_qps"]) for r in both), key=lambda t: (t[0], t[1] or -1)) == [
        ("orders", None), ("orders", None), ("pay", None), ("pay", 5.0)]
    assert len(DeltaTable(str(path)).to_pandas()) == 4  # pandas reads the merged table
    old_state = spark.createDataFrame([("topic", "orders", 10.0, 1, None, None, None, None, "enforce", 0)],
                                      "resource_type string, resource string, limit_qps double, version long, "
                                      "last_candidate_end timestamp, last_decision_end timestamp, "
                                      "last_change_end timestamp, lift_at_qps double, mode string, batch_id long")
    write_deltalake(str(tmp_path / "state" / "policy"), old_state.toArrow())
    latest = lake.latest_rows("state/policy", list(RESOURCE_KEYS), "batch_id")
    assert latest[0]["limit_qps"] == 10.0 and latest[0]["broker_shares"] is None


def test_outputs_collected_by_one_job_append_as_the_same_tables(spark, tmp_path):
    from pipelines.dataplane.lake.registry import collect_tables

    limits = spark.createDataFrame([], schemas.GOLD_LIMITS)
    outputs = {"gold/topic_tps": rows(spark), "gold/limits": limits, "gold/group_tps": spark.createDataFrame(
        [], schemas.GOLD_GROUP_TPS)}
    one, each = DeltaRsLake(spark, str(tmp_path / "one")), DeltaRsLake(spark, str(tmp_path / "each"))
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("collect-test", "collect_tables")
    try:
        collected = one.collect(outputs)
        jobs = tracker.getJobIdsForGroup("collect-test")
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert len(jobs) == 1
    assert sorted(collected) == sorted(outputs) and collected["gold/limits"].num_rows == 0
    for table, df in outputs.items():
        assert one.append_arrow(collected[table], table, app_id="q", version=0) == each.append(
            df, table, app_id="q", version=0)
    assert one.append_arrow(collected["gold/topic_tps"], "gold/topic_tps", app_id="q", version=0) == 0  # replay
    assert_df_equality(one.read("gold/topic_tps").orderBy("topic"), each.read("gold/topic_tps").orderBy("topic"))
    assert one.read("gold/topic_tps").where("topic = 'orders'").first()["failures_by_class"] == {"OTHER": 3}
    # known row counts: an empty table and a large one are left to their own append; one table left: no job
    assert one.collect(outputs, {"gold/topic_tps": 2, "gold/limits": 0, "gold/group_tps": 0}) == {}
    assert collect_tables({"gold/limits": limits})["gold/limits"].schema.names == schemas.GOLD_LIMITS.names
    assert one.append(rows(spark), "gold/topic_tps", app_id="q", version=5, rows=0) == 0   # known empty: no write
