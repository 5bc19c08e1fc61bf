"""The Spark-free closed loop's speed and its decisions: every named scenario of the closed-loop backtest run by
:func:`pipelines.sim.loop.simulate`, its CPU time (``time.process_time``, not wall time: the machine is shared)
per 30 simulated minutes, its checks, and its decided ``gold/limits`` rows compared with a recording.

    .venv/bin/python bench/sim_speed.py [--scenarios a,b] [--repeat 2] [--check] [--record FILE] [--compare FILE]
                                        [--baseline COMMIT [--runs 4]]

* ``--repeat N``: run each scenario N times and keep the least CPU time (other jobs on the machine inflate it);
* ``--check``: exit 1 when a scenario costs more than ``--budget`` (1 s) of CPU per 30 simulated minutes (issue 40:
  "a 30-minute scenario takes at most 1 s on one core");
* ``--record FILE``: write each scenario's decided rows (action, limit_qps, version, reason, per-broker limits,
  window, basis, mode, previous_qps, burst, decided/expiry times) and its figures as JSON;
* ``--compare FILE``: compare them with a recording (strings exactly, numbers to a relative 1e-9); exit 1 and print
  the first differences when any differs. An optimization must leave them equal.

* ``--baseline COMMIT``: the same measurement of this tree and of COMMIT (a worktree, ``bench/ab.py``), ``--runs``
  runs each, interleaved, as separate processes; prints each run's CPU seconds per 30 simulated minutes, the medians
  per tree and their ratio (``--check``: this tree's median against ``--budget``). The machine's speed swings by a
  third within minutes here, so only interleaved runs compare.

"On one core": polars runs with one thread (``POLARS_MAX_THREADS=1`` unless the environment sets it), as in the
sweep's workers; with its default pool of one thread per CPU, the process's CPU time also counts the pool's
threads (about 0.4 s more per 30 simulated minutes here, on two cores).

Prints one line per scenario: simulated minutes, CPU seconds, CPU seconds per 30 simulated minutes (and the share
of it spent in the decision plane the streaming job shares, :data:`DECISION_PLANE`), decisions,
checks (PASS or the failed ones) and, with ``--compare``, ``same`` or ``DIFFERS``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # before polars is imported: "on one core"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (bench/ab.py: --baseline, --tree)

TREE = ab.tree_from_argv()  # the tree measured: this checkout, or a baseline's worktree (--tree)
sys.path.insert(0, str(TREE))

from pipelines.sim.figures import compute  # noqa: E402
from pipelines.sim.settings import SCENARIO_SIZES, build_spec, governor_config, load_backtest_config, scenario_world  # noqa: E402,E501
from pipelines.sim.cluster import ClosedLoopCluster  # noqa: E402
from pipelines.sim.loop import simulate  # noqa: E402

#: A fixed clock, so that every run of a scenario has the same start (and the same rows).
NOW = dt.datetime(2026, 1, 5, 12, tzinfo=dt.timezone.utc)
REL = 1e-9
ROW_COLUMNS = ("window_end", "resource_type", "resource", "action", "limit_qps", "previous_qps", "burst", "version",
               "mode", "basis", "reason", "broker_limits", "decided_at", "expires_at")
#: Figures that are not decisions (time measured, not simulated).
NOT_COMPARED = {"wall_seconds"}


def _plain(value):
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if hasattr(value, "isoformat"):  # pandas Timestamp
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):  # numpy scalar
        return _plain(value.item())
    return value


def decided_rows(result) -> list[dict]:
    """The run's ``gold/limits`` rows (both paths, in decision order) as plain JSON values."""
    out = []
    for row in result.limits.to_dict("records"):
        item = {c: _plain(row.get(c)) for c in ROW_COLUMNS}
        if isinstance(item["broker_limits"], list):  # Arrow's list of (key, value) pairs
            item["broker_limits"] = {str(k): v for k, v in item["broker_limits"]}
        out.append(item)
    return out


