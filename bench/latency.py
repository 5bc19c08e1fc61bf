"""Latency of the continuous governor: a writer lands the article-001 retry storm minute by minute while the
governor runs with the shipped config (``conf/local.toml``: its trigger, watermark and fast path), and measures the
wall time from the first storm line landing to the culprit's limit appearing in ``limits.json``.

    .venv/bin/python bench/latency.py [--runs 3] [--final-runs 1] [--minute-seconds 20] [--stagger-seconds 4]
                                      [--trigger-seconds N] [--phases 0,3.3,6.7] [--timeline] [--log FILE]
                                      [--baseline COMMIT [--max-median 15] [--max-worst 25] [--runs-log FILE]]

Time-lapse: one minute of stats.log lines (RocketMQ prints them once a minute, at the end of the minute they cover)
lands every ``--minute-seconds`` of wall time; the brokers' files of one minute land ``--stagger-seconds`` apart
(broker-a first; the send-failure file with the last), as shippers on different hosts deliver them. Each run is a
new landing directory and lake in the same Spark session.

Phase: Spark fires a processing-time trigger at the multiples of its interval (``ProcessingTimeExecutor``), so
where the brokers' files land relative to those instants decides which micro-batch reads which file. Run ``i``
lands its first file at ``phases[i]`` seconds after a multiple of the trigger (default: the runs spread evenly over
one trigger interval), so the median and the worst cover the phases instead of whatever the start time gave.

* ``--runs`` runs with the shipped fast path: median and worst of first storm line landed → limit in
  ``limits.json`` (target: every run, so the worst phase, <= 30 s at the shipped 10 s trigger);
* ``--final-runs`` runs with the fast path off (``windows.fast_path = "never"``): the final path alone, measured
  the same way (it waits for the watermark: window + line lag + watermark of event time in time-lapse, plus
  triggers).

Prints the config each mode ran with and every run's figure, and each query's micro-batch processing times (median,
max, how many over the trigger). Exit status 1 when a run saw no limit for the culprit, or a fast-path run took
longer than the target.

``--baseline COMMIT``: this tree and COMMIT (a worktree under a temporary directory, ``bench/ab.py``: this script run
with that tree first on ``sys.path`` and its own ``conf/local.toml``) each run once per phase, interleaved phase by
phase (a new process and Spark session per run, ``--final-runs`` of the final path alone after them); prints every
run, each tree's median and worst, and checks this tree's against ``--max-median`` and ``--max-worst`` (issue 40's
15 s and 25 s).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (bench/ab.py: --baseline, --tree)

TREE = ab.tree_from_argv()  # the tree measured: this checkout, or a baseline's worktree (--tree)
sys.path.insert(0, str(TREE))
import old_layout  # noqa: E402,F401 - a baseline tree may have the module paths before issue 43

from pipelines import governor  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.dataplane.session import build_session  # noqa: E402
from pipelines.sim.minutes import land, minute_files  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402

CULPRIT = "get-pugc-to-ai-consumer"
TARGET_SECONDS = 30.0


def _by_broker(files: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """One minute's files in landing order: each broker's stats file apart (by broker name), the send failures
    with the last broker's."""
    stats: dict[str, list] = {}
    failures = []
    for rel, text in files:
        parts = Path(rel).parts
        if parts[0] == "broker_stats":
            stats.setdefault(parts[1], []).append((rel, text))
        else:
            failures.append((rel, text))
    groups = [stats[b] for b in sorted(stats)] or [[]]
    groups[-1] = groups[-1] + failures
    return groups


def _culprit_limit(limits_file: Path) -> str | None:
    """The basis of the culprit's limit in ``limits.json`` (None: none yet)."""
    if not limits_file.exists():
        return None
    try:
        records = json.loads(limits_file.read_text())["records"]
    except (ValueError, KeyError):  # replaced while read: look again
        return None
    found = [r for r in records if r["resource"] == CULPRIT]
    return found[0]["reason"].split("]")[0].lstrip("[") if found else None


