"""The replay checked against what is known: a generated scenario rendered open loop (``python -m pipelines.sim
--out DIR``), replayed (``python -m pipelines.sim.replay``, the governor's ``--once`` run included), against the
simulator's own closed loop of the same scenario and seed (:func:`pipelines.sim.loop.simulate`).

    .venv/bin/python bench/replay_agreement.py [--scenarios storm_fixed,retry_storm,noisy_neighbour]
                                               [--minutes 60] [--brokers 4] [--topics 10] [--groups 6] [--seed 7]
                                               [--estimated] [--dir DIR]

For every cause of the scenario (its ground truth) the replay must agree with the simulator: its first limit in
force within one window (60 s), its bystanders' rejected sends (the other resources on its brokers, while the
recording flags it) within 10 % (or 1 send per flagged minute), its lift within 2 minutes (or neither lifted).

The brokers' capacities are the simulator's, passed as ``--capacity``: a rendering prints the scenario's demand,
not what brokers of that capacity would have admitted, so its busy minutes do not show the simulator's capacity.
``--estimated`` replays with the capacities estimated from the recording instead (printed, not checked).

``--enforced``: the recording is instead what the simulator's closed loop printed while the governor enforced its
limits (the brokers' admitted stats lines, the producers' logged refusals, the same background failures), with its
decisions as the ``gold/limits`` of a ``--limits-lake``; the replay must find the same first limit and lift. Its
bystanders' rejected sends are printed, not checked: before the first limit the busy broker refused send-backs that
no log shows and producers' sends beyond their log throttle, so the recording holds only the part of the storm the
broker admitted (the replay's demand is that part).

Prints the config, one line per cause with both figures and PASS/FAIL, the wall seconds of each replay; exits 1
when a cause fails (or a command fails).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pipelines.config import load_config  # noqa: E402
from pipelines.sim.admitted import admitted_rows, failure_rows, trickle  # noqa: E402
from pipelines.sim.figures import truth  # noqa: E402
from pipelines.sim.loop import closed_cluster, simulate  # noqa: E402
from pipelines.sim.minutes import failure_text, land, stats_files  # noqa: E402
from pipelines.sim.replay_figures import resource_figures  # noqa: E402
from pipelines.sim.settings import load_backtest_config  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402

START = dt.datetime(2026, 1, 5, 9, tzinfo=dt.timezone.utc)
WINDOW_S, LIFT_S, BYSTANDER_REL = 60.0, 120.0, 0.10


def record_closed_loop(sim, out: Path) -> tuple[Path, Path]:
    """(a landing directory of what ``sim``'s brokers printed and its producers logged, a lake whose ``gold/limits``
    are ``sim``'s decisions)."""
    from deltalake import write_deltalake

    c = sim.cluster
    admitted = pd.concat([admitted_rows(c, m) for m in range(c.T)], ignore_index=True)
    by_minute = stats_files(c.spec, admitted)
    files = [f for m in sorted(by_minute) for f in by_minute[m]]
    rng = np.random.default_rng(c.spec.seed + 3)
    failures = pd.concat([failure_rows(c, 0, len(c.rejections.tick), rng),
                          trickle(c, np.random.default_rng(c.spec.seed + 1))], ignore_index=True)
    files.append(("send_failures/closed-loop.jsonl", failure_text(failures)))
    land(out / "landing", files)
    cols = ["decided_at", "window_end", "resource_type", "resource", "limit_qps", "action", "mode", "expires_at",
            "version"]
    write_deltalake(str(out / "lake" / "gold" / "limits"), sim.limits[cols].astype({"version": "int64"}))
    return out / "landing", out / "lake"


def render(spec: ScenarioSpec, landing: Path) -> None:
    """``spec`` rendered open loop to ``landing`` by ``python -m pipelines.sim``."""
    subprocess.run([sys.executable, "-m", "pipelines.sim", "--out", str(landing), "--scenario", spec.name, "--seed",
                    str(spec.seed), "--minutes", str(spec.minutes), "--start", spec.start_utc.isoformat(),
                    "--brokers", str(spec.brokers), "--topics", str(spec.topics), "--groups", str(spec.groups)],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def replay(landing: Path, report: Path, capacity: dict | None, limits_lake: Path | None = None) -> tuple[dict, float]:
    """(the replay's replay.json, its wall seconds) of ``landing``."""
    flags = ["--capacity", *[f"{b}={c:.6f}" for b, c in capacity.items()]] if capacity else []
    flags += ["--limits-lake", str(limits_lake)] if limits_lake else []
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipelines.sim.replay", "--landing", str(landing), "--report",
                           str(report), *flags], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"replay of {landing} failed: {done.stderr.strip()}")
    return json.loads((report / "replay.json").read_text(encoding="utf-8")), time.monotonic() - started


