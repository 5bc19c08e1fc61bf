"""Randomized closed loops (issue 40): case ``k`` is a scenario drawn from a generator seeded with ``k``, run by the
Spark-free simulator (:func:`pipelines.sim.loop.simulate`) and judged by the closed-loop backtest's own checks
(:func:`pipelines.sim.figures.compute`); ``tests/sim/test_sweep.py`` runs cases ``0..N-1`` in CI.

    python -m pipelines.sim.sweep --case SEED            # one case: its parameters and its check table
    python -m pipelines.sim.sweep --cases 500 [--first 0] # a range: one line per case, the failures' replay commands

Exit status 1 when a case fails a check, 2 for a bad flag.

What varies (:func:`draw`), within what the checks can hold to:

* the kind: a persisting storm, a storm fixed once (with or without a legitimate retry level after the fix), an
  intermittent storm (storm and quiet minutes, 2 episodes), a storm spread over 3+ brokers, a noisy neighbour
  (a surge on a shared broker, lasting or ending), a flash sale on healthy brokers, a normal day;
* the scenario's seed (catalog, traffic, noise), the cluster's size, when the cause starts (a storm from minute
  :data:`FIRST_STORM_MINUTE`: after the governor's first final window) and stops;
* a storm's carriers (brokers hosting the culprit topic), its consume rate (its traffic share) and send-back level
  (1-2.5x what it consumes), the write amplification of a send-back, the retry level after a fix (1-8 %), and how
  much of the group's consumption falls when its retry traffic is rejected (``consume_drop_when_rejected`` 0-1);
* a surge's size (2.6-6x its broker's normal writes: the broker serves 3x, so it saturates it) and duration,
  the noisy broker's normal load and the share of it the culprit topic of the cluster has;
* a flash sale's size and ramp, a normal day's diurnal amplitude;
* the propagation delay from a published limit to the brokers, 0-30 s.

Every run is long enough for the checks it is judged by: the cause lasts at least 4 minutes after its onset, and a
run goes on 9 minutes after a single fix (lifted within 8) and 21 minutes after the last of recurring episodes
(within 20). Cases are short (mostly 12-25 simulated minutes) so that hundreds fit in CI.
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from pipelines.cli import OneLineParser
from pipelines.sim.overrides import for_cluster, judged, overridden

PROG = "python -m pipelines.sim.sweep"
#: A fixed start (UTC): a case's rows do not depend on the day it runs.
START = dt.datetime(2026, 1, 5, 6, 0, tzinfo=dt.timezone.utc)
#: Kinds and how often they are drawn.
KINDS: dict[str, float] = {"persisting_storm": 0.16, "storm_fixed": 0.14, "storm_fixed_legit_retry": 0.14,
                           "intermittent_storm": 0.08, "spread_storm": 0.08, "noisy_neighbour": 0.18,
                           "flash_sale": 0.12, "normal_day": 0.05, "overridden_storm": 0.05}


@dataclass(frozen=True)
class Case:
    """One drawn closed loop: ``kind`` (a scenario of :mod:`pipelines.sim.scenarios`), the spec's fields
    (``spec``), the propagation delay (s) and the clients' settings that differ from ``conf/backtest.toml``."""

    seed: int
    kind: str
    spec: dict[str, Any]
    propagation_seconds: float
    clients: dict[str, Any] = field(default_factory=dict)
    overrides: tuple[dict, ...] = ()  # control/overrides rows (pipelines.sim.overrides.overridden)

    def describe(self) -> str:
        items = ", ".join(f"{k}={v}" for k, v in sorted(self.spec.items()))
        extra = ", ".join(f"{k}={v}" for k, v in sorted(self.clients.items()))
        return (f"case {self.seed}: {self.kind} ({items}); propagation {self.propagation_seconds:g} s"
                + (f"; clients {extra}" if extra else "") + "".join(
                    f"; {o['kind']} {o['limit_qps'] or ''} {o['starts_at']:%H:%M:%S}-{o['ends_at']:%H:%M:%S}"
                    for o in self.overrides))

    @property
    def scenario(self) -> str:
        """The scenario of :mod:`pipelines.sim.scenarios` it runs (an ``overridden_storm`` is a persisting storm)."""
        return "persisting_storm" if self.kind == "overridden_storm" else self.kind

    def replay(self) -> str:
        return f"{PROG} --case {self.seed}"