def one_run(spark, base, fast_path: str, args, phase: float = 0.0) -> dict:
    """One time-lapse run; returns the seconds from the first storm line landed to the limit (None: no limit),
    its basis and the queries' micro-batch processing times."""
    minutes = args.steady_minutes + args.storm_minutes
    start = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=minutes + 5)).replace(second=0, microsecond=0)
    spec = ScenarioSpec(seed=7, start=start, minutes=minutes, brokers=2, topics=8, groups=4,
                        onset_minute=args.steady_minutes)
    per_minute = minute_files(spec)
    work = Path(tempfile.mkdtemp(prefix="rg-latency-"))
    landing, lake = work / "landing", work / "lake"
    for name in ("broker_stats", "send_failures"):
        (landing / name).mkdir(parents=True)
    windows = {"fast_path": fast_path}
    if args.trigger_seconds is not None:
        windows["trigger_seconds"] = args.trigger_seconds
    cfg = base.model_copy(update={"windows": base.windows.model_copy(update=windows)}).with_paths(
        str(landing), str(lake))
    spark.streams.resetTerminated()
    runner = threading.Thread(target=lambda: governor.run(spark, cfg, once=False), daemon=True)
    runner.start()
    time.sleep(3)
    trigger = cfg.windows.trigger_seconds
    time.sleep((phase - time.time()) % trigger)  # the first file lands `phase` s after a trigger instant
    limits_file = lake / "control" / "limits.json"
    landed = seen = basis = None
    landed_epoch = 0.0

    def look() -> None:
        nonlocal seen, basis
        if landed is not None and seen is None:
            found = _culprit_limit(limits_file)
            if found:
                seen, basis = time.monotonic(), found

    for m, files in enumerate(per_minute):
        minute_start = time.monotonic()
        for i, group in enumerate(_by_broker(files)):
            while time.monotonic() < minute_start + i * args.stagger_seconds:
                look()
                time.sleep(0.1)
            land(landing, group)
            # minute m's files hold the lines printed at the end of minute m - 1: the first storm minute lands next
            if m == args.steady_minutes + 1 and landed is None and group:
                landed, landed_epoch = time.monotonic(), time.time()
        while time.monotonic() < minute_start + args.minute_seconds:
            look()
            time.sleep(0.1)
    wait_until = time.monotonic() + 8 * args.minute_seconds
    while seen is None and time.monotonic() < wait_until:
        look()
        time.sleep(0.2)
    progress = {q.name: [p for p in q.recentProgress if p.get("numInputRows", 0) or p["batchId"] > 0]
                for q in spark.streams.active}
    for q in spark.streams.active:
        q.stop()
    runner.join(timeout=120)
    shutil.rmtree(work, ignore_errors=True)
    return {"seconds": None if seen is None else seen - landed, "basis": basis, "progress": progress,
            "landed_epoch": landed_epoch, "cfg": cfg, "phase": phase}