def compare(sim, replayed: dict, key: tuple[str, str], bystanders: bool = True) -> tuple[bool, str]:
    """(agrees, the line) for one cause: the simulator's figures over the replay's flagged spans of it; the
    bystanders' rejected sends part of the verdict only with ``bystanders``."""
    row = next((r for r in replayed["resources"] if (r["resource_type"], r["resource"]) == key), None)
    if row is None or row["first_in_force"] is None:
        return False, f"{key[0]} {key[1]}: not limited in the replay"
    spans = [(pd.Timestamp(a), pd.Timestamp(b)) for a, b in row["spans"]]
    ref = resource_figures(sim, key, spans)
    first = (pd.Timestamp(row["first_in_force"]) - pd.Timestamp(ref["first_in_force"])).total_seconds()
    mine, theirs = row["bystander_rejected"]["replayed"], ref["bystander_rejected"]["replayed"]
    by_ok = abs(mine - theirs) <= max(BYSTANDER_REL * theirs, row["cause_minutes"])
    lifts = (row["lifted_at"], ref["lifted_at"])
    lift = (pd.Timestamp(lifts[0]) - pd.Timestamp(lifts[1])).total_seconds() if all(lifts) else None
    lift_ok = lift is not None and abs(lift) <= LIFT_S or lifts == (None, None)
    ok = abs(first) <= WINDOW_S and (by_ok or not bystanders) and lift_ok
    text = (f"{key[0]} {key[1]}: first limit in force {pd.Timestamp(ref['first_in_force']):%H:%M:%S} / "
            f"{pd.Timestamp(row['first_in_force']):%H:%M:%S} ({first:+.0f} s); bystanders' rejected sends "
            f"{theirs:,.0f} / {mine:,.0f} ({100 * (mine - theirs) / theirs if theirs else 0:+.1f} %"
            f"{'' if bystanders else ', not checked'}); lift "
            f"{_t(lifts[1])} / {_t(lifts[0])}" + (f" ({lift / 60:+.1f} min)" if lift is not None else ""))
    return ok, text


def _t(v) -> str:
    return "none" if v is None else f"{pd.Timestamp(v):%H:%M:%S}"


def check(name: str, args: argparse.Namespace, out: Path) -> bool:
    """Render, replay and compare one scenario; prints its lines; True when every cause agrees."""
    spec = ScenarioSpec(name=name, seed=args.seed, start=START, minutes=args.minutes, brokers=args.brokers,
                        topics=args.topics, groups=args.groups)
    bcfg = load_backtest_config(REPO / "conf" / "backtest.toml")
    cluster = closed_cluster(spec, bcfg)
    capacity = {b: float(c) for b, c in cluster.capacity.items()}
    sim = simulate(spec, load_config(REPO / "conf" / "local.toml"), bcfg, cluster=cluster)
    if args.enforced:
        landing, lake = record_closed_loop(sim, out / name)
        replayed, wall = replay(landing, out / name / "report", capacity, lake)
    else:
        render(spec, out / name / "landing")
        replayed, wall = replay(out / name / "landing", out / name / "report", capacity)
    culprits, _spans = truth(sim)
    print(f"{name}: replay {wall:.0f} s wall (job {replayed['run']['job_seconds']:.0f} s); simulator / replay")
    ok = True
    if not culprits:  # no cause (a flash sale, a normal day): neither may enforce a limit
        theirs = sorted({f"{rt} {r}" for _t, snap in sim.in_force for _b, rt, r in snap})
        mine = sorted(f"{r['resource_type']} {r['resource']}" for r in replayed["resources"] if r["first_in_force"])
        ok = not theirs and not mine
        print(f"  [{'PASS' if ok else 'FAIL'}] no cause: enforced limits {', '.join(theirs) or 'none'} / "
              f"{', '.join(mine) or 'none'}")
    for key in sorted(culprits):
        agree, line = compare(sim, replayed, key, bystanders=not args.enforced)
        ok &= agree
        print(f"  [{'PASS' if agree else 'FAIL'}] {line}")
    if args.estimated:
        est, _ = replay(out / name / "landing", out / f"{name}-estimated", None)
        print("  with estimated capacities: " + "; ".join(
            f"{c['broker']} {c['capacity_tps']:,.0f} writes/s ({c['rule']}), the simulator's {capacity[c['broker']]:,.0f}"
            for c in est["capacity"] if c["busy_windows"]) + "; " + "; ".join(
            f"{r['resource']}: bystanders' rejected sends {r['bystander_rejected']['replayed']:,.0f}"
            for r in est["resources"]))
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default="storm_fixed,retry_storm,noisy_neighbour")
    p.add_argument("--minutes", type=int, default=60)
    p.add_argument("--brokers", type=int, default=4)
    p.add_argument("--topics", type=int, default=10)
    p.add_argument("--groups", type=int, default=6)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--estimated", action="store_true")
    p.add_argument("--enforced", action="store_true")
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args()
    print(f"replay agreement ({'the simulator closed loop recorded, --limits-lake' if args.enforced else 'rendered open loop'}): {args.minutes} min, {args.brokers} brokers, {args.topics} topics, {args.groups} groups, "
          f"seed {args.seed}, start {START:%Y-%m-%dT%H:%MZ}; conf/local.toml, conf/backtest.toml; capacities the "
          f"simulator's (--capacity); bounds: first limit {WINDOW_S:.0f} s, bystanders {BYSTANDER_REL:.0%}, lift "
          f"{LIFT_S / 60:.0f} min")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.dir or Path(tmp)
        results = [check(name, args, out) for name in args.scenarios.split(",")]
    print("all agree" if all(results) else "DISAGREE")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