def draw(seed: int, bcfg=None, clusters: dict | None = None) -> Case:
    """Case ``seed``: its kind and parameters from ``numpy.random.default_rng(seed)`` (module docstring), drawn
    again (from the same generator) until its scenario holds the premise of its kind (:func:`premise`).
    ``clusters``: where to keep the cluster the premise was judged on (by seed; not run yet), for :func:`run`."""
    rng = np.random.default_rng(seed)
    kind = str(rng.choice(list(KINDS), p=np.array(list(KINDS.values())) / sum(KINDS.values())))
    for _ in range(50):
        case = _draw(seed, kind, rng)
        cluster = _cluster(case, bcfg) if case.kind in PREMISED else None
        if premise(case, bcfg, cluster) is None:
            if clusters is not None and cluster is not None:
                clusters[seed] = cluster
            return case
    raise RuntimeError(f"case {seed}: no {kind} holding its premise in 50 draws")


def _draw(seed: int, kind: str, rng: np.random.Generator) -> Case:
    integer = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731 (inclusive bounds)
    uniform = lambda lo, hi: round(float(rng.uniform(lo, hi)), 3)  # noqa: E731
    brokers = integer(5, 6) if kind == "spread_storm" else integer(3, 5)
    spec: dict[str, Any] = {"seed": integer(1, 10_000), "brokers": brokers, "topics": integer(6, 12),
                            "groups": integer(4, 8)}
    clients: dict[str, Any] = {}
    if kind in ("persisting_storm", "storm_fixed", "storm_fixed_legit_retry", "intermittent_storm",
                "spread_storm", "overridden_storm"):
        onset = integer(3, 7)
        consume = uniform(100.0, 700.0)
        spec.update(onset_minute=onset, storm_consume_tps=consume,
                    storm_sendback_tps=round(consume * uniform(1.0, 2.5), 1),
                    storm_write_amplification=uniform(1.0, 4.0),
                    culprit_topic_brokers=integer(3, brokers - 1) if kind == "spread_storm" else integer(1, 2))
        clients["consume_drop_when_rejected"] = uniform(0.0, 1.0)
        if kind in ("persisting_storm", "spread_storm", "overridden_storm"):
            spec["minutes"] = onset + integer(6, 12)
        elif kind == "intermittent_storm":
            on, off = integer(2, 5), integer(1, 5)
            spec.update(storm_on_minutes=on, storm_off_minutes=off, storm_episodes=2,
                        minutes=onset + 2 * (on + off) - off + 21)
        else:
            fix = onset + integer(4, 9)
            spec.update(storm_fix_minute=fix, minutes=fix + 9)
            if kind == "storm_fixed_legit_retry":
                spec["fixed_retry_share"] = uniform(0.01, 0.08)
    elif kind == "noisy_neighbour":
        onset = integer(8, 12)
        normal = integer(9_000, 24_000)
        topic = round(normal / 60.0 * uniform(0.2, 0.5), 1)
        spec.update(onset_minute=onset, culprit_broker_normal_put_per_min=normal, culprit_topic_tps=topic,
                    noisy_base_tps=uniform(10.0, 40.0), noisy_put_tps=round(normal / 60.0 * uniform(2.6, 6.0), 1))
        if rng.random() < 0.5:  # the surge ends: the limit is lifted after it
            duration = integer(4, 10)
            spec.update(noisy_minutes=duration, minutes=onset + duration + 9)
        else:
            spec["minutes"] = onset + integer(6, 10)
    elif kind == "flash_sale":
        onset = integer(7, 11)
        ramp = integer(2, 10)
        spec.update(onset_minute=onset, flash_base_tps=uniform(20.0, 150.0), flash_factor=uniform(2.0, 8.0),
                    flash_ramp_minutes=ramp, minutes=onset + ramp + integer(2, 5))
    else:  # normal_day
        minutes = integer(10, 20)
        spec.update(minutes=minutes, diurnal_amplitude=uniform(0.1, 0.5), restart_minute=integer(2, minutes - 1))
    case = Case(seed, kind, spec, float(integer(0, 30)), clients)
    return overridden(case, rng, START) if kind == "overridden_storm" else case