def report_mode(name: str, runs: list[dict], args) -> tuple[float | None, bool]:
    cfg = runs[0]["cfg"]
    w = cfg.windows
    print(f"{name}: trigger {w.trigger_seconds} s, watermark {w.watermark_seconds} s, window {w.length_seconds} s, "
          f"fast path {w.fast_path}; one stats minute every {args.minute_seconds:g} s of wall time, brokers' files "
          f"{args.stagger_seconds:g} s apart; {len(runs)} run(s)")
    figures = [r["seconds"] for r in runs]
    for i, r in enumerate(runs, 1):
        shown = "no limit for the culprit appeared" if r["seconds"] is None else \
            f"{r['seconds']:.1f} s, basis {r['basis']}"
        print(f"  run {i} (files land {r['phase']:.1f} s after a trigger instant): first storm line landed -> "
              f"limit in limits.json: {shown}")
        for q, batches in r["progress"].items():
            durations = sorted(p["durationMs"].get("triggerExecution", 0) / 1000 for p in batches)
            if durations:
                over = sum(d > w.trigger_seconds for d in durations)
                print(f"    {q}: {len(durations)} micro-batches, processing time median "
                      f"{statistics.median(durations):.1f} s, max {durations[-1]:.1f} s, {over} over the trigger")
            if args.timeline:
                for p in batches:
                    begun = dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
                    print(f"      {q} batch {p['batchId']}: starts {begun - r['landed_epoch']:+7.1f} s after the "
                          f"storm landed, takes {p['durationMs'].get('triggerExecution', 0) / 1000:5.1f} s, "
                          f"{p.get('numInputRows', 0)} input rows")
    ok = all(f is not None for f in figures)
    if not ok:
        return None, False
    median = statistics.median(figures)
    print(f"  median {median:.1f} s, worst {max(figures):.1f} s")
    return median, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs with the shipped fast path")
    parser.add_argument("--final-runs", type=int, default=1, help="runs with the fast path off (0: none)")
    parser.add_argument("--minute-seconds", type=float, default=20.0)
    parser.add_argument("--stagger-seconds", type=float, default=4.0)
    parser.add_argument("--trigger-seconds", type=int, default=None, help="default: the shipped config's")
    parser.add_argument("--steady-minutes", type=int, default=6)
    parser.add_argument("--storm-minutes", type=int, default=6)
    parser.add_argument("--phases", default=None,
                        help="comma-separated seconds after a trigger instant at which each run's files land "
                             "(default: --runs phases spread evenly over one trigger interval)")
    parser.add_argument("--log", default=None, help="write the governor's log (INFO) to this file")
    parser.add_argument("--timeline", action="store_true",
                        help="also print every micro-batch: start relative to the first storm line, duration, rows")
    parser.add_argument("--baseline", metavar="COMMIT", help="A/B against COMMIT (module docstring)")
    parser.add_argument("--max-median", type=float, default=15.0, help="with --baseline: this tree's median target")
    parser.add_argument("--max-worst", type=float, default=25.0, help="with --baseline: this tree's worst target")
    parser.add_argument("--runs-log", help="with --baseline: the single runs' output appended to this file")
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # the tree measured (bench/ab.py), read before imports
    parser.add_argument("--json", help=argparse.SUPPRESS)  # write the figures here (bench/ab.py)
    args = parser.parse_args(argv)
    if args.baseline:
        return compare(args, sys.argv[1:] if argv is None else list(argv))
    if args.runs < 1 or args.final_runs < 0 or args.stagger_seconds * 2 >= args.minute_seconds:
        parser.error("--runs >= 1, --final-runs >= 0, and both brokers must land within --minute-seconds")

    os.environ.setdefault("RATE_GOVERNOR_SIGNING_KEY", "bench-key")
    base = load_config(TREE / "conf" / "local.toml")
    trigger = args.trigger_seconds or base.windows.trigger_seconds
    try:
        phases = [float(p) % trigger for p in args.phases.split(",")] if args.phases else \
            [round(i * trigger / args.runs, 1) for i in range(args.runs)]
    except ValueError:
        parser.error(f"--phases: not a list of seconds: {args.phases!r}")
    if len(phases) != args.runs:
        parser.error(f"--phases: {len(phases)} phases for {args.runs} runs")
    if args.log:
        handler = logging.FileHandler(args.log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(message)s"))
        logging.getLogger("rate_governor").addHandler(handler)
        logging.getLogger("rate_governor").setLevel(logging.DEBUG)
    spark = build_session(base.spark)
    print(f"bench/latency.py on {os.cpu_count()} cores; conf/local.toml as shipped"
          + (f", trigger {args.trigger_seconds} s" if args.trigger_seconds else ""))
    shipped = [one_run(spark, base, base.windows.fast_path, args, phase) for phase in phases]
    final = [one_run(spark, base, "never", args, phases[i % len(phases)]) for i in range(args.final_runs)]
    spark.stop()
    median, ok = report_mode("fast path as shipped", shipped, args)
    if final:
        _, final_ok = report_mode("final path alone", final, args)
        ok = ok and final_ok
    if median is not None:
        worst = max(r["seconds"] for r in shipped)
        met = worst <= TARGET_SECONDS
        print(f"check: fast path median {median:.1f} s, worst {worst:.1f} s <= {TARGET_SECONDS:g} s at every phase: "
              f"{'PASS' if met else 'FAIL'}")
        ok = ok and met
    if not ok:
        print("bench/latency.py: a check failed (see above)", file=sys.stderr)
    ab.write_json(args.json, {"runs": [{"seconds": r["seconds"], "basis": r["basis"], "phase": r["phase"]}
                                       for r in shipped],
                              "final": [{"seconds": r["seconds"], "basis": r["basis"], "phase": r["phase"]}
                                        for r in final], "tree": str(TREE)})
    return 0 if ok else 1


def compare(args, argv: list[str]) -> int:
    """``--baseline COMMIT`` (module docstring)."""
    trigger = args.trigger_seconds or load_config(TREE / "conf" / "local.toml").windows.trigger_seconds
    phases = [float(p) % trigger for p in args.phases.split(",")] if args.phases else \
        [round(i * trigger / args.runs, 1) for i in range(args.runs)]
    rest = ab.without(ab.without(ab.without(ab.without(argv, "--baseline"), "--runs"), "--phases"), "--final-runs")
    rest = ab.without(ab.without(ab.without(rest, "--max-median"), "--max-worst"), "--runs-log")

    def per_run(i: int) -> list[str]:
        if i < len(phases):
            return [*rest, "--runs", "1", "--phases", str(phases[i]), "--final-runs", "0"]
        return [*rest, "--runs", "1", "--phases", str(phases[i % len(phases)]), "--final-runs", "1"]

    with ab.worktree(args.baseline) as base_tree:
        print(f"A/B: {ab.commit_of(ab.REPO)} against {args.baseline}, one run per phase {phases} each, interleaved, "
              f"then {args.final_runs} of the final path alone; {os.cpu_count()} cores (seconds are this machine's)",
              flush=True)
        results = ab.interleave(Path(__file__).resolve(), [("this tree", ab.REPO, per_run),
                                                            (f"baseline {args.baseline}", base_tree, per_run)],
                                len(phases) + args.final_runs, Path(args.runs_log) if args.runs_log else None)
    figures = {}
    for label, runs in results.items():
        shipped = [r for run in runs[:len(phases)] for r in run.get("runs", [])]
        final = [r for run in runs[len(phases):] for r in run.get("final", [])]
        seconds = [r["seconds"] for r in shipped]
        shown = "; ".join(f"phase {r['phase']:.1f} s: " + ("no limit" if r["seconds"] is None else
                                                            f"{r['seconds']:.1f} s ({r['basis']})") for r in shipped)
        print(f"{label}, fast path as shipped: {shown}")
        if final:
            print(f"{label}, final path alone: " + "; ".join(
                "no limit" if r["seconds"] is None else f"{r['seconds']:.1f} s ({r['basis']})" for r in final))
        if len(seconds) == len(phases) and all(s is not None for s in seconds):
            figures[label] = (statistics.median(seconds), max(seconds))
            print(f"   median {figures[label][0]:.1f} s, worst {figures[label][1]:.1f} s")
        else:
            print("   a run saw no limit for the culprit (or failed)")
    new = figures.get("this tree")
    if new is None:
        return 1
    passed = new[0] <= args.max_median and new[1] <= args.max_worst
    base = figures.get(f"baseline {args.baseline}")
    print(f"live containment, this tree: median {new[0]:.1f} s, worst {new[1]:.1f} s (targets <= {args.max_median:g} s, "
          f"<= {args.max_worst:g} s: {'PASS' if passed else 'FAIL'})"
          + (f"; baseline {args.baseline}: median {base[0]:.1f} s, worst {base[1]:.1f} s" if base else ""))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
