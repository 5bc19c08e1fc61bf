"""The same decisions before and after a change: the final path's outputs of ``--once`` runs of this tree and of a
baseline commit (checked out in a worktree) on the same landed input, every gold table, ``state/policy`` and
``limits.json`` compared, with the governor's clock pinned (``decided_at`` and ``expires_at`` are processing times).

    .venv/bin/python bench/same_decisions.py --baseline COMMIT [--inputs article,large_mix] [--landing NAME=DIR ...]
                                             [--dir DIR] [--record FILE]

Inputs: ``article`` (the article-001 scenario, seed 7, a fixed start), ``large_mix`` (20 minutes of a 10,000-topic,
50-broker cluster, as ``bench/scale.py``), ``loop:SCENARIO`` (a named closed-loop scenario's landed input, from the
Spark-free closed loop: :func:`closed_loop_landing`; ``loop:all`` for every one), and any landed directory given
with ``--landing NAME=DIR`` (e.g. the ``backtest/landing`` of a Spark closed-loop run). Decisions, versions and reasons must be equal exactly, numbers to a
relative 1e-9 (summation order may differ). Prints one line per table and input and the first differences; exit 1
when any differs. ``e2e`` is the end-to-end tests' input (``tests/e2e/test_governor_e2e.py`` ``SPEC``): with
``--record DIR``, the rows of each input that is the same at both commits are written as ``DIR/<input>.json.gz``
(to compare a later tree with, or to read); an input that differs is never recorded. Both trees run with the
clock pinned (``decided_at``, ``expires_at``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The governor's pinned clock: every decision's ``decided_at``.
PINNED = "2030-01-01T00:00:00+00:00"
#: The article input's fixed start (UTC), so its rows are the same on every run.
ARTICLE_START = "2026-01-05T06:30:00Z"
#: Tables compared: the final path's (``quarantine`` for refused decisions only).
TABLES = ("gold/topic_tps", "gold/group_tps", "gold/broker_tps", "gold/anomalies", "gold/limits", "state/policy")
REL = 1e-9

#: Run by the baseline's and this tree's interpreter in their own tree: one --once run with a pinned clock.
DRIVER = r"""
import datetime as dt, json, sys
sys.path.insert(0, sys.argv[1])
import old_layout  # a baseline tree may have the module paths before issue 43
from pipelines.config import load_config
from pipelines.dataplane.session import build_session
from pipelines import governor
cfg = load_config(sys.argv[1] + "/conf/local.toml").with_paths(sys.argv[2], sys.argv[3])
pinned = dt.datetime.fromisoformat(sys.argv[4])
spark = build_session(cfg.spark)
governor.run(spark, cfg, once=True, clock=lambda: pinned)
spark.stop()
"""


def generate(name: str, out: Path) -> Path:
    """The landed input ``name`` (``article`` or ``large_mix``) written to ``out``."""
    if name == "article":
        subprocess.run([sys.executable, "-m", "pipelines.sim", "--out", str(out), "--scenario", "retry_storm",
                        "--seed", "7", "--start", ARTICLE_START], cwd=REPO, check=True, capture_output=True)
        return out
    if name == "large_mix":
        sys.path.insert(0, str(REPO))
        from bench.scale import large_mix
        from pipelines.sim.render import render_landing

        spec = large_mix(20, 7)
        spec = spec.__class__(**{**spec.__dict__, "start": dt.datetime(2026, 1, 5, 6, 0, tzinfo=dt.timezone.utc)})
        render_landing(spec, out)
        return out
    if name == "e2e":  # the end-to-end tests' input (tests/e2e/test_governor_e2e.py SPEC)
        sys.path.insert(0, str(REPO))
        from pipelines.sim.render import render_landing
        from tests.e2e.test_governor_e2e import SPEC

        render_landing(SPEC, out)
        return out
    if name.startswith("loop:"):
        return closed_loop_landing(name[len("loop:"):], out)
    raise SystemExit(f"bench/same_decisions.py: unknown input {name!r} (article, large_mix, e2e, loop:SCENARIO or "
                     "--landing NAME=DIR)")


def closed_loop_landing(scenario: str, out: Path) -> Path:
    """A named closed-loop scenario's landed input: the scenario run in the Spark-free closed loop
    (:func:`pipelines.sim.loop.simulate`, shipped config, a fixed start), then what its brokers admitted rendered as
    stats.log lines and every rejected send and the demand's trickle of ordinary failures as send-failure lines, all
    landed at once in ``out``."""
    import numpy as np
    import pandas as pd

    sys.path.insert(0, str(REPO))
    from pipelines.sim.settings import SCENARIO_SIZES, build_spec, governor_config, load_backtest_config
    from pipelines.sim.admitted import admitted_rows, failure_rows, trickle
    from pipelines.sim.loop import simulate
    from pipelines.sim.minutes import failure_text, land, stats_files

    if scenario not in SCENARIO_SIZES:
        raise SystemExit(f"bench/same_decisions.py: unknown closed-loop scenario {scenario!r} "
                         f"({', '.join(SCENARIO_SIZES)})")
    bcfg = load_backtest_config(REPO / "conf" / "backtest.toml")
    spec = build_spec(scenario, {}, now=dt.datetime(2026, 1, 5, 12, tzinfo=dt.timezone.utc))
    cluster = simulate(spec, governor_config(bcfg, None, None), bcfg).cluster
    admitted = pd.concat([admitted_rows(cluster, m) for m in range(cluster.minutes_done())], ignore_index=True)
    rendered = stats_files(spec, admitted)
    files = [f for m in sorted(rendered) for f in rendered[m]]
    rng = np.random.default_rng(7)
    failures = pd.concat([failure_rows(cluster, 0, len(cluster.rejections.tick), rng), trickle(cluster, rng)],
                         ignore_index=True)
    files.append(("send_failures/all.jsonl", failure_text(failures)))
    land(out, files)
    return out


def run(tree: Path, landing: Path, lake: Path) -> float:
    """One --once run of ``tree``'s governor; returns its seconds."""
    env = {**os.environ, "RATE_GOVERNOR_SIGNING_KEY": "same-decisions-key", "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).resolve().parent)])}
    script = lake.parent / f".driver-{lake.name}.py"  # a file: Spark's Python workers re-import __main__
    script.write_text(DRIVER)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tree), str(landing), str(lake), PINNED], cwd=tree,
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the governor of {tree} failed on {landing}:\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def rows(lake: Path, table: str) -> list[dict]:
    """A table's rows, sorted, as plain values (times ISO text, maps as sorted pairs); [] when absent."""
    from deltalake import DeltaTable

    path = lake / table
    if not (path / "_delta_log").is_dir():
        return []
    data = DeltaTable(str(path)).to_pyarrow_table()
    if table == "state/policy":
        data = data.drop_columns([c for c in ("batch_id",) if c in data.column_names])
    out = [{k: _plain(v) for k, v in r.items()} for r in data.to_pylist()]
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _plain(value):
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return sorted([list(p) for p in value])
    return value


