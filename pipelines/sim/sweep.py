"""Randomized closed loops: case ``k`` is a scenario drawn from a generator seeded with ``k``, run by the
Spark-free simulator (:func:`pipelines.sim.loop.simulate`) and judged by the closed-loop backtest's own checks
(:func:`pipelines.sim.figures.compute`); ``tests/sim/test_sweep.py`` runs cases ``0..N-1`` in CI.

    python -m pipelines.sim.sweep --case SEED            # one case: its parameters and its check table
    python -m pipelines.sim.sweep --cases 200 [--first 0] [--workers 2] [--json FILE]  # a range: one line per case
    python -m pipelines.sim.sweep --seeds 3 17 42 [--workers 2] [--json FILE]  # these cases, as a range is run
    python -m pipelines.sim.sweep --kind overridden_storm --cases 6  # the overridden storms' own cases

Exit status 1 when a case fails a check, 2 for a bad flag.

What varies (:func:`pipelines.sim.draws.draw`; an irregular world and compound incidents):

* the kind (:data:`KINDS`): a persisting storm (6-20 minutes), a storm fixed once (with or without a legitimate
  retry level of 1-9.9 % after the fix), an intermittent storm (3-4 episodes of 2-5 minutes, quiet spells of 4-12
  minutes: from 7 an episode starts after a lift, below it may come back before or as the lift lands), a storm spread
  over 3 to every broker, a noisy neighbour (1.3-2.5x its broker's capacity, lasting or ending), a flash sale on healthy
  brokers, a normal day; compound (:data:`COMPOUND`): two surges on one broker, a storm and a surge on different
  brokers, 3-10 groups storming at once, a surge spread over 2+ brokers, a flash sale past every broker's capacity, a
  demand at 0.9-1.1x capacity, a surge back twice after its lift (a mid-size topic's limited 18-24 minutes first: the
  case mutation p12 needs); a storm under way when the governor starts on a new lake (``cold_start``, judged by
  :func:`pipelines.sim.fastest.cold_start_target`) and a governor restarted mid-incident;
* when a cause starts (at any second; a storm from minute :data:`FIRST_STORM_MINUTE` but for a cold start), ramps
  (1-5 minutes) and is fixed (at any second, rolled out over 1-4 minutes);
* a storm's carriers, its consume rate and send-back level (1-2.5x what it consumes), the write amplification of a
  send-back, and how much of the group's consumption falls when its retry traffic is rejected;
* the brokers' capacity (1.1-3x their normal writes), the propagation delay (0-30 s), what producers log of the
  limiter's rejections (all, 10 % or none; a 200-line throttle or none);
* the world (:func:`pipelines.sim.draws._draw_world`, :class:`pipelines.sim.irregular.Irregularity`): per-broker
  shipping delays and jitter, a slow broker, one whose minutes land behind the watermark, a dropped minute, a file
  shipped twice, a broker whose stats stop, per-broker apply delays, a broker restart; and from a generator of its
  own (:func:`pipelines.sim.draws._draw_gaps`) one-off gaps on a cause's own carriers, in the producers' failure
  logs of its topic or of bystanders, and on the other brokers while a limit is pending: a minute dropped, shipped
  twice, late inside or past the watermark, or a shipper stopped 2-5 minutes and restarted with its backlog;
* what the governor observes (:func:`pipelines.sim.irregular.observation`, from a generator of its own so
  that a case's other draws stay as they were): the limiter's own view through the RocketMQ admin sink for about a
  third of the cases (printed ``world limiter_view=True``), the file write-back alone for the rest;
* pulsed producers (:func:`pipelines.sim.draws._draw_pulses`, a generator of its own too): for half the cases with a
  surge whose producers log every refusal, the surge's topic sends in pulses of 6 s to half the period every 15, 20
  or 30 s while it is active (printed ``pulse_period_seconds``, ``pulse_on_seconds``), so a limit between its minute
  rate and its pulses' refuses in each pulse while the minute admits well under the cap.

Operators' overrides have their own cases, apart from these (``--kind overridden_storm``,
:func:`pipelines.sim.overrides.draw_overridden`: a persisting storm with a drawn pin or exemption of its culprit,
judged by the overrides' checks); case ``k`` above is drawn as before they existed.

Every run is long enough for the checks it is judged by: a run goes on 10 minutes after the last fix (each lift
within 8 minutes of a fix followed by 8 quiet minutes). Cases are 10-60 simulated minutes.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Sequence

from pipelines.cli import OneLineParser
from pipelines.sim.figures import NO_MINUTE, check_figure

from pipelines.sim.draws import (  # noqa: F401 (the drawing of a case, importable from here)
    COMPOUND, KINDS, PROG, SCENARIO_OF, START, STORM_KINDS, Case, draw,
)
from pipelines.sim.premise import (  # noqa: F401
    CAPACITY_BAND, FIRST_STORM_MINUTE, HEALTHY_SHARE, PREMISED, SATURATED_SHARE, _spec, _with_clients, premise,
)
from pipelines.sim.fastest import cold_start_target, episode_fastest, fastest_in_force, unseen_minutes
from pipelines.sim.overrides import KIND as OVERRIDDEN, draw_overridden, for_cluster, judged as judge_overridden


def run(case: Case, cfg=None, bcfg=None, cluster=None):
    """Simulate ``case`` → its :class:`pipelines.sim.figures.Figures` (no baseline cluster: the checks do not
    read it). ``cfg``/``bcfg``: the governor's config and the backtest's world (default as shipped); ``cluster``:
    the case's cluster as :func:`draw` built it for its premise (not run yet; default built here)."""
    from pipelines.sim.figures import compute
    from pipelines.sim.irregular import Irregularity
    from pipelines.sim.settings import governor_config, load_backtest_config
    from pipelines.sim.loop import simulate

    bcfg = bcfg or load_backtest_config("conf/backtest.toml")
    cfg = cfg or governor_config(bcfg, None, None)
    bcfg = _with_clients(case, bcfg)
    overrides = tuple(for_cluster(case.overrides, cluster, cfg)) if getattr(case, "overrides", ()) else ()
    result = simulate(_spec(case), cfg, bcfg, propagation_seconds=case.propagation_seconds, cluster=cluster,
                      irregular=Irregularity(**case.irregular), overrides=overrides)
    # overridden_storm: judged by the overrides' own checks (pipelines.sim.overrides.judged)
    return judge_overridden(compute(result), result, overrides, cfg, case) if overrides else compute(result)


