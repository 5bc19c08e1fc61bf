"""The per-resource policy fold: plain Python over frozen dataclasses, one resource at a time.

:func:`fold_resource` walks one resource's finalized (or, on the fast path, open) windows in event-time order with
its saved :class:`ResourceState` and emits ``set`` / ``relax`` / ``lift`` :class:`Decision` s. It is run per resource
on the driver by :func:`pipelines.decide.folding.fold_all`; its input rows come from
:func:`pipelines.decide.candidates.candidate_limits` (a rule fired: :class:`Candidate`) and
:func:`pipelines.decide.evidence.observations` (the demand evidence of a window: :class:`Observation`).

**Closed loop.** A capped resource shows the cap, not its demand: each window under an enforced limit is judged by
its rule's :class:`~pipelines.decide.limit_policy.LimitPolicy` (``bound``, ``hold``, ``capped``, ``clear``; that
module says when). The limit is lifted :func:`recovery_needed` windows after the last window that kept it (the
cause seen, or its demand hidden at the cap), unless a later window already shows it not clear
(:meth:`Fold.vetoed`: a lift decided on final windows 2-3 minutes behind the brokers would land in it). A limit at
its cap with its demand hidden is probed by its policy; the fast path's open windows let a probe start, be undone
or prove the lift before its windows are final (:meth:`Fold.act_on_open`).

**An enforced limit stays enforced while its cause persists.** An advisory candidate (a surge on healthy brokers)
never replaces or loosens an enforced limit of the same resource: under the limit, "healthy" describes the brokers
as limited. **Frozen basis.** The target of an enforced limit, the rule's baseline and the per-broker shares are
frozen when the limit is first set, and reset when it is lifted.

**Recurrence memory** (flap damping, as BGP route-flap damping). The lift of an *enforced* limit remembers when it
happened and the frozen target. An enforced anomaly of the same resource within ``recurrence_windows`` windows of
that lift goes straight to the remembered target, and each recurrence doubles the clear windows the next lift needs
(``recovery_windows`` × 2^recurrences, at most ``max(recovery_windows, recurrence_windows)``). The rules and their
numbers: docs/decisions.md §4.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from pipelines.config import DetectionConfig, LimitsConfig
from pipelines.decide.fold_types import (  # noqa: F401 (the fold's vocabulary, importable from here)
    FORGOTTEN, UNLIMITED, Candidate, Decision, Evidence, Observation, ResourceState, limit_in_force, recovery_needed,
)
from pipelines.decide.facts import TOLERANCE, shares_of, split
from pipelines.decide.lifting import Lifting
from pipelines.decide.limit_policy import (  # noqa: F401 (as above)
    LimitPolicy, policy_for,
)
from pipelines.decide.words import Action, Mode, Status

_EPOCH = dt.datetime(1970, 1, 1)

class Fold(Lifting):
    """One resource's walk (:func:`fold_resource`): its state, the decisions and evidence so far, and the steps the
    limit policies share (:mod:`pipelines.decide.limit_policy`); its lift is :class:`~pipelines.decide.lifting.Lifting`'s."""

    def __init__(self, state: ResourceState, cfg: LimitsConfig, detection: DetectionConfig,
                 window_seconds: int, now: dt.datetime | None = None,
                 horizon_end: dt.datetime | None = None) -> None:
        self.state, self.cfg, self.detection = state, cfg, detection
        self.window = dt.timedelta(seconds=window_seconds)
        #: when the decisions are made (processing time, naive UTC; None: at the end of the window decided) and the
        #: end of the micro-batch's last window
        self.now, self.horizon_end = now, horizon_end
        self.decisions: list[Decision] = []
        self.evidence: list[Evidence] = []
        #: this micro-batch's observations and the fast path's open windows after it (the lift veto)
        self.observations: list[Observation] = []
        self.opened: list[Observation] = []
        self.policy: LimitPolicy | None = None
        if state.resource_type in ("group", "topic"):
            self.policy = policy_for(state.resource_type)

    # --- what the policies ask -----------------------------------------------------------------------------------
    def cooled(self, window_end: dt.datetime) -> bool:
        last = self.state.last_change_end
        return last is None or window_end - last >= self.window * self.cfg.cooldown_windows

    def above_target(self) -> bool:
        """The limit is above its frozen target by more than ``hysteresis_pct`` (a first cut, or a probe)."""
        s = self.state
        return s.target_qps is not None and s.limit_qps > s.target_qps * (1.0 + self.cfg.hysteresis_pct / 100.0)

    def healthy_since(self) -> dt.datetime:
        s = self.state
        return max(x for x in (s.last_change_end, s.last_distress_end, s.limited_since) if x is not None)

    def healthy_for(self, window_end: dt.datetime) -> bool:
        """Every carrier healthy, and the limit unchanged, for ``recovery_windows`` windows up to ``window_end``."""
        return window_end - self.healthy_since() >= self.window * self.cfg.recovery_windows

    def outlived(self, evidence: str) -> str:
        s = self.state
        return (f"the anomaly outlived the first cut{evidence}: down to the target of {s.target_qps:.1f} msg/s "
                f"frozen on {s.limited_since:%Y-%m-%dT%H:%M:%SZ}")

    def effective_end(self, decided_end: dt.datetime) -> dt.datetime:
        """The end of the first window wholly under a decision made now (:attr:`now`; without it, at the end of the
        window ``decided_end``): the first window starting at or after it. Brokers apply a decision a propagation
        delay later; a window partly under it is judged against the level before (:func:`limit_in_force`)."""
        at = self.now if self.now is not None else decided_end
        seconds, length = (at - _EPOCH).total_seconds(), self.window.total_seconds()
        start = _EPOCH + dt.timedelta(seconds=math.ceil(seconds / length - TOLERANCE) * length)
        return start + self.window

    def raise_to(self, window_end: dt.datetime, raised: float, reason: str) -> None:
        """A probe: the limit raised to ``raised`` (msg/s, cluster-wide; ``relax``), remembering the level before it
        and the first window wholly under the raise."""
        before = self.state.limit_qps
        self.emit(window_end, raised, Action.RELAX, reason, self.state.mode)
        self.state = replace(self.state, probe_from_qps=before, probe_effective_end=self.effective_end(window_end))

    def note_capped(self, window_end: dt.datetime) -> None:
        """A window at the cap with its demand hidden: never a clear one (the lift waits for a window after it)."""
        last = self.state.last_capped_end
        self.state = replace(self.state, last_capped_end=window_end if last is None else max(last, window_end))

    def refresh(self, window_end: dt.datetime, reason: str) -> None:
        """Re-issue the limit in force (a new ``expires_at``) ``refresh_seconds`` after the last decision."""
        s = self.state
        if s.last_decision_end is not None and window_end - s.last_decision_end >= dt.timedelta(
                seconds=self.cfg.refresh_seconds):
            self.emit(window_end, s.limit_qps, Action.SET, reason, s.mode, change=False)

    def emit(self, window_end: dt.datetime, limit: float, action: Action, reason: str, mode: Mode, change: bool = True,
             shares: Mapping[str, float] | None = None, target: float | None = None, remember: bool = False,
             fresh: bool = False, baseline: float | None = None) -> None:
        """Append a decision and move the state. ``remember``: a lift the recurrence memory keeps (the cause of an
        enforced limit went away); a probe's lift forgets it (legitimate demand), an advisory lift leaves it as it
        was. ``fresh``: the decision starts a new limit (frozen target, shares and baseline from this window)."""
        s = self.state
        lifted = action == Action.LIFT
        if lifted and s.mode == Mode.ENFORCE:
            s = (replace(s, last_lift_end=window_end, lifted_target_qps=s.target_qps or s.limit_qps) if remember
                 else replace(s, **FORGOTTEN))
        fresh = fresh or (s.limit_qps is None and not lifted)
        shares = dict(s.broker_shares) if shares is None else dict(shares)
        self.decisions.append(Decision(s.resource_type, s.resource, window_end, limit, s.limit_qps, action, reason,
                                       s.version + 1, mode, {} if lifted else split(limit, shares)))
        moved = {"version": s.version + 1, "last_decision_end": window_end, "mode": mode}
        if change:
            moved["last_change_end"] = window_end
        if lifted:
            moved.update(UNLIMITED)
        else:
            moved.update(limit_qps=limit, broker_shares=shares,
                         target_qps=target if target is not None else s.target_qps)
            if fresh:
                moved.update(limited_since=window_end, baseline_tps=baseline, cause_changes=0, probe_from_qps=None,
                             probe_ceiling_qps=None, probe_hold_until=None, probe_backoff=0, last_capped_end=None,
                             probe_effective_end=None)
            elif change:
                # a new value supersedes a probe in flight (a raise sets its own after this, :meth:`raise_to`)
                moved.update(cause_changes=s.cause_changes + 1, probe_from_qps=None, probe_effective_end=None)
        self.state = replace(s, **moved)

    # --- the walk --------------------------------------------------------------------------------------------------
    def seen(self, window_end: dt.datetime) -> None:
        last = max(window_end, self.state.last_candidate_end or window_end)
        self.state = replace(self.state, last_candidate_end=last)

    def note_carriers(self, obs: Observation) -> None:
        """A window's carriers: the last distress, and the writes of each busy carrier (a surge probe's bound)."""
        s = self.state
        if not obs.healthy:
            s = replace(s, last_distress_end=max(obs.window_end, s.last_distress_end or obs.window_end))
        busy = {b: obs.carrier_load[b] for b in obs.busy_brokers if b in obs.carrier_load}
        if busy:
            s = replace(s, busy_load={**s.busy_load, **busy})
        self.state = s

    def recurrence(self, cand: Candidate) -> tuple[float, str] | None:
        """(remembered target, reason suffix) when a new enforced limit is a recurrence (module docstring), else
        None; moves the memory: the recurrence count grows, or a memory older than ``recurrence_windows`` is
        forgotten. An advisory candidate neither uses nor counts the memory."""
        s = self.state
        last = s.last_lift_end
        if cand.mode != Mode.ENFORCE or last is None or cand.window_end < last:
            return None
        if cand.window_end - last > self.window * self.cfg.recurrence_windows:
            self.state = replace(s, **FORGOTTEN)
            return None
        self.state = s = replace(s, recurrences=s.recurrences + 1)
        if s.lifted_target_qps is None:
            return None
        lifted = (self.window * recovery_needed(s.recurrences, self.cfg)).total_seconds() / 60
        return s.lifted_target_qps, (
            f"; recurrence {s.recurrences} within {self.cfg.recurrence_windows} windows of the lift at "
            f"{last:%Y-%m-%dT%H:%M:%SZ}: straight to the target of {s.lifted_target_qps:.1f} msg/s frozen "
            f"before, lifted only after {lifted:g} min of clear windows")

    def start(self, cand: Candidate) -> None:
        """A new limit (none in force, or an enforced one replacing an advisory record): the target, but a
        non-critical anomaly cuts at most ``max_cut_pct`` of the observed rate; a recurrence goes straight to the
        remembered target. Target, shares and baseline are frozen here."""
        start, reason, target = cand.target_qps, cand.reason, cand.target_qps
        again = self.recurrence(cand)
        if again is not None:
            start = target = again[0]
            reason += again[1]
        elif not cand.critical and cand.observed_tps:
            start = max(start, cand.observed_tps * (1.0 - self.cfg.max_cut_pct / 100.0))
        self.emit(cand.window_end, start, Action.SET, reason, cand.mode, shares=shares_of(cand.broker_tps),
                  target=target, fresh=True, baseline=cand.baseline_tps)

    def on_candidate(self, cand: Candidate) -> bool:
        """A rule fired in the candidate's window (:func:`fold_resource`, step 1); False when the window is stale:
        no limit in force and the window at or before the last lift, which was decided on it or on later windows (a
        broker's lines that landed late, or an open window that proved the lift, finalized after it)."""
        if not (math.isfinite(cand.target_qps) and cand.target_qps > 0):
            raise ValueError(f"limit target for {self.state.resource} must be finite and > 0, got {cand.target_qps}")
        s, cfg = self.state, self.cfg
        current = s.limit_qps
        if current is None and s.last_lift_end is not None and cand.window_end <= s.last_lift_end:
            return False
        if current is None or (s.mode != Mode.ENFORCE and cand.mode == Mode.ENFORCE):
            self.start(cand)
            return True
        if s.mode == Mode.ENFORCE and cand.mode != Mode.ENFORCE:  # never replaced by an advisory record
            self.refresh(cand.window_end, f"refresh (anomaly persists: {cand.reason}; the enforced limit stays, "
                                          "the brokers are healthy because of it)")
            return True
        frozen = s.mode == Mode.ENFORCE and s.target_qps is not None
        target = s.target_qps if frozen else cand.target_qps
        shares = None if s.broker_shares else shares_of(cand.broker_tps)  # adopt shares a limit lacks
        if current < cand.floor_qps:
            self.emit(cand.window_end, target, Action.SET, cand.reason, cand.mode, shares=shares, target=target)
        elif target < current * (1.0 - cfg.hysteresis_pct / 100.0) and (cand.critical or self.cooled(cand.window_end)):
            # max_cut_pct bounds a cut on one window's evidence; a frozen target is proven by the limit's first
            # window and by this one (the anomaly outlived the first cut): reached in one step
            tighter = target if cand.critical or frozen else max(target, current * (1.0 - cfg.max_cut_pct / 100.0))
            reason = f"{cand.reason}; {self.outlived('')}" if frozen else cand.reason
            self.emit(cand.window_end, tighter, Action.SET, reason, cand.mode, shares=shares, target=target)
        else:
            self.refresh(cand.window_end, f"refresh (anomaly persists): {cand.reason}")
        return True


