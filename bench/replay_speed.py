"""How long ``python -m pipelines.sim.replay`` takes on a large recording, the governor's ``--once`` run included,
against its target: a 90-minute recording of 50 brokers, 1,000 topics and 300 consumer groups in under 5 minutes
on this 2-core machine.

    .venv/bin/python bench/replay_speed.py [--minutes 90] [--brokers 50] [--topics 1000] [--groups 300]
                                           [--scenario large_mix] [--target-seconds 300] [--runs 1] [--dir DIR]

The recording is generated (``python -m pipelines.sim --out DIR``, not timed): ``large_mix`` is a diurnal cluster
with the article-001 retry storm on ``broker-a`` and a flash sale, so the closed loop has a limit to hold. Each run
replays it into a fresh report directory (the job's lake included) as a separate process; prints the config, the
machine's load average before and after, each run's wall seconds with the steps of ``replay.json`` (the job, the
demand, the closed loop, the cluster without a governor) and the median; exits 1 when the median misses the target
(or a run fails). No baseline commit applies: the command is new (the closed loop's own speed against a baseline is
``bench/sim_speed.py --baseline``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def replay_once(landing: Path, report: Path) -> dict:
    """One replay of ``landing`` into ``report``: its wall seconds and ``replay.json``'s timings and run."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipelines.sim.replay", "--landing", str(landing), "--report",
                           str(report)], cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode:
        raise SystemExit(f"the replay failed (exit {done.returncode}): {done.stderr.strip()}")
    figures = json.loads((report / "replay.json").read_text(encoding="utf-8"))
    return {"wall": wall, "job": figures["run"]["job_seconds"], **figures["timings"],
            "resources": [f"{r['resource_type']} {r['resource']}" for r in figures["resources"]],
            "summary": done.stdout.strip().splitlines()[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="large_mix")
    p.add_argument("--minutes", type=int, default=90)
    p.add_argument("--brokers", type=int, default=50)
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--groups", type=int, default=300)
    p.add_argument("--target-seconds", type=float, default=300.0)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.dir or Path(tmp)
        landing = out / "landing"
        subprocess.run([sys.executable, "-m", "pipelines.sim", "--out", str(landing), "--scenario", args.scenario,
                        "--minutes", str(args.minutes), "--brokers", str(args.brokers), "--topics", str(args.topics),
                        "--groups", str(args.groups)], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        lines = sum(1 for f in (landing / "broker_stats").rglob("*") if f.is_file() for _ in f.open("rb"))
        print(f"replay speed: {args.scenario}, {args.minutes} min, {args.brokers} brokers, {args.topics} topics, "
              f"{args.groups} groups ({lines:,} stats lines); conf/local.toml, conf/backtest.toml; {os.cpu_count()} "
              f"CPUs; target {args.target_seconds:.0f} s wall; load average before {load()}")
        runs = []
        for i in range(args.runs):
            r = replay_once(landing, out / f"report-{i}")
            runs.append(r)
            print(f"  run {i + 1}: {r['wall']:.1f} s wall (job {r['job']:.1f} s, demand {r['demand_seconds']:.1f} s, "
                  f"closed loop {r['closed_loop_seconds']:.1f} s, no governor {r['no_governor_seconds']:.1f} s, "
                  f"report {r.get('report_seconds', float('nan')):.1f} s); limited or flagged: "
                  f"{', '.join(r['resources']) or 'none'}")
    median = statistics.median(r["wall"] for r in runs)
    ok = median <= args.target_seconds
    print(f"median {median:.1f} s against the target {args.target_seconds:.0f} s: {'met' if ok else 'MISSED'}; "
          f"load average after {load()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
