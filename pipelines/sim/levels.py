"""A limit's level against the ground truth of the closed loop's world (:mod:`pipelines.sim.cluster`), not against
the governor's own view: what the world allowed, per cause and episode.

* **A storm's level** (:func:`storm_levels`): the limit of a runaway consumer group's retry traffic against the
  rule's target computed from the group's **true normal consume rate** (``limits.allowed_retry_share`` × the
  median of its consumption the world demands, per minute: the consumer's own rate, not what a limit or a busy
  broker let it receive), and where the room its busy carriers leave binds
  (:meth:`pipelines.decide.limits.retry_storm.RetryStormLimit.first_bound`), against that bound computed from each
  carrier's **true capacity** (write units/s) and its **true bystander demand** (every other pair's demanded writes
  there): ``storm_room_share`` × capacity less the bystanders' writes, shared between the storms there in proportion to
  their demanded writes, ÷ the group's write cost per retry. Never below ``min_limit_qps``. Judged on the decided
  level in force at every carrier (a probe's raise read as the level before it: probes have their own check),
  per episode: its lowest against that target (an over-cut), and its last against the rule's target from the true
  consume rate alone (a limit left loose; above the room a carrier leaves, the bystanders' check judges it).
* **A surge's level** (:func:`surge_levels`): in every minute the surging topic's producers are refused by the
  limiter, the room its carriers really leave (true capacity less every other pair's admitted writes, ÷ the topic's
  write cost per put, no more than the topic demands there; capacity up to :data:`ROOM_SHARE` of it, a breaker's
  bursts make a carrier busy above it) and the share of it left unused (that room less what the
  topic was admitted). A surge held at its baseline on a carrier with room for twice that leaves half the room.

Minutes are the run's (index from its start), rates msg/s cluster-wide unless said otherwise, capacities write
units/s per broker (:class:`pipelines.sim.cluster.ClosedLoopCluster` ``capacity``; ``work``: units per request).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipelines import rocketmq as rmq
from pipelines.sim.pulses import sending_nothing


@dataclass(frozen=True)
class Level:
    """One cause's level in one episode (``episode`` from 1): ``figure`` (a storm: lowest decided level ÷ true
    target; a surge: the share of the room left unused, 0-1), ``settled`` (a storm: its last decided level in the
    episode ÷ the rule's target from the true consume rate, the room left aside: a limit above the room its
    carriers leave that keeps them healthy is no harm; a surge: NaN), ``target`` (a storm: the true target, msg/s; a
    surge: the room, msg/s, summed over the judged minutes' mean), ``minutes`` judged, and what was ``left_out``
    (reason → count of minutes)."""

    name: str
    kind: str
    episode: int
    figure: float
    settled: float
    target: float
    minutes: int
    left_out: dict = field(default_factory=dict)


def _pairs(c, resource: tuple[str, str]) -> np.ndarray:
    return ((c.pairs["resource_type"] == resource[0]) & (c.pairs["resource"] == resource[1])).to_numpy()


def true_consume(c, group: str, before_minute: int | None = None) -> float:
    """The group's true normal consume rate (msg/s, cluster-wide): the median per minute of the consumption the
    world demands of it (``GROUP_GET_NUMS`` of its topics, retry topics left out), over the minutes before
    ``before_minute`` when there are three or more, else over the run. NaN without consumption."""
    t = c.traffic
    rows = t[(t["period"].astype(str) == "minute") & (t["stat_name"].astype(str) == rmq.GROUP_GET_NUMS)]
    keys = rows["stats_key"].astype(str)
    mine = rows[keys.str.endswith("@" + group) & ~keys.str.startswith(rmq.RETRY_TOPIC_PREFIX)]
    if mine.empty:
        return float("nan")
    per = mine.groupby("minute_start")["sum"].sum().sort_index() / 60.0
    m = ((per.index - c.start) // pd.Timedelta(minutes=1)).to_numpy()
    early = per.to_numpy()[m < before_minute] if before_minute is not None else np.array([])
    return float(np.median(early if early.size >= 3 else per.to_numpy()))


def storm_target(c, group: str, storms: list[str], full_minute: int, first_minute: int,
                 limits) -> tuple[float, str]:
    """The rule's target for ``group`` from the ground truth (module docstring), msg/s cluster-wide, and a text
    saying which bound gave it. ``storms``: every storm group of the incident (they share a carrier's room, each in
    proportion to its demanded writes there); ``full_minute``: the episode's first minute at its full level (the
    storms' demand there); ``first_minute``: the minute it began (the bystanders' normal writes the minute before
    it); ``limits``: :class:`pipelines.config.LimitsConfig`."""
    target = limits.allowed_retry_share * true_consume(c, group, first_minute)
    why = f"{limits.allowed_retry_share:g} x the true consume rate"
    m = min(max(full_minute, 0), c.T - 1)
    normal_m = min(max(first_minute - 1, 0), c.T - 1)
    mine = _pairs(c, ("group", group))
    storm_pairs = c.pairs["resource_type"].eq("group").to_numpy() & c.pairs["resource"].isin(storms).to_numpy()
    demand_g = c.demand[mine, m].sum()
    for b in sorted(set(c.pairs.loc[mine, "broker"])):
        on = (c.pairs["broker"] == b).to_numpy()
        storm_writes = (c.demand[on & storm_pairs, m] * c.work[on & storm_pairs, m]).sum()
        bystanders = (c.demand[on & ~storm_pairs, normal_m] * c.work[on & ~storm_pairs, normal_m]).sum()
        capacity = float(c.capacity[b])
        if storm_writes + bystanders <= capacity or storm_writes <= 0:  # not busy: the room does not bind
            continue
        bound = demand_g * max(limits.storm_room_share * capacity - bystanders, 0.0) / storm_writes
        if bound < target:
            target, why = bound, (f"the room {b} leaves ({limits.storm_room_share:g} x its capacity {capacity:.0f} "
                                  f"less its bystanders' {bystanders:.0f} units/s)")
    return max(target, limits.min_limit_qps), why


#: A storm that starts within this many seconds of the run's start (a cold start) never showed the governor its
#: group's normal consume rate: its level cannot be judged against the true one.
UNSEEN_NORMAL_SECONDS = 180


def storm_levels(result, cause, storms: list[str], decided: np.ndarray, everywhere: np.ndarray,
                 limits) -> list[Level]:
    """Per episode of a storm ``cause``: its decided level (``decided``: per second, msg/s cluster-wide, the level
    before a probe while one is in force, :func:`pipelines.sim.probes.decided_targets`) over the seconds the cause
    is active and the level is in force at every carrier (``everywhere``), against :func:`storm_target`."""
    c = result.cluster
    out = []
    for k, (a, b) in enumerate(cause.active, start=1):
        lo = max(0, int((pd.Timestamp(a) - c.start).total_seconds()))
        hi = min(c.T * 60, int(np.ceil((pd.Timestamp(b) - c.start).total_seconds())))
        sl = slice(lo, hi)
        judged = everywhere[sl] & ~np.isnan(decided[sl])
        left = {}
        partial = int((~everywhere[sl] & ~np.isnan(decided[sl])).sum())
        if partial:
            left["seconds in force at some carriers only"] = partial
        full = int(np.ceil((lo + cause.ramp_seconds) / 60.0 - 1e-9))  # its first whole minute at its full level
        target, why = storm_target(c, cause.resource, storms, full, lo // 60, limits)
        name = f"group {cause.resource}"
        if lo < UNSEEN_NORMAL_SECONDS:  # a storm under way when the run starts: its normal never shown
            left["the group's normal consume rate never shown (a storm under way at the run's start; its consumer "
                 "slowed by its refused send-backs)"] = int(judged.sum())
            out.append(Level(name, "storm", k, float("nan"), float("nan"), target, 0, left))
            continue
        if not judged.any():
            out.append(Level(name, "storm", k, float("nan"), float("nan"), target, 0, left))
            continue
        values = decided[sl][judged]
        rule = max(limits.allowed_retry_share * true_consume(c, cause.resource, lo // 60), limits.min_limit_qps)
        lowest, squeezes = _lowest(c, cause, decided, judged, lo, target, limits)
        if squeezes:
            left["squeezes (a cut while a carrier was busy: judged as at most one cut by max_cut_pct below the "
                 "true target or the level before it, whichever is lower)"] = squeezes
        out.append(Level(name, "storm", k, lowest, float(values[-1]) / rule, target,
                         int(np.ceil(judged.sum() / 60.0)), {**left, "target": why}))
    return out


#: Minutes before a cut in which a busy carrier makes it a squeeze (as :data:`pipelines.sim.truth.
#: SQUEEZE_LOOKBACK_MIN`: a window's stats, the final path's lateness, the propagation).
SQUEEZE_LOOKBACK_MIN = 4


def _lowest(c, cause, decided: np.ndarray, judged: np.ndarray, lo: int, target: float, limits) -> tuple[float, int]:
    """(the lowest decided level of an episode ÷ ``target``, how many squeezes it had). A **squeeze**, a cut while
    one of the cause's carriers was busy (fast-failing sends) in the :data:`SQUEEZE_LOOKBACK_MIN` minutes before it,
    answers a broker that could not take the level before it: the level it cut to is judged against one cut by
    ``max_cut_pct`` from the lower of that level and the true target (its figure ÷ that is the level's figure, so
    one squeeze's halving of a level at the target reads 1.0, a second 0.5). ``judged``: the episode's seconds
    (from ``lo``) in force at every carrier."""
    mine = _pairs(c, (cause.resource_type, cause.resource))
    carriers = np.isin(c.pair_broker, np.unique(c.pair_broker[mine]))
    busy = c.busy_rejected[:, carriers, :].sum(axis=(1, 2)) > 0  # per minute
    keep = 1.0 - limits.max_cut_pct / 100.0
    seconds = np.flatnonzero(judged) + lo
    ratios, squeezes, before = [], 0, np.nan
    for i, t in enumerate(seconds):
        v = decided[t]
        if i and v == decided[seconds[i - 1]]:
            continue
        prior = decided[t - 1] if t > 0 and not np.isnan(decided[t - 1]) else before
        m = t // 60
        if np.isfinite(prior) and v < prior and busy[max(0, m - SQUEEZE_LOOKBACK_MIN):m + 1].any():
            squeezes += 1
            ratios.append(v / (keep * min(prior, target)))
        else:
            ratios.append(v / target)
        before = v
    return (min(ratios) if ratios else float("nan")), squeezes


#: The share of a carrier's true capacity a surge's room is judged up to: a limiter rejecting most of a surge opens
#: its breaker, and each time it closes a burst reaches the send queue, so a carrier goes busy from 0.79 of its
#: capacity on (the world's breaker: :mod:`pipelines.sim.broker_model`; the lowest share its carriers were seen busy
#: at, ``limits.surge_floor_yield_share``). The room to full capacity is kept beside.
ROOM_SHARE = 0.79


def surge_levels(result, cause, everywhere: np.ndarray, share: float = ROOM_SHARE,
                 split: str = "shares") -> list[Level]:
    """Per episode of a surge ``cause``: the share of its carriers' true room left unused in the minutes its
    producers were refused by the limiter (module docstring), over the minutes the cause is active for the whole
    minute and its limit in force at every carrier (``everywhere``, per second). Minutes whose carriers leave no room
    (another cause fills them) are left out, counted.

    ``split``: how the room of several carriers adds up. ``shares`` (the figure judged): as one cluster-wide limit
    split over its carriers by the topic's traffic on each (``broker_limits``: RocketMQ producers spread their sends
    over every carrier's queues) can use it: the tightest carrier's room ÷ its share of the topic's demand, at most
    the demand. ``carriers``: each carrier's room on its own, summed (what per-carrier limits sized by room could
    use; kept beside). A pulsed producer (:mod:`pipelines.sim.pulses`) is judged over the seconds it sends: the
    room is there every second, its demand and what it was admitted come in its pulses."""
    c = result.cluster
    mine = _pairs(c, (cause.resource_type, cause.resource))
    idx = np.flatnonzero(mine)
    off = sending_nothing(c)
    out = []
    for k, (a, b) in enumerate(cause.active, start=1):
        m0 = max(0, int(np.ceil((pd.Timestamp(a) - c.start).total_seconds() / 60.0)))
        m1 = min(c.minutes_done(), int((pd.Timestamp(b) - c.start).total_seconds() // 60))
        usable_sum = unused_sum = 0.0
        minutes, left = 0, {}
        for m in range(m0, m1):
            if not everywhere[m * 60:(m + 1) * 60].all() or c.limiter_rejected[m, mine, :].sum() <= 0:
                continue
            on = float((~off[m * 60:(m + 1) * 60]).mean())  # a pulsed producer's share of the minute it sends in
            if on <= 0:
                continue
            rooms = np.array([_room(c, i, m, share) for i in idx])
            demand = c.demand[idx, m] / on  # per second it sends: the room is there every second
            admitted = c.admitted[m, idx, :].sum(axis=1) / 60.0 / on
            if split == "shares":
                weights = demand / demand.sum() if demand.sum() > 0 else np.full(idx.size, 1.0 / idx.size)
                usable = min(float(np.min(np.where(weights > 0, rooms / np.maximum(weights, 1e-12), np.inf))),
                             float(demand.sum()))
                unused = max(usable - float(admitted.sum()), 0.0)
            else:  # room used on one carrier does not make up for room left on another
                usable = float(np.minimum(rooms, demand).sum())
                unused = float(np.maximum(np.minimum(rooms, demand) - admitted, 0.0).sum())
            if usable <= 0:
                left["refused with no room on its carriers"] = left.get("refused with no room on its carriers", 0) + 1
                continue
            minutes += 1
            usable_sum += usable * on
            unused_sum += unused * on
        figure = unused_sum / usable_sum if usable_sum > 0 else float("nan")
        out.append(Level(f"topic {cause.resource}", "surge", k, figure, float("nan"),
                         usable_sum / minutes if minutes else float("nan"), minutes, left))
    return out


def _room(c, i: int, m: int, share: float) -> float:
    """Pair ``i``'s room on its broker in minute ``m`` (msg/s): ``share`` × the broker's true capacity less every
    other pair's admitted writes there, ÷ the pair's write cost per request; never below 0."""
    others = c.pair_broker == c.pair_broker[i]
    others[i] = False
    writes = (c.admitted[m, others, :].sum(axis=1) / 60.0 * c.work[others, m]).sum()
    return max(share * float(c.capacity.iloc[c.pair_broker[i]]) - writes, 0.0) / c.work[i, m]
