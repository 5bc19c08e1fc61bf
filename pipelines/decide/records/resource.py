"""The limit policies' vocabulary: what the fold (:mod:`pipelines.decide.paths.walk`) reads and writes per resource.
Frozen dataclasses; no Spark. Rates are cluster-wide msg/s unless named per broker; times naive UTC window ends.

* :class:`ResourceState`: what the policy remembers about a resource between micro-batches (``state/policy``);
  :func:`limit_in_force`: the limit the brokers applied in a window;
* :class:`Candidate`: a rule fired in a window; :class:`Observation`: a window's demand evidence;
* :class:`Decision`: a ``set`` / ``relax`` / ``lift``; :class:`Evidence`: how a window under a limit was judged.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from pipelines.decide.words import Action, Mode, Status

#: The recurrence memory of a resource with none (:class:`ResourceState`).
FORGOTTEN = {"last_lift_end": None, "lifted_target_qps": None, "recurrences": 0}
#: What a lift resets: the frozen basis and the surge probe's bounds of the limit.
UNLIMITED = {"limit_qps": None, "lift_at_qps": None, "target_qps": None, "limited_since": None, "broker_shares": {},
             "baseline_tps": None, "busy_load": {}, "probe_from_qps": None, "probe_ceiling_qps": None,
             "probe_hold_until": None, "probe_backoff": 0, "cause_changes": 0, "last_capped_end": None,
             "probe_effective_end": None, "change_effective_end": None, "probe_decided_at": None,
             "previous_limit_qps": None, "at_cap_since": None}


@dataclass(frozen=True)
class ResourceState:
    """What the policy remembers about one resource between micro-batches (saved in ``state/policy``).

    ``limit_qps`` the cluster-wide limit in force (None: none); ``target_qps`` its frozen target (enforce mode);
    ``broker_shares`` each broker's share of the limit (fractions summing to 1, frozen at the first set);
    ``baseline_tps`` the rule's baseline frozen at the first set (a surge's baseline put rate, a storm's consume
    rate; msg/s); ``limited_since`` the window end of the decision that started the current limit;
    ``last_candidate_end`` the last window where the anomaly or the cap was seen; ``last_distress_end`` the last
    window where a broker carrying the resource was busy. Surge probing: ``busy_load`` each carrier's writes (msg/s)
    in the last window it was busy; ``probe_from_qps`` the level before the last probe (a raise);
    ``probe_effective_end`` the end of the first window wholly under that raise (the windows before it ran at
    ``probe_from_qps``: :func:`limit_in_force`); ``probe_ceiling_qps`` a level whose probe made a carrier busy (or
    whose raise the demand followed), not reached again before ``probe_hold_until``; ``probe_backoff`` how many
    times; ``cause_changes`` the value changes since the limit was set; ``last_capped_end`` the last window at the
    cap whose demand was hidden (``capped``: never a clear window); ``change_effective_end`` the end of the first
    window wholly under the last value change (decided at processing time, :func:`pipelines.decide.limits.steps.
    effective_end`; the windows before it ran at an older value); ``probe_decided_at`` when the probe in flight was
    decided (stream time, :func:`pipelines.decide.limits.steps.decided_at`: its undo is due ``probe_max_windows``
    windows after it); ``probe_excess_messages`` what the last undone probe admitted beyond the level before it
    (messages, cluster-wide). ``window_decisions``: the decisions taken as decisions of ``last_decision_end`` beyond the
    first (each gets the next version rank, :data:`pipelines.decide.records.limit_rows.EXTRA_RANKS`). Recurrence memory:
    ``last_lift_end`` when the last enforced limit was lifted, ``lifted_target_qps`` its frozen target,
    ``recurrences`` how many limits in a row were set within ``recurrence_windows`` of the previous lift (0: the
    first). ``previous_limit_qps``: the value in force before the last change of value (None: none), in force in
    the windows before ``change_effective_end`` (a change decided before the one before it was wholly in force keeps
    the lower of the two values before it: those windows may have run at either). ``at_cap_since``: the end of the
    first window at the cap (``bound`` or ``capped``) since the limit was set or since ``recovery_windows`` windows
    in a row were clear (:meth:`pipelines.decide.limits.base.LimitPolicy.at_cap_since`; None: not at the cap): a limit
    held at its cap long (``RateGovernorLimitAtCap``) may be holding legitimate demand the rule cannot tell from its
    cause.
    """

    resource_type: str
    resource: str
    limit_qps: float | None = None
    version: int = 0
    last_candidate_end: dt.datetime | None = None
    last_decision_end: dt.datetime | None = None
    last_change_end: dt.datetime | None = None
    lift_at_qps: float | None = None
    mode: Mode = Mode.ENFORCE
    target_qps: float | None = None
    limited_since: dt.datetime | None = None
    broker_shares: Mapping[str, float] = field(default_factory=dict)
    last_distress_end: dt.datetime | None = None
    last_lift_end: dt.datetime | None = None
    lifted_target_qps: float | None = None
    recurrences: int = 0
    baseline_tps: float | None = None
    busy_load: Mapping[str, float] = field(default_factory=dict)
    probe_from_qps: float | None = None
    probe_ceiling_qps: float | None = None
    probe_hold_until: dt.datetime | None = None
    probe_backoff: int = 0
    cause_changes: int = 0
    last_capped_end: dt.datetime | None = None
    probe_effective_end: dt.datetime | None = None
    change_effective_end: dt.datetime | None = None
    probe_decided_at: dt.datetime | None = None
    window_decisions: int = 0
    probe_excess_messages: float | None = None
    previous_limit_qps: float | None = None
    at_cap_since: dt.datetime | None = None


def limit_in_force(state: ResourceState, window_end: dt.datetime) -> float | None:
    """The cluster-wide limit (msg/s) the brokers applied in the window ending ``window_end`` (UTC): the current
    one, but a raise (a probe) only from its first whole window (``probe_effective_end``), the windows before it
    having run at the level before it (``probe_from_qps``; judged against the raised value they would look clear);
    and any other change only from its first whole window (``change_effective_end``): the windows before it ran at
    the value before (``previous_limit_qps``) or partly at each, and are judged against the lower of the two
    (:func:`in_transition`): never clear on a value higher than all of the window ran under."""
    if (state.probe_from_qps is not None and state.probe_effective_end is not None
            and window_end < state.probe_effective_end):
        if in_transition(state, window_end):  # a raise decided before the value it raises was wholly in force
            return min(state.probe_from_qps, state.previous_limit_qps)
        return state.probe_from_qps
    if in_transition(state, window_end):
        return min(state.previous_limit_qps, state.limit_qps)
    return state.limit_qps


def in_transition(state: ResourceState, window_end: dt.datetime) -> bool:
    """Whether the window ending ``window_end`` ran before the last change of value was wholly in force (before
    ``change_effective_end``): part of it, or all, at ``previous_limit_qps``. Such a window is judged against the
    lower of the two values (:func:`limit_in_force`): at the cap of the lower one it shows nothing clear (an undone
    probe's raise that the returning demand took), and it does not start a probe of the current value."""
    return (state.previous_limit_qps is not None and state.limit_qps is not None
            and state.change_effective_end is not None and window_end < state.change_effective_end)


@dataclass(frozen=True)
class Candidate:
    """A rule fired for the resource in the window ending ``window_end`` (UTC): limit it to ``target_qps``
    (cluster-wide msg/s). ``baseline_tps``: the rule's baseline in that window (msg/s: a surge's baseline put rate,
    a storm's consume rate); ``broker_tps``: the resource's traffic per broker in that window (msg/s; the shares of
    a new limit); ``busy_load``: the writes of each carrier busy in that window (msg/s, its ``BROKER_BUSY`` row's
    baseline, :func:`pipelines.decide.rules.anomalies.broker_writes`; a surge's first limit's burst bound,
    :meth:`pipelines.decide.limits.surge.SurgeLimit.first_bound`); ``busy_normal``: of a storm's busy carriers, what
    each wrote before (msg/s, :func:`pipelines.decide.rules.crowding.busy_normals`; its first limit's room,
    :meth:`pipelines.decide.limits.retry_storm.RetryStormLimit.first_bound`)."""

    window_end: dt.datetime
    target_qps: float
    reason: str
    floor_qps: float = 0.0
    lift_at_qps: float | None = None
    observed_tps: float | None = None
    critical: bool = True
    mode: Mode = Mode.ENFORCE
    broker_tps: Mapping[str, float] = field(default_factory=dict)
    baseline_tps: float | None = None
    busy_load: Mapping[str, float] = field(default_factory=dict)
    busy_normal: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Observation:
    """What the resource did in the window ending ``window_end`` (UTC): ``observed_tps`` its traffic of the limited
    kind (cluster-wide msg/s: a topic's puts, a group's retry traffic), ``rejected`` the sends its limiter rejected,
    ``healthy`` no broker carrying it was busy (``busy_brokers`` those that were), ``consume_tps`` a group's consume
    rate on its non-retry topics (msg/s; None for a topic), ``carrier_load`` each carrier's writes (msg/s per
    broker), ``viewed`` the limiter's own view reported rejections (no count), ``sendback_tps`` a group's admitted
    send-backs alone (msg/s; ``observed_tps`` beyond it is its client's fallback plain sends; None for a topic),
    ``broker_tps`` the resource's traffic per broker (msg/s, brokers with traffic). On the fast path
    (``open_evidence``) the sums are partial, they only grow, ``complete`` says whether every expected broker has
    reported (the consume rate is then final) and ``reported`` names the brokers whose minute line of the window has
    landed (a broker's line carries all its keys at once, so each of their figures is final; None: every broker,
    a final window)."""

    window_end: dt.datetime
    observed_tps: float = 0.0
    rejected: int = 0
    healthy: bool = True
    consume_tps: float | None = None
    carrier_load: Mapping[str, float] = field(default_factory=dict)
    busy_brokers: tuple[str, ...] = ()
    viewed: bool = False
    complete: bool = True
    sendback_tps: float | None = None
    broker_tps: Mapping[str, float] = field(default_factory=dict)
    reported: frozenset[str] | None = None


@dataclass(frozen=True)
class Decision:
    """One decision on a resource's cluster-wide limit, as a decision of the window ending ``window_end`` (UTC):
    ``limit_qps`` (msg/s; for a ``lift`` the limit lifted), ``previous_qps`` the limit before it (None: none),
    ``action``, ``reason``, ``version`` (the state's next), ``mode``, ``broker_limits`` each broker's figure (msg/s,
    :func:`pipelines.decide.rules.facts.split`; empty for a lift), ``nth`` how many decisions of the same window came
    before it (its version's rank, :func:`pipelines.decide.records.limit_rows.finish`).
    :func:`pipelines.decide.records.limit_rows.finish` makes the ``gold/limits`` row."""

    resource_type: str
    resource: str
    window_end: dt.datetime
    limit_qps: float
    previous_qps: float | None
    action: Action
    reason: str
    version: int
    mode: Mode = Mode.ENFORCE
    broker_limits: Mapping[str, float] = field(default_factory=dict)
    nth: int = 0


@dataclass(frozen=True)
class Evidence:
    """The demand evidence of one window of a resource under an enforced limit (``gold/anomalies`` gets a row for
    ``bound`` and ``hold`` windows where no rule fired; ``gold/topic_tps.limit_qps`` the limit); ``veto`` rows name
    an open window that kept a lift from being decided (logged, never written as a window)."""

    window_end: dt.datetime
    status: Status
    limit_qps: float
    observed_tps: float
    rejected: int
    detail: str
    rule_fired: bool = False


class PendingPreliminary(NamedTuple):
    """The fast path's newest preliminary ``set`` of a resource that the final path has not folded yet
    (:func:`pipelines.decide.paths.reconcile.pending_preliminary`): the end of its window (naive UTC), its limit
    (msg/s cluster-wide) and its mode. The final path keeps that value when its own first limit is within
    ``hysteresis_pct`` of it (:meth:`pipelines.decide.limits.base.LimitPolicy.start`)."""

    window_end: dt.datetime
    limit_qps: float
    mode: str


@dataclass(frozen=True)
class Batch:
    """What the micro-batch tells each resource's walk: ``horizon_end`` the end of its last window (finalized, or
    open on the fast path), ``now`` when its decisions are made (processing time; None: at the end of the window
    decided), ``observations`` the resource's windows of the batch (by window end) and ``opened`` the fast path's
    open windows after it (the veto's evidence; complete ones may start, undo or prove a probe)."""

    horizon_end: dt.datetime | None
    now: dt.datetime | None = None
    observations: tuple[Observation, ...] = ()
    opened: tuple[Observation, ...] = ()
    #: the fast path's newest preliminary ``set`` of the resource the final path has not folded yet; None without
    preliminary: PendingPreliminary | None = None

    def stream_end(self, window_end: dt.datetime) -> dt.datetime:
        """The end of the newest window the micro-batch has seen of the resource, final or open, or ``window_end``
        when later: the stream's time its decisions are taken at, at most (:func:`pipelines.decide.limits.steps.
        decided_at`)."""
        ends = [window_end] + [o.window_end for o in self.opened] + (
            [self.horizon_end] if self.horizon_end is not None else [])
        return max(ends)


class Judged(NamedTuple):
    """A window under the enforced limit judged: its :class:`~pipelines.decide.words.Status` and why."""

    status: Status
    detail: str