def same(a, b) -> bool:
    """Equal, floats to a relative :data:`REL`."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= REL * max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def limits_file(lake: Path) -> list[dict]:
    path = lake / "control" / "limits.json"
    if not path.exists():
        return []
    records = json.loads(path.read_text())["records"]
    return sorted(({k: v for k, v in r.items() if k != "signature"} for r in records),
                  key=lambda r: (r["resource_type"], r["resource"]))


def compare(base: Path, new: Path) -> list[str]:
    """One line per table: equal, or the first differences."""
    lines = []
    for table in TABLES:
        a, b = rows(base, table), rows(new, table)
        diffs = [(x, y) for x, y in zip(a, b) if not same(x, y)]
        ok = len(a) == len(b) and not diffs
        lines.append(f"  {'same' if ok else 'DIFFERENT'}: {table}: {len(a)} rows at the baseline, {len(b)} here")
        for x, y in diffs[:3]:
            keys = [k for k in x if not same(x.get(k), y.get(k))]
            lines.append(f"    {keys}: {[x.get(k) for k in keys]} -> {[y.get(k) for k in keys]}")
    a, b = limits_file(base), limits_file(new)
    ok = same(a, b)
    lines.append(f"  {'same' if ok else 'DIFFERENT'}: control/limits.json: {len(a)} records at the baseline, {len(b)} here")
    return lines


def record(lake: Path, out: Path) -> None:
    """A lake's rows of every compared table (and limits.json) as a gzipped JSON fixture."""
    data = {table: rows(lake, table) for table in TABLES}
    data["control/limits.json"] = limits_file(lake)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress(json.dumps(data, sort_keys=True, default=str).encode(), mtime=0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="the commit to compare with (checked out in a worktree)")
    ap.add_argument("--inputs", default="article",
                    help="comma-separated: article, large_mix, e2e, loop:SCENARIO, loop:all ('' for none)")
    ap.add_argument("--landing", action="append", default=[], help="NAME=DIR: a landed directory to compare on")
    ap.add_argument("--dir", default="", help="work directory (default: a temporary one)")
    ap.add_argument("--record", default="", help="a directory: the rows of each input that is the same, as fixtures")
    args = ap.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="rg-same-"))
    work.mkdir(parents=True, exist_ok=True)
    tree = work / "baseline"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.baseline], cwd=REPO, check=True,
                       capture_output=True)
    names = []
    for name in filter(None, args.inputs.split(",")):
        if name == "loop:all":
            sys.path.insert(0, str(REPO))
            from pipelines.sim.settings import SCENARIO_SIZES
            names += [f"loop:{n}" for n in SCENARIO_SIZES]
        else:
            names.append(name)
    inputs = {name: generate(name, work / f"landing-{name.replace(':', '-')}") for name in names
              if not (work / f"landing-{name.replace(':', '-')}").exists()} | {
        name: work / f"landing-{name.replace(':', '-')}" for name in names}
    for item in args.landing:
        name, _, path = item.partition("=")
        inputs[name] = Path(path)
    print(f"same decisions: baseline {args.baseline} against {REPO} ({subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, capture_output=True, text=True).stdout.strip()}); clock pinned at {PINNED}; inputs {', '.join(inputs)}; dir {work}")
    failed = 0
    for name, landing in inputs.items():
        base_lake, new_lake = work / f"lake-{name}-baseline", work / f"lake-{name}-here"
        seconds = []
        for t, lake in ((tree, base_lake), (REPO, new_lake)):
            if not lake.exists():
                seconds.append(f"{run(t, landing, lake):.0f} s")
            else:
                seconds.append("kept")
        lines = compare(base_lake, new_lake)
        failed += any("DIFFERENT" in line for line in lines)
        print(f"{name}: baseline run {seconds[0]}, this tree {seconds[1]}")
        print("\n".join(lines))
        if args.record and not any("DIFFERENT" in line for line in lines):
            record(base_lake, Path(args.record) / f"{name.replace(':', '-')}.json.gz")
    print("RESULT:", "the same decisions" if not failed else f"{failed} input(s) differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
