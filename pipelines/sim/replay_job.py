"""The governor's own ``--once`` run on a recording, for the replay (:mod:`pipelines.sim.replay`): the job parses,
checks, quarantines and windows the landing directory exactly as it would in production, and the replay reads its
tables (:mod:`pipelines.sim.replay_input`). It runs as its own process (``python -m pipelines.governor``), so the
simulator stays free of Spark.

The run gets the operator's config with only what would reach outside the replay changed (:func:`job_settings`):
the landing directory and a lake of the replay's own, files as the source, every write-back sink off (a replay
never writes to a broker or a Kafka topic), no metrics port, and advisory mode (its decisions are the open-loop
reading of the recording; no signing key is needed). Known brokers are then ``[brokers] known`` (the name server is
read only by the RocketMQ sink, docs/contracts.md §1.3).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import tomli_w

from pipelines.config import parse_config, read_toml

ROOT = Path(__file__).resolve().parents[2]


class JobError(Exception):
    """The governor's run failed; the message is one line (its own last line, and where its log is)."""


def job_settings(conf: str | Path, landing: Path, lake: Path) -> dict:
    """The operator's config file ``conf`` as a mapping, with the replay's changes (module docstring).

    Raises:
        pipelines.config.ConfigError: the file is missing, not TOML, or a setting is bad (named).
    """
    data = read_toml(conf)
    data.setdefault("source", {}).update({"kind": "files", "landing": str(landing)})
    data.setdefault("lake", {}).update({"path": str(lake), "checkpoint_dir": ""})
    sink = data.setdefault("sink", {})
    for name in ("kafka", "rocketmq"):
        sink.setdefault(name, {})["enabled"] = False
    data.setdefault("metrics", {})["port"] = 0
    data.setdefault("limits", {})["mode"] = "advisory"
    parse_config(data)  # the changed mapping must still be a valid config
    return data


def write_job_config(conf: str | Path, landing: Path, lake: Path, path: Path) -> Path:
    """Write :func:`job_settings` to ``path`` (TOML) and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(job_settings(conf, landing, lake)), encoding="utf-8")
    return path


def run_once(config: Path, landing: Path, lake: Path, log: Path) -> float:
    """Run ``python -m pipelines.governor --conf config --landing landing --lake lake --once``, its output to
    ``log``; returns its wall seconds.

    Raises:
        JobError: it exited non-zero (its last line and the log's path in the message).
    """
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        done = subprocess.run([sys.executable, "-m", "pipelines.governor", "--conf", str(config), "--landing",
                               str(landing), "--lake", str(lake), "--once"], cwd=ROOT, stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        lines = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
        raise JobError(f"the governor's --once run failed (exit {done.returncode}): "
                       f"{lines[-1] if lines else 'no output'} (log: {log})")
    return time.monotonic() - started

