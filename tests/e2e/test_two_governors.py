"""Two governors on one lake: the second refuses in one line before starting Spark and writes nothing; once the
first is killed, the next one takes the lease over at once and completes."""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from pipelines import governor
from pipelines.config import load_config
from pipelines.job.flows.fast import CHECKPOINT as FAST
from pipelines.dataplane.lake import open_lake
from pipelines.job.lease import LEASE_FILE
from pipelines.sim.render import render_landing
from pipelines.sim.spec import ScenarioSpec
from tests.helpers import write_config

pytestmark = pytest.mark.slow

SPEC = ScenarioSpec(
    seed=3, start=dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc), minutes=8, brokers=2, topics=3, groups=2,
    onset_minute=4,
)


def _governor(conf: Path, landing: Path, lake: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.governor", "--conf", str(conf), "--landing", str(landing),
            "--lake", str(lake), *extra]


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc.poll() is None, f"first governor exited ({proc.returncode}) before {what}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_second_governor_refuses_and_a_killed_ones_lease_is_taken_over(spark, tmp_path, caplog):
    conf = tmp_path / "lean.toml"
    write_config(conf, **{"quality.validate_every_n_batches": 0, "windows.trigger_seconds": 2})
    first_landing, second_landing, lake = tmp_path / "landing", tmp_path / "other-landing", tmp_path / "lake"
    render_landing(SPEC, first_landing)
    render_landing(SPEC, second_landing)
    # its own process group: the kill below takes the driver and its JVM together, as a node, container or
    # systemd unit going down does (a driver killed alone leaves its JVM writing for a moment: docs/reliability.md)
    first = subprocess.Popen(_governor(conf, first_landing, lake), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for(lambda: (lake / "bronze" / "broker_stats" / "_delta_log").is_dir(), 180, "its first write", first)

        started = time.monotonic()
        second = subprocess.run(_governor(conf, second_landing, lake, "--once"), capture_output=True, text=True,
                                timeout=120)
        took = time.monotonic() - started
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(f"rate-governor: lake {lake} is held by ")
        assert f":{first.pid} since " in lines[0] and lines[0].endswith("; stop it or wait")
        assert took < 30, f"the refusal took {took:.1f} s (it must come before Spark starts)"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert (lake / LEASE_FILE).exists()  # left behind by the killed governor

    # the next one needs no kill: it runs in this test's Spark session (a fresh JVM adds nothing to the lease)
    with caplog.at_level(logging.WARNING, logger="rate_governor"):
        governor.run(spark, load_config(conf).with_paths(str(first_landing), str(lake)), once=True)
    assert "taking over the stale lease" in caplog.text
    assert not (lake / LEASE_FILE).exists()  # released at the end
    bronze = open_lake(spark, str(lake)).read("bronze/broker_stats")
    assert bronze.where(F.col("origin").contains("other-landing")).count() == 0   # nothing of the refused one
    assert bronze.count() == bronze.dropDuplicates(["origin", "raw"]).count() > 0  # nothing twice


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: relative path → (size, mtime in ns)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def _between_batches(lake: Path) -> bool:
    """Every query of the governor on ``lake`` has committed the newest micro-batch it planned, and no log entry is
    half written: Spark writes each entry to a temporary file and renames it, and Hadoop's checksummed local file
    system renames the entry first and its ``.crc`` after, so an entry can be visible while its temporary checksum
    still waits to be renamed."""
    def newest(folder: Path) -> int:
        return max((int(p.name) for p in folder.glob("*") if p.name.isdigit()), default=-1)
    queries = [lake / "_checkpoints" / q for q in ("ingest", FAST, "gold")]
    if any(".tmp" in p.name for p in (lake / "_checkpoints").rglob("*")):
        return False
    return all(newest(q / "offsets") == newest(q / "commits") >= 0 for q in queries)


def _hang_between_batches(proc: subprocess.Popen, lake: Path, timeout: float) -> None:
    """SIGSTOP ``proc``'s process group (the driver and its JVM) at a moment when no micro-batch is in flight, as
    seen in the stopped process's files: a check made before the signal can be overtaken by the next trigger, so a
    stop that lands mid-batch is resumed and tried again."""
    deadline = time.monotonic() + timeout
    while True:
        _wait_for(lambda: _between_batches(lake), max(deadline - time.monotonic(), 0.0), "no micro-batch in flight",
                  proc)
        os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)  # system calls in flight return before the threads stop
        if _between_batches(lake):
            return
        os.killpg(proc.pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "timed out hanging the holder between micro-batches"


def test_a_holder_that_hung_past_the_ttl_stops_its_queries_and_writes_nothing_after(spark, tmp_path, caplog):
    """A continuous governor is stopped (SIGSTOP, Python and its JVM) longer than ``lake.lease_ttl_seconds``;
    another governor takes the lake over, runs and releases it; when the first resumes (SIGCONT) it must notice
    that its lease expired, stop its queries, write nothing and exit != 0 with one line."""
    ttl = 15
    conf = write_config(tmp_path / "hung.toml", **{"quality.validate_every_n_batches": 0,
                                                    "windows.trigger_seconds": 2, "lake.lease_ttl_seconds": ttl})
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    render_landing(SPEC, landing)
    first = subprocess.Popen(_governor(conf, landing, lake), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        _wait_for(lambda: (lake / "control" / "limits.json").exists(), 240, "its first gold micro-batch", first)
        # hang it between micro-batches: every planned batch committed (a holder hung between its handler and
        # Spark's commit is docs/reliability.md, "Not covered")
        _hang_between_batches(first, lake, 120)  # the driver and its JVM hang
        time.sleep(ttl + 1.5)
        later = dt.datetime(2026, 11, 22, 8, 0) + dt.timedelta(minutes=SPEC.minutes + 5, hours=8)
        (landing / "broker_stats" / "broker-a" / "late.log").write_text(
            f"{later:%Y-%m-%d %H:%M:%S} INFO - [TOPIC_PUT_NUMS] [late] Stats In One Minute, SUM: 60 TPS: 1.00 AVGPT: 1.00\n")
        # the one that takes the lake over needs no kill: it runs in this test's Spark session
        with caplog.at_level(logging.WARNING, logger="rate_governor"):
            governor.run(spark, load_config(conf).with_paths(str(landing), str(lake)), once=True)
        assert "taking over the stale lease" in caplog.text
        before = _files(lake)
        os.killpg(first.pid, signal.SIGCONT)
        _, stderr = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGCONT)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
    assert first.returncode == 2, stderr[-3000:]
    # no traceback but Spark's report of a micro-batch that failed on the lost lease (one planned before the
    # renewal thread saw the loss may start after SIGCONT; its foreachBatch asks the lease first and raises)
    lines = stderr.splitlines()
    for start in (i for i, line in enumerate(lines) if line.startswith("Traceback")):
        block = lines[start:start + 60]
        assert any("LakeHeldError: " in line for line in block), "\n".join(block)
    assert stderr.strip().splitlines()[-1] == (
        f"rate-governor: lake {lake}: the lease was taken over by another governor; stopped"), stderr[-3000:]
    after = _files(lake)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    # Nothing written after it resumed: no table, no limits.json, no sink state, no lease, no state store, no commit.
    # Only Spark's own planning of one more micro-batch may land first (its offsets, and the file source's list of
    # files seen), written by the JVM before any of the governor's code runs; that micro-batch then fails on the
    # fence before it reads anything, and the next governor runs it. Spark writes each of those log entries to a
    # temporary file first (HDFSMetadataLog: ".<batch>.<uuid>.tmp", renamed when complete): a query stopped while
    # it writes one leaves the temporary file of the same entry. Each file may have its checksum beside it
    # (Hadoop's ".<name>.crc"). A micro-batch whose foreachBatch had finished when the holder hung may still have
    # its commit to write when it resumes: the next governor already ran that micro-batch again and committed it,
    # so Spark's rename of the commit refuses ("Concurrent update to the log") and only its temporary file stays.
    planning = rf"_checkpoints/(ingest|{FAST}|gold)/(offsets|sources/0)/\.?(\d+|\.\d+\.[0-9a-f-]{{36}}\.tmp)(\.crc)?"
    refused_commit = rf"_checkpoints/(ingest|{FAST}|gold)/commits/\.?\.\d+\.[0-9a-f-]{{36}}\.tmp(\.crc)?"
    assert all(re.fullmatch(planning, k) or re.fullmatch(refused_commit, k) for k in changed), changed
    assert not (lake / LEASE_FILE).exists()
