"""The closed-loop backtest's scenario suite: every scenario of the issue run against the governor's real streaming
queries (shipped conf/local.toml, continuous mode) with the feedback of the simulated brokers' limiters, the
figures and checks of each, and what the suite costs on this machine.

    .venv/bin/python bench/closed_loop.py [--scenarios a,b,...] [--propagation 10] [--sweep persisting_storm]
                                          [--sweep-propagation 0,10,30] [--dir DIR] [--keep] [--conf conf/backtest.toml]
                                          [--sim]

Runs ``--scenarios`` (default: all of them) at ``--propagation`` seconds (default: the config's), and the ``--sweep``
scenarios also at every ``--sweep-propagation``, each in its world (:func:`pipelines.sim.settings.scenario_world`:
its clients' settings and irregularities, printed after its config); one Spark session, one fresh lake per run under ``DIR`` (a
temporary directory by default; the run lakes are deleted unless ``--keep``, their reports and pictures are copied
to ``DIR/reports``). Every run's figures are appended to ``DIR/results`` (Delta table ``backtest/results``,
governor ``closed-loop``). Prints one table (the baseline of each
run: the same cluster without any limit, for the bystanders' rejected sends), the config, the wall time of each
run and of the suite, and each run's enforced decisions (``m:ss action qps (basis)`` from the scenario's start).
``--sim`` adds, for each run, the same scenario in the same world through the Spark-free simulator
(:func:`pipelines.sim.loop.simulate_named`, at the run's propagation): its row and its decisions, to compare
(its wall time is the simulator's). Exit status 1 when a check of a Spark run fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pipelines.backtest.cli import check_world, run_backtest, world_line  # noqa: E402
from pipelines.backtest.results import write_results  # noqa: E402
from pipelines.sim.report import config_line  # noqa: E402
from pipelines.sim.settings import SCENARIO_ROLES, SCENARIO_SIZES, build_spec, governor_config  # noqa: E402
from pipelines.sim.settings import scenario_world  # noqa: E402
from pipelines.sim.settings import load_backtest_config  # noqa: E402
from pipelines.dataplane.lake import open_lake  # noqa: E402
from pipelines.dataplane.session import build_session  # noqa: E402


def _fmt(v: float, digits: int = 0) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{v:,.{digits}f}"


def row(name: str, prop: float, out: dict) -> str:
    f = out["figures"]
    v = f.value
    failed = [n for n, ok, _ in f.checks if not ok]
    per = f.details.get("bystander_after_pct_of_before", "")
    episodes = f"; {per}" if ";" in per else ""  # more than one episode: each beside the all-episode figure
    return (f"| {name} | {prop:g} | {_fmt(v('onset_to_limit_in_force'))} | "
            f"{_fmt(v('culprit_admitted_over_target'), 2)} | {_fmt(v('bystander_rejected_per_minute_before'))} | "
            f"{_fmt(v('bystander_rejected_per_minute_after'), 1)} ({_fmt(v('bystander_after_pct_of_before'), 2)} %"
            f"{episodes}) | "
            f"{_fmt(v('bystander_rejected_per_minute_no_governor'))} | "
            f"{f.details.get('limit_changes_while_cause_persists', 'n/a')}; all {_fmt(v('limit_changes_all_episodes'))} | "
            f"{f.details.get('fix_to_lift_minutes', 'n/a')} | "
            f"{_fmt(v('false_limits'))} | {_fmt(v('step_seconds_median'), 1)} / {_fmt(v('step_seconds_max'), 1)} | "
            f"{_fmt(v('wall_seconds'))} | {'PASS' if not failed else 'FAIL: ' + '; '.join(failed)} |")


def decisions(limits, start) -> str:
    """A run's enforced ``gold/limits`` rows, one ``m:ss action qps (basis)`` each in decision order, times from the
    scenario's start (simulated)."""
    if limits is None or not len(limits):
        return "none"
    rows = limits[limits["mode"] == "enforce"].copy()
    rows["at"] = (pd.to_datetime(rows["decided_at"], utc=True) - pd.Timestamp(start)).dt.total_seconds()
    out = []
    for r in rows.sort_values("at", kind="stable").itertuples():
        qps = "" if r.action == "lift" or pd.isna(r.limit_qps) else f" {r.limit_qps:.1f}"
        out.append(f"{int(r.at // 60)}:{int(r.at % 60):02d} {r.action}{qps} ({str(r.basis)[0]})")
    return ", ".join(out) or "none"


def sim_twin(name: str, bcfg, propagation: float) -> dict:
    """The same named scenario in the same world through the Spark-free simulator
    (:func:`pipelines.sim.loop.simulate_named`), with its figures, shaped as :func:`run_backtest`'s output."""
    from pipelines.sim.figures import compute
    from pipelines.sim.loop import closed_cluster, simulate_named

    result = simulate_named(name, governor_config(bcfg, None, None), bcfg, propagation_seconds=propagation)
    baseline = closed_cluster(result.spec, result.bcfg)
    baseline.advance_to(baseline.end)
    return {"result": result, "figures": compute(result, baseline)}


