"""Scale: the governor (``--once``) on the ``large_mix`` scenario (10,000 topics, 50 brokers, 2,000 groups), timed,
with its headroom against real time and a check of what it limited.

    .venv/bin/python bench/scale.py [--minutes 20] [--no-validate] [--conf FILE] [--dir DIR] [--seed 7]
                                    [--baseline COMMIT [--runs 3] [--min-ratio 1.2] [--log FILE]]

Renders ``minutes`` minutes of ``large_mix`` (:func:`pipelines.sim.render.render_landing`; storm onset at
``minutes // 2``) into ``DIR/landing``, runs :func:`pipelines.governor.run` once on the shipped ``conf/local.toml``
(GX validation per micro-batch on, as shipped; ``--no-validate`` sets ``quality.validate_every_n_batches = 0``, a
non-shipped setting the output names) with the lake in ``DIR/lake``, then prints the config it ran with (file and
every setting changed from it), the input lines, the wall time of the run, events/s and the headroom
``minutes × 60 s ÷ wall time`` (how many times faster than the cluster produced the lines; > 1 means a single
governor on this machine keeps up). The check uses
the scenario's ground truth: the storm's culprit group must have an enforced limit and no other resource may
(the backtest's "zero enforced limits on healthy resources"), and the headroom must be at least ``--min-headroom``
(default 15). Exit status 1 when the check fails. The wall time includes the Spark session's start (printed apart),
as an SRE's ``--once`` run pays it. A signing key for the control records is generated for the run when the
environment has none. A ``--dir`` whose ``landing`` was rendered by an earlier run (with its ``landing.json``) is
reused as it is.

``--baseline COMMIT``: the landing is rendered once, then this tree's governor and COMMIT's (a worktree under a
temporary directory, ``bench/ab.py``: this script run with that tree first on ``sys.path`` and its own
``conf/local.toml``) run on it ``--runs`` times each, interleaved, each on a new lake; prints each run's wall time and
headroom, the medians and the ratio of this tree's median headroom to the baseline's (exit 1 below ``--min-ratio``,
issue 40's 1.2, or when a run's check failed).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (bench/ab.py: --baseline, --tree)

TREE = ab.tree_from_argv()  # the tree measured: this checkout, or a baseline's worktree (--tree)
sys.path.insert(0, str(TREE))
import old_layout  # noqa: E402,F401 - a baseline tree may have the module paths before issue 43

from pyspark.sql import functions as F  # noqa: E402

from pipelines import governor  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines import tables  # noqa: E402
from pipelines.dataplane.lake import open_lake  # noqa: E402
from pipelines.ops import console  # noqa: E402
from pipelines.dataplane.session import build_session  # noqa: E402
from pipelines.sim.render import render_landing  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
#: ``gold/limits``' action of a lift (the same word before and after issue 40 moved it to pipelines.decide)
ACTION_LIFT = "lift"


def large_mix(minutes: int, seed: int) -> ScenarioSpec:
    """The ``large_mix`` scenario at the scale of the brief: 10,000 topics, 50 brokers, 2,000 groups."""
    return ScenarioSpec(name="large_mix", seed=seed, topics=10_000, brokers=50, groups=2_000, minutes=minutes,
                        onset_minute=minutes // 2)


def limited_resources(spark, lake: Path) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(resources with an enforced limit, resources with an advisory one) in ``gold/limits``, lifts left out."""
    limits = open_lake(spark, str(lake)).read(tables.GOLD_LIMITS).where(F.col("action") != ACTION_LIFT)
    rows = limits.select("resource_type", "resource", "mode").distinct().collect()
    enforced = {(r["resource_type"], r["resource"]) for r in rows if r["mode"] == "enforce"}
    advisory = {(r["resource_type"], r["resource"]) for r in rows if r["mode"] != "enforce"}
    return enforced, advisory


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=int, default=20, help="minutes of traffic to generate (default 20)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-validate", action="store_true",
                    help="quality.validate_every_n_batches = 0 (not shipped: no GX validation per micro-batch)")
    ap.add_argument("--conf", default=str(TREE / "conf" / "local.toml"))
    ap.add_argument("--dir", default="", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--min-headroom", type=float, default=15.0,
                    help="the least headroom (times real time, Spark start included) that passes (default 15)")
    ap.add_argument("--baseline", metavar="COMMIT", help="A/B against COMMIT (module docstring)")
    ap.add_argument("--runs", type=int, default=3, help="runs per variant with --baseline (default 3)")
    ap.add_argument("--min-ratio", type=float, default=1.2,
                    help="with --baseline: the least median headroom ratio this tree / baseline that passes")
    ap.add_argument("--log", help="with --baseline: the single runs' output appended to this file")
    ap.add_argument("--tree", help=argparse.SUPPRESS)  # the tree measured (bench/ab.py), read before imports
    ap.add_argument("--json", help=argparse.SUPPRESS)  # write the figures here (bench/ab.py)
    args = ap.parse_args(argv)
    if args.baseline:
        return compare(args, sys.argv[1:] if argv is None else list(argv))
    console.configure_logging(False)  # the governor's own lines, e.g. "gold batch N: limits published in X s"
    if args.minutes < 2:
        ap.error("--minutes must be at least 2")
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="rg-scale-"))
    landing, lake = work / "landing", work / "lake"
    if lake.exists():
        ap.error(f"{lake} exists; use a fresh --dir")
    try:
        spec = large_mix(args.minutes, args.seed)
        started = time.monotonic()
        if (work / "landing.json").exists():  # rendered by an earlier run (--baseline renders once)
            written = json.loads((work / "landing.json").read_text())
        else:
            written = render_landing(spec, landing)
            (work / "landing.json").write_text(json.dumps(written, default=str))
        render_s = time.monotonic() - started
        lines = written["stats_lines"] + written["failure_lines"]
        print(f"large_mix, {args.minutes} min: {written['stats_lines']:,} stats lines + {written['failure_lines']:,} "
              f"send failures in {written['files']} files, rendered in {render_s:.1f} s; culprit group "
              f"{written['culprit_group']}, onset {str(written['onset'])[11:16]} UTC", flush=True)

        cfg = load_config(args.conf).with_paths(str(landing), str(lake))
        changed = []
        if args.no_validate:
            cfg = cfg.model_copy(update={"quality": cfg.quality.model_copy(update={"validate_every_n_batches": 0})})
            changed.append("quality.validate_every_n_batches = 0")
        shipped = Path(args.conf).resolve() == REPO / "conf" / "local.toml"
        print(f"config: {args.conf}{' (shipped)' if shipped else ''}; changed for this run: "
              f"{', '.join(changed) or 'nothing'}; spark.master {cfg.spark.master}, shuffle partitions "
              f"{cfg.spark.shuffle_partitions}, lake.writer {cfg.lake.writer}, GX validation every "
              f"{cfg.quality.validate_every_n_batches} batch(es), source.max_files_per_trigger "
              f"{cfg.source.max_files_per_trigger}; {os.cpu_count()} cores", flush=True)
        if not os.environ.get(cfg.limits.signing_key_env) and not cfg.limits.signing_key_file:
            os.environ[cfg.limits.signing_key_env] = secrets.token_hex(32)  # this run only
        started = time.monotonic()
        spark = build_session(cfg.spark)
        session_s = time.monotonic() - started
        governor.run(spark, cfg, once=True)
        wall = time.monotonic() - started

        enforced, advisory = limited_resources(spark, lake)
        culprit = ("group", written["culprit_group"])
        healthy_limited = sorted(enforced - {culprit})
        headroom = args.minutes * 60 / wall
        ok = culprit in enforced and not healthy_limited and headroom >= args.min_headroom
        every = cfg.quality.validate_every_n_batches
        gx = f"GX validation every {every} batch(es)" if every else "no GX validation"
        print(f"governor --once ({gx}, {cfg.spark.master}): {lines:,} lines in "
              f"{wall:.1f} s (Spark session start {session_s:.1f} s included) = {lines / wall:,.0f} events/s; "
              f"headroom {args.minutes * 60} s / {wall:.1f} s = {headroom:.2f}x real time "
              f"(check: >= {args.min_headroom}x)")
        print(f"culprit {culprit[0]}:{culprit[1]} limited (enforce): {culprit in enforced}; healthy resources "
              f"limited (enforce): {len(healthy_limited)} {healthy_limited[:5]}; advisory-only: {len(advisory)}")
        print("check:", "ok" if ok else "FAILED")
        ab.write_json(args.json, {"wall": wall, "headroom": headroom, "session": session_s, "ok": ok,
                                  "culprit_limited": culprit in enforced, "healthy_limited": len(healthy_limited),
                                  "tree": str(TREE)})
        return 0 if ok else 1
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def compare(args, argv: list[str]) -> int:
    """``--baseline COMMIT``: one landing, this tree and the baseline interleaved ``--runs`` times (module
    docstring)."""
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="rg-scale-ab-"))
    shared = work / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    if not (shared / "landing.json").exists():
        spec = large_mix(args.minutes, args.seed)
        started = time.monotonic()
        (shared / "landing.json").write_text(json.dumps(render_landing(spec, shared / "landing"), default=str))
        print(f"large_mix, {args.minutes} min rendered once in {time.monotonic() - started:.1f} s into {shared}",
              flush=True)
    runs_args = ab.without(ab.without(ab.without(ab.without(argv, "--baseline"), "--runs"), "--min-ratio"), "--log")
    runs_args = [*ab.without(ab.without(runs_args, "--dir"), "--conf"), "--dir", str(shared),
                 "--min-headroom", "0"]

    def fresh_lake(_run: int, _label: str) -> None:  # a new lake for every run; the landing stays
        shutil.rmtree(shared / "lake", ignore_errors=True)

    try:
        results = ab.against_baseline(Path(__file__).resolve(), args.baseline, runs_args, args.runs,
                                      Path(args.log) if args.log else None, before=fresh_lake)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    medians = {}
    checks_ok = True
    for label, runs in results.items():
        medians[label] = ab.median(runs, "headroom")
        shown = "; ".join(f"{r['wall']:.1f} s = {r['headroom']:.2f}x, check {'ok' if r['ok'] else 'FAILED'}"
                          if "wall" in r else f"failed (exit {r['exit']})" for r in runs)
        checks_ok = checks_ok and all(r.get("ok") for r in runs)
        wall = ab.median(runs, "wall")
        print(f"{label}: {shown}; median wall {wall or float('nan'):.1f} s, headroom "
              f"{medians[label] or float('nan'):.2f}x")
    new, base = medians["this tree"], medians[f"baseline {args.baseline}"]
    if not new or not base:
        print("a variant reported no figure: see the runs' output", file=sys.stderr)
        return 2
    ratio = new / base
    print(f"headroom this tree / baseline {args.baseline}: {new:.2f} / {base:.2f} = {ratio:.2f}x (target >= "
          f"{args.min_ratio}x: {'PASS' if ratio >= args.min_ratio else 'FAIL'}); every run's check (culprit limited, "
          f"no healthy resource enforced): {'ok' if checks_ok else 'FAILED'}")
    return 0 if ratio >= args.min_ratio and checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