#: A storm starts at this minute of the run or later. The fast path judges a ratio rule (RUNAWAY_RETRY) on an open
#: window only once it is complete by census, against the brokers of the newest finalized window; a new lake has
#: none, so no open window is complete until the governor's first final window (:func:`pipelines.decide.
#: preliminary.census`). With the shipped settings (watermark 120 s) the fast path reads it 3.5-5.2 minutes into a
#: run (earlier when failure lines move the watermark): a storm from minute 3 or 4 was contained from the final
#: window or the next open one, 132-154 s after its onset (cases 185, 454). A storm in the governor's first
#: minutes is a cold start, not what the 100 s target is about; from minute 5 its onset minute is judged at 6:12.5.
FIRST_STORM_MINUTE = 5
#: The kinds whose premise reads their cluster's demand (:func:`premise`).
PREMISED = ("flash_sale", "normal_day", "noisy_neighbour")
#: A broker whose demand stays under this share of its capacity is never busy (no send queue builds up).
HEALTHY_SHARE = 0.9
#: A noisy neighbour's surge takes its broker at least this far over its capacity (its send queue overflows).
SATURATED_SHARE = 1.1


def _with_clients(case: Case, bcfg):
    from pipelines.sim.settings import load_backtest_config

    bcfg = bcfg or load_backtest_config("conf/backtest.toml")
    if case.clients:
        bcfg = bcfg.model_copy(update={"clients": bcfg.clients.model_copy(update=case.clients)})
    return bcfg


def _cluster(case: Case, bcfg):
    from pipelines.sim.loop import closed_cluster
    from pipelines.sim.spec import ScenarioSpec

    return closed_cluster(ScenarioSpec(name=case.scenario, start=START, **case.spec), _with_clients(case, bcfg))


def premise(case: Case, bcfg=None, cluster=None) -> str | None:
    """Why ``case``'s scenario is not what its kind stands for (None: it is), from the demand of its cluster
    (:func:`pipelines.sim.loop.closed_cluster`: write units per second per broker and minute against the broker's
    capacity): a flash sale and a normal day keep every broker under :data:`HEALTHY_SHARE` of its capacity (the
    right answer is no limit: a flash sale that overloads a broker is a noisy neighbour); a noisy neighbour's surge
    takes its broker over :data:`SATURATED_SHARE` (else no broker is busy, and the surge is only advised). A storm
    starts at :data:`FIRST_STORM_MINUTE` or later (after the governor's first final window); it needs nothing else:
    its consumer is broken whatever the load."""
    if case.kind not in PREMISED:
        onset = case.spec.get("onset_minute", FIRST_STORM_MINUTE)
        return None if onset >= FIRST_STORM_MINUTE else (
            f"the storm starts at minute {onset}, before the governor's first final window (a cold start)")
    c = cluster if cluster is not None else _cluster(case, bcfg)
    load = np.zeros((len(c.brokers), c.T))
    np.add.at(load, c.pair_broker, c.demand * c.work)
    share = load / c.capacity.to_numpy(dtype=float)[:, None]
    if case.kind != "noisy_neighbour":
        worst = float(share.max())
        return None if worst < HEALTHY_SHARE else f"a broker's demand reaches {worst:.2f}x its capacity"
    b = c.brokers.index(c.incident.culprit_broker)
    onset = case.spec["onset_minute"]
    peak = float(share[b, onset:onset + case.spec.get("noisy_minutes", c.T)].min())
    return None if peak > SATURATED_SHARE else f"the surge takes its broker to {peak:.2f}x its capacity only"