HEADER = ("| scenario | propagation s | onset -> in force s | admitted / target | bystander rejected/min before | "
          "after, all episodes (% of before; per episode) | no governor, same minutes | value changes per episode; "
          "all | fix -> lift min | false limits | "
          "step s median / max | wall s | checks |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def one_run(spark, results, root: Path, name: str, prop: float, bcfg, args) -> tuple[bool, list[str]]:
    """Run scenario ``name`` in its world at ``prop`` seconds of propagation, print its line and decisions (and the
    simulator's with ``--sim``), keep its report and picture; returns (every check passed, its table rows)."""
    spec = build_spec(name, {})
    world, irregular = scenario_world(name, bcfg)
    check_world(spec, world, irregular)
    lake = root / f"{name}-p{prop:g}"
    t0 = time.monotonic()
    out = run_backtest(spark, lake=lake, bcfg=world, spec=spec, propagation_seconds=prop, irregular=irregular)
    write_results(results, out["result"], out["figures"], uuid.uuid4().hex[:12], dt.datetime.now(dt.timezone.utc))
    ok = all(c[1] for c in out["figures"].checks)
    print(f"  {name} ({SCENARIO_ROLES[name]}) at propagation {prop:g} s: {time.monotonic() - t0:.0f} s, "
          f"{'PASS' if ok else 'FAIL'}; {config_line(out['result'])}; {world_line(out['result'], bcfg)}", flush=True)
    print(f"    decisions (Spark): {decisions(out['result'].limits, out['result'].spec.start_utc)}", flush=True)
    rows = [row(name, prop, out)]
    if args.sim:
        twin = sim_twin(name, bcfg, prop)
        rows.append(row(f"{name} (simulator)", prop, twin))
        print(f"    decisions (simulator): {decisions(twin['result'].limits, twin['result'].spec.start_utc)}",
              flush=True)
    kept = root / "reports"
    kept.mkdir(exist_ok=True)
    for path in (out["report"], out["png"]):
        shutil.copy(path, kept / f"{path.stem}-p{prop:g}{path.suffix}")
    if not args.keep:
        shutil.rmtree(lake, ignore_errors=True)
    return ok, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", default=",".join(SCENARIO_SIZES), help="comma-separated (default: all)")
    p.add_argument("--propagation", type=float, default=None, help="seconds (default: the config's)")
    p.add_argument("--sweep", default="persisting_storm", help="scenarios also run at --sweep-propagation ('' none)")
    p.add_argument("--sweep-propagation", default="0,10,30")
    p.add_argument("--conf", default="conf/backtest.toml")
    p.add_argument("--dir", default=None)
    p.add_argument("--keep", action="store_true", help="keep every run's lake")
    p.add_argument("--sim", action="store_true", help="also run each scenario through the Spark-free simulator in "
                                                      "its world: its row and both runs' decisions, side by side")
    args = p.parse_args(argv)
    bcfg = load_backtest_config(args.conf)
    base_prop = bcfg.propagation_seconds if args.propagation is None else args.propagation
    runs = [(s, base_prop) for s in args.scenarios.split(",") if s]
    for s in [x for x in args.sweep.split(",") if x]:
        runs += [(s, float(v)) for v in args.sweep_propagation.split(",") if (s, float(v)) not in runs]
    unknown = sorted({s for s, _ in runs} - set(SCENARIO_SIZES))
    if unknown:
        print(f"bench/closed_loop.py: unknown scenario(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    os.environ.setdefault("RATE_GOVERNOR_SIGNING_KEY", "bench-closed-loop-key")
    root = Path(args.dir or tempfile.mkdtemp(prefix="rg-closed-loop-"))
    spark = build_session(governor_config(bcfg, None, None).spark)
    results = open_lake(spark, root / "results", "delta-rs")
    lines, failed, started = [], 0, time.monotonic()
    print(f"closed-loop suite: {len(runs)} runs on {os.cpu_count()} cores; {bcfg.governor_conf} as shipped; "
          f"dir {root}", flush=True)
    for name, prop in runs:
        ok, rows = one_run(spark, results, root, name, prop, bcfg, args)
        failed += not ok
        lines += rows
    print()
    print(HEADER)
    print("\n".join(lines))
    total = time.monotonic() - started
    print(f"\nsuite: {len(runs)} runs, {total:.0f} s ({total / 60:.1f} min) wall on {os.cpu_count()} cores; "
          f"{failed} run(s) with a failed check; results in {root / 'results'}")
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
