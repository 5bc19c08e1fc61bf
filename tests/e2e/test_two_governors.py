"""Two governors on one lake: the second refuses in one line before starting Spark and writes nothing; once the
first is killed, the next one takes the lease over at once and completes."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from pipelines.io.lake import open_lake
from pipelines.io.lease import LEASE_FILE
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


def test_second_governor_refuses_and_a_killed_ones_lease_is_taken_over(spark, tmp_path):
    conf = tmp_path / "lean.toml"
    write_config(conf, **{"quality.validate_every_n_batches": 0, "windows.trigger_seconds": 2})
    first_landing, second_landing, lake = tmp_path / "landing", tmp_path / "other-landing", tmp_path / "lake"
    render_landing(SPEC, first_landing)
    render_landing(SPEC, second_landing)
    first = subprocess.Popen(_governor(conf, first_landing, lake), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
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
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    assert (lake / LEASE_FILE).exists()  # left behind by the killed governor

    third = subprocess.run(_governor(conf, first_landing, lake, "--once"), capture_output=True, text=True,
                           timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "taking over the stale lease" in third.stderr
    assert not (lake / LEASE_FILE).exists()  # released at the end
    bronze = open_lake(spark, str(lake)).read("bronze/broker_stats")
    assert bronze.where(F.col("origin").contains("other-landing")).count() == 0   # nothing of the refused one
    assert bronze.count() == bronze.dropDuplicates(["origin", "raw"]).count() > 0  # nothing twice
