"""The per-resource policy fold: plain Python over frozen dataclasses, one resource at a time.

:func:`fold_resource` walks one resource's finalized (or, on the fast path, open) windows in event-time order with
its saved :class:`ResourceState` and emits ``set`` / ``relax`` / ``lift`` :class:`Decision` s. It is run per resource
on the driver by :func:`pipelines.transforms.policy_fold.decide`; its input rows come from
:func:`pipelines.transforms.policy.candidate_limits` (a rule fired: :class:`Candidate`) and
:func:`pipelines.transforms.policy.observations` (what a resource under a limit did: :class:`Observation`).

**Closed loop.** A limit changes the traffic the governor reads next: a capped resource shows the cap, not its
demand, so "the rule no longer fires" proves nothing while a limit is in force. Each window of a resource under an
enforced limit is therefore judged on its *demand evidence* (:func:`classify`):

* ``bound``: the cluster-wide observed rate is at least ``bound_share`` of the cluster-wide limit, or the limiter
  rejected sends of the resource (``RATE_LIMITED`` failures): the anomaly persists (a ``gold/anomalies`` row with
  the numbers, "limit-bound: 38.2 of 40.2 msg/s, rejecting"), the limit is refreshed, never relaxed;
* ``clear``: at most ``clear_share`` of the limit and no rejection: the limit is doing nothing;
* ``hold``: in between: neither recovery nor escalation.

Recovery needs ``recovery_windows`` windows without the anomaly and without the cap being reached (clear windows,
or windows where the resource has no traffic at all); the limit is then lifted at once: it was doing nothing, so
the x1.5 ramp would only delay the lift. A surge limit (``topic``) that stays at its cap while every broker carrying
the topic is healthy (no ``BROKER_BUSY``) for ``recovery_windows`` windows is *probed* upward x``relax_factor``
per step (NSQ's RDY policy, article 003), and lifted once it would reach the normal rate: legitimate demand that
grew must not be held forever. A retry-storm limit (``group``) is never probed: its demand is the broken consumer.

**Frozen basis.** The target of an enforced limit is frozen when the limit is first set (the pre-limit rates: a
throttled consumer's falling consume rate must not ratchet its limit down to the floor), and so are the per-broker
shares of the limit (each broker's share of the resource's traffic in the window that set it: a capped share must
not feed on itself). Both are reset when the limit is lifted.

**Recurrence memory** (flap damping, as BGP route-flap damping or an alert's back-off). A lift remembers when it
happened and the frozen target. An anomaly of the same resource within ``recurrence_windows`` windows of that lift
is a *recurrence*: the new limit goes straight to the remembered target (no ``max_cut_pct`` step: the target was
proven by the limit before), and each recurrence doubles the clear windows the next lift needs
(``recovery_windows`` × 2^recurrences, at most ``max(recovery_windows, recurrence_windows)``). A consumer that breaks
every few minutes thus keeps its limit through its quiet spells from its second storm on, while a consumer fixed
once is lifted after ``recovery_windows``. Quiet for ``recurrence_windows`` after a lift, the memory is forgotten.

Decisions depend only on event-time windows and saved state, never on how windows were cut into micro-batches.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from pipelines.config import LimitsConfig

ACTION_SET = "set"
ACTION_RELAX = "relax"
ACTION_LIFT = "lift"
MODE_ENFORCE = "enforce"
#: The basis of a decision: decided on an open window's partial evidence (fast path) or on a finalized window.
BASIS_PRELIMINARY = "preliminary"
BASIS_FINAL = "final"
#: Demand evidence of a window under an enforced limit (:func:`classify`).
BOUND, HOLD, CLEAR = "bound", "hold", "clear"
#: Key of the per-broker figure of a broker that carried no traffic when the limit was set (docs/contracts.md §3).
ANY_BROKER = "*"
#: The recurrence memory of a resource with none (:class:`ResourceState`).
FORGOTTEN = {"last_lift_end": None, "lifted_target_qps": None, "recurrences": 0}


@dataclass(frozen=True)
class ResourceState:
    """What the policy remembers about one resource between micro-batches (saved in ``state/policy``).

    ``limit_qps`` the cluster-wide limit in force (None: none); ``target_qps`` its frozen target (enforce mode);
    ``broker_shares`` each broker's share of the limit (fractions summing to 1, frozen at the first set);
    ``limited_since`` the window end of the decision that started the current limit; ``last_candidate_end`` the
    last window where the anomaly or the cap was seen; ``last_distress_end`` the last window where a broker
    carrying the resource was busy (surge probing waits for health). Recurrence memory: ``last_lift_end`` when the
    last limit was lifted, ``lifted_target_qps`` its frozen target, ``recurrences`` how many limits in a row were
    set within ``recurrence_windows`` of the previous lift (0: the first).
    """

    resource_type: str
    resource: str
    limit_qps: float | None = None
    version: int = 0
    last_candidate_end: dt.datetime | None = None
    last_decision_end: dt.datetime | None = None
    last_change_end: dt.datetime | None = None
    lift_at_qps: float | None = None
    mode: str = MODE_ENFORCE
    target_qps: float | None = None
    limited_since: dt.datetime | None = None
    broker_shares: Mapping[str, float] = field(default_factory=dict)
    last_distress_end: dt.datetime | None = None
    last_lift_end: dt.datetime | None = None
    lifted_target_qps: float | None = None
    recurrences: int = 0


def recovery_needed(recurrences: int, cfg: LimitsConfig) -> int:
    """Clear windows a limit needs before its lift: ``recovery_windows`` doubled per recurrence, at most
    ``max(recovery_windows, recurrence_windows)`` (see the module's "Recurrence memory")."""
    return min(cfg.recovery_windows * 2 ** min(recurrences, 16), max(cfg.recovery_windows, cfg.recurrence_windows))


@dataclass(frozen=True)
class Candidate:
    """A rule fired for the resource in the window ending ``window_end`` (UTC): limit it to ``target_qps``
    (cluster-wide msg/s). ``broker_tps``: the resource's traffic per broker in that window (msg/s; the shares of a
    new limit)."""

    window_end: dt.datetime
    target_qps: float
    reason: str
    floor_qps: float = 0.0
    lift_at_qps: float | None = None
    observed_tps: float | None = None
    critical: bool = True
    mode: str = MODE_ENFORCE
    broker_tps: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Observation:
    """What the resource did in the finalized window ending ``window_end`` (UTC): ``observed_tps`` its traffic of
    the limited kind (cluster-wide msg/s: a topic's puts, a group's retry traffic), ``rejected`` the sends its
    limiter rejected (``RATE_LIMITED`` failures naming it), ``healthy`` no broker carrying it was busy."""

    window_end: dt.datetime
    observed_tps: float = 0.0
    rejected: int = 0
    healthy: bool = True


@dataclass(frozen=True)
class Decision:
    resource_type: str
    resource: str
    window_end: dt.datetime
    limit_qps: float
    previous_qps: float | None
    action: str
    reason: str
    version: int
    mode: str = MODE_ENFORCE
    broker_limits: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Evidence:
    """The demand evidence of one window of a resource under an enforced limit (``gold/anomalies`` gets a row for
    ``bound`` windows where no rule fired; ``gold/topic_tps.limit_qps`` the limit)."""

    window_end: dt.datetime
    status: str
    limit_qps: float
    observed_tps: float
    rejected: int
    detail: str
    rule_fired: bool = False


def classify(obs: Observation, limit_qps: float, cfg: LimitsConfig) -> tuple[str, str]:
    """(status, detail) of a window under an enforced limit of ``limit_qps`` (cluster-wide msg/s):
    :data:`BOUND` when the observed rate is at least ``cfg.bound_share`` of the limit or the limiter rejected
    sends, :data:`CLEAR` when at most ``cfg.clear_share`` and no rejection, else :data:`HOLD`."""
    numbers = f"{obs.observed_tps:.1f} of {limit_qps:.1f} msg/s"
    if obs.rejected > 0 or obs.observed_tps >= cfg.bound_share * limit_qps:
        rejecting = f", rejecting ({obs.rejected} sends rejected by the limiter)" if obs.rejected > 0 else ""
        return BOUND, f"limit-bound: {numbers}{rejecting}"
    if obs.observed_tps <= cfg.clear_share * limit_qps:
        return CLEAR, f"below the cap: {numbers} (clear at <= {cfg.clear_share:.0%})"
    return HOLD, f"near the cap: {numbers} (between {cfg.clear_share:.0%} and {cfg.bound_share:.0%})"


def shares_of(broker_tps: Mapping[str, float]) -> dict[str, float]:
    """Per-broker traffic (msg/s) → each broker's share (fractions summing to 1); brokers without traffic are left
    out; empty when there is no traffic."""
    live = {b: float(v) for b, v in broker_tps.items() if b and v is not None and v > 0 and math.isfinite(v)}
    total = sum(live.values())
    return {b: v / total for b, v in sorted(live.items())} if total > 0 else {}


def broker_limits(limit_qps: float, shares: Mapping[str, float]) -> dict[str, float]:
    """A cluster-wide limit split by the frozen shares: ``{broker: limit × share}`` plus :data:`ANY_BROKER` at the
    smallest share's figure (a broker that carries the resource only after the limit was set is held no looser
    than the least-loaded carrier). The listed brokers' figures add up to ``limit_qps``; the cluster-wide floor
    (``min_limit_qps``) is the floor of ``limit_qps``, not of each share. Empty without shares (every broker then
    applies the cluster-wide figure)."""
    if not shares:
        return {}
    split = {b: limit_qps * s for b, s in shares.items()}
    split[ANY_BROKER] = min(split.values())
    return split


def fold_resource(
    state: ResourceState,
    candidates: Iterable[Candidate],
    horizon_end: dt.datetime,
    cfg: LimitsConfig,
    window_seconds: int,
    recover_windows: bool = True,
    observations: Iterable[Observation] = (),
) -> tuple[list[Decision], ResourceState, list[Evidence]]:
    """Walk one resource's windows (candidates and observations, any order; sorted here) up to ``horizon_end``
    (the end of the last finalized window, UTC) and return its decisions, new state and the demand evidence of
    its windows under an enforced limit.

    Per window, in order:
      1. a rule fired (a candidate):
         a. no limit yet → ``set``: the target, but a non-critical anomaly cuts at most ``max_cut_pct`` of the
            observed rate; the target and the per-broker shares are frozen; a recurrence (``recurrence_windows``
            after a lift) goes straight to the remembered target;
         b. the limit is below the candidate's floor (a growing legitimate surge, advisory) → ``set`` to the target;
         c. the (frozen) target is lower than the limit by more than ``hysteresis_pct`` and the last change is at
            least ``cooldown_windows`` old (or the anomaly is critical) → ``set``: to a frozen target in one step
            (the anomaly outlived the first cut), else at most ``max_cut_pct``;
         d. else, ``refresh_seconds`` after the last decision → ``set`` with the same limit (new ``expires_at``);
      2. no rule fired but the resource is under an enforced limit: :func:`classify` its observation; ``bound``
         and ``hold`` keep the anomaly alive (refresh as 1d); a ``bound`` group limit still above its frozen target
         (the first cut was bounded by ``max_cut_pct``) goes down to the target once the cool-down is over, so a
         persisting storm sees at most one change after its first limit; a ``bound`` surge limit whose brokers have been
         healthy for ``recovery_windows`` windows is probed upward (``relax`` x``relax_factor``; ``lift`` once at
         ``lift_at_qps``);
      3. :func:`recovery_needed` windows after the anomaly or the cap was last seen (``recovery_windows``, doubled
         per recurrence) → ``lift``, remembered for ``recurrence_windows``.
    The fast path (open windows) folds with ``recover_windows=False``: absence is only known on final windows.
    A window older than the last one seen (a final window behind a preliminary one) may tighten the limit but does
    not move ``last_candidate_end`` back.

    Raises:
        ValueError: a candidate's target is not a finite number > 0 (the candidate step guarantees it).
    """
    decisions: list[Decision] = []
    evidence: list[Evidence] = []
    window = dt.timedelta(seconds=window_seconds)
    recovery = window * cfg.recovery_windows
    memory = window * cfg.recurrence_windows
    refresh = dt.timedelta(seconds=cfg.refresh_seconds)
    cooldown = window * cfg.cooldown_windows
    keep = 1.0 - cfg.max_cut_pct / 100.0

    def emit(window_end: dt.datetime, limit: float, action: str, reason: str, mode: str, change: bool = True,
             shares: Mapping[str, float] | None = None, target: float | None = None, remember: bool = False) -> None:
        """Append a decision and move the state; ``remember``: a lift the recurrence memory keeps (the cause went
        away); any other lift forgets it (a surge probed up to its normal rate was legitimate demand)."""
        nonlocal state
        lifted = action == ACTION_LIFT
        if lifted:
            state = (replace(state, last_lift_end=window_end, lifted_target_qps=state.target_qps or state.limit_qps)
                     if remember else replace(state, **FORGOTTEN))
        new_limit = state.limit_qps is None and not lifted
        shares = dict(state.broker_shares) if shares is None else dict(shares)
        decisions.append(
            Decision(state.resource_type, state.resource, window_end, limit, state.limit_qps, action, reason,
                     state.version + 1, mode, {} if lifted else broker_limits(limit, shares))
        )
        state = replace(
            state,
            limit_qps=None if lifted else limit,
            version=state.version + 1,
            last_decision_end=window_end,
            last_change_end=window_end if change else state.last_change_end,
            mode=mode,
            lift_at_qps=None if lifted else state.lift_at_qps,
            target_qps=None if lifted else (target if target is not None else state.target_qps),
            limited_since=None if lifted else (window_end if new_limit else state.limited_since),
            broker_shares={} if lifted else shares,
        )

    def seen(window_end: dt.datetime) -> None:
        nonlocal state
        last = max(window_end, state.last_candidate_end or window_end)
        state = replace(state, last_candidate_end=last)

    def refresh_due(window_end: dt.datetime) -> bool:
        return state.last_decision_end is not None and window_end - state.last_decision_end >= refresh

    def cooled(window_end: dt.datetime) -> bool:
        return state.last_change_end is None or window_end - state.last_change_end >= cooldown

    def outlived(evidence: str) -> str:
        return (f"the anomaly outlived the first cut{evidence}: down to the target of {state.target_qps:.1f} msg/s "
                f"frozen on {state.limited_since:%Y-%m-%dT%H:%M:%SZ}")

    def recover(until: dt.datetime) -> None:
        if not recover_windows or state.limit_qps is None or state.last_candidate_end is None:
            return
        needed = recovery_needed(state.recurrences, cfg)
        lift_at = max(state.last_candidate_end + window * needed,
                      (state.last_decision_end or state.last_candidate_end) + window)
        if lift_at <= until:
            why = (f"demand at most {cfg.clear_share:.0%} of the {state.limit_qps:.1f} msg/s limit and no anomaly"
                   if state.mode == MODE_ENFORCE else "anomaly absent")
            damped = f", doubled for each of {state.recurrences} recurrences" if state.recurrences else ""
            emit(lift_at, state.limit_qps, ACTION_LIFT,
                 f"{why} since {state.last_candidate_end:%Y-%m-%dT%H:%M:%SZ} ({needed} windows{damped}): the "
                 "limit is doing nothing and is lifted, brokers fall back to their defaults", state.mode, remember=True)

    def recurrence(cand: Candidate) -> tuple[float, str] | None:
        """(remembered target, reason suffix) when a new limit is a recurrence (module docstring), else None;
        moves the memory: the recurrence count grows, or a memory older than ``recurrence_windows`` is forgotten."""
        nonlocal state
        last = state.last_lift_end
        if last is None or cand.window_end < last:  # no lift remembered, or a window from before it
            return None
        if cand.window_end - last > memory:
            state = replace(state, **FORGOTTEN)
            return None
        state = replace(state, recurrences=state.recurrences + 1)
        if state.lifted_target_qps is None or cand.mode != MODE_ENFORCE:
            return None
        lifted = (window * recovery_needed(state.recurrences, cfg)).total_seconds() / 60
        return state.lifted_target_qps, (
            f"; recurrence {state.recurrences} within {cfg.recurrence_windows} windows of the lift at "
            f"{last:%Y-%m-%dT%H:%M:%SZ}: straight to the target of {state.lifted_target_qps:.1f} msg/s frozen "
            f"before, lifted only after {lifted:g} min of clear windows")

    def on_candidate(cand: Candidate) -> None:
        if not (math.isfinite(cand.target_qps) and cand.target_qps > 0):
            raise ValueError(f"limit target for {state.resource} must be finite and > 0, got {cand.target_qps}")
        current = state.limit_qps
        if current is None:
            start, reason, target = cand.target_qps, cand.reason, cand.target_qps
            again = recurrence(cand)
            if again is not None:
                start = target = again[0]
                reason += again[1]
            elif not cand.critical and cand.observed_tps:
                start = max(start, cand.observed_tps * keep)
            emit(cand.window_end, start, ACTION_SET, reason, cand.mode, shares=shares_of(cand.broker_tps),
                 target=target)
            return
        frozen = state.mode == MODE_ENFORCE and cand.mode == MODE_ENFORCE and state.target_qps is not None
        target = state.target_qps if frozen else cand.target_qps
        shares = None if state.broker_shares else shares_of(cand.broker_tps)  # adopt shares a limit lacks
        if current < cand.floor_qps:
            emit(cand.window_end, target, ACTION_SET, cand.reason, cand.mode, shares=shares, target=target)
        elif target < current * (1.0 - cfg.hysteresis_pct / 100.0) and (cand.critical or cooled(cand.window_end)):
            # max_cut_pct bounds a cut on one window's evidence; a frozen target is proven by the limit's first
            # window and by this one (the anomaly outlived the first cut): reached in one step
            tighter = target if cand.critical or frozen else max(target, current * keep)
            reason = f"{cand.reason}; {outlived('')}" if frozen else cand.reason
            emit(cand.window_end, tighter, ACTION_SET, reason, cand.mode, shares=shares, target=target)
        elif refresh_due(cand.window_end):
            emit(cand.window_end, current, ACTION_SET, f"refresh (anomaly persists): {cand.reason}", state.mode,
                 change=False, shares=shares)

    def on_capped(obs: Observation, status: str, detail: str) -> None:
        """No rule fired in a window under an enforced limit whose evidence is ``bound`` or ``hold``."""
        current = state.limit_qps
        healthy_since = max(x for x in (state.last_change_end, state.last_distress_end, state.limited_since)
                            if x is not None)
        surge = status == BOUND and state.resource_type == "topic"
        probed_above = state.target_qps is not None and current > state.target_qps * (1.0 + cfg.hysteresis_pct / 100)
        if status == BOUND and not surge and probed_above and cooled(obs.window_end):  # demand runs into the first cut
            emit(obs.window_end, state.target_qps, ACTION_SET, outlived(f" ({detail})"), state.mode)
        elif surge and not obs.healthy and probed_above:  # a probe made a carrier busy again: one step back
            lower = max(state.target_qps, current / cfg.relax_factor)
            emit(obs.window_end, lower, ACTION_SET, f"probe undone: {detail} and a broker carrying it is busy; "
                 f"back to {lower:.1f} msg/s", state.mode)
        elif surge and obs.healthy and obs.window_end - healthy_since >= recovery:
            raised = current * cfg.relax_factor
            text = (f"probe: {detail} while every broker carrying it stays healthy since "
                    f"{healthy_since:%Y-%m-%dT%H:%M:%SZ}")
            if state.lift_at_qps is not None and raised >= state.lift_at_qps:
                emit(obs.window_end, current, ACTION_LIFT,
                     f"{text}; x{cfg.relax_factor} would reach the normal rate of {state.lift_at_qps:.1f} msg/s: "
                     "lifted, brokers fall back to their defaults", state.mode)
            else:
                emit(obs.window_end, raised, ACTION_RELAX, f"{text}; raised x{cfg.relax_factor}", state.mode)
        elif refresh_due(obs.window_end):
            emit(obs.window_end, current, ACTION_SET, f"refresh (anomaly persists, {detail})", state.mode,
                 change=False)

    cands: dict[dt.datetime, Candidate] = {}
    for c in candidates:  # one per window (the candidate step guarantees it; the lowest target wins otherwise)
        if c.window_end not in cands or c.target_qps < cands[c.window_end].target_qps:
            cands[c.window_end] = c
    obs_by_end = {o.window_end: o for o in observations}
    for end in sorted(set(cands) | set(obs_by_end)):
        recover(end - window)
        cand, obs = cands.get(end), obs_by_end.get(end)
        enforced = state.limit_qps is not None and state.mode == MODE_ENFORCE
        if obs is not None and not obs.healthy:
            state = replace(state, last_distress_end=max(end, state.last_distress_end or end))
        status = None
        if enforced and obs is not None:
            status, detail = classify(obs, state.limit_qps, cfg)
            evidence.append(Evidence(end, status, state.limit_qps, obs.observed_tps, obs.rejected, detail,
                                     rule_fired=cand is not None))
        if cand is not None:
            on_candidate(cand)
            lift_at = max(x for x in (state.lift_at_qps, cand.lift_at_qps, 0.0) if x is not None)
            state = replace(state, lift_at_qps=lift_at or None)
            seen(end)
        elif status in (BOUND, HOLD):
            on_capped(obs, status, detail)
            if state.limit_qps is not None:
                seen(end)
    recover(horizon_end)
    return decisions, state, evidence
