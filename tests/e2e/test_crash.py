"""Exactly-once across crashes: SIGKILL the governor at several points, restart it, and compare every Delta table
and limits.json with an uninterrupted run over the same landing data."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from pipelines import governor
from pipelines.sim.render import render_landing
from pipelines.sim.spec import ScenarioSpec
from pipelines.config import load_config
from pipelines.faults import CRASH_AFTER_ENV, CRASH_AT_ENV
from pipelines.job.checkpoint import CheckpointMismatchError, check_checkpoint
from pipelines.dataplane.lake import TABLES, open_lake
from tests.e2e.test_governor_e2e import _line_time
from tests.helpers import set_comparable, write_config

pytestmark = pytest.mark.slow

SPEC = ScenarioSpec(
    seed=5, start=dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc), minutes=20, brokers=2, topics=4,
    groups=3, onset_minute=10,
)
#: Columns whose value is the wall-clock time of processing, not a result.
TIMING_COLUMNS = {"ingested_at", "decided_at", "expires_at", "validated_at", "recorded_at"}
#: (crash point, hit) for the interrupted runs, in order; the last run completes.
CRASHES = [
    ("ingest:after:events", 1),                   # the first batch's events file in place, checkpoint not committed
    ("ingest:after:bronze/broker_stats", 2),      # mid micro-batch (the second one)
    ("gold:after:state/policy", 1),               # all Delta writes of a batch done, checkpoint not committed
    ("publish:before-replace", 1),                # during the limits file write
]
CHUNK_MINUTES = 10


def _chunked_landing(root: Path) -> Path:
    """The scenario split in 10-minute files, so --once runs several micro-batches (max 4 files each)."""
    whole, landing = root / "whole", root / "landing"
    render_landing(SPEC, whole)
    for f in sorted(whole.rglob("*")):
        if not f.is_file():
            continue
        chunks: dict[int, list[str]] = {}
        for line in f.read_text().splitlines(keepends=True):
            chunks.setdefault(int((_line_time(line) - SPEC.start).total_seconds() // (CHUNK_MINUTES * 60)), []).append(line)
        for index, lines in sorted(chunks.items()):
            target = landing / f.relative_to(whole).parent / f"{index:02d}-{f.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(lines))
            os.utime(target, (1_700_000_000 + index, 1_700_000_000 + index))
    return landing


def _run(landing: Path, lake: Path, conf: Path, crash: tuple[str, int] | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k not in (CRASH_AT_ENV, CRASH_AFTER_ENV)}
    if crash:
        env[CRASH_AT_ENV], env[CRASH_AFTER_ENV] = crash[0], str(crash[1])
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.governor", "--conf", str(conf), "--landing", str(landing), "--lake", str(lake), "--once"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    return done.returncode


def _tables(spark, lake: Path, origin: str = "/[ab]/landing/") -> dict:
    """Every table without its wall-clock columns; ``origin`` (a regex) is where the runs' landing paths differ."""
    out = {}
    for table in TABLES:
        df = open_lake(spark, str(lake)).read(table)
        keep = [c for c in df.columns if c not in TIMING_COLUMNS and c != "failures_by_class"]
        df = df.select(*keep)
        if "origin" in df.columns:  # the two runs read copies of the landing directory (in /a and /b here)
            df = df.withColumn("origin", F.regexp_replace("origin", origin, "/landing/"))
        out[table] = set_comparable(df)
    return out


def _limits_records(lake: Path) -> list:
    records = json.loads((lake / "control" / "limits.json").read_text())["records"]
    return [{k: v for k, v in r.items() if k not in ("expires_at", "signature")} for r in records]


def _write_tail(landing: Path) -> None:
    """Later data landing after the runs: Spark runs no trailing no-data micro-batch after it recovered a replayed
    batch, so the last windows of a run are emitted when more data arrives; both runs get this same later data."""
    tail = SPEC.start + dt.timedelta(minutes=SPEC.minutes + 10) + dt.timedelta(hours=8)
    target = landing / "broker_stats" / "broker-a" / "99-tail.log"
    target.write_text(f"{tail:%Y-%m-%d %H:%M:%S} INFO - [TOPIC_PUT_NUMS] [tail] Stats In One Minute, SUM: 60 TPS: 1.00 AVGPT: 1.00\n")
    os.utime(target, (1_700_000_100, 1_700_000_100))


