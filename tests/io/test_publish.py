"""The publisher's driver-side path (delta-rs lake) gives the same control records as the Spark path, reads every
writer's commits and needs no state of its own (a new Publisher, as after a restart, sees the same set)."""

from __future__ import annotations

import datetime as dt

from pipelines import schemas
from pipelines.config import GovernorConfig
from pipelines.writeback import publish
from pipelines import tables
from pipelines.dataplane.lake import DeltaRsLake

NOW = dt.datetime(2026, 11, 22, 8, 0)
LATER = NOW + dt.timedelta(minutes=10)
KEY = b"k"


def row(rtype, resource, qps, version, action="set", expires=LATER, mode="enforce", split=None):
    return (NOW, NOW, rtype, resource, qps, int(qps) + 1, None, action, mode, expires, f"r{version}", version, "final",
            split)


def write(spark, lake, rows, app_id, batch):
    lake.append(spark.createDataFrame(rows, schemas.GOLD_LIMITS), tables.GOLD_LIMITS, app_id=app_id, version=batch)


def spark_path(lake, now):
    return publish.control_records(publish.current_limits(lake.read(tables.GOLD_LIMITS), now),
                                   GovernorConfig().limits, KEY)


def driver_path(lake, now):
    latest = lake.latest_rows(tables.GOLD_LIMITS, ["resource_type", "resource"], "version")
    return publish.records_from_rows(publish.current_rows(latest, now), GovernorConfig().limits, KEY)


def test_driver_path_equals_spark_path_over_both_writers(spark, tmp_path):
    lake = DeltaRsLake(spark, str(tmp_path))
    assert driver_path(lake, NOW) == [] == spark_path(lake, NOW)  # no table yet
    write(spark, lake, [row("group", "g1", 30.0, 1), row("topic", "t1", 50.0, 1), row("group", "g2", 5.0, 1),
                        row("group", "ü-last", 7.0, 1), row("group", "Z-upper", 8.0, 1)], "governor-gold", 0)
    # the fast flow's commit: a newer g1, a lift of t1, g2 re-set but already expired, an advisory one
    write(spark, lake, [row("group", "g1", 12.5, 2), row("topic", "t1", 0.0, 2, action="lift"),
                        row("group", "g2", 6.0, 2, expires=NOW - dt.timedelta(seconds=1)),
                        row("topic", "t9", 99.0, 4, mode="advisory")], "governor-fast", 0)
    write(spark, lake, [row("group", "g1", 11.0, 3, action="relax",
                            split={"broker-a": 8.25, "broker-b": 2.75, "*": 2.75})], "governor-gold", 1)
    got = driver_path(lake, NOW)
    assert got == spark_path(lake, NOW)
    assert [(r["resource"], r["version"], r["limit_qps"]) for r in got] == [
        ("Z-upper", 1, 8.0), ("g1", 3, 11.0), ("ü-last", 1, 7.0), ("t9", 4, 99.0)]
    # the per-broker shares ride in the signed record (docs/contracts.md §3); records without them carry none
    assert got[1]["brokers"] == {"*": {"limit_qps": 2.75, "burst": 3}, "broker-a": {"limit_qps": 8.25, "burst": 9},
                                 "broker-b": {"limit_qps": 2.75, "burst": 3}}
    assert "brokers" not in got[0]
    assert got[0]["expires_at"] == "2026-11-22T08:10:00Z"
    assert driver_path(lake, LATER) == [] == spark_path(lake, LATER)  # everything expired


def test_publisher_uses_the_driver_path_and_rebuilds_from_the_table(spark, tmp_path):
    cfg = GovernorConfig().with_paths(str(tmp_path / "landing"), str(tmp_path))
    lake = DeltaRsLake(spark, str(tmp_path))
    write(spark, lake, [row("group", "g1", 30.0, 1)], "governor-gold", 0)
    first = publish.Publisher(cfg, lake)
    assert [r["version"] for r in first.records(NOW)] == [1]
    write(spark, lake, [row("group", "g1", 20.0, 2)], "governor-fast", 0)  # another writer's commit
    assert [r["version"] for r in first.records(NOW)] == [2]
    restarted = publish.Publisher(cfg, lake)
    assert restarted.records(NOW) == first.records(NOW) == spark_path_with(cfg, lake, restarted.key)


def spark_path_with(cfg, lake, key):
    return publish.control_records(publish.current_limits(lake.read(tables.GOLD_LIMITS), NOW), cfg.limits, key)


def test_the_spark_ranked_latest_rows_of_the_delta_spark_writer_publish_the_same_records(spark, tmp_path):
    """Both writers give ``latest_rows``, so the publisher has one path: the delta-spark writer's (ranked with Spark,
    :class:`pipelines.dataplane.lake.base.LakeBase`) gives the same records as the delta-rs writer's driver-side pick."""
    from pipelines.dataplane.lake.base import LakeBase

    class SparkRanked(DeltaRsLake):  # delta-rs storage, the delta-spark writer's ranking
        latest = LakeBase.latest
        latest_rows = LakeBase.latest_rows

    lake = DeltaRsLake(spark, str(tmp_path))
    ranked = SparkRanked(spark, str(tmp_path))
    assert ranked.latest_rows(tables.GOLD_LIMITS, ["resource_type", "resource"], "version") == []  # no table yet
    write(spark, lake, [row("group", "g1", 30.0, 1), row("topic", "t1", 50.0, 1)], "governor-gold", 0)
    write(spark, lake, [row("group", "g1", 11.0, 3, action="relax", split={"broker-a": 8.25, "*": 2.75}),
                        row("topic", "t1", 0.0, 2, action="lift")], "governor-gold", 1)
    assert driver_path(ranked, NOW) == driver_path(lake, NOW) == spark_path(lake, NOW)
    assert [(r["resource"], r["version"]) for r in driver_path(ranked, NOW)] == [("g1", 3)]