#: The decision plane's entry points as the simulator's modules call them (module, name): the package the
#: streaming job shares (:mod:`pipelines.decide`), timed apart from the simulator's own work.
DECISION_PLANE = (("pipelines.sim.windows", "reduce_windows"), ("pipelines.sim.loop", "prepare_fast"),
                  ("pipelines.sim.loop", "decide_fast"), ("pipelines.sim.loop", "prepare_final"),
                  ("pipelines.sim.loop", "decide_final"), ("pipelines.sim.loop", "open_evidence"),
                  ("pipelines.sim.loop", "expected_brokers"),
                  # a baseline tree from before the paths' distinct names (one-place)
                  ("pipelines.sim.loop", "prepare_preliminary"), ("pipelines.sim.loop", "decide_preliminary"),
                  ("pipelines.sim.loop", "decide_prepared"))


class DecisionPlaneClock:
    """CPU seconds spent inside :data:`DECISION_PLANE` while in use (its functions wrapped, then put back)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._saved: list = []

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            c0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - c0
        return timed

    def __enter__(self) -> "DecisionPlaneClock":
        import importlib

        for module, name in DECISION_PLANE:
            mod = importlib.import_module(module)
            if not hasattr(mod, name):  # a baseline tree from before the shared reduction
                continue
            self._saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, self._wrap(getattr(mod, name)))
        return self

    def __exit__(self, *exc) -> None:
        for mod, name, fn in self._saved:
            setattr(mod, name, fn)
        self._saved.clear()


def run(name: str, cfg, bcfg, repeat: int) -> tuple[float, float, dict]:
    """(least CPU seconds of ``repeat`` runs, the decision plane's CPU seconds in that run, the recording of the
    last run)."""
    spec = build_spec(name, {}, now=NOW)
    bcfg, irregular = scenario_world(name, bcfg)  # its clients and irregularities
    best, plane, result = math.inf, math.inf, None
    for _ in range(repeat):
        with DecisionPlaneClock() as clock:
            c0 = time.process_time()
            result = simulate(spec, cfg, bcfg, irregular=irregular)
            spent = time.process_time() - c0
        if spent < best:
            best, plane = spent, clock.seconds
    base = ClosedLoopCluster(spec, bcfg.broker.model_copy(update={"tick_seconds": 0.5}), bcfg.clients)
    base.advance_to(base.end)
    figures = compute(result, base)
    values = {k: _plain(v[0]) for k, v in figures.values.items() if k not in NOT_COMPARED}
    checks = [[n, bool(ok), m] for n, ok, m in figures.checks]
    return best, plane, {"minutes": spec.minutes, "rows": decided_rows(result), "figures": values, "checks": checks}


def differences(old, new, where: str = "") -> list[str]:
    """Where two recordings differ (strings and counts exactly, floats to a relative :data:`REL`)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            if k not in old or k not in new:
                out.append(f"{where}.{k}: only in {'new' if k in new else 'recording'}")
            else:
                out += differences(old[k], new[k], f"{where}.{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{where}: {len(old)} items recorded, {len(new)} now"]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(old, float) and isinstance(new, (int, float)) and not isinstance(new, bool):
        return [] if abs(old - new) <= REL * max(abs(old), abs(new)) else [f"{where}: {old!r} -> {new!r}"]
    return [] if old == new else [f"{where}: {old!r} -> {new!r}"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default=",".join(SCENARIO_SIZES), help="comma-separated (default: all)")
    p.add_argument("--repeat", type=int, default=1, help="runs per scenario; the least CPU time is kept")
    p.add_argument("--check", action="store_true", help="exit 1 above --budget CPU s per 30 simulated minutes")
    p.add_argument("--budget", type=float, default=1.0, help="CPU seconds per 30 simulated minutes (default 1)")
    p.add_argument("--record", type=Path, help="write the decided rows and figures to this JSON file")
    p.add_argument("--compare", type=Path, help="compare the decided rows and figures with this JSON file")
    p.add_argument("--conf", default="conf/backtest.toml")
    p.add_argument("--baseline", metavar="COMMIT", help="A/B against COMMIT (module docstring)")
    p.add_argument("--runs", type=int, default=4, help="runs per tree with --baseline (default 4)")
    p.add_argument("--tree", help=argparse.SUPPRESS)  # the tree measured (bench/ab.py), read before imports
    p.add_argument("--json", help=argparse.SUPPRESS)  # write the figures here (bench/ab.py)
    args = p.parse_args(argv)
    names = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(names) - set(SCENARIO_SIZES))
    if unknown or args.repeat < 1 or args.runs < 1:
        why = "unknown scenario(s) " + ", ".join(unknown) if unknown else "--repeat and --runs must be at least 1"
        print(f"bench/sim_speed.py: {why}", file=sys.stderr)
        return 2
    if args.baseline:
        return compare(args)
    recorded = json.loads(args.compare.read_text()) if args.compare else None
    bcfg = load_backtest_config(args.conf)
    cfg = governor_config(bcfg, None, None)
    simulate(build_spec("normal_day", {"minutes": 8}, now=NOW), cfg, bcfg)  # warm-up: imports, polars' first calls
    out, slow, differ, total_cpu, total_plane, total_min = {}, [], [], 0.0, 0.0, 0
    for name in names:
        cpu, plane, rec = run(name, cfg, bcfg, args.repeat)
        out[name] = rec
        per30 = cpu / rec["minutes"] * 30.0
        total_cpu, total_plane, total_min = total_cpu + cpu, total_plane + plane, total_min + rec["minutes"]
        failed = [n for n, ok, _ in rec["checks"] if not ok]
        same = ""
        if recorded is not None:
            diffs = differences(recorded.get(name), rec, name) if name in recorded else [f"{name}: not recorded"]
            same = "; same" if not diffs else f"; DIFFERS ({len(diffs)})"
            if diffs:
                differ.append(name)
                for d in diffs[:8]:
                    print(f"    {d}")
        if per30 > args.budget:
            slow.append(name)
        print(f"{name}: {rec['minutes']} min, {cpu:.2f} s CPU, {per30:.2f} s per 30 min (decision plane "
              f"{plane / rec['minutes'] * 30:.2f} s); {len(rec['rows'])} "
              f"decisions; {'PASS' if not failed else 'FAIL ' + '; '.join(failed)}{same}", flush=True)
    print(f"all: {total_min} min, {total_cpu:.2f} s CPU, {total_cpu / total_min * 30:.2f} s per 30 min, of which "
          f"the decision plane {total_plane / total_min * 30:.2f} s and the simulator "
          f"{(total_cpu - total_plane) / total_min * 30:.2f} s "
          f"(least of {args.repeat} run(s) each; POLARS_MAX_THREADS={os.environ['POLARS_MAX_THREADS']})")
    ab.write_json(args.json, {"per30": total_cpu / total_min * 30, "plane_per30": total_plane / total_min * 30,
                              "minutes": total_min, "tree": str(TREE)})
    if args.record:
        args.record.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    if differ:
        print(f"decisions differ from {args.compare}: {', '.join(differ)}", file=sys.stderr)
    if args.check and slow:
        print(f"over {args.budget:g} s CPU per 30 simulated minutes: {', '.join(slow)}", file=sys.stderr)
    return 1 if differ or (args.check and slow) else 0


