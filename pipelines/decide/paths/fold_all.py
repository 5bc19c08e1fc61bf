"""The per-resource policy fold (:func:`pipelines.decide.paths.walk.fold_resource`) run for every resource with a
candidate or a limit in force, over the rows the micro-batch collected (:func:`fold_all`: one call per micro-batch,
on either path); and the ``state/policy`` rows in and out.

The input is small: only resources with a candidate in this micro-batch or a limit in force (a few rows per such
resource and window; a storm over 10,000 topics would be 10,000 resources of a few rows). Resources are folded in
(resource_type, resource) order.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

import pyarrow as pa

from pipelines.columns import Key
from pipelines import columns
from pipelines.decide.arrow import aware, figures, from_rows, naive
from pipelines.decide.rules.candidates import Keyed
from pipelines.decide.paths.walk import fold_resource
from pipelines.decide.records.resource import Decision, Evidence, Observation, PendingPreliminary, ResourceState
from pipelines.decide.limits.steps import Params
from pipelines.decide.words import Mode, Status

log = logging.getLogger("rate_governor")

#: The state columns of ``state/policy`` besides the resource keys and ``batch_id``, each a ResourceState field.
STATE_COLUMNS = tuple(name for name, _ in columns.POLICY_STATE
                      if name not in ("resource_type", "resource", "batch_id", columns.OVERRIDE_ID))
_TIMES = {name for name, kind in columns.POLICY_STATE if kind == "timestamp"}
_MAPS = {name for name, kind in columns.POLICY_STATE if kind.startswith("map<")}
_INTS = {"version", "recurrences", "probe_backoff", "cause_changes", "window_decisions"}



def state_of(row: dict) -> ResourceState:
    """A ``state/policy`` row (dict; times aware or naive UTC, maps as dicts or pairs) → :class:`ResourceState`."""
    values = {}
    for name in STATE_COLUMNS:
        value = row.get(name)
        if name in _TIMES:
            value = naive(value)
        elif name in _MAPS:
            value = figures(value)
        elif name in _INTS:
            value = 0 if value is None else int(value)
        elif name == "mode":
            value = Mode(value) if isinstance(value, str) else Mode.ENFORCE
        elif value is not None:
            value = float(value)
        values[name] = value
    return ResourceState(row["resource_type"], row["resource"], **values)


def state_row(state: ResourceState, batch_id: int | None = None) -> dict:
    """:class:`ResourceState` → a ``state/policy`` row (times aware UTC, maps as sorted pairs, empty maps null)."""
    row = {"resource_type": state.resource_type, "resource": state.resource}
    for name in STATE_COLUMNS:
        value = getattr(state, name)
        if name in _TIMES:
            value = aware(value)
        elif name in _MAPS:
            value = sorted(value.items()) or None
        row[name] = value
    if batch_id is not None:
        row["batch_id"] = batch_id
    return row


def state_table(states: list[ResourceState], batch_id: int) -> pa.Table:
    """New ``state/policy`` rows, tagged with the micro-batch."""
    return from_rows([state_row(s, batch_id) for s in states], columns.POLICY_STATE)


@dataclass
class Folded:
    """The fold's outputs of one micro-batch: decisions and evidence by resource, the new state per folded
    resource (in (resource_type, resource) order)."""

    decisions: list[Decision] = field(default_factory=list)
    evidence: list[tuple[Key, Evidence]] = field(default_factory=list)
    states: list[ResourceState] = field(default_factory=list)

    def vetoes(self) -> list[tuple[Key, Evidence]]:
        """The ``veto`` evidence rows: open or later windows that kept a lift from being decided."""
        return [(k, e) for k, e in self.evidence if e.status == Status.VETO]


def fold_all(candidates: list[Keyed], saved: dict[Key, dict], horizon_end: dt.datetime, params: Params, *,
             recover: bool = True, observations: dict[Key, list[Observation]] | None = None,
             open_evidence: dict[Key, list[Observation]] | None = None, now: dt.datetime | None = None,
             preliminary: dict[Key, PendingPreliminary] | None = None) -> Folded:
    """The fold of one micro-batch, both paths' one call: every resource with a candidate, or with a saved state
    whose limit is in force (a resource only observed has nothing to fold), by
    :func:`pipelines.decide.paths.walk.fold_resource`, in (resource_type, resource) order.

    Args:
        candidates: this micro-batch's candidates (:func:`pipelines.decide.rules.candidates.candidate_limits`).
        saved: the saved state per resource (``state/policy`` rows by key, :func:`state_of` reads them).
        horizon_end: end of the last finalized (or open, on the fast path) window of the micro-batch (UTC).
        params: the policies' settings (:meth:`pipelines.decide.limits.steps.Params.from_config`).
        recover: lift after recovery (final path); the fast path folds without (absence is known on final windows).
        observations: the demand evidence of the micro-batch's windows per resource (final path), None on the fast
            path; open_evidence: the fast path's open windows (the lift veto, a retry-storm limit's probe); now:
            when the decisions are made (UTC; a raise's first whole window); preliminary: per resource the fast
            path's newest ``set`` the final path has not folded yet (window end, msg/s, mode).
    Returns:
        :class:`Folded`; each veto is logged (INFO).

    Raises:
        ValueError: a candidate's target is not finite and > 0; a resource type no rule limits.
    """
    by_key: dict[Key, list] = {}
    for k in candidates:
        by_key.setdefault((k.resource_type, k.resource), []).append(k.candidate)
    anchored = set(by_key) | {key for key, row in saved.items() if row.get("limit_qps") is not None}
    out = Folded()
    horizon = naive(horizon_end)
    for key in sorted(anchored):
        start = state_of(saved[key]) if key in saved else ResourceState(*key)
        decisions, state, evidence = fold_resource(
            start, by_key.get(key, []), horizon, params, recover, observations=(observations or {}).get(key, ()),
            open_evidence=(open_evidence or {}).get(key, ()), now=naive(now) if now is not None else None,
            preliminary=(preliminary or {}).get(key))
        out.decisions += decisions
        out.evidence += [(key, e) for e in evidence]
        out.states.append(state)
    for (rtype, resource), veto in out.vetoes():
        log.info("%s %s: %s", rtype, resource, veto.detail)
    return out
