"""What each tuned limit setting trades: the CI sweep's cases run at the shipped value and at values either side.

    .venv/bin/python bench/setting_tradeoffs.py [--cases 200] [--first 0] [--workers 2]
                                               [--settings storm_room_share=0.9,1.0 surge_burst_share=0.6,0.8 ...]

Four settings of ``[limits]`` (conf/local.toml) were each set from a few sweep cases: ``storm_room_share`` (a storm's
first limit against the room its busy carriers leave), ``surge_burst_share`` (a surge's first limit and probes against
the breaker's bursts), ``surge_floor_yield_share`` (when a surge's floor yields to a crowded carrier) and
``probe_headroom_share`` (how far a probe may load a carrier that was busy). For each, the sweep's cases
(:func:`pipelines.sim.sweep.draw_case`, judged by :func:`pipelines.sim.sweep.verdict`) run once at the shipped
config (the baseline, same session) and once per alternative value, that one setting changed. Prints the config,
then per value: the cases passing, the cases that fail there and pass at the shipped value (with the checks they
fail), and the reverse. Exit status 1 when an alternative passes more cases than the shipped value (the shipped
value is not the best of those tried: say so and retune), 0 otherwise, 2 for a bad flag.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # one thread per process, as the sweep's workers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.cli import OneLineParser, fail  # noqa: E402

PROG = "bench/setting_tradeoffs.py"
#: The settings and the values either side of the shipped one tried by default.
DEFAULT = ("storm_room_share=0.9,1.0", "surge_burst_share=0.6,0.8", "surge_floor_yield_share=0.75,0.85",
           "probe_headroom_share=0.8,1.0")
_WORKER: dict = {}


def _setting(text: str) -> tuple[str, list[float]]:
    """``name=v1,v2`` → (name, values); the name must be a float setting of ``[limits]``."""
    from pipelines.config import LimitsConfig

    name, _, values = text.partition("=")
    if not isinstance(getattr(LimitsConfig(), name, None), float):
        raise ValueError(f"--settings {text!r}: {name!r} is not a float setting of [limits]")
    try:
        out = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--settings {text!r}: want name=value,value") from None
    if not out:
        raise ValueError(f"--settings {text!r}: no value")
    return name, out


def _one(job: tuple[int, str | None, float | None]) -> tuple[int, str | None, float | None, list[str]]:
    """One case at the shipped config, or with one ``[limits]`` setting changed → its failed checks' names."""
    seed, name, value = job
    from pipelines.sim import sweep
    from pipelines.sim.settings import governor_config, load_backtest_config

    if not _WORKER:
        bcfg = load_backtest_config("conf/backtest.toml")
        _WORKER.update(bcfg=bcfg, cfg=governor_config(bcfg, None, None))
    cfg, bcfg = _WORKER["cfg"], _WORKER["bcfg"]
    if name is not None:
        cfg = cfg.model_copy(update={"limits": cfg.limits.model_copy(update={name: value})})
    clusters: dict = {}  # the cluster the draw built for the case's premise, run as is (not built again)
    case = sweep.draw_case(seed, bcfg, clusters)
    failed, _excused = sweep.verdict(case, sweep.run(case, cfg, bcfg, clusters.pop(seed, None)), cfg, bcfg)
    return seed, name, value, sorted(n for n, _ in failed)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=200, help="sweep cases from --first (default 200: the CI's)")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--settings", nargs="+", default=list(DEFAULT), help="name=value,value (default: the four)")
    a = p.parse_args(argv)
    if a.cases < 1 or a.workers < 1:
        return fail(PROG, "--cases and --workers must be at least 1")
    try:
        settings = [_setting(s) for s in a.settings]
    except ValueError as e:
        return fail(PROG, str(e))
    from pipelines.sim.settings import governor_config, load_backtest_config

    shipped = governor_config(load_backtest_config("conf/backtest.toml"), None, None).limits
    seeds = range(a.first, a.first + a.cases)
    print(f"{PROG}: cases {a.first}..{a.first + a.cases - 1}, {a.workers} workers; shipped: "
          + ", ".join(f"{n}={getattr(shipped, n):g}" for n, _ in settings))
    jobs = [(s, None, None) for s in seeds] + [(s, n, v) for n, vs in settings for v in vs for s in seeds]
    start = time.monotonic()
    with ProcessPoolExecutor(a.workers, mp_context=get_context("spawn")) as pool:
        results = list(pool.map(_one, jobs, chunksize=4))
    base = {seed: failed for seed, name, _v, failed in results if name is None}
    shipped_passing = sum(not f for f in base.values())
    print(f"shipped: {shipped_passing} of {len(base)} pass")
    better = False
    for name, values in settings:
        for value in values:
            run = {seed: failed for seed, n, v, failed in results if n == name and v == value}
            passing = sum(not f for f in run.values())
            worse = {s: f for s, f in run.items() if f and not base[s]}
            fixed = sorted(s for s, f in run.items() if not f and base[s])
            print(f"{name}={value:g} (shipped {getattr(shipped, name):g}): {passing} of {len(run)} pass; "
                  f"newly failing {len(worse)}, newly passing {len(fixed)}{': ' + str(fixed) if fixed else ''}")
            for seed, failed in sorted(worse.items()):
                print(f"    case {seed}: {'; '.join(failed)}")
            better |= passing > shipped_passing
    print(f"{len(jobs)} runs in {time.monotonic() - start:.0f} s")
    if better:
        print("CHECK FAILED: an alternative value passes more cases than the shipped one")
        return 1
    print("check passed: no alternative tried passes more cases than the shipped values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
