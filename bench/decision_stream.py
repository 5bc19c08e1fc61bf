"""The decision stream of the Spark-free closed loop, recorded and compared: what a behaviour-preserving change of
the decision plane (:mod:`pipelines.decide`) must leave exactly as it was.

    .venv/bin/python bench/decision_stream.py --record DIR [--scenarios all] [--cases 500] [--workers N] [--tree T]
    .venv/bin/python bench/decision_stream.py --compare DIR [--scenarios all] [--cases 500] [--workers N]

For each named scenario of the closed-loop backtest (:data:`pipelines.sim.settings.SCENARIO_SIZES`, a fixed start)
and each case ``0..N-1`` of the sweep (:func:`pipelines.sim.sweep.draw` in the tree it runs in, run as
:func:`pipelines.sim.sweep.run` runs it), one simulated closed loop (:func:`pipelines.sim.loop.simulate`) and its
**decision stream**:

* ``limits``: every ``gold/limits`` row both paths decided, in decision order (the simulator's ``SimResult.limits``);
* ``gold``: per gold micro-batch, every table the final path handed over (``FinalOutputs.tables()``:
  ``gold/topic_tps`` with the limit in force, ``gold/group_tps``, ``gold/broker_tps``, ``gold/anomalies``,
  ``gold/limits``, ``quarantine``, ``state/policy``), each table's rows sorted;
* ``state``: the last ``state/policy`` row per resource (what the next micro-batch would fold from);
* ``published``: the limits in force at the brokers over time (``Broker.timeline``: each change, each broker ×
  resource's figure in msg/s with its record's version, mode and expiry);
* ``figures``, ``checks``: the backtest's figures and checks of the run (:func:`pipelines.sim.figures.compute`), and
  for a sweep case its parameters and verdict (:func:`pipelines.sim.sweep.verdict`).

The gold tables are caught where the simulator keeps its history (``History.add`` receives each gold batch's
tables), the result where :func:`~pipelines.sim.loop.simulate` returns it: both wrapped for the run, no simulator
code changed.

``--record DIR`` writes one gzipped JSON file per run (``DIR/scenario-<name>.json.gz``, ``DIR/case-<seed>.json.gz``)
and ``DIR/index.json`` (the commit and the command); ``--compare DIR`` runs the same and compares each with its file:
strings, counts, booleans and times exactly, floats to a relative 1e-9 (:data:`REL`). It prints one line per run that
differs with its first differences (at most :data:`SHOWN`) and a summary (``--patterns``: every differing field
once, with the number of runs it differs in); exit status 1 when any run differs or is
missing from the recording, 2 for a bad flag. Cases run over ``--workers`` spawned processes (default: the CPUs this
process may use), one polars thread each, as the sweep's :func:`~pipelines.sim.sweep.judge_many` runs them; a run's
stream does not depend on the worker. ``--tree DIR``: import ``pipelines`` from another checkout (e.g. ``git archive COMMIT`` unpacked, with
``--label COMMIT``) instead of this one; the recording is that tree's.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import gzip
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # before polars is imported: one thread per worker, as the sweep

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ab  # noqa: E402  (bench/ab.py: --tree)

TREE = ab.tree_from_argv()
sys.path.insert(0, str(TREE))

#: A fixed clock for the named scenarios (as bench/sim_speed.py), so that every run has the same start.
NOW = dt.datetime(2026, 1, 5, 12, tzinfo=dt.timezone.utc)
#: Floats compare to this relative difference (summation order may move the last bit).
REL = 1e-9
#: Differences printed per run.
SHOWN = 8


def plain(value):
    """A table cell or figure → a JSON value: times as ISO text, maps (dicts or Arrow's (key, value) pairs) as dicts
    with sorted keys, NaN as None, numpy scalars as Python ones."""
    if isinstance(value, dt.datetime) or hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value):
            return {k: plain(v) for k, v in sorted(value)}
        return [plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return plain(value.item())
    return value


def table_rows(table) -> list[dict]:
    """An Arrow table → its rows as JSON values, sorted (by their JSON text: polars' group-bys leave the order of a
    table's rows to its thread pool, never their values)."""
    rows = [{k: plain(v) for k, v in row.items()} for row in table.to_pylist()]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


class Capture:
    """While in use: every gold batch's tables (``History.add``) and the :class:`SimResult` of the run
    (:func:`~pipelines.sim.loop.simulate`, looked up by :func:`pipelines.sim.sweep.run` when it is called)."""

    def __enter__(self) -> "Capture":
        from pipelines.sim import loop

        self.loop, self.gold, self.result = loop, [], None
        self._add, self._simulate = loop.History.add, loop.simulate
        capture = self

        def add(history, tables, first):
            capture.gold.append({name: table_rows(t) for name, t in sorted(tables.items())})
            return capture._add(history, tables, first)

        def simulate(*args, **kwargs):
            capture.result = capture._simulate(*args, **kwargs)
            return capture.result

        loop.History.add, loop.simulate = add, simulate
        return self

    def __exit__(self, *exc) -> None:
        self.loop.History.add, self.loop.simulate = self._add, self._simulate

    def stream(self) -> dict:
        """The decision stream of the captured run (module docstring)."""
        result = self.result
        state: dict[str, dict] = {}
        for batch in self.gold:
            for row in batch.get("state/policy", []):
                state[f"{row['resource_type']}|{row['resource']}"] = row
        published = []
        for at, snapshot in result.in_force:
            figures = {f"{b}|{t}|{r}": {"limit_qps": plain(qps), "version": rec.get("version"),
                                        "mode": rec.get("mode"), "expires_at": rec.get("expires_at")}
                       for (b, t, r), (qps, rec) in sorted(snapshot.items())}
            published.append([plain(at), figures])
        limits = [{k: plain(v) for k, v in row.items()} for row in result.limits.to_dict("records")]
        return {"limits": limits, "gold": self.gold, "state": dict(sorted(state.items())), "published": published}


def figures_of(figures) -> dict:
    return {"figures": {k: plain(v[0]) for k, v in figures.values.items() if k != "wall_seconds"},
            "checks": [[n, bool(ok), m] for n, ok, m in figures.checks]}


_WORLD: dict = {}


def _world():
    if not _WORLD:
        os.chdir(TREE)  # conf/backtest.toml is read relative to the tree
        from pipelines.sim.settings import governor_config, load_backtest_config

        bcfg = load_backtest_config("conf/backtest.toml")
        _WORLD.update(bcfg=bcfg, cfg=governor_config(bcfg, None, None), clusters={})
    return _WORLD["cfg"], _WORLD["bcfg"], _WORLD["clusters"]


def scenario_stream(name: str) -> dict:
    """A named scenario's decision stream (and its figures against the same cluster without a governor)."""
    from pipelines.sim.figures import compute
    from pipelines.sim.settings import build_spec, scenario_world
    from pipelines.sim.loop import closed_cluster

    cfg, bcfg, _ = _world()
    spec = build_spec(name, {}, now=NOW)
    bcfg, irregular = scenario_world(name, bcfg)  # its clients and irregularities
    with Capture() as capture:
        result = capture.loop.simulate(spec, cfg, bcfg, irregular=irregular)
    base = closed_cluster(spec, bcfg)
    base.advance_to(base.end)
    return {**capture.stream(), **figures_of(compute(result, base))}


def case_stream(seed: int) -> dict:
    """Sweep case ``seed``'s decision stream, drawn and run as the sweep does, with its verdict."""
    from pipelines.sim import sweep

    cfg, bcfg, clusters = _world()
    case = sweep.draw(seed, bcfg, clusters)
    with Capture() as capture:
        figures = sweep.run(case, cfg, bcfg, clusters.pop(seed, None))
    bad, excused = sweep.verdict(case, figures, cfg, bcfg)
    return {"case": case.describe(), "failed": plain(bad), "excused": plain(excused), **capture.stream(),
            **figures_of(figures)}


def differences(old, new, where: str = "") -> list[str]:
    """Where two streams differ (strings, counts, booleans exactly; floats to a relative :data:`REL`)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            if k not in old or k not in new:
                out.append(f"{where}.{k}: only in {'this tree' if k in new else 'the recording'}")
            else:
                out += differences(old[k], new[k], f"{where}.{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        out = [] if len(old) == len(new) else [f"{where}: {len(old)} items recorded, {len(new)} now"]
        return out + [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{where}[{i}]")]
    numbers = (int, float)
    if (isinstance(old, float) or isinstance(new, float)) and isinstance(old, numbers) and isinstance(new, numbers) \
            and not isinstance(old, bool) and not isinstance(new, bool):
        same = old == new or abs(old - new) <= REL * max(abs(old), abs(new))
        return [] if same else [f"{where}: {old!r} -> {new!r}"]
    return [] if old == new and type(old) is type(new) else [f"{where}: {old!r} -> {new!r}"]


def _path(folder: Path, name: str) -> Path:
    return folder / f"{name}.json.gz"


def job(item: tuple[str, str, str, bool]) -> tuple[str, list[str], float]:
    """One run (``("scenario", name)`` or ``("case", seed)``) recorded into, or compared with, ``folder`` →
    (its name, its differences, CPU seconds)."""
    kind, key, folder, recording = item
    c0 = time.process_time()
    stream = scenario_stream(key) if kind == "scenario" else case_stream(int(key))
    name = f"{kind}-{key}"
    path = _path(Path(folder), name)
    if recording:
        path.write_bytes(gzip.compress(json.dumps(stream, sort_keys=True).encode(), mtime=0))
        return name, [], time.process_time() - c0
    if not path.exists():
        return name, [f"{name}: not in the recording"], time.process_time() - c0
    old = json.loads(gzip.decompress(path.read_bytes()))
    new = json.loads(json.dumps(stream, sort_keys=True))  # the same JSON values the recording holds
    return name, differences(old, new, name), time.process_time() - c0


def run_all(items: list, workers: int):
    if workers <= 1 or len(items) < 2:
        for item in items:
            yield job(item)
        return
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        yield from pool.map(job, items, chunksize=2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, metavar="DIR", help="record the streams into DIR")
    mode.add_argument("--compare", type=Path, metavar="DIR", help="compare the streams with DIR's recording")
    p.add_argument("--scenarios", default="all", help="comma-separated named scenarios, 'all' or '' (default all)")
    p.add_argument("--cases", type=int, default=500, help="sweep cases 0..N-1 (default 500; 0 for none)")
    p.add_argument("--first", type=int, default=0, help="first sweep case (default 0)")
    p.add_argument("--workers", type=int, default=0, help="processes (default: the CPUs this process may use)")
    p.add_argument("--tree", help="import pipelines from this checkout (read before the imports)")
    p.add_argument("--patterns", action="store_true",
                   help="with --compare: also print every differing field once, its run and row indices left out")
    p.add_argument("--label", default="", help="what the tree is, for the recording's index (default: its commit)")
    args = p.parse_args(argv)
    from pipelines.sim.settings import SCENARIO_SIZES

    names = list(SCENARIO_SIZES) if args.scenarios == "all" else [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(names) - set(SCENARIO_SIZES))
    if unknown or args.cases < 0:
        print(f"bench/decision_stream.py: {'unknown scenario(s) ' + ', '.join(unknown) if unknown else '--cases < 0'}",
              file=sys.stderr)
        return 2
    folder = (args.record or args.compare).resolve()
    if args.compare and not folder.is_dir():
        print(f"bench/decision_stream.py: no recording at {folder}", file=sys.stderr)
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    recording = args.record is not None
    items = [("scenario", n, str(folder), recording) for n in names] + [
        ("case", str(s), str(folder), recording) for s in range(args.first, args.first + args.cases)]
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=TREE, capture_output=True, text=True)
    commit = args.label or (subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=TREE, capture_output=True,
                                           text=True).stdout.strip() if Path(top.stdout.strip() or "/") == TREE
                            else "not a checkout (--label names it)")
    print(f"decision stream: {'recording into' if recording else 'comparing with'} {folder}; tree {TREE} ({commit}); "
          f"{len(names)} scenario(s), cases {args.first}..{args.first + args.cases - 1}", flush=True)
    started, differ, cpu, patterns = time.monotonic(), [], 0.0, collections.Counter()
    for name, diffs, seconds in run_all(items, args.workers or len(os.sched_getaffinity(0))):
        cpu += seconds
        patterns.update({re.sub(r"\[\d+\]", "[]", d.split(": ", 1)[0].split(".", 1)[-1]) for d in diffs})
        if diffs:
            differ.append(name)
            print(f"{name}: DIFFERS ({len(diffs)})", flush=True)
            for d in diffs[:SHOWN]:
                print(f"    {d if len(d) <= 600 else d[:600] + ' …'}", flush=True)
        elif name.startswith("scenario-"):
            print(f"{name}: {'recorded' if recording else 'same'}", flush=True)
    if recording:
        index = {"commit": commit, "tree": str(TREE), "scenarios": names, "first": args.first, "cases": args.cases,
                 "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        (folder / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    if args.patterns and patterns:
        print("differing fields (in how many runs):")
        for pattern, runs in sorted(patterns.items()):
            print(f"    {pattern}: {runs}")
    wall = time.monotonic() - started
    print(f"{len(items) - len(differ)} of {len(items)} runs {'recorded' if recording else 'the same'}"
          f"{'' if recording else f', {len(differ)} differ'}; {wall:.0f} s wall, {cpu:.0f} s CPU", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