def run(case: Case, cfg=None, bcfg=None, cluster=None):
    """Simulate ``case`` → its :class:`pipelines.sim.figures.Figures` (no baseline cluster: the checks do not
    read it). ``cfg``/``bcfg``: the governor's config and the backtest's world (default as shipped); ``cluster``:
    the case's cluster as :func:`draw` built it for its premise (not run yet; default built here)."""
    from pipelines.sim.figures import compute
    from pipelines.sim.settings import governor_config, load_backtest_config
    from pipelines.sim.loop import simulate
    from pipelines.sim.spec import ScenarioSpec

    bcfg = bcfg or load_backtest_config("conf/backtest.toml")
    cfg = cfg or governor_config(bcfg, None, None)
    bcfg = _with_clients(case, bcfg)
    spec = ScenarioSpec(name=case.scenario, start=START, **case.spec)
    if case.overrides:  # overridden_storm: judged by the overrides' own checks (pipelines.sim.overrides.judged)
        cluster = cluster if cluster is not None else _cluster(case, bcfg)
        overrides = tuple(for_cluster(case.overrides, cluster, cfg))
        result = simulate(spec, cfg, bcfg, propagation_seconds=case.propagation_seconds, cluster=cluster,
                          overrides=overrides)
        return judged(compute(result), result, overrides, cfg)
    return compute(simulate(spec, cfg, bcfg, propagation_seconds=case.propagation_seconds, cluster=cluster))


