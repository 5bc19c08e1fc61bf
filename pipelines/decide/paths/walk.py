"""The per-resource fold: one resource's windows walked in event-time order by its rule's limit policy.

:func:`fold_resource` is the walk, a loop: for each window (a candidate, :class:`~pipelines.decide.records.resource.
Candidate`, from :func:`pipelines.decide.rules.candidates.candidate_limits`; an observation, :class:`~pipelines.decide.
fold_types.Observation`, from :func:`pipelines.decide.rules.evidence.observations`) the lift that came due before it
(:meth:`~pipelines.decide.limits.base.LimitPolicy.lift_due`), then the window itself
(:meth:`~pipelines.decide.limits.base.LimitPolicy.on_window`); after the last, the lift due at the horizon and what the
fast path's open windows let the final path decide (:meth:`~pipelines.decide.limits.base.LimitPolicy.act_on_open`).
Everything a limit does is its policy's (:mod:`pipelines.decide.limits.base`, one class per rule,
:func:`pipelines.decide.catalogue.policy_for`); the shared arithmetic is :mod:`pipelines.decide.limits.steps`. It is run
for every resource of a micro-batch by :func:`pipelines.decide.paths.fold_all.fold_all`. The rules and their numbers:
docs/decisions.md §4.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from pipelines.decide.catalogue import policy_for
from pipelines.decide.records.resource import (
    Batch, Candidate, Decision, Evidence, Observation, PendingPreliminary, ResourceState,
)
from pipelines.decide.limits.base import Limit
from pipelines.decide.limits.steps import Params, Step


def fold_resource(
    state: ResourceState,
    candidates: Iterable[Candidate],
    horizon_end: dt.datetime,
    params: Params,
    recover_windows: bool = True,
    observations: Iterable[Observation] = (),
    open_evidence: Iterable[Observation] = (),
    now: dt.datetime | None = None,
    preliminary: PendingPreliminary | None = None,
) -> tuple[list[Decision], ResourceState, list[Evidence]]:
    """Walk one resource's windows (candidates and observations, any order; sorted here) up to ``horizon_end``
    (the end of the last finalized window, naive UTC) with its saved ``state`` → its decisions, its new state and
    the evidence rows of its windows under an enforced limit (``veto`` rows among them).

    ``params``: the policy's settings (:meth:`pipelines.decide.limits.steps.Params.of`); ``recover_windows``: lift when
    due (the final path; the fast path folds without: absence is only known on final windows);
    ``open_evidence``: the fast path's open windows after the horizon (the veto, a probe's evidence); ``now``: when
    the decisions are made (naive UTC; a raise is in force from the first window starting after it; None: at the end
    of the window decided); ``preliminary``: the fast path's newest ``set`` the final path has not folded yet
    (:class:`~pipelines.decide.records.resource.PendingPreliminary`). One candidate per window (the lowest target
    wins); a window older than the last one seen may tighten the limit but does not move ``last_candidate_end``
    back.

    Raises:
        ValueError: a candidate's target is not a finite number > 0 (the candidate step guarantees it); the
            resource's type is limited by no rule.
    """
    policy: Limit = policy_for(state.resource_type, params)
    cands: dict[dt.datetime, Candidate] = {}
    for c in candidates:
        if c.window_end not in cands or c.target_qps < cands[c.window_end].target_qps:
            cands[c.window_end] = c
    seen = {o.window_end: o for o in observations}
    batch = Batch(horizon_end, now, tuple(sorted(seen.values(), key=lambda o: o.window_end)), tuple(open_evidence),
                  preliminary)
    step = Step(state)
    for end in sorted(set(cands) | set(seen)):
        if recover_windows:
            step = policy.timed(step, policy.lift_due(step.state, end - params.window, batch), batch)
        step = policy.timed(step, policy.on_window(step.state, end, cands.get(end), seen.get(end), batch), batch)
    if recover_windows:
        step = policy.timed(step, policy.lift_due(step.state, horizon_end, batch), batch)
        step = policy.timed(step, policy.act_on_open(step.state, batch, decided=bool(step.decisions)), batch)
    return list(step.decisions), step.state, list(step.evidence)

