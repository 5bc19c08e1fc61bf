"""The checkpoint's Spark line (pipelines/job/checkpoint.py): recorded on every start, an older line refused in one
line before Spark starts. The upgrade itself (a 4.0 checkpoint continued by the installed pyspark):
tests/e2e/test_spark_upgrade.py. And the repair of a query killed before its first micro-batch, on a real
stateful streaming query (the governor restarting on such a checkpoint: tests/e2e/test_governor_e2e.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.config import load_config
from pipelines.job.checkpoint import (CHECKPOINT_SETTINGS_FILE, SPARK_VERSION_KEY, CheckpointMismatchError,
                                     check_checkpoint, clear_unplanned_first_batch, spark_line)
from tests.helpers import leave_unplanned_batch_zero


@pytest.fixture()
def cfg(tmp_path):
    return load_config("conf/local.toml").with_paths(str(tmp_path / "landing"), str(tmp_path / "lake"))


def settings_file(cfg) -> Path:
    return Path(cfg.checkpoint_root) / CHECKPOINT_SETTINGS_FILE


def saved(cfg) -> dict:
    return json.loads(settings_file(cfg).read_text())


def test_spark_line():
    assert spark_line("4.3.0") == (4, 3) and spark_line("4.10.1") == (4, 10) and spark_line("4.2.0.dev1") == (4, 2)


def test_newer_line_continues_and_is_recorded_older_line_is_refused(cfg):
    check_checkpoint(cfg, "4.0.5")
    assert saved(cfg)[SPARK_VERSION_KEY] == "4.0.5"
    check_checkpoint(cfg, "4.3.0")                      # the upgrade: goes on, the newer version recorded
    assert saved(cfg)[SPARK_VERSION_KEY] == "4.3.0"
    check_checkpoint(cfg, "4.3.1")
    check_checkpoint(cfg, "4.3.0")                      # a patch release back within the line: same format
    assert saved(cfg)[SPARK_VERSION_KEY] == "4.3.0"
    with pytest.raises(CheckpointMismatchError) as refused:
        check_checkpoint(cfg, "4.2.1")
    message = str(refused.value)
    assert "last run by Spark 4.3.0" in message and "runs Spark 4.2.1" in message
    assert "pip install 'pyspark>=4.3'" in message and "lake.checkpoint_dir" in message and "\n" not in message
    assert saved(cfg)[SPARK_VERSION_KEY] == "4.3.0"     # a refused start changes nothing
    assert saved(cfg)["windows.length_seconds"] == 60   # the bound settings are kept next to it


def test_settings_recorded_before_versions_count_as_the_40_line(cfg):
    """Checkpoints written before this check (pyspark 4.0) have settings without a Spark version: any line of the
    range continues on them."""
    check_checkpoint(cfg, "4.0.5")
    settings_file(cfg).write_text(json.dumps({"windows.length_seconds": 60, "source.kind": "files"}))
    check_checkpoint(cfg, "4.3.0")
    assert saved(cfg) == {"windows.length_seconds": 60, "source.kind": "files", SPARK_VERSION_KEY: "4.3.0"}


def test_cli_refuses_an_older_line_in_one_line_before_spark_starts(cfg, tmp_path):
    import pyspark

    major, minor = spark_line(pyspark.__version__)
    newer = f"{major}.{minor + 1}.0"
    (tmp_path / "landing").mkdir()
    check_checkpoint(cfg, newer)                        # as if a newer line had run on this lake
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.governor", "--conf", "conf/local.toml", "--landing", str(tmp_path / "landing"),
         "--lake", str(tmp_path / "lake"), "--once"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"last run by Spark {newer}" in done.stderr and f"pip install 'pyspark>={major}.{minor + 1}'" in done.stderr
    assert not (tmp_path / "lake" / "bronze").exists()  # nothing written


def _count_words(spark, source: Path, checkpoint: Path, name: str) -> dict:
    """A stateful streaming query (a running count per word) over ``source``, run to the end of what is there."""
    counts = spark.readStream.text(str(source)).groupBy("value").count()
    query = (counts.writeStream.outputMode("complete").format("memory").queryName(name)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination()
        return {r["value"]: r["count"] for r in spark.table(name).collect()}
    finally:
        query.stop()


def test_a_query_killed_before_its_first_batch_starts_again_and_reads_everything(spark, cfg, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.txt").write_text("storm\ncalm\nstorm\n")
    checkpoint = Path(cfg.checkpoint_root) / "counts"
    left = leave_unplanned_batch_zero(checkpoint)
    with pytest.raises(Exception, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
        _count_words(spark, source, checkpoint, "unrepaired")     # what every restart met before the repair

    assert clear_unplanned_first_batch(cfg) == sorted(left)
    assert _count_words(spark, source, checkpoint, "repaired") == {"storm": 2, "calm": 1}

    (source / "b.txt").write_text("storm\n")                    # a checkpoint with batches is never touched
    leave_unplanned_batch_zero(checkpoint)
    before = sorted(p for p in checkpoint.rglob("*") if p.is_file())
    assert clear_unplanned_first_batch(cfg) == []
    assert sorted(p for p in checkpoint.rglob("*") if p.is_file()) == before