#: Checks a kind may find nothing to judge by (their measured text starts with
#: :data:`pipelines.sim.figures.NO_MINUTE`), with the reason: kind → {the check's name's start: why}. Anywhere else a
#: required check with no qualifying minute fails its case.
OPTIONAL: dict[str, dict[str, str]] = {
    "governor_restart": {"admitted within": (
        "the governor is down for 1-5 minutes from the onset on: its first limit comes that much later, and a storm "
        "fixed within minutes of it may have no limited minute without a carrier still busy from the unlimited ones "
        "(a minute with a busy carrier is not the limiter's figure)")},
    "cold_start": {"a storm's limit at its true target": (
        "the storm is under way when the governor starts: the group's normal consume rate was never shown, and its "
        "consumer, slowed by its refused send-backs, shows less; the rule's target is 10 % of what it shows")},
}


def verdict(case: Case, figures, cfg=None, bcfg=None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(failed checks, checks the run cannot be judged by): every check of ``figures`` as
    :func:`pipelines.sim.figures.compute` made it, but for the cases it cannot decide, reported apart (docs/backtest.md
    §2):

    * ``onset -> limit in force <= 100 s`` (and an episode limited again within 100 s after a lift) when the
      limit came as fast as the pipeline allows (:func:`fastest_in_force`, +1 s) and that is above 100 s: with a
      propagation delay above 27 s no governor meets it;
    * the bystanders' check when no bystander was rejected before containment (0 of 0: the ratio is undefined)
      and none after either; one rejected after still fails.

    A cold start's onset check is judged against :func:`cold_start_target` (from the governor's start) instead:
    failed above it, passed (reported n/a with the figure) within it. Where the governor was down (killed) when
    the cause's clock started, its onset is judged from the restart: n/a when the limit was in force within the
    fastest possible after it."""
    v = figures.values
    value = lambda name: v.get(name, (float("nan"),))[0]  # noqa: E731
    fastest = fastest_in_force(case, cfg, bcfg, carriers=figures.carriers) + 1.0
    failed, excused = [], []
    restart = case.irregular.get("governor_restart_second")
    down = case.irregular.get("governor_down_seconds", 0.0)
    for name, ok, measured in figures.checks:
        onset = value("onset_to_limit_in_force")
        at = value("limit_in_force_at_s")
        if restart is not None and down and name.startswith("onset -> limit in force") and not ok and (
                at - onset < restart) and at - restart <= fastest:
            excused.append((name, f"{measured}; the governor was down {restart - down:.0f}-{restart:.0f} s into the "
                                  f"run, the limit in force {at - restart:.0f} s after its restart (the fastest "
                                  f"possible {fastest - 1.0:.1f} s)"))
            continue
        if case.kind == "cold_start" and name.startswith("onset -> limit in force"):
            since_start = case.spec["onset_minute"] * 60.0 + onset
            target = cold_start_target(case, cfg, bcfg)
            if since_start <= target:
                excused.append((name, f"{measured}; a cold start: in force {since_start:.0f} s after the governor's "
                                      f"start, target {target:.0f} s"))
            else:
                failed.append((name, f"{measured}; a cold start: in force {since_start:.0f} s after the governor's "
                                     f"start, above its target {target:.0f} s"))
            continue
        if ok:
            continue
        optional = next((why for start, why in OPTIONAL.get(case.kind, {}).items() if name.startswith(start)), None)
        if optional is not None and measured.startswith(NO_MINUTE):
            excused.append((name, f"{measured}: optional for {case.kind}: {optional}"))
            continue
        unseen = 60.0 * unseen_minutes(case, figures.carriers, value("onset_clock_s"))
        if name.startswith("onset -> limit in force") and fastest + unseen > 100.0 and onset <= fastest + unseen:
            excused.append((name, f"{measured}: the fastest possible is {fastest + unseen - 1.0:.1f} s" + (
                f" (the cause's first {unseen / 60:.0f} minute(s) missing from its carriers' stats)"
                if unseen else "")))
        elif name.startswith("an episode that starts after a lift") and all(
                v[k][0] <= episode_fastest(case, figures, k, fastest) for k in v
                if k.startswith("onset_to_limit_in_force_episode_")) and all(
                v[k][0] == 1.0 for k in v if k.startswith("remembered_target_episode_")):
            excused.append((name, f"{measured}: within the fastest possible (from "
                                  f"{fastest - 1.0:.1f} s, and a minute more per minute missing from the carriers' "
                                  "stats at its start)"))
        elif (name.startswith("bystander rejected sends") and value("bystander_rejected_per_minute_before") == 0
              and value("bystander_rejected_per_minute_after") == 0):
            excused.append((name, f"{measured}: no bystander rejected before containment nor after"))
        else:
            failed.append((name, measured))
    return failed, excused


def failed(figures, case: Case | None = None) -> list[tuple[str, str]]:
    """The failed checks of a run: (check, measured); with ``case``, without those :func:`verdict` excuses."""
    if case is not None:
        return verdict(case, figures)[0]
    return [(name, measured) for name, ok, measured in figures.checks if not ok]


def report(case: Case, figures) -> str:
    """A failing (or asked-for) case: its parameters, its check table and the one-line replay command."""
    bad, excused = verdict(case, figures)
    lines = [case.describe()]
    for name, ok, measured in figures.checks:
        mark = "ok  " if ok else "FAIL" if any(n == name for n, _ in bad) else "n/a "
        why = next((w for n, w in excused if n == name), measured)
        lines.append(f"  {mark} {name}: {why}")
    lines.append(f"  replay: {case.replay()}")
    return "\n".join(lines)



@dataclass(frozen=True)
class Judged:
    """One case judged: its seed and kind, failed checks and n/a checks (:func:`verdict`), its replay command, and
    the :func:`report` text when a check failed; ``seconds``: the CPU seconds its process spent drawing, running and
    judging it (its cost, not part of its verdict: two runs of a case compare equal)."""

    seed: int
    kind: str
    failed: tuple[tuple[str, str], ...]
    excused: tuple[tuple[str, str], ...]
    replay: str
    report: str = ""
    figures: tuple[tuple[str, float], ...] = ()  # each failed check's figure (figures.CHECK_FIGURES): (name, value)
    seconds: float = field(default=0.0, compare=False)


_WORLD: dict = {}


def draw_case(seed: int, bcfg=None, clusters: dict | None = None, kind: str | None = None) -> Case:
    """Case ``seed`` of the sweep (:func:`draw`), or of ``kind`` ``overridden_storm``'s own cases."""
    return draw_overridden(seed, bcfg, clusters) if kind == OVERRIDDEN else draw(seed, bcfg, clusters)