def assert_same_tables(spark, got_lake: Path, want_lake: Path, how: str, origin: str = "/[ab]/landing/",
                       tables=TABLES) -> dict:
    """Each of ``tables`` in ``got_lake`` equals ``want_lake``'s (rows as multisets, wall-clock columns left out,
    the policy state's latest row per resource); returns ``want_lake``'s tables. ``how`` names ``got_lake`` in a
    failure."""
    want, got = _tables(spark, want_lake, origin), _tables(spark, got_lake, origin)
    want["state/policy"], got["state/policy"] = _latest_state(want["state/policy"]), _latest_state(got["state/policy"])
    for table in tables:
        a, b = got[table], want[table]
        assert a.count() == b.count(), f"{table}: {a.count()} rows {how}, {b.count()} in the reference run"
        extra, missing = a.exceptAll(b), b.exceptAll(a)
        assert extra.count() == 0 and missing.count() == 0, (
            f"{table} differs: {how} only {[r.asDict() for r in extra.limit(3).collect()]}, "
            f"reference only {[r.asDict() for r in missing.limit(3).collect()]}")
    return want


def _latest_state(df):
    from pyspark.sql import Window

    newest = Window.partitionBy("resource_type", "resource").orderBy(F.col("batch_id").desc())
    return df.select("*", F.row_number().over(newest).alias("_n")).where(F.col("_n") == 1).drop("_n", "batch_id")


def test_sigkill_at_each_point_then_restart_equals_uninterrupted_run(spark, tmp_path):
    # several micro-batches per run; GX validation off here (its results table is covered by tests/quality)
    conf = write_config(tmp_path / "crash.toml", **{"source.max_files_per_trigger": 4,
                                                    "quality.validate_every_n_batches": 0})
    clean_landing, crashed_landing = _chunked_landing(tmp_path / "a"), _chunked_landing(tmp_path / "b")
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"

    clean_cfg = load_config(conf).with_paths(str(clean_landing), str(clean))
    governor.run(spark, clean_cfg, once=True)             # uninterrupted, in this test's Spark session
    for point in CRASHES:
        code = _run(crashed_landing, crashed, conf, point)
        assert code == -9, f"expected SIGKILL at {point}, exit {code}"
    _write_tail(clean_landing)
    governor.run(spark, clean_cfg, once=True)
    _write_tail(crashed_landing)
    governor.run(spark, load_config(conf).with_paths(str(crashed_landing), str(crashed)), once=True)  # recovery

    want = assert_same_tables(spark, crashed, clean, "after crashes")
    assert want["gold/limits"].where(F.col("resource") == "get-pugc-to-ai-consumer").count() > 0
    assert _limits_records(crashed) == _limits_records(clean)
    assert not list((crashed / "control").glob(".limits.json.*.tmp"))


def test_restart_with_changed_window_length_is_refused(tmp_path):
    base = load_config("conf/local.toml").with_paths(str(tmp_path / "landing"), str(tmp_path / "lake"))
    check_checkpoint(base)                                   # first start records the settings
    detection = base.detection.model_copy(update={"retry_floor_tps": 80.0})
    check_checkpoint(base.model_copy(update={"detection": detection}))   # a threshold may change
    longer = base.model_copy(update={"windows": base.windows.model_copy(update={"length_seconds": 120})})
    with pytest.raises(CheckpointMismatchError, match="windows.length_seconds is 120 but the checkpoint"):
        check_checkpoint(longer)
    # the CLI refuses before starting Spark, in one line
    (tmp_path / "landing").mkdir()
    changed = tmp_path / "c.toml"
    write_config(changed, **{"windows.length_seconds": 120})
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.governor", "--conf", str(changed), "--landing", str(tmp_path / "landing"),
         "--lake", str(tmp_path / "lake"), "--once"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "windows.length_seconds is 120 but the checkpoint" in done.stderr and "restore" in done.stderr
