"""Faults while the governor runs, each with the checked outcome "no row lost or doubled, the governor goes on":
a landing file removed between listing and reading, a half-written file renamed into place late (older mtime), the
lake's disk full for a moment, a broker clock 10 minutes off in either direction."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from pipelines import governor
from pipelines.config import load_config
from pipelines.faults import (APPEND_FAULT, BALLAST, FAIL_AT_ENV, FAIL_COUNT_ENV, FAIL_MODE_ENV, FAIL_SKIP_ENV,
                             FILL_DIR_ENV)
from pipelines.dataplane import sources
from pipelines.dataplane.lake import open_lake
from pipelines.dataplane.lake.retry import APPEND_ATTEMPTS
from pipelines.job.flows.gold import GoldFlow
from pipelines.job.flows.ingest import IngestFlow
from pipelines.sim.render import render_landing
from pipelines.sim.spec import ScenarioSpec
from tests.helpers import assert_every_table_readable, write_config

pytestmark = pytest.mark.slow

SPEC = ScenarioSpec(
    seed=7, start=dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc), minutes=8, brokers=2, topics=3, groups=2,
    onset_minute=4,
)
GMT8 = dt.timedelta(hours=8)


def _conf(tmp_path: Path, **settings) -> Path:
    """conf/local.toml without per-batch GX validation, with ``settings`` (dotted names) changed."""
    return write_config(tmp_path / "faults.toml", **{"quality.validate_every_n_batches": 0, **settings})


def _line(stamp_utc: dt.datetime, topic: str = "orders") -> str:
    """A stats.log minute line of ``topic`` stamped ``stamp_utc`` (printed in GMT+8 as RocketMQ does)."""
    return f"{stamp_utc + GMT8:%Y-%m-%d %H:%M:%S} INFO - [TOPIC_PUT_NUMS] [{topic}] Stats In One Minute, SUM: 60 TPS: 1.00 AVGPT: 1.00\n"


def _count(spark, lake: Path, table: str) -> int:
    return open_lake(spark, str(lake)).read(table).count()


def _assert_balanced(spark, lake: Path) -> None:
    recon = open_lake(spark, str(lake)).read("quality/reconciliation")
    assert recon.count() > 0 and recon.where(~F.col("balanced")).count() == 0


# --- a landing file removed between listing and reading ---------------------------------------------------------


def test_file_removed_after_listing_fails_a_bare_file_source_but_not_ours(spark, tmp_path):
    def landing_with_two_files(root: Path) -> Path:
        folder = root / "broker_stats" / "broker-a"
        folder.mkdir(parents=True)
        (folder / "1.log").write_text("a\nb\nc\n")
        (folder / "2.log").write_text("d\ne\n")
        (root / "send_failures").mkdir()
        return folder / "2.log"

    def first_batch(df, root: Path, gone: Path) -> list[int]:
        seen: list[int] = []

        def handler(batch, batch_id):
            gone.unlink(missing_ok=True)  # listed by this micro-batch, not read yet
            seen.append(batch.count())

        query = (df.writeStream.foreachBatch(handler).trigger(availableNow=True)
                 .option("checkpointLocation", str(root / "_cp")).start())
        query.awaitTermination()
        return seen

    bare_root = tmp_path / "bare"
    gone = landing_with_two_files(bare_root)
    bare = spark.readStream.format("text").option("recursiveFileLookup", "true").load(str(bare_root / "broker_stats"))
    with pytest.raises(Exception, match="FileNotFound|does not exist|FILE_NOT_EXIST"):
        first_batch(bare, bare_root, gone)

    ours_root = tmp_path / "ours"
    gone = landing_with_two_files(ours_root)
    cfg = load_config(_conf(tmp_path)).with_paths(str(ours_root), str(tmp_path / "lake"))
    assert first_batch(sources.raw_records(spark, cfg), ours_root, gone) == [3]  # 1.log read, 2.log had no rows


def test_governor_goes_on_when_a_listed_file_disappears(spark, tmp_path, monkeypatch):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    written = render_landing(SPEC, landing)
    victim = sorted((landing / "broker_stats").rglob("*.log"))[-1]
    victim_lines = len(victim.read_text().splitlines())
    removed: list[Path] = []

    def removing(handler):
        def wrapped(self, df, batch_id):
            if not removed:  # before the first micro-batch of either query reads anything
                victim.unlink()
                removed.append(victim)
            return handler(self, df, batch_id)
        return wrapped

    monkeypatch.setattr(IngestFlow, "handle", removing(IngestFlow.handle))
    monkeypatch.setattr(GoldFlow, "handle", removing(GoldFlow.handle))
    governor.run(spark, load_config(_conf(tmp_path)).with_paths(str(landing), str(lake)), once=True)
    assert removed
    bronze = _count(spark, lake, "bronze/broker_stats")
    assert bronze == written["stats_lines"] - victim_lines   # every line of the files that were still there
    silver_or_quarantine = sum(_count(spark, lake, t) for t in
                               ("silver/broker_stats", "silver/send_failures", "quarantine"))
    assert silver_or_quarantine == bronze + written["failure_lines"]
    _assert_balanced(spark, lake)


# --- a half-written file renamed into place late ----------------------------------------------------------------


def test_half_written_file_is_ignored_until_renamed_then_read_once_despite_older_mtime(spark, tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    written = render_landing(SPEC, landing)
    cfg = load_config(_conf(tmp_path)).with_paths(str(landing), str(lake))
    governor.run(spark, cfg, once=True)
    before = _count(spark, lake, "bronze/broker_stats")
    assert before == written["stats_lines"]

    folder = landing / "broker_stats" / "broker-b"
    folder.mkdir(exist_ok=True)
    tail = SPEC.start + dt.timedelta(minutes=SPEC.minutes + 5)
    lines = [_line(tail + dt.timedelta(minutes=i), "late-topic") for i in range(4)]
    hidden = folder / ".late.log.tmp"
    hidden.write_text("".join(lines[:2]) + lines[2][:30])          # half written, no newline at the end
    governor.run(spark, cfg, once=True)
    assert _count(spark, lake, "bronze/broker_stats") == before    # a hidden file is not read

    hidden.write_text("".join(lines))
    oldest = min(p.stat().st_mtime for p in landing.rglob("*") if p.is_file() and p != hidden)
    os.utime(hidden, (oldest - 3600, oldest - 3600))                # written long ago, renamed only now
    hidden.rename(folder / "late.log")
    governor.run(spark, cfg, once=True)
    bronze = open_lake(spark, str(lake)).read("bronze/broker_stats")
    assert bronze.count() == before + len(lines)
    assert bronze.count() == bronze.dropDuplicates(["origin", "raw"]).count()
    governor.run(spark, cfg, once=True)
    assert _count(spark, lake, "bronze/broker_stats") == before + len(lines)  # and only once
    _assert_balanced(spark, lake)


# --- the disk of the lake full for a moment -----------------------------------------------------------------


def _governor_process(conf: Path, landing: Path, lake: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RATE_GOVERNOR_FAIL")}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.governor", "--conf", str(conf), "--landing", str(landing),
         "--lake", str(lake), "--once"], capture_output=True, text=True, timeout=900, env={**clean, **env})


@pytest.fixture()
def small_disk(tmp_path):
    """A 64 MiB tmpfs for the lakes (mounting needs root), and the fault mode that goes with it: ``fill`` (the
    governor really fills it at the failure point, a real torn write and ENOSPC); without a mount, ``torn`` (a
    partial Parquet file written into the table, then ENOSPC raised)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True)
    mounted = mount.returncode == 0
    # as root (CI) the mount must work: the docs/reliability.md row promises a real file system filled mid-write
    assert mounted or os.geteuid() != 0, mount.stderr
    yield disk, "fill" if mounted else "torn"
    if mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_disk_full_for_a_moment_is_retried_and_too_long_fails_the_batch_for_a_clean_replay(spark, tmp_path, small_disk):
    """The lake's disk fills up in the middle of an append (part of the file written, then ENOSPC): for a moment
    (3 attempts), the append is retried and the run completes; for longer than the retries, the micro-batch fails,
    the job exits != 0, and a restart once there is space replays it to the same tables. Every table stays readable
    by pyarrow, pandas and Spark."""
    disk, mode = small_disk
    landing = tmp_path / "landing"
    written = render_landing(SPEC, landing)
    conf = _conf(tmp_path)
    fault = {FAIL_AT_ENV: APPEND_FAULT, FAIL_SKIP_ENV: "2", FAIL_MODE_ENV: mode, FILL_DIR_ENV: str(disk)}

    brief = disk / "brief"  # full for 3 attempts in a row, mid-run: absorbed by the retries
    done = _governor_process(conf, landing, brief, **fault, **{FAIL_COUNT_ENV: "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("lake append failed") == 3 and "No space left on device" in done.stderr
    if mode == "fill":  # the file system's own ENOSPC, met by a write already under way (4 KiB were left)
        assert "injected at" not in done.stderr
    assert not (disk / BALLAST).exists()

    long = disk / "long"  # full for longer than the retries of both queries: a batch fails, a restart replays it
    failed = _governor_process(conf, landing, long, **fault, **{FAIL_COUNT_ENV: str(2 * APPEND_ATTEMPTS)})
    assert failed.returncode != 0 and "No space left on device" in failed.stderr
    assert failed.stderr.count("lake append failed") == APPEND_ATTEMPTS - 1
    (disk / BALLAST).unlink(missing_ok=True)  # space again
    # the restart and the runs below need no fault and no kill: they run in this test's Spark session
    run = lambda lake: governor.run(spark, load_config(conf).with_paths(str(landing), str(lake)), once=True)  # noqa: E731
    run(long)
    # When the failure stopped the gold query after its data batch but before the batch that emits the windows,
    # Spark emits them only once newer data moves the watermark (no trailing no-data batch after a restart): one
    # line ten minutes later lands for both lakes, so both emit every window of the scenario.
    flush = landing / "broker_stats" / "broker-a" / "flush.log"
    flush.write_text(_line(SPEC.start_utc.replace(tzinfo=None) + dt.timedelta(minutes=SPEC.minutes + 10), "flush"))
    for lake in (brief, long):
        run(lake)

    for lake in (brief, long):
        assert _count(spark, lake, "bronze/broker_stats") == written["stats_lines"] + 1
        assert _count(spark, lake, "bronze/send_failures") == written["failure_lines"]
        accounted = sum(_count(spark, lake, t) for t in ("silver/broker_stats", "silver/send_failures", "quarantine"))
        assert accounted == written["stats_lines"] + 1 + written["failure_lines"]
        _assert_balanced(spark, lake)
        assert_every_table_readable(spark, open_lake(spark, str(lake)))
    for table in ("gold/topic_tps", "gold/limits"):
        assert _count(spark, brief, table) == _count(spark, long, table) > 0


# --- a broker clock 10 minutes off ----------------------------------------------------------------------------


def _clock_skew_runs(spark, tmp_path: Path, name: str, max_future: int) -> list:
    """Run 1: broker-a on time (now-8..now-4 min) and broker-b 10 min fast; run 2: broker-a's next minutes and
    broker-b 10 min slow. Returns the reconciliation rows of broker_stats, by batch."""
    now = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0, tzinfo=None)
    landing, lake = tmp_path / name / "landing", tmp_path / name / "lake"
    minute = dt.timedelta(minutes=1)
    ten = dt.timedelta(minutes=10)

    def land(broker: str, file: str, stamps: list[dt.datetime]) -> None:
        folder = landing / "broker_stats" / broker
        folder.mkdir(parents=True, exist_ok=True)
        (folder / file).write_text("".join(_line(t) for t in stamps))

    conf = _conf(tmp_path, **{"stats.max_future_seconds": max_future})
    cfg = load_config(conf).with_paths(str(landing), str(lake))
    land("broker-a", "1.log", [now - k * minute for k in range(8, 3, -1)])
    land("broker-b", "1.log", [now - k * minute + ten for k in range(4, -1, -1)])  # fast: now+6 .. now+10
    governor.run(spark, cfg, once=True)
    land("broker-a", "2.log", [now - 3 * minute, now - 2 * minute])
    land("broker-b", "2.log", [now - k * minute - ten for k in range(8, 3, -1)])    # slow: now-18 .. now-14
    governor.run(spark, cfg, once=True)
    recon = open_lake(spark, str(lake)).read("quality/reconciliation").where(F.col("source") == "broker_stats")
    return sorted(recon.collect(), key=lambda r: r["batch_id"])


def test_broker_clock_ten_minutes_off_is_quarantined_ahead_and_counted_late_behind(spark, tmp_path):
    first, second = _clock_skew_runs(spark, tmp_path, "guarded", max_future=60)
    lake = tmp_path / "guarded" / "lake"
    fast = open_lake(spark, str(lake)).read("quarantine").where(F.col("reason").contains("after ingestion"))
    assert fast.count() == 5                       # broker-b's fast lines, with the reason
    assert (first["records_read"], first["silver_rows"], first["quarantine_rows"]) == (10, 5, 5)
    # broker-a's next minutes are on time; broker-b's slow lines are behind the watermark: late, counted, not lost
    assert (second["records_read"], second["silver_rows"], second["late_rows"], second["quarantine_rows"]) == (7, 2, 5, 0)
    assert first["balanced"] and second["balanced"]
    assert _count(spark, lake, "bronze/broker_stats") == 17


def test_without_the_guard_a_fast_clock_makes_the_other_brokers_lines_late(spark, tmp_path):
    first, second = _clock_skew_runs(spark, tmp_path, "unguarded", max_future=86400)
    assert first["quarantine_rows"] == 0 and first["silver_rows"] == 10
    assert second["late_rows"] == 7                # broker-a's on-time lines too: what the guard prevents


# --- the Kafka write-back down at start, then back --------------------------------------------------------------


def test_governor_runs_with_its_kafka_sink_down_and_catches_up_when_it_is_back(spark, tmp_path):
    import json

    from tests.e2e.test_governor_e2e import CULPRIT, SPEC as STORM
    from tests.kafka_broker import KafkaBroker, free_port

    port = free_port()
    conf = _conf(tmp_path, **{
        "sink.kafka.enabled": True,
        "sink.kafka.bootstrap_servers": f"127.0.0.1:{port}",
    })
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    render_landing(STORM, landing)
    cfg = load_config(conf).with_paths(str(landing), str(lake))
    governor.run(spark, cfg, once=True)                                    # no broker on that port
    published = json.loads((lake / "control" / "limits.json").read_text())["records"]
    assert [r["resource"] for r in published] == [CULPRIT]                 # the file sink went on
    status = open_lake(spark, str(lake)).read("control/sink_status").collect()
    assert status and all(not r["ok"] and r["error"] for r in status)

    broker = KafkaBroker(port).start()
    try:
        broker.create_topic("rate-governor-limits")
        tail = STORM.start + dt.timedelta(minutes=STORM.minutes + 10)
        (landing / "broker_stats" / "broker-a" / "99-tail.log").write_text(_line(tail, "tail"))
        governor.run(spark, cfg, once=True)                                # a restart, broker back
        got = broker.read_topic("rate-governor-limits")
    finally:
        broker.kill()
    status = open_lake(spark, str(lake)).read("control/sink_status").orderBy("batch_id").collect()
    assert status[-1]["ok"] and status[-1]["sent"] >= 1
    current = {r["resource"]: r["version"] for r in
               json.loads((lake / "control" / "limits.json").read_text())["records"]}
    assert {k: json.loads(v)["version"] for k, v in got if v} == {f"group:{CULPRIT}": current[CULPRIT]}