def judge(seed: int, kind: str | None = None) -> Judged:
    """Draw (:func:`draw_case`), run and judge case ``seed`` with the shipped config and world (loaded once per
    process)."""
    from pipelines.sim.settings import governor_config, load_backtest_config

    if not _WORLD:
        bcfg = load_backtest_config("conf/backtest.toml")
        _WORLD.update(cfg=governor_config(bcfg, None, None), bcfg=bcfg, clusters={})
    cfg, bcfg, clusters = _WORLD["cfg"], _WORLD["bcfg"], _WORLD["clusters"]
    started = time.process_time()
    case = draw_case(seed, bcfg, clusters, kind)
    figures = run(case, cfg, bcfg, clusters.pop(seed, None))
    bad, excused = verdict(case, figures, cfg, bcfg)
    figs = tuple((fig[0], float(figures.value(fig[0]))) for name, _ in bad if (fig := check_figure(name)) is not None)
    return Judged(seed, case.kind, tuple(bad), tuple(excused), case.replay(), report(case, figures) if bad else "",
                  figs, time.process_time() - started)


def judge_many(seeds: Sequence[int], workers: int | None = None, kind: str | None = None) -> dict[int, Judged]:
    """:func:`judge` of every seed (of ``kind``), over ``workers`` processes (default: the CPUs this process may
    use). The
    workers are spawned (polars' thread pools do not survive a fork) with one polars thread each, so that the
    processes, not the threads, share the cores; a case's result does not depend on which worker ran it."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial
    from multiprocessing import get_context

    seeds = list(seeds)
    workers = workers or len(os.sched_getaffinity(0))
    if workers <= 1 or len(seeds) < 2:
        return {seed: judge(seed, kind) for seed in seeds}
    previous = os.environ.get("POLARS_MAX_THREADS")
    os.environ["POLARS_MAX_THREADS"] = "1"  # inherited by the spawned workers only when they start
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            return dict(zip(seeds, pool.map(partial(judge, kind=kind), seeds, chunksize=4)))
    finally:
        if previous is None:
            os.environ.pop("POLARS_MAX_THREADS", None)
        else:
            os.environ["POLARS_MAX_THREADS"] = previous


def _parser() -> OneLineParser:
    """The sweep's command line (module docstring): one case, a range of cases or these seeds, with the number of
    processes, the files to write the verdicts and the CPU seconds to, and the kind of cases."""
    p = OneLineParser(prog=PROG, description="Randomized closed loops judged by the backtest's checks.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--case", type=int, help="run case SEED and print its parameters and checks")
    which.add_argument("--cases", type=int, help="run this many cases from --first")
    which.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                       help="run these cases (as --cases runs a range; e.g. the cases that catch a policy mutation)")
    p.add_argument("--first", type=int, default=0, help="first case of --cases (default 0)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes for --cases (default 1: in this process, one line per case as it ends)")
    p.add_argument("--json", metavar="FILE",
                   help="with --cases or --seeds: write {case: [failed checks]} of every case to FILE")
    p.add_argument("--times", metavar="FILE",
                   help="with --cases or --seeds: write {case: CPU seconds to draw, run and judge it} to FILE")
    p.add_argument("--kind", choices=[OVERRIDDEN],
                   help="the cases of this kind, apart from the sweep's (their own seeds): operators' overrides")
    return p


@dataclass
class Swept:
    """The cases of one sweep as they ended: ``verdicts``: case → its failed checks' names; ``seconds``: case → the
    CPU seconds to draw, run and judge it; ``bad``: per failed case, its failure and replay lines (printed last)."""

    verdicts: dict[int, list[str]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)


def _sweep_in_workers(seeds: Sequence[int], workers: int, kind: str | None) -> Swept:
    """The cases ``seeds`` judged over ``workers`` processes (:func:`judge_many`), one line per case printed in
    seed order once all have ended; returns their :class:`Swept`."""
    swept = Swept()
    for seed, judged in sorted(judge_many(seeds, workers, kind).items()):
        swept.verdicts[seed] = [n for n, _ in judged.failed]
        swept.seconds[seed] = judged.seconds
        state = "FAIL " + "; ".join(swept.verdicts[seed]) if judged.failed else "ok"
        print(f"case {seed} {judged.kind}: {state}")
        if judged.failed:
            swept.bad.append(f"failed: case {seed} {judged.kind}\n  replay: {judged.replay}")
    return swept


def _sweep_here(seeds: Sequence[int], kind: str | None) -> Swept:
    """The cases ``seeds`` drawn, run and judged in this process with the shipped config and world, one line per
    case printed as it ends (with the checks it could not be judged by); returns their :class:`Swept`."""
    from pipelines.sim.settings import governor_config, load_backtest_config

    bcfg = load_backtest_config("conf/backtest.toml")
    cfg = governor_config(bcfg, None, None)
    clusters: dict = {}
    swept = Swept()
    for seed in seeds:
        started = time.process_time()
        case = draw_case(seed, bcfg, clusters, kind)
        figures = run(case, cfg, bcfg, clusters.pop(seed, None))
        problems, excused = verdict(case, figures, cfg, bcfg)
        swept.seconds[seed] = time.process_time() - started
        swept.verdicts[seed] = [n for n, _ in problems]
        state = "FAIL " + "; ".join(n for n, _ in problems) if problems else "ok" + (
            " (n/a: " + "; ".join(w for _, w in excused) + ")" if excused else "")
        print(f"case {seed} {case.kind}: {state}", flush=True)
        if problems:
            swept.bad.append(f"failed: {case.describe()}\n  replay: {case.replay()}")
    return swept


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.case is not None:
        case = draw_case(args.case, kind=args.kind)
        figures = run(case)
        print(report(case, figures))
        return 1 if failed(figures, case) else 0
    if args.cases is not None and args.cases < 1:
        p.error(f"--cases must be >= 1, got {args.cases}")
    if args.seeds is not None and min(args.seeds) < 0:
        p.error(f"--seeds must be >= 0, got {min(args.seeds)}")
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    seeds = sorted(set(args.seeds)) if args.seeds is not None else range(args.first, args.first + args.cases)
    swept = _sweep_in_workers(seeds, args.workers, args.kind) if args.workers > 1 else _sweep_here(seeds, args.kind)
    for line in swept.bad:
        print(line)
    for path, data in ((args.json, swept.verdicts),
                       (args.times, {k: round(v, 3) for k, v in swept.seconds.items()})):
        if path:
            with open(path, "w", encoding="utf-8") as out:
                json.dump({str(k): v for k, v in data.items()}, out, indent=0)
    print(f"{len(seeds) - len(swept.bad)} of {len(seeds)} cases passed")
    return 1 if swept.bad else 0


if __name__ == "__main__":
    sys.exit(main())