def fastest_in_force(case: Case, cfg=None, bcfg=None, timing=None) -> float:
    """The earliest a limit can be in force after a cause that shows first in a minute's stats lines (s from the
    cause's first second): the minute's lines land ``shipping.stats_seconds`` after its end, the next ingest
    trigger (``windows.trigger_seconds``) writes them ``Timing.ingest_seconds`` later, the next fast trigger
    (``windows.fast_trigger_seconds``) decides, published ``Timing.fast_seconds`` later, in force after the
    propagation delay. 72.5 s + propagation with the shipped settings."""
    from pipelines.sim.settings import governor_config, load_backtest_config
    from pipelines.sim.loop import Timing

    bcfg = bcfg or load_backtest_config("conf/backtest.toml")
    cfg = cfg or governor_config(bcfg, None, None)
    timing = timing or Timing()
    w = cfg.windows
    ingest = -(-(60 + bcfg.shipping.stats_seconds) // w.trigger_seconds) * w.trigger_seconds + timing.ingest_seconds
    fast = -(-ingest // w.fast_trigger_seconds) * w.fast_trigger_seconds
    return fast + timing.fast_seconds + case.propagation_seconds


def verdict(case: Case, figures, cfg=None, bcfg=None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(failed checks, checks the run cannot be judged by): every check of ``figures`` as
    :func:`pipelines.sim.figures.compute` made it, but for two cases it cannot decide, reported apart (see
    docs of issue 40's sweep):

    * ``onset -> limit in force <= 100 s`` (and an episode limited again within 100 s after a lift) when the
      limit came as fast as the pipeline allows (:func:`fastest_in_force`, +1 s) and that is above 100 s: with a
      propagation delay above 27 s no governor meets it;
    * the bystanders' check when no bystander was rejected before containment (0 of 0: the ratio is undefined)
      and none after either; one rejected after still fails."""
    v = figures.values
    value = lambda name: v.get(name, (float("nan"),))[0]  # noqa: E731
    fastest = fastest_in_force(case, cfg, bcfg) + 1.0
    failed, excused = [], []
    for name, ok, measured in figures.checks:
        if ok:
            continue
        onset = value("onset_to_limit_in_force")
        if name.startswith("onset -> limit in force") and fastest > 100.0 and onset <= fastest:
            excused.append((name, f"{measured}: the fastest possible is {fastest - 1.0:.1f} s"))
        elif name.startswith("an episode that starts after a lift") and fastest > 100.0 and all(
                v[k][0] <= fastest for k in v if k.startswith("onset_to_limit_in_force_episode_")) and all(
                v[k][0] == 1.0 for k in v if k.startswith("remembered_target_episode_")):
            excused.append((name, f"{measured}: the fastest possible is {fastest - 1.0:.1f} s"))
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
    the :func:`report` text when a check failed."""

    seed: int
    kind: str
    failed: tuple[tuple[str, str], ...]
    excused: tuple[tuple[str, str], ...]
    replay: str
    report: str = ""


_WORLD: dict = {}


def judge(seed: int) -> Judged:
    """Draw, run and judge case ``seed`` with the shipped config and world (loaded once per process)."""
    from pipelines.sim.settings import governor_config, load_backtest_config

    if not _WORLD:
        bcfg = load_backtest_config("conf/backtest.toml")
        _WORLD.update(cfg=governor_config(bcfg, None, None), bcfg=bcfg, clusters={})
    cfg, bcfg, clusters = _WORLD["cfg"], _WORLD["bcfg"], _WORLD["clusters"]
    case = draw(seed, bcfg, clusters)
    figures = run(case, cfg, bcfg, clusters.pop(seed, None))
    bad, excused = verdict(case, figures, cfg, bcfg)
    return Judged(seed, case.kind, tuple(bad), tuple(excused), case.replay(), report(case, figures) if bad else "")


def judge_many(seeds: Sequence[int], workers: int | None = None) -> dict[int, Judged]:
    """:func:`judge` of every seed, over ``workers`` processes (default: the CPUs this process may use). The
    workers are spawned (polars' thread pools do not survive a fork) with one polars thread each, so that the
    processes, not the threads, share the cores; a case's result does not depend on which worker ran it."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    seeds = list(seeds)
    workers = workers or len(os.sched_getaffinity(0))
    if workers <= 1 or len(seeds) < 2:
        return {seed: judge(seed) for seed in seeds}
    previous = os.environ.get("POLARS_MAX_THREADS")
    os.environ["POLARS_MAX_THREADS"] = "1"  # inherited by the spawned workers only when they start
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            return dict(zip(seeds, pool.map(judge, seeds, chunksize=4)))
    finally:
        if previous is None:
            os.environ.pop("POLARS_MAX_THREADS", None)
        else:
            os.environ["POLARS_MAX_THREADS"] = previous


def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser(prog=PROG, description="Randomized closed loops judged by the backtest's checks.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--case", type=int, help="run case SEED and print its parameters and checks")
    which.add_argument("--cases", type=int, help="run this many cases from --first")
    p.add_argument("--first", type=int, default=0, help="first case of --cases (default 0)")
    args = p.parse_args(argv)
    if args.case is not None:
        case = draw(args.case)
        figures = run(case)
        print(report(case, figures))
        return 1 if failed(figures, case) else 0
    if args.cases < 1:
        p.error(f"--cases must be >= 1, got {args.cases}")
    from pipelines.sim.settings import governor_config, load_backtest_config

    bcfg = load_backtest_config("conf/backtest.toml")
    cfg = governor_config(bcfg, None, None)
    bad, clusters = [], {}
    for seed in range(args.first, args.first + args.cases):
        case = draw(seed, bcfg, clusters)
        figures = run(case, cfg, bcfg, clusters.pop(seed, None))
        problems, excused = verdict(case, figures, cfg, bcfg)
        state = "FAIL " + "; ".join(n for n, _ in problems) if problems else "ok" + (
            " (n/a: " + "; ".join(w for _, w in excused) + ")" if excused else "")
        print(f"case {seed} {case.kind}: {state}", flush=True)
        if problems:
            bad.append(case)
    for case in bad:
        print(f"failed: {case.describe()}\n  replay: {case.replay()}")
    print(f"{args.cases - len(bad)} of {args.cases} cases passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
