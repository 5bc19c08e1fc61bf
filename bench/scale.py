"""Scale: the governor (``--once``) on the ``large_mix`` scenario (10,000 topics, 50 brokers, 2,000 groups), timed,
with its headroom against real time and a check of what it limited.

    .venv/bin/python bench/scale.py [--minutes 20] [--no-validate] [--conf FILE] [--dir DIR] [--seed 7]

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
environment has none.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import functions as F  # noqa: E402

from pipelines import governor  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.io import tables  # noqa: E402
from pipelines.io.lake import open_lake  # noqa: E402
from pipelines.ops import console  # noqa: E402
from pipelines.session import build_session  # noqa: E402
from pipelines.sim.render import render_landing  # noqa: E402
from pipelines.sim.spec import ScenarioSpec  # noqa: E402
from pipelines.decide.fold_types import ACTION_LIFT  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


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
    ap.add_argument("--conf", default=str(REPO / "conf" / "local.toml"))
    ap.add_argument("--dir", default="", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--min-headroom", type=float, default=15.0,
                    help="the least headroom (times real time, Spark start included) that passes (default 15)")
    args = ap.parse_args(argv)
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
        written = render_landing(spec, landing)
        render_s = time.monotonic() - started
        lines = written["stats_lines"] + written["failure_lines"]
        print(f"large_mix, {args.minutes} min: {written['stats_lines']:,} stats lines + {written['failure_lines']:,} "
              f"send failures in {written['files']} files, rendered in {render_s:.1f} s; culprit group "
              f"{written['culprit_group']}, onset {written['onset']:%H:%M} UTC", flush=True)

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
        return 0 if ok else 1
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
