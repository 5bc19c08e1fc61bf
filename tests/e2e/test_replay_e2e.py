"""python -m pipelines.sim.replay end to end, the governor's --once run included (a JVM each): a generated scenario
rendered open loop and replayed agrees with the simulator's own closed loop of it (bench/replay_agreement.py, one
scenario), and the real stats.log minutes quoted in public sources (tests/fixtures/public_stats) end in the one-line
"too short" error, never a traceback, after the job quarantined the broker outside ``[brokers] known``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from pipelines.sim.replay_input import quarantine_reasons

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_rendered_fixed_storm_replayed_agrees_with_the_simulator_s_closed_loop(tmp_path):
    done = subprocess.run([sys.executable, "bench/replay_agreement.py", "--scenarios", "storm_fixed", "--minutes",
                           "45", "--dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[PASS] group get-pugc-to-ai-consumer" in done.stdout and "[FAIL]" not in done.stdout
    report = (tmp_path / "storm_fixed" / "report" / "report.md").read_text(encoding="utf-8")
    assert "| group `get-pugc-to-ai-consumer` |" in report
    assert (tmp_path / "storm_fixed" / "report" / "resource-group-get-pugc-to-ai-consumer.png").is_file()


@pytest.mark.slow
def test_the_public_minutes_are_too_short_for_a_replay_and_a_broker_outside_brokers_known_is_quarantined(tmp_path):
    conf = tomllib.loads((ROOT / "conf" / "local.toml").read_text(encoding="utf-8"))
    conf["brokers"]["known"] = ["article-001"]  # the other folder's line: quarantined by the job, as in production
    (tmp_path / "known.toml").write_text(tomli_w.dumps(conf), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pipelines.sim.replay", "--landing",
                           str(ROOT / "tests" / "fixtures" / "public_stats"), "--report", str(tmp_path / "r"),
                           "--conf", str(tmp_path / "known.toml")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 1
    assert done.stderr.startswith("python -m pipelines.sim.replay: too short: 1 minute(s) of stats between "
                                  "2022-02-08 07:39 and 2022-02-08 07:39 UTC"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stdout + done.stderr
    reasons = quarantine_reasons(tmp_path / "r" / "lake")
    assert reasons["reason"].to_list() == ["unknown broker apache-rocketmq-3222 (not in [brokers] known)"]

