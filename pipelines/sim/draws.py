"""Drawing a sweep case: its kind, its scenario's parameters, clients, brokers and irregular world,
from ``numpy.random.default_rng(seed)``, until the scenario holds the premise of its kind
(:func:`pipelines.sim.premise.premise`).
:mod:`pipelines.sim.sweep` runs and judges what is drawn here; its docstring says what varies."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from pipelines.sim.case import (  # noqa: F401 (what a case is, importable from here)
    COMPOUND, PROG, SCENARIO_OF, START, Case,
)
from pipelines.sim.irregular import observation, stopped_shipper
from pipelines.sim.premise import cluster_of, premise
from pipelines.sim.scenarios import STORM_SCENARIOS
from pipelines.sim.spec import ScenarioSpec
from pipelines.sim.world import build_world

#: Kinds and how often they are drawn. The first eight are single causes; the rest compound or stress the
#: governor itself.
KINDS: dict[str, float] = {"persisting_storm": 0.08, "storm_fixed": 0.07, "storm_fixed_legit_retry": 0.07,
                           "intermittent_storm": 0.08, "spread_storm": 0.05, "noisy_neighbour": 0.09,
                           "flash_sale": 0.06, "normal_day": 0.05,
                           "two_surges": 0.05, "storm_and_surge": 0.06, "shared_library": 0.06,
                           "spread_surge": 0.05, "flash_overload": 0.04, "near_capacity": 0.04,
                           "cold_start": 0.05, "governor_restart": 0.05, "surge_and_flash": 0.04,
                           "recurring_surge": 0.05, "spread_storm_fixed": 0.03, "tight_surge": 0.03,
                           "legit_high_retry": 0.03, "fixed_high_retry": 0.03}
#: The hard kinds every CI run must hold at least 10 cases of: case ``seed`` is of ``HARD_KINDS[seed % HARD_PERIOD]``
#: when that exists (10 of each among 200 consecutive seeds), else drawn by :data:`KINDS`' weights: a flash sale
#: past the whole cluster's capacity, a storm over every broker then fixed, a governor killed mid-incident, surges
#: on carriers of 1.1-1.4x headroom (a probe overloads them), a group retrying legitimately at 20-47 %.
HARD_KINDS = ("flash_overload", "spread_storm_fixed", "governor_restart", "tight_surge", "legit_high_retry")
HARD_PERIOD = 20
#: The storm kinds (a broken consumer group of the catalog's culprit).
STORM_KINDS = ("persisting_storm", "storm_fixed", "storm_fixed_legit_retry", "intermittent_storm", "spread_storm",
               "spread_storm_fixed", "fixed_high_retry")
#: A legitimate retry level a group may keep under the rule's 0.5 ratio whatever its consume rate's ±5 % noise
#: (0.47 × 1.05 < 0.5): 20-47 % of what it consumes.
HIGH_RETRY_SHARE = (0.2, 0.47)
#: Minutes a run goes on after the fix of a group that keeps retrying 20-47 %: its limit stays at the cap, which
#: ``RateGovernorLimitAtCap`` names after 30 minutes.
AFTER_HIGH_RETRY_FIX = 34
#: A recurring surge of a mid-size topic (its surge this many times its rate before it) has a first episode of
#: :data:`LONG_FIRST_MINUTES`, drawn from a stream of its own, ``default_rng([seed, LONG_FIRST_STREAM])``, so a
#: case's other draws do not move. Such a topic is limited for 16+ of its 30 surge-baseline windows, then comes back
#: near the rule's factor: a baseline fed with the limited windows would hold the capped level (2x the rate before,
#: or what a probe raised it to) and hide the comeback on its busy broker (2.5x that); mutation p12 of
#: ``mutations/policy.toml`` is that baseline. Under 7x a surge limited at 2x with its rejections unlogged can read
#: as gone while it lasts (the lift rule's 4x on what shows); past 12x the comeback fires over any baseline. The
#: small topics' surges are 40-1000x their rate: 3 short episodes.
MID_SURGE_RATIO = (7.0, 12.0)
LONG_FIRST_MINUTES = (18, 24)
LONG_FIRST_STREAM = zlib.crc32(b"recurring_surge_long_first")


#: A legitimate retry group's run needs no onset; its spec's onset minute (the scenario reads none of it).
FIRST_LEGIT_MINUTE = 6
#: The quiet spells between a recurring cause's episodes (an intermittent storm's, a recurring surge's), minutes:
#: from 2 (the cause back before its lift can be decided, or as it lands) to 12 (back after its lift).
QUIET_MINUTES = (2, 12)
#: Minutes a run goes on after the final fix of a cause that comes back: it is judged lifted within 20 minutes
#: of it (:data:`pipelines.sim.truth.FIX_TO_LIFT_RECURRENT_MAX_MIN`), and 2 more for the publication.
AFTER_FINAL_FIX = 22
#: A governor killed mid-incident stays down this long (seconds) before it is restarted on its lake.
GOVERNOR_DOWN_SECONDS = (60.0, 300.0)
#: Gaps in what the governor reads (:func:`_draw_gaps`), each drawn for its share of the cases from one stream of
#: their own, ``default_rng([seed, GAP_STREAM])``, so a case's other draws do not move: one gap in a cause's own
#: carrier's stats (:data:`CARRIER_GAP_SHARE` of the cases with a cause), one in the failure log of a cause's topic or
#: of a bystander topic on its carriers (:data:`FAILURE_GAP_SHARE`), one on a broker or topic carrying no cause while
#: a limit is held, probed or lifted (:data:`PENDING_GAP_SHARE`); each of :data:`GAP_KINDS`, equally often.
CARRIER_GAP_SHARE = 0.3
FAILURE_GAP_SHARE = 0.3
PENDING_GAP_SHARE = 0.25
#: A failure-log gap falls on a cause's own topic for this share (where its sends log failures), else a bystander's.
CAUSE_TOPIC_SHARE = 0.6
#: A gap in the stats of a broker non-carrier rather than the failure log of a topic only non-carriers carry.
PENDING_STATS_SHARE = 0.6
GAP_KINDS = ("dropped", "duplicated", "late", "lost", "stopped")
GAP_STREAM = zlib.crc32(b"gaps_while_pending")
#: How late a line may land and still count. The job has one watermark (``windows.watermark_seconds``, 120 s) over
#: stats and failure events (``pipelines/job/flows/gold.py``, ``fast.py``), and a line is judged against the watermark
#: of the lines read before it: those that landed at least one ingest trigger (``windows.trigger_seconds``) earlier.
#: A failure event is stamped with its failed send and lands ``shipping.failures_seconds`` (5 s) after it; a stats
#: minute is stamped with its start and lands 60 s + its broker's delay + jitter (+ its lateness) after it.
#:
#: A stats minute late by at most this less its broker's delay and the world's jitter is counted (gap kind ``late``,
#: at least 10 s): no line read before it is newer than its landing less 5 s, so the watermark is at least 125 s
#: behind its landing, which is 60 s + delay + jitter + lateness after the minute's start.
STATS_LATE_ROOM = 65.0
#: A stats minute this many seconds late is past the watermark (gap kind ``lost``) even with no failure line moving
#: it: a broker shipping as usual (delay at most 15 s, jitter under 5 s) lands a minute at most 120 s + its delay and
#: jitter after the minute's start, so the watermark is at most 250 s + those 20 s behind a landing; the late minute's
#: start is 60 s + its delay (at least 2 s) + its lateness before it: 208 s suffice.
STATS_LOST_SECONDS = (210.0, 300.0)
#: A failure line late by less than 120 s more than usual is counted (gap kind ``late``): no line read before it is
#: newer than its landing less the usual 5 s, so the watermark is at least 120 s + its lateness behind its send.
FAILURE_LATE_SECONDS = (10.0, 110.0)
#: A failure line this late is past the watermark even when only the stats lines move it (gap kind ``lost``): as for
#: :data:`STATS_LOST_SECONDS`, the watermark is at most 270 s behind its landing, its send 5 s + its lateness: 265 s.
FAILURE_LOST_SECONDS = (270.0, 360.0)
#: A file shipped twice: stats 30-300 s later (counted once whenever it lands); failure lines 10-110 s later, inside
#: the watermark (:data:`FAILURE_LATE_SECONDS`), so that the copy counts (the data plane sums failure lines).
STATS_COPY_SECONDS = (30.0, 300.0)
FAILURE_COPY_SECONDS = (10.0, 110.0)
#: A shipper stopped this many seconds, then restarted with its backlog (gap kind ``stopped``).
STOP_SECONDS = (120.0, 300.0)

#: Consumer clients without the fallback send (a C++ client: a refused send-back is only re-consumed locally, so
#: nothing the governor reads shows the refused demand at the cap): for this share of the cases with a storm, from
#: a stream of its own (:func:`_draw_clients`).
NO_FALLBACK_SHARE = 1 / 3
NO_FALLBACK_STREAM = zlib.crc32(b"no_fallback_send")

#: A tight surge (kind ``tight_surge``) is required (its carrier busy, a limit due) from this share of its
#: carrier's capacity on (the premise's :data:`pipelines.sim.premise.SATURATED_SHARE`); under it a limit is allowed.
SATURATED_SHARE_TIGHT = 1.1

#: Pulsed producers (:func:`_draw_pulses`): drawn for this share of the cases with a surge whose
#: refusals reach the governor, from a stream of their own, ``default_rng([seed, PULSE_STREAM])``, so a case's other
#: draws do not move; a pulse every :data:`PULSE_PERIODS` seconds, lasting 6 s to half the period (at 6 s or more the
#: tokens a pulse finds saved, one second's, add at most a sixth to what its limit admits in it).
PULSE_SHARE = 0.5
PULSE_PERIODS = (15, 20, 30)
PULSE_MIN_ON_SECONDS = 6
PULSE_STREAM = zlib.crc32(b"pulsed_producers")


def draw(seed: int, bcfg=None, clusters: dict | None = None) -> Case:
    """Case ``seed``: its kind and parameters from ``numpy.random.default_rng(seed)`` (module docstring), drawn
    again (from the same generator) until its scenario holds the premise of its kind
    (:func:`pipelines.sim.premise.premise`), then its
    world's irregularities (:func:`_draw_world`, which needs the causes' brokers). ``clusters``: where to keep the
    cluster the premise was judged on (by seed; not run yet), for :func:`run`."""
    rng = np.random.default_rng(seed)
    kind = str(rng.choice(list(KINDS), p=np.array(list(KINDS.values())) / sum(KINDS.values())))
    if seed % HARD_PERIOD < len(HARD_KINDS):
        kind = HARD_KINDS[seed % HARD_PERIOD]
    for _ in range(50):
        case = _draw(seed, kind, rng, bcfg)
        cluster = cluster_of(case, bcfg)
        if premise(case, bcfg, cluster) is None:
            hosts = tuple(sorted({b for c in (cluster.incident.causes if cluster.incident else ()) for b in c.brokers}))
            case = replace(case, hosts=hosts, irregular=_draw_world(case, rng, cluster))
            case = _draw_pulses(case, cluster)
            case = _draw_clients(case, cluster)
            if clusters is not None:
                clusters[seed] = cluster
            return case
    raise RuntimeError(f"case {seed}: no {kind} holding its premise in 50 draws")


def _draw_clients(case: Case, cluster) -> Case:
    """``case`` with consumer clients without the fallback send (``ClientConfig.fallback_send`` False;
    ``cluster``'s set up to match) for :data:`NO_FALLBACK_SHARE` of the cases with a storm cause."""
    causes = cluster.incident.causes if cluster.incident is not None and cluster.incident.causes else ()
    stormy = any(cz.kind == "storm" for cz in causes) or (cluster.incident is not None and not causes and (
        cluster.incident.kind in STORM_SCENARIOS))
    if not stormy or np.random.default_rng([case.seed, NO_FALLBACK_STREAM]).random() >= NO_FALLBACK_SHARE:
        return case
    cluster.clients = cluster.clients.model_copy(update={"fallback_send": False})
    cluster.reroute()
    return replace(case, clients={**case.clients, "fallback_send": False})


def _draw_pulses(case: Case, cluster) -> Case:
    """``case`` with pulsed producers (:class:`pipelines.sim.cluster.ClientConfig` ``pulse_*``; ``cluster``'s set up
    to match) for :data:`PULSE_SHARE` of the cases with a surge cause whose limiter refusals all reach the governor:
    the producers log every one (share 1, no throttle). A pulsed surge at a limit between its mean and its pulses'
    rate is refused in every pulse while its minute's admitted rate stays under the cap: only the refusals tell the
    limit still binds (mutation p01 leaves them out). Where the refusals are sampled, throttled or unlogged, no minute
    line tells such a surge from a fixed one (the limiter's own view is read only when a limit is published), so
    none is drawn there (docs/backtest.md §6.1: a gap of the observation, not of the policy)."""
    causes = cluster.incident.causes if cluster.incident is not None else ()
    told = case.clients.get("rejection_log_share") == 1.0 and case.clients.get("log_lines_per_minute") == 0
    rng = np.random.default_rng([case.seed, PULSE_STREAM])
    if not any(cz.kind == "surge" for cz in causes) or not told or rng.random() >= PULSE_SHARE:
        return case
    period = int(rng.choice(PULSE_PERIODS))
    pulse = {"pulse_period_seconds": period,
             "pulse_on_seconds": int(rng.integers(PULSE_MIN_ON_SECONDS, period // 2 + 1))}
    cluster.clients = cluster.clients.model_copy(update=pulse)
    cluster.apply_pulses()
    return replace(case, clients={**case.clients, **pulse})


def _draw_world(case: Case, rng: np.random.Generator, cluster) -> dict[str, Any]:
    """The world (:class:`pipelines.sim.irregular.Irregularity`): every broker's shipping delay 2-15 s with 0-5 s of
    jitter; with some chance one broker slow (15-60 s), one whose minutes land minutes late (120-240 s: behind the
    watermark, dropped), a dropped minute, a minute shipped twice (30-300 s later), a broker whose stats stop,
    per-broker apply delays (0-20 s), a broker restart during the incident; the limiter's own view for a third
    (:func:`~pipelines.sim.irregular.observation`, its own stream). Here a broker whose minutes all land late or
    whose stats stop for good carries no cause (it would hide the cause, not test the policy), and a dropped minute is
    never a cause's in its first three minutes; then :func:`_draw_gaps` adds one-off gaps on a cause's own carriers,
    in failure logs and on the other brokers (its own stream)."""
    brokers, T = list(cluster.brokers), cluster.T
    integer = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    hosts = set(case.hosts) if case.hosts else {b for c in (cluster.incident.causes if cluster.incident else ())
                                                 for b in c.brokers}
    free = [b for b in brokers if b not in hosts]
    onset = int((pd.Timestamp(cluster.incident.onset) - cluster.start) // pd.Timedelta(minutes=1)) \
        if cluster.incident is not None else T // 2
    out: dict[str, Any] = {"seed": integer(0, 10_000),
                           "stats_delay_seconds": {b: round(float(rng.uniform(2, 15)), 1) for b in brokers},
                           "stats_jitter_seconds": round(float(rng.uniform(0, 5)), 1)}
    if rng.random() < 0.3:
        out["stats_delay_seconds"][str(rng.choice(brokers))] = round(float(rng.uniform(15, 60)), 1)
    if free and rng.random() < 0.25:
        out["stats_delay_seconds"][str(rng.choice(free))] = round(float(rng.uniform(120, 240)), 1)
    if rng.random() < 0.2:
        b = str(rng.choice(brokers))
        m = integer(1, T - 1)
        if not (b in hosts and onset <= m <= onset + 2):
            out["dropped_minutes"] = [(b, m)]
    if rng.random() < 0.2:
        out["duplicated_minutes"] = [(str(rng.choice(brokers)), integer(1, T - 1),
                                      round(float(rng.uniform(30, 300)), 1))]
    if free and rng.random() < 0.1:
        out["stats_stop_minute"] = {str(rng.choice(free)): integer(2, T - 1)}
    if rng.random() < 0.5:
        out["apply_delay_seconds"] = {b: round(float(rng.uniform(0, 20)), 1) for b in brokers}
    if hosts and rng.random() < 0.15:
        out["broker_restarts"] = [(str(rng.choice(sorted(hosts))), round(float(rng.uniform(onset + 2, T)) * 60, 1))]
    if case.kind == "governor_restart":  # killed mid-incident, down 1-5 minutes, restarted on its lake
        killed = float(rng.uniform(onset + 1.5, min(T - 6, onset + 6))) * 60
        down = float(rng.uniform(*GOVERNOR_DOWN_SECONDS))
        out.update(governor_restart_second=round(killed + down, 1), governor_down_seconds=round(down, 1))
    out.update(_draw_gaps(case.seed, GapScene.of(cluster, onset), out))
    return {**out, **observation(case.seed)}


@dataclass(frozen=True)
class GapScene:
    """What :func:`_draw_gaps` reads of a case's cluster: its brokers, minutes and onset minute (the incident's, else
    the middle of the run); each cause's failing sends' topic where its clients log failures (a surge's topic; None
    for a storm: a consumer's refused send-backs and fallback sends leave no line) with the brokers carrying it; every
    topic whose producers log failures with the brokers carrying it."""

    brokers: tuple[str, ...]
    minutes: int
    onset: int
    causes: tuple[tuple[str | None, tuple[str, ...]], ...] = ()
    topics: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, cluster, onset: int) -> "GapScene":
        causes = tuple((c.resource if c.resource_type == "topic" else None, tuple(c.brokers))
                       for c in (cluster.incident.causes if cluster.incident is not None else ()))
        pairs = cluster.pairs[cluster.pairs["kind"] == "topic"]
        topics: dict[str, set] = {}
        for b, t in zip(pairs["broker"], pairs["resource"]):
            topics.setdefault(str(t), set()).add(str(b))
        return cls(tuple(cluster.brokers), int(cluster.T), onset, causes,
                   {t: tuple(sorted(bs)) for t, bs in sorted(topics.items())})


def _draw_gaps(seed: int, scene: GapScene, world: dict) -> dict[str, Any]:
    """Gaps in what the governor reads, from ``default_rng([seed, GAP_STREAM])`` (:data:`GAP_STREAM`, so that a case's
    other draws do not move), added to ``world``'s (its :class:`pipelines.sim.irregular.Irregularity` fields drawn so
    far; it must hold every broker's ``stats_delay_seconds``). Minutes are the run's (index from 0), seconds from its
    start; each gap is one of :data:`GAP_KINDS`, equally often:

    * on a cause's own carrier, for :data:`CARRIER_GAP_SHARE` of the cases with a cause: its stats of a minute from
      the onset minute minus one to the run's last but one (the onset minute itself may be dropped or late, and the
      minute before it is the baseline the cause is read against);
    * in a failure log, for :data:`FAILURE_GAP_SHARE` of the cases with a cause, from the same minutes: the cause's
      own topic's for :data:`CAUSE_TOPIC_SHARE` of them where its clients log failures (a surge; a storm's consumer
      clients log none), else a bystander topic's on its carriers (their busy lines are what a busy carrier shows);
    * on a broker carrying no cause, or the failure log of a topic only such brokers carry
      (:data:`PENDING_STATS_SHARE` stats), for :data:`PENDING_GAP_SHARE` of the cases, from the onset minute plus 3
      to the run's last but one: while a limit is held, probed or lifted (every broker when there is no cause).

    The kinds, in the stats (``dropped_minutes``, ``duplicated_minutes``, ``late_minutes``) and in a failure log
    (``failure_dropped_minutes``, ``failure_duplicated_minutes``, ``failure_late_minutes``, ``failure_stops``):
    ``dropped``: the minute never ships; ``duplicated``: shipped again :data:`STATS_COPY_SECONDS` later (counted
    once) or, failure lines, :data:`FAILURE_COPY_SECONDS` later (counted twice); ``late``: late inside the watermark,
    10 s to :data:`STATS_LATE_ROOM` less the broker's delay and jitter (a broker with less room than 10 s, a slow
    one, draws ``lost`` instead), or :data:`FAILURE_LATE_SECONDS`; ``lost``: late past it, :data:`STATS_LOST_SECONDS` or
    :data:`FAILURE_LOST_SECONDS`; ``stopped``: the shipper stopped for :data:`STOP_SECONDS` and restarted, its backlog
    landing at once at the restart (:func:`pipelines.sim.irregular.stopped_shipper`; for stats the first minute held
    is the drawn one). A shipper dead until the run's end is not drawn here (``_draw_world`` keeps it off a cause's
    carriers): the sweep's lift check does not name such a world as an exclusion."""
    rng = np.random.default_rng([seed, GAP_STREAM])
    T, onset = scene.minutes, scene.onset
    flips = rng.random(3)
    out = {k: list(world.get(k, [])) for k in ("dropped_minutes", "duplicated_minutes", "late_minutes",
                                               "failure_dropped_minutes", "failure_duplicated_minutes",
                                               "failure_late_minutes", "failure_stops")}
    carriers = sorted({b for _, bs in scene.causes for b in bs})
    first = max(0, onset - 1)
    if carriers and flips[0] < CARRIER_GAP_SHARE and T - 2 >= first:
        _stats_gap(rng, str(rng.choice(carriers)), first, T, world, out)
    if scene.causes and flips[1] < FAILURE_GAP_SHARE and T - 2 >= first:
        own = sorted({t for t, _ in scene.causes if t is not None})
        bystanders = sorted(t for t, bs in scene.topics.items() if t not in own and set(bs) & set(carriers))
        pool = own if own and (not bystanders or rng.random() < CAUSE_TOPIC_SHARE) else bystanders
        if pool:
            _failure_gap(rng, str(rng.choice(pool)), first, T, out)
    if flips[2] < PENDING_GAP_SHARE and T - 2 >= onset + 3:
        others = [b for b in scene.brokers if b not in carriers] or list(scene.brokers)
        quiet = sorted(t for t, bs in scene.topics.items() if not set(bs) & set(carriers))
        if not quiet or rng.random() < PENDING_STATS_SHARE:
            _stats_gap(rng, str(rng.choice(others)), onset + 3, T, world, out)
        else:
            _failure_gap(rng, str(rng.choice(quiet)), onset + 3, T, out)
    return {k: v for k, v in out.items() if v != list(world.get(k, []))}


def _stats_gap(rng: np.random.Generator, b: str, lo: int, T: int, world: dict, out: dict) -> None:
    """One gap (:func:`_draw_gaps`) in broker ``b``'s stats, of a minute from ``lo`` to ``T - 2`` of a run of ``T``
    minutes, added to ``out``."""
    kind, m = str(rng.choice(GAP_KINDS)), int(rng.integers(lo, T - 1))
    delay = float(world["stats_delay_seconds"][b])
    room = STATS_LATE_ROOM - delay - float(world.get("stats_jitter_seconds", 0.0))
    if kind == "late" and room < 10.0:
        kind = "lost"
    if kind == "dropped":
        out["dropped_minutes"].append((b, m))
    elif kind == "duplicated":
        out["duplicated_minutes"].append((b, m, round(float(rng.uniform(*STATS_COPY_SECONDS)), 1)))
    elif kind == "late":
        out["late_minutes"].append((b, m, round(float(rng.uniform(10.0, room)), 1)))
    elif kind == "lost":
        out["late_minutes"].append((b, m, round(float(rng.uniform(*STATS_LOST_SECONDS)), 1)))
    else:  # stopped just before minute m's file was due, restarted 2-5 minutes later
        stopped = round((m + 1) * 60.0 + delay - float(rng.uniform(0.0, 60.0)), 1)
        restarted = round(stopped + float(rng.uniform(*STOP_SECONDS)), 1)
        out["late_minutes"] += stopped_shipper(b, stopped, restarted, delay, T)


def _failure_gap(rng: np.random.Generator, topic: str, lo: int, T: int, out: dict) -> None:
    """One gap (:func:`_draw_gaps`) in the failure log of ``topic``, of a minute from ``lo`` to ``T - 2`` of a run of
    ``T`` minutes, added to ``out``."""
    kind, m = str(rng.choice(GAP_KINDS)), int(rng.integers(lo, T - 1))
    if kind == "dropped":
        out["failure_dropped_minutes"].append((topic, m))
    elif kind == "duplicated":
        out["failure_duplicated_minutes"].append((topic, m, round(float(rng.uniform(*FAILURE_COPY_SECONDS)), 1)))
    elif kind in ("late", "lost"):
        more = FAILURE_LATE_SECONDS if kind == "late" else FAILURE_LOST_SECONDS
        out["failure_late_minutes"].append((topic, m, round(float(rng.uniform(*more)), 1)))
    else:  # stopped during minute m, restarted 2-5 minutes later
        stopped = round(m * 60.0 + float(rng.uniform(0.0, 60.0)), 1)
        out["failure_stops"].append((topic, stopped, round(stopped + float(rng.uniform(*STOP_SECONDS)), 1)))


def _cause_timing(spec: dict, rng: np.random.Generator, fixable: bool) -> None:
    """A cause's start at any second, a 1-5 min ramp for some, a fix at any second rolled out over 1-4 min for some."""
    spec["onset_second"] = int(rng.integers(0, 60))
    if rng.random() < 0.3:
        spec["ramp_minutes"] = round(float(rng.uniform(1, 5)), 2)
    if fixable:
        spec["fix_second"] = int(rng.integers(0, 60))
        if rng.random() < 0.3:
            spec["rollout_minutes"] = round(float(rng.uniform(1, 4)), 2)


@dataclass(frozen=True)
class _Dice:
    """Draws from one generator: integers with inclusive bounds, uniforms rounded to 3 decimals."""

    rng: np.random.Generator

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def uniform(self, lo: float, hi: float) -> float:
        return round(float(self.rng.uniform(lo, hi)), 3)


def _draw(seed: int, kind: str, rng: np.random.Generator, bcfg=None) -> Case:
    """Case ``seed`` of ``kind``: the cluster's size, the clients' logging, the brokers' capacity factor, then the
    kind's own parameters (:func:`_draw_storm`, :func:`_draw_noisy`, …, :func:`_draw_compound`), in this order from
    ``rng``."""
    dice = _Dice(rng)
    integer, uniform = dice.integer, dice.uniform
    brokers = integer(5, 6) if kind in ("spread_storm", "spread_storm_fixed") else integer(3, 5)
    spec: dict[str, Any] = {"seed": integer(1, 10_000), "brokers": brokers, "topics": integer(6, 12),
                            "groups": integer(10, 14) if kind == "shared_library" else integer(4, 8)}
    clients: dict[str, Any] = {"rejection_log_share": float(rng.choice([1.0, 0.1, 0.0])),
                               "log_lines_per_minute": int(rng.choice([0, 200]))}
    broker: dict[str, Any] = {"capacity_factor": uniform(1.5, 3.0) if kind in ("flash_sale", "normal_day")
                              else uniform(1.1, 1.4) if kind == "tight_surge" else uniform(1.1, 3.0)}
    if kind in STORM_KINDS or kind in ("cold_start", "governor_restart"):
        _draw_storm(kind, spec, clients, dice)
    elif kind == "legit_high_retry":
        spec.update(onset_minute=FIRST_LEGIT_MINUTE, minutes=integer(15, 25), storm_consume_tps=uniform(100.0, 700.0),
                    fixed_retry_share=uniform(*HIGH_RETRY_SHARE), culprit_topic_brokers=integer(1, 2))
    elif kind == "noisy_neighbour":
        _draw_noisy(spec, broker["capacity_factor"], dice)
    elif kind == "flash_sale":
        onset = integer(7, 11)
        ramp = integer(2, 10)
        spec.update(onset_minute=onset, flash_base_tps=uniform(20.0, 150.0), flash_factor=uniform(2.0, 8.0),
                    flash_ramp_minutes=ramp, minutes=onset + ramp + integer(2, 5))
    elif kind == "normal_day":
        minutes = integer(10, 20)
        spec.update(minutes=minutes, diurnal_amplitude=uniform(0.1, 0.5), restart_minute=integer(2, minutes - 1))
    else:
        _draw_compound(seed, kind, spec, rng, broker, bcfg)
        if kind == "surge_and_flash":  # the noisy neighbour's limiter rejections all reach the governor
            clients.update(rejection_log_share=1.0, log_lines_per_minute=0)
    spec.setdefault("name", SCENARIO_OF.get(kind, kind))
    name = spec.pop("name")
    case = Case(seed, kind, spec, float(integer(0, 30)), clients, broker)
    return case if name == case.scenario else replace(case, spec={**spec, "_scenario": name})


def _draw_storm(kind: str, spec: dict, clients: dict, dice: _Dice) -> None:
    """A broken consumer group (the storm kinds, a cold start, a governor restart): its onset, consume rate (msg/s),
    send-backs (1-2.5x it), write amplification and carriers, how much of its refused consumption the clients drop,
    its timing; then how it ends: not before the run's end (persisting; some outlast a limit's 600 s ttl), on and off
    (intermittent: 3-4 episodes, quiet :data:`QUIET_MINUTES`), or fixed 4-9 minutes after the onset (with a
    legitimate retry level after the fix for some)."""
    integer, uniform, rng = dice.integer, dice.uniform, dice.rng
    brokers = spec["brokers"]
    if kind == "governor_restart":
        spec["name"] = "storm_fixed"
    onset = integer(1, 2) if kind == "cold_start" else integer(5, 8)
    consume = uniform(100.0, 700.0)
    spec.update(onset_minute=onset, storm_consume_tps=consume,
                storm_sendback_tps=round(consume * uniform(1.0, 2.5), 1),
                storm_write_amplification=uniform(1.0, 4.0),
                culprit_topic_brokers=integer(3, brokers) if kind == "spread_storm" else brokers
                if kind == "spread_storm_fixed" else integer(1, 2))
    clients["consume_drop_when_rejected"] = uniform(0.0, 1.0)
    _cause_timing(spec, rng, kind not in ("persisting_storm", "spread_storm", "cold_start"))
    if kind in ("persisting_storm", "spread_storm", "cold_start"):  # some outlast a limit's ttl (600 s)
        spec["minutes"] = onset + integer(6, 20) + int(np.ceil(spec.get("ramp_minutes", 0)))
    elif kind == "intermittent_storm":
        on, off, episodes = integer(3, 5), integer(*QUIET_MINUTES), integer(3, 4)  # 2 on: gone before a limit
        spec.update(storm_on_minutes=on + int(np.ceil(spec.get("ramp_minutes", 0))), storm_off_minutes=off,
                    storm_episodes=episodes, minutes=onset + episodes * (on + off) - off + AFTER_FINAL_FIX)
        spec.pop("rollout_minutes", None)  # each quiet spell starts at a whole fix
        if rng.random() < 0.5:  # its consumer retries legitimately once fixed (and between episodes)
            spec["fixed_retry_share"] = uniform(0.01, 0.099)
    else:
        fix = onset + integer(4, 9) + int(np.ceil(spec.get("ramp_minutes", 0)))
        after = AFTER_HIGH_RETRY_FIX if kind == "fixed_high_retry" else 10
        spec.update(storm_fix_minute=fix, minutes=fix + after + int(np.ceil(spec.get("rollout_minutes", 0))))
        if kind == "storm_fixed_legit_retry" or (kind == "spread_storm_fixed" and rng.random() < 0.5):
            spec["fixed_retry_share"] = uniform(0.01, 0.099)
        elif kind == "fixed_high_retry":
            spec["fixed_retry_share"] = uniform(*HIGH_RETRY_SHARE)


def _draw_noisy(spec: dict, capacity_factor: float, dice: _Dice) -> None:
    """A noisy neighbour: its broker's normal writes (9,000-24,000 msg/min), the culprit topic at 20-50 % of them, the
    noisy topic's base (10-40 msg/s) and surge (1.3-2.5x its broker's capacity), its timing; half of them end (the
    limit is lifted after), the others last long enough for a limit at its cap to be probed upward."""
    integer, uniform, rng = dice.integer, dice.uniform, dice.rng
    onset = integer(8, 12)
    normal = integer(9_000, 24_000)
    topic = round(normal / 60.0 * uniform(0.2, 0.5), 1)
    spec.update(onset_minute=onset, culprit_broker_normal_put_per_min=normal, culprit_topic_tps=topic,
                noisy_base_tps=uniform(10.0, 40.0),
                noisy_put_tps=round(normal / 60.0 * capacity_factor * uniform(1.3, 2.5), 1))
    _cause_timing(spec, rng, True)
    ramp = int(np.ceil(spec.get("ramp_minutes", 0)))
    if rng.random() < 0.5:  # the surge ends: the limit is lifted after it
        duration = integer(4, 10) + ramp
        spec.update(noisy_minutes=duration,
                    minutes=onset + duration + 10 + int(np.ceil(spec.get("rollout_minutes", 0))))
    else:  # some last long enough for a limit at its cap to be probed upward
        spec["minutes"] = onset + integer(6, 20) + ramp
        spec.pop("rollout_minutes", None)


@dataclass(frozen=True)
class _CompoundScene:
    """A compound case's cluster without its causes, what its causes are sized on: ``B`` brokers, their capacity
    ``cap`` and mean load ``load`` before the onset (write units/s), each topic's rate there (``topic_rate``:
    (broker index, topic) → msg/s), the ``world`` (placements, subscriptions) and its ``topics``; ``a``, ``b``: the
    causes' first and last second (``b`` -1: to the run's end); ``rng``: the case's generator."""

    B: int
    cap: np.ndarray
    load: np.ndarray
    topic_rate: dict
    world: Any
    topics: list
    a: float
    b: float
    rng: np.random.Generator

    def surge(self, t: int, share: float, required: int = 1, split: float = 1.0, a: float | None = None,
              b: float | None = None) -> tuple:
        """Topic ``t`` at a level taking each of its brokers to ``share`` of its capacity (``split`` of the load)."""
        world, level, total = self.world, 0.0, 0.0
        for p in np.flatnonzero(world.pl_topic == t).tolist():
            bi, sh = int(world.pl_broker[p]), float(world.pl_share[p])
            now = self.topic_rate.get((bi, self.topics[t]), 0.0)
            total += now
            level = max(level, (now + split * max(share * self.cap[bi] - self.load[bi], 0.0)) / sh)
        if required:  # a surge by the rule's measure too: 4x its baseline (a smaller rise is no TRAFFIC_SURGE)
            level = max(level, 4.5 * total)
        return ("surge", t, self.a if a is None else a, self.b if b is None else b,
                round(float(max(level, 60.0)), 1), required)

    def storm(self, g: int) -> tuple:
        """Group ``g`` sending back 1-2.5x what it consumes and at least 80-200 msg/s."""
        world = self.world
        consumed = float(world.put_rate[world.sp_place[world.sp_group == g]].mean(axis=1).sum())
        level = max(consumed * float(self.rng.uniform(1.0, 2.5)), float(self.rng.uniform(80, 200)))
        return ("storm", g, self.a, self.b, round(level, 1), 1)

    def hosting(self, bi: int) -> int:
        """``bi``, or the next broker that hosts a topic (a broker may host none)."""
        B = self.B
        return next((x % B for x in range(bi, bi + B) if (self.world.pl_broker == x % B).any()), bi)

    def single_broker_topics(self, bi: int) -> list[int]:
        """The topics but topic 0 that only broker ``bi`` carries."""
        counts = np.bincount(self.world.pl_topic, minlength=len(self.topics))
        return [int(t) for t in self.world.pl_topic[self.world.pl_broker == bi] if counts[t] == 1 and t != 0]

    def on_broker(self, bi: int) -> list[int]:
        """Every topic broker ``bi`` carries (a placement each)."""
        return [int(t) for t in self.world.pl_topic[self.world.pl_broker == bi]]

    def rate(self, bi: int, t: int, default: float = 0.0) -> float:
        """Topic ``t``'s rate on broker ``bi`` before the onset, msg/s."""
        return self.topic_rate.get((bi, self.topics[t]), default)


def _draw_compound(seed: int, kind: str, spec: dict, rng: np.random.Generator, broker: dict, bcfg) -> None:
    """Several causes at once, sized on the case's cluster without them (its brokers' capacity and load): two
    topics surging on one broker; a storm (the culprit group, on broker-a) and a surge on another broker; 3-10
    groups storming at once (a shared library's bug); a surge of topic 0 spread over 2+ brokers; a flash sale of
    topic 0 over every broker past its capacity (ramped); a topic at 0.9-1.1x its broker's capacity (a limit
    allowed, not required); a topic surging three times on one broker (4-7 minutes each, quiet 8-12 minutes
    between): the smallest of the broker's topics, or a mid-size one whose surge is 7-12x its rate
    (:data:`MID_SURGE_RATIO`) with a first episode of 18-24 minutes (its length from a stream of its own: limited for
    about 16-22 of the 30 windows of its surge baseline when it comes back). A surge takes
    its broker(s) to the drawn share of capacity; a storm sends back 1-2.5x what its group consumes and at least
    80 msg/s (a runaway by the rule)."""
    onset, a, b = _compound_timing(kind, spec, rng)
    scene = _compound_scene(kind, spec, rng, broker, bcfg, onset, a, b)
    spec["storm_write_amplification"] = round(float(rng.uniform(1.0, 4.0)), 3)
    spec["causes"] = tuple(_COMPOUND_CAUSES.get(kind, _near_capacity)(seed, kind, spec, scene, _Dice(rng)))


def _compound_timing(kind: str, spec: dict, rng: np.random.Generator) -> tuple[int, float, float]:
    """A compound case's onset minute (9-12: after the surge baseline's finalized windows), length (5-14 minutes),
    whether it ends (half, and every recurring surge), its timing; → (onset minute, the causes' first second, their
    last second or -1)."""
    integer = _Dice(rng).integer
    B = spec["brokers"]
    if kind in ("spread_surge", "flash_overload"):
        spec["culprit_topic_brokers"] = B if kind == "flash_overload" else integer(2, B)
    onset = integer(9, 12)  # after the surge baseline's finalized windows
    spec["onset_minute"] = onset
    length = integer(5, 14)
    ended = rng.random() < 0.5 or kind == "recurring_surge"
    spec["minutes"] = onset + length + (10 if ended else 0)
    _cause_timing(spec, rng, ended)
    if kind == "flash_overload":
        spec["ramp_minutes"] = round(float(rng.uniform(1, 5)), 2)
    ramp = int(np.ceil(spec.get("ramp_minutes", 0)))
    spec["minutes"] += ramp + int(np.ceil(spec.get("rollout_minutes", 0)))
    a = onset * 60 + spec["onset_second"]
    b = (onset + length + ramp) * 60 + spec.get("fix_second", 0) if ended else -1
    return onset, a, b


def _compound_scene(kind: str, spec: dict, rng: np.random.Generator, broker: dict, bcfg, onset: int, a: float,
                    b: float) -> _CompoundScene:
    """The case's cluster without its causes (:func:`pipelines.sim.premise.cluster_of`) read before the onset
    (:class:`_CompoundScene`)."""
    probe = cluster_of(Case(0, kind, {**spec, "causes": ()}, 0.0, {}, broker), bcfg)
    cap = probe.capacity.to_numpy(dtype=float)
    load = np.zeros((len(probe.brokers), probe.T))
    np.add.at(load, probe.pair_broker, probe.demand * probe.work)
    load = load[:, 1:onset].mean(axis=1)  # the minutes before the onset but the first: a broker's start, empty
    pairs = probe.pairs
    topic_rate = {}  # (broker index, topic) → msgs/s before the onset
    for i, (bname, rt, r) in enumerate(zip(pairs["broker"], pairs["resource_type"], pairs["resource"])):
        if rt == "topic":
            topic_rate[(probe.brokers.index(bname), r)] = float(probe.demand[i, 1:onset].mean())
    world = build_world(ScenarioSpec(name="compound", start=START, **{**spec, "causes": ()}))
    return _CompoundScene(B=spec["brokers"], cap=cap, load=load, topic_rate=topic_rate, world=world,
                          topics=[str(t) for t in world.topic], a=a, b=b, rng=rng)


def _two_surges(seed: int, kind: str, spec: dict, s: _CompoundScene, dice: _Dice) -> list[tuple]:
    """Two topics surging on one broker, splitting the room between them."""
    rng = dice.rng
    bi = s.hosting(dice.integer(0, s.B - 1))
    ts = s.single_broker_topics(bi) or s.on_broker(bi)
    picks = [int(x) for x in rng.choice(ts, size=min(2, len(ts)), replace=False)]
    share, split = float(rng.uniform(1.3, 3.0)), float(rng.uniform(0.3, 0.7))
    return [s.surge(picks[0], share, 1, split)] + ([s.surge(picks[1], share, 1, 1 - split)] if len(picks) > 1 else [])


def _storm_and_surge(seed: int, kind: str, spec: dict, s: _CompoundScene, dice: _Dice) -> list[tuple]:
    """The culprit group's storm (on broker-a) and a surge of a topic only another broker carries."""
    rng = dice.rng
    others = [t for bi in range(1, s.B) for t in s.single_broker_topics(bi)]
    return [s.storm(0)] + ([s.surge(int(rng.choice(others)), float(rng.uniform(1.3, 3.0)))] if others else [])


def _shared_library(seed: int, kind: str, spec: dict, s: _CompoundScene, dice: _Dice) -> list[tuple]:
    """3-10 groups storming at once (a shared library's bug)."""
    k = dice.integer(3, min(10, spec["groups"] - 1))
    return [s.storm(int(g)) for g in sorted(dice.rng.choice(np.arange(1, spec["groups"]), size=k, replace=False))]


def _spread_surge(seed: int, kind: str, spec: dict, s: _CompoundScene, dice: _Dice) -> list[tuple]:
    """Topic 0 surging over 2+ brokers (1.3-3x their capacity), or its flash sale past every broker's (1.2-2x)."""
    rng = dice.rng
    return [s.surge(0, float(rng.uniform(1.3, 3.0) if kind == "spread_surge" else rng.uniform(1.2, 2.0)))]


def _tight_surge(seed: int, kind: str, spec: dict, s: _CompoundScene, dice: _Dice) -> list[tuple]:
    """Demand 1.0-1.5x the room its carrier leaves (capacity 1.1-1.4x its load); required from
    :data:`SATURATED_SHARE_TIGHT` of its carrier's capacity."""
    rng = dice.rng
    bi = s.hosting(dice.integer(0, s.B - 1))
    ts = s.single_broker_topics(bi) or s.on_broker(bi)
    t = int(rng.choice(ts))
    room = max(s.cap[bi] - s.load[bi], 0.0)
    share = (s.load[bi] + float(rng.uniform(1.0, 1.5)) * room) / s.cap[bi]
    return [s.surge(t, share, int(share > SATURATED_SHARE_TIGHT))]


def _recurring_surge(seed: int, kind: str, spec: dict, s: _CompoundScene, dice: _Dice) -> list[tuple]:
    """A noisy neighbour that comes back after its lift, 3 episodes of 4-7 minutes, quiet :data:`QUIET_MINUTES`
    between: the smallest of its broker's topics, or a mid-size one (:data:`MID_SURGE_RATIO`) whose first episode
    lasts :data:`LONG_FIRST_MINUTES` (from a stream of its own, so the other draws stay as they were)."""
    rng, integer = dice.rng, dice.integer
    bi = s.hosting(integer(0, s.B - 1))
    ts = s.single_broker_topics(bi) or s.on_broker(bi)
    t = int(rng.choice(ts))
    rate = lambda x: s.rate(bi, x)  # noqa: E731
    t = min(ts, key=rate)  # a small topic: its surge is 4x+ admitted
    share = float(rng.uniform(1.3, 3.0))
    on, off = integer(4, 7), integer(*QUIET_MINUTES)
    mid = [x for x in ts if rate(x) > 0 and MID_SURGE_RATIO[0] <= s.surge(x, share)[4] / rate(x)
           <= MID_SURGE_RATIO[1]]
    first = on
    if mid:  # a mid-size topic, limited long first (the other draws stay as they were: a stream of its own)
        t = max(mid, key=rate)
        first = int(np.random.default_rng([seed, LONG_FIRST_STREAM]).integers(LONG_FIRST_MINUTES[0],
                                                                              LONG_FIRST_MINUTES[1] + 1))
    starts = [0] + [first + off + k * (on + off) for k in range(2)]  # minutes after the first onset
    causes = [s.surge(t, share, 1, 1.0, s.a + m * 60, s.a + (m + (first if k == 0 else on)) * 60)
              for k, m in enumerate(starts)]
    spec["minutes"] = (spec["onset_minute"] + starts[-1] + on + AFTER_FINAL_FIX
                       + int(np.ceil(spec.get("rollout_minutes", 0))))
    return causes


def _surge_and_flash(seed: int, kind: str, spec: dict, s: _CompoundScene, dice: _Dice) -> list[tuple]:
    """A legitimate flash sale (5x its rate, at least +60 msg/s, ramped 2-4 minutes, 3-6 minutes after the onset)
    beside a limited noisy neighbour on its broker (the smaller of two topics: 4x+ admitted)."""
    rng = dice.rng
    bi = s.hosting(dice.integer(0, s.B - 1))
    ts = s.single_broker_topics(bi)
    ts += [t for t in s.on_broker(bi) if t not in ts and t != 0][:max(0, 2 - len(ts))]
    ts = ts or s.on_broker(bi)
    picks = [int(x) for x in rng.choice(ts, size=min(2, len(ts)), replace=False)]
    picks.sort(key=lambda x: -s.rate(bi, x))  # the smaller surges: 4x+ admitted
    causes = [s.surge(picks[-1], float(rng.uniform(1.5, 3.0)))]
    if len(picks) > 1:
        now = s.rate(bi, picks[0], 1.0)
        start = s.a + float(rng.uniform(3, 6)) * 60
        causes.append(("flash", picks[0], round(start), -1, round(max(5.0 * now, now + 60.0), 1),
                       round(float(rng.uniform(2, 4)), 2)))
        spec["minutes"] = max(spec["minutes"], int(start // 60) + 10)
    return causes


def _near_capacity(seed: int, kind: str, spec: dict, s: _CompoundScene, dice: _Dice) -> list[tuple]:
    """A topic taking its broker to 0.92-1.08x its capacity: a limit allowed, not required."""
    bi = s.hosting(dice.integer(0, s.B - 1))
    ts = s.single_broker_topics(bi) or s.on_broker(bi)
    return [s.surge(int(dice.rng.choice(ts)), float(dice.rng.uniform(0.92, 1.08)), 0)]


#: Each compound kind's causes (:func:`_draw_compound`).
_COMPOUND_CAUSES = {"two_surges": _two_surges, "storm_and_surge": _storm_and_surge, "shared_library": _shared_library,
                    "spread_surge": _spread_surge, "flash_overload": _spread_surge, "tight_surge": _tight_surge,
                    "recurring_surge": _recurring_surge, "surge_and_flash": _surge_and_flash,
                    "near_capacity": _near_capacity}
