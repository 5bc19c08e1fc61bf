"""Where ``RateGovernorLimitUnderNormal`` would fire in the sweep's closed loops, against their checks (issue 49).

    .venv/bin/python bench/under_normal.py --first 0 --cases 200 [--workers 2]
    .venv/bin/python bench/under_normal.py --seeds 115,204,274

Each case is run as ``python -m pipelines.sim.sweep --case N`` runs it (:func:`pipelines.sim.sweep.run`, judged by
:func:`pipelines.sim.sweep.verdict`), with the simulator's final decision call wrapped to read every
``state/policy`` row it writes: an enforced topic limit whose value is under what its normal traffic needs
(:func:`pipelines.decide.catalogue.normal_floor`: ``limits.surge_squeeze_headroom`` × the baseline frozen with it,
what ``rate_governor_limit_normal_floor_messages_per_second`` exports) is under its floor from that decision until a
later row is not (or the run's end; simulated time). The alert fires on a spell at least its ``for`` long (read
from ``conf/prometheus/rate-governor.rules.yml``); an override in force silences it, and the sweep's overridden
cases are left as they run (their state rows name the override).

Prints the config, one line per case with a spell under the floor or a failed lift check (its spells, minutes,
whether the alert fires within the run, the lift check's text), then the totals. A limit **stuck** is one the lift
check reports "not lifted" and still held at the run's end (a lift decided after the judged minutes is late, not
stuck): named when its topic is under its floor at the end (the alert fires its ``for`` after the spell began,
within the run or after it), **not named** otherwise (held at or above its floor: no alert of this kind can tell
it). Lift failures of a limit lifted, but late, are counted apart, and so are cases where the alert fires with every
lift check passed (a cause still on: a flash sale past the brokers' capacity). Exit status 1 when a stuck limit is
not named, 2 for a bad flag.
"""

from __future__ import annotations

import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # one thread per process, as the sweep's workers
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.cli import OneLineParser, fail  # noqa: E402

PROG = "bench/under_normal.py"
LIFT = "each lift"


def run_one(seed: int) -> dict:
    """Case ``seed`` → its spells under the normal floor per topic ((start, end or None, minutes)), its failed
    checks and its lift check's text."""
    from unittest import mock

    from pipelines.sim import loop, sweep
    from pipelines.sim.alerts import under_normal_spells
    from pipelines.sim.settings import governor_config, load_backtest_config

    rows, shipped = [], loop.decide_final

    def reading(prepared, locked, cfg, now, **kwargs):
        out = shipped(prepared, locked, cfg, now, **kwargs)
        rows.extend((now, r) for r in out.state.to_pylist())
        return out

    with mock.patch.object(loop, "decide_final", reading):
        case = sweep.draw_case(seed)
        figures = sweep.run(case)
        bad, _ = sweep.verdict(case, figures)
    headroom = governor_config(load_backtest_config("conf/backtest.toml"), None, None).limits.surge_squeeze_headroom
    rows.sort(key=lambda x: x[0])
    end = rows[-1][0] if rows else None
    spells = [(sp.topic, sp.start, sp.end, sp.minutes(end)) for sp in under_normal_spells(rows, headroom)]
    last = {r["resource"]: r for _, r in rows if r["resource_type"] == "topic"}
    return {"seed": seed, "kind": case.kind, "failed": [name for name, _ in bad],
            "lift": next((m for n, m in bad if n.startswith(LIFT)), ""), "spells": spells,
            "held": {t for t, r in last.items() if r["limit_qps"] is not None and r["mode"] == "enforce"}}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=0, help="the first case (seed), default 0")
    parser.add_argument("--cases", type=int, default=200, help="how many cases from --first (default 200: CI's)")
    parser.add_argument("--seeds", help="x,y,z: these cases instead")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    args = parser.parse_args(argv)
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()] if args.seeds else list(
            range(args.first, args.first + args.cases))
    except ValueError:
        return fail(PROG, f"--seeds {args.seeds!r}: want integers separated by commas")
    if not seeds or min(seeds) < 0 or args.cases < 1 or args.workers < 1:
        return fail(PROG, "want at least one case, seeds >= 0 and --workers >= 1")
    from pipelines.sim.alerts import RULES, UNDER_NORMAL as ALERT, alert_for_minutes

    wait = alert_for_minutes()
    print(f"config: {len(seeds)} cases ({seeds[0]}..{seeds[-1]}), {ALERT} fires after {wait:g} min under the "
          f"normal floor ({RULES.relative_to(ROOT)}), workers {args.workers}", flush=True)
    named, late, missed, lifted_late, noise = [], [], [], [], []
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        for r in pool.map(run_one, seeds):
            fires = {t for t, _, _, m in r["spells"] if m >= wait}
            under_at_end = {t for t, _, stop, _ in r["spells"] if stop is None}
            stuck = set(re.findall(r"topic (\S+) fixed [\d:]+: not lifted", r["lift"])) & r["held"]
            if stuck - under_at_end:
                missed.append(r["seed"])
            elif stuck:
                (named if stuck <= fires else late).append(r["seed"])
            elif r["lift"]:
                lifted_late.append(r["seed"])
            elif fires:
                noise.append(r["seed"])
            if r["spells"] or r["lift"]:
                spells = "; ".join(f"{t} {a:%H:%M:%S}-{'end' if b is None else format(b, '%H:%M:%S')} {m:.1f} min"
                                   for t, a, b, m in r["spells"]) or "none under the floor"
                print(f"case {r['seed']} ({r['kind']}): {spells}; alert {'fires' if fires else 'silent'} in the run"
                      + (f"; lift check failed: {r['lift']}" if r["lift"] else ""), flush=True)
    print(f"stuck limits (not lifted by the run's end) the alert names: {len(named)} {named}; named only after the "
          f"run's end (under its floor for less than {wait:g} min by then): {len(late)} {late}; not named (held at or "
          f"above the floor): {len(missed)} {missed}. Lifted late: {len(lifted_late)} {lifted_late}. Fires with "
          f"every lift check passed: {len(noise)} {noise}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