def fold_resource(
    state: ResourceState,
    candidates: Iterable[Candidate],
    horizon_end: dt.datetime,
    cfg: LimitsConfig,
    window_seconds: int,
    recover_windows: bool = True,
    observations: Iterable[Observation] = (),
    detection: DetectionConfig | None = None,
    open_evidence: Iterable[Observation] = (),
    now: dt.datetime | None = None,
) -> tuple[list[Decision], ResourceState, list[Evidence]]:
    """Walk one resource's windows (candidates and observations, any order; sorted here) up to ``horizon_end``
    (the end of the last finalized window, UTC) and return its decisions, new state and the demand evidence of
    its windows under an enforced limit.

    Per window, in order: (1) a rule fired (a candidate): a new limit (:meth:`Fold.start`) or, under one, a
    refresh, a raise to an advisory floor, or a cut towards the (frozen) target (:meth:`Fold.on_candidate`); (2) no
    rule fired under an enforced limit: the policy judges the window (``bound``/``hold``: the cause persists,
    :meth:`~pipelines.decide.limit_policy.LimitPolicy.at_cap`; ``capped``: the demand hidden, never clear,
    :meth:`~pipelines.decide.limit_policy.LimitPolicy.capped`); (3) :func:`recovery_needed` windows after the last
    window that kept the limit → ``lift``, unless a later window is not clear (a ``veto`` evidence row). After the
    walk, the open windows may start, undo or prove a probe (:meth:`Fold.act_on_open`). ``now``: when the decisions
    are made (UTC; a raise is in force from the first window starting after it, :meth:`Fold.effective_end`; None:
    at the end of the window decided). The fast path folds with ``recover_windows=False`` (absence is only known
    on final windows). A window older than the last one seen may tighten the limit but does not move
    ``last_candidate_end`` back. ``detection``: the rules' thresholds (default: the shipped ones).

    Raises:
        ValueError: a candidate's target is not a finite number > 0 (the candidate step guarantees it).
    """
    fold = Fold(state, cfg, detection or DetectionConfig(), window_seconds, now=now, horizon_end=horizon_end)
    fold.opened = list(open_evidence)
    cands: dict[dt.datetime, Candidate] = {}
    for c in candidates:  # one per window (the candidate step guarantees it; the lowest target wins otherwise)
        if c.window_end not in cands or c.target_qps < cands[c.window_end].target_qps:
            cands[c.window_end] = c
    obs_by_end = {o.window_end: o for o in observations}
    fold.observations = sorted(obs_by_end.values(), key=lambda o: o.window_end)
    for end in sorted(set(cands) | set(obs_by_end)):
        if recover_windows:
            fold.recover(end - fold.window)
        cand, obs = cands.get(end), obs_by_end.get(end)
        if obs is not None:
            fold.note_carriers(obs)
        s = fold.state
        status = detail = None
        if s.limit_qps is not None and s.mode == Mode.ENFORCE and obs is not None and fold.policy is not None:
            status, detail = fold.policy.judge(obs, s, fold)
            fold.evidence.append(Evidence(end, status, s.limit_qps, obs.observed_tps, obs.rejected, detail,
                                          rule_fired=cand is not None))
        if cand is not None and fold.on_candidate(cand):
            lift_at = max(x for x in (fold.state.lift_at_qps, cand.lift_at_qps, 0.0) if x is not None)
            fold.state = replace(fold.state, lift_at_qps=lift_at or None)
            fold.seen(end)
        elif status in (Status.BOUND, Status.HOLD):
            fold.policy.at_cap(fold, obs, status, detail)
            if fold.state.limit_qps is not None:
                fold.seen(end)
        elif status == Status.CAPPED:
            fold.note_capped(end)
            fold.policy.capped(fold, obs, detail)
    if recover_windows:
        fold.recover(horizon_end)
        fold.act_on_open()
    return fold.decisions, fold.state, fold.evidence