def compare(args) -> int:
    """``--baseline``: this tree and the baseline, ``--runs`` interleaved runs each (timing only: no recording is
    compared, each tree runs its own code on its own ``--conf``)."""
    runs_args = ["--scenarios", args.scenarios, "--repeat", str(args.repeat), "--conf", args.conf]
    results = ab.against_baseline(Path(__file__).resolve(), args.baseline, runs_args, args.runs)
    medians = {}
    for label, runs in results.items():
        ok = [r for r in runs if r.get("exit") == 0]
        values = [r["per30"] for r in ok if "per30" in r]
        planes = [r["plane_per30"] for r in ok if "plane_per30" in r]
        print(f"{label}: " + ", ".join(f"{v:.2f}" for v in values) + " s CPU per 30 simulated minutes"
              + (" (decision plane " + ", ".join(f"{v:.2f}" for v in planes) + " s)" if planes else ""))
        median = ab.median(ok, "per30")
        medians[label] = math.nan if median is None else median
    this, base = medians["this tree"], medians[f"baseline {args.baseline}"]
    print(f"median: this tree {this:.2f} s, baseline {args.baseline} {base:.2f} s per 30 simulated minutes: "
          f"{this / base:.2f}x the baseline (POLARS_MAX_THREADS={os.environ['POLARS_MAX_THREADS']})")
    failed = any(r.get("exit") != 0 for runs in results.values() for r in runs)
    if args.check and not this <= args.budget:
        print(f"over {args.budget:g} s CPU per 30 simulated minutes (this tree's median)", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
