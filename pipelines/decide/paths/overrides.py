"""Operators' overrides of the running governor (``control/overrides``, docs/operators.md §9): every override
semantics of the decision plane, pure, called around the fold (:func:`pipelines.decide.paths.fold_all.fold_all`).

* **pin**: the resource is held at ``limit_qps`` (cluster-wide msg/s; each broker its share as usual: the shares of
  the limit it replaces, else of its traffic once a final window shows it), enforced, refreshed every
  ``limits.refresh_seconds``; no rule probes, tightens or lifts it. The rules still judge its windows in shadow
  (their evidence is written: ``limit-bound`` anomalies, ``gold/topic_tps.limit_qps``), their decisions are dropped.
* **exempt**: no enforced limit (one in force is lifted at once); the rules still run, as for a resource of
  ``limits.advisory_resources``: their decisions are advisory records, so an analyst sees what they would have done.
* **release** ends an override early. None lasts forever (``overrides.max_duration_seconds``); of two overrides of
  one resource in force at once, the newest (latest ``starts_at``) wins.

When an override starts or ends (or another replaces it) the resource's policy state is dropped and the rules start
afresh from the current evidence: ``state/policy.override_id`` names the override a state was saved under, and a
state saved under another regime than the one in force is never folded. A limit in force that an ended override
left behind is lifted (an exempted storm still raging is limited again by the same micro-batch's fold).

Rows an override causes have basis ``override``, a reason naming it (``override ovr-… (pin at 800.0 msg/s by
alice until …: …)``) and a version above the resource's newest row (in force at once); the rules' decisions under
an exemption, or first after an override, name it too. Times: processing time, UTC.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import pyarrow as pa

from pipelines.columns import OVERRIDE_ID, Key
from pipelines.config import GovernorConfig
from pipelines.decide.arrow import aware, figures, naive
from pipelines.decide.rules.candidates import Keyed, mode
from pipelines.decide.rules.facts import close, shares_from_figures, shares_of, split as broker_limits
from pipelines.decide.records.resource import ResourceState
from pipelines.decide.limits.base import LimitPolicy
from pipelines.decide.paths.fold_all import Folded, state_of, state_row
from pipelines.decide.records.limit_rows import burst_for, decision_version
from pipelines.decide.text import fixed, stamp
from pipelines.decide.words import Action, Mode

PIN, EXEMPT, KINDS = "pin", "exempt", ("pin", "exempt")
CREATE, RELEASE, RESOURCE_TYPES = "create", "release", ("topic", "group")
#: ``gold/limits.basis`` of a row an override caused (decided by a person, not on evidence).
BASIS_OVERRIDE = "override"
#: Last digit of an override row's event-time ``version`` (above the final path's 5 and 6).
OVERRIDE_RANK = 7
#: An override's id: ``ovr-`` and 8 to 32 lowercase hex digits.
ID_FORMAT = re.compile(r"ovr-[0-9a-f]{8,32}")
#: How a reason names the override it was decided under (the first such mention is the one).
TAG = re.compile(r"\boverride (ovr-[0-9a-f]{8,32}) \((?:pin|exempt)\b")



@dataclass(frozen=True)
class Override:
    """One override, its release folded in. Times are aware UTC; ``limit_qps`` cluster-wide msg/s (pin only)."""

    override_id: str
    kind: str
    resource_type: str
    resource: str
    limit_qps: float | None
    starts_at: dt.datetime
    ends_at: dt.datetime
    author: str
    reason: str
    recorded_at: dt.datetime
    released_at: dt.datetime | None = None
    released_by: str | None = None

    @property
    def key(self) -> Key:
        return self.resource_type, self.resource

    @property
    def until(self) -> dt.datetime:
        """When it ends: ``ends_at``, or its release when earlier (never before its start)."""
        if self.released_at is None:
            return self.ends_at
        return min(self.ends_at, max(self.released_at, self.starts_at))

    def in_force(self, at: dt.datetime) -> bool:
        return self.starts_at <= aware(at) < self.until

    def newness(self) -> tuple:
        """Order of precedence between overrides of one resource: the latest start wins."""
        return self.starts_at, self.recorded_at, self.override_id

    def label(self) -> str:
        """How a reason names it: ``override ovr-… (pin at 800.0 msg/s by alice until 2026-…Z: the reason)``."""
        what = f"pin at {fixed(self.limit_qps, 1)} msg/s" if self.kind == PIN else "exempt"
        return f"override {self.override_id} ({what} by {self.author} until {stamp(self.ends_at)}: {self.reason})"

    def ending(self, at: dt.datetime) -> str:
        """Why it is no longer in force at ``at``: released, ended, or not started."""
        if self.released_at is not None and self.released_at < self.ends_at and self.released_at <= aware(at):
            return f"released by {self.released_by} at {stamp(self.released_at)}"
        return f"ended at {stamp(self.ends_at)}" if aware(at) >= self.ends_at else "replaced by a newer override"


def refusal(row: Mapping, cfg: GovernorConfig) -> str | None:
    """Why a ``create`` row of ``control/overrides`` cannot be an override (None: it can). The command refuses the
    same (:mod:`pipelines.ops.override`); the governor ignores such a row, logged."""
    kind, rtype, resource, qps = row.get("kind"), row.get("resource_type"), row.get("resource"), row.get("limit_qps")
    if not isinstance(row.get("override_id"), str) or not ID_FORMAT.fullmatch(row["override_id"]):
        return f"override_id {row.get('override_id')!r} is not ovr- and 8-32 hex digits"
    if kind not in KINDS:
        return f"unknown kind {kind!r} (pin or exempt)"
    if rtype not in RESOURCE_TYPES:
        return f"unknown resource type {rtype!r} (topic or group)"
    if not resource:
        return "no resource"
    if not (row.get("author") or "").strip() or not (row.get("reason") or "").strip():
        return "an override needs an author and a reason"
    start, end = aware(row.get("starts_at")), aware(row.get("ends_at"))
    if start is None or end is None or end <= start:
        return "its end is not after its start"
    limit = cfg.overrides.max_duration_seconds
    if (end - start).total_seconds() > limit:
        return f"it lasts {(end - start).total_seconds():.0f} s, over overrides.max_duration_seconds = {limit}"
    if kind == EXEMPT:
        return None if qps is None else "an exemption has no limit_qps"
    if not isinstance(qps, (int, float)) or not math.isfinite(qps) or qps <= 0:
        return f"a pin needs a finite limit_qps > 0, got {qps!r}"
    if resource in cfg.limits.protected:
        return f"{resource} is on limits.protected: never limited, so never pinned"
    if qps > cfg.limits.max_limit_qps:
        return f"{qps:g} msg/s is above limits.max_limit_qps = {cfg.limits.max_limit_qps:g}"
    if qps < cfg.limits.min_limit_qps:
        return f"{qps:g} msg/s is below limits.min_limit_qps = {cfg.limits.min_limit_qps:g}"
    return None


def parse(rows: Iterable[Mapping], cfg: GovernorConfig) -> tuple[list[Override], list[tuple[Mapping, str]]]:
    """``control/overrides`` rows (dicts by column, any order) → (the overrides, releases folded in, by start; the
    rows that are not, each with its reason: a bad ``create`` (:func:`refusal`), a second ``create`` of an id, a
    ``release`` of an unknown id, an unknown event). A later release of a released override changes nothing."""
    created: dict[str, Override] = {}
    refused: list[tuple[Mapping, str]] = []
    never = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    ordered = sorted(rows, key=lambda r: (aware(r.get("recorded_at")) or never, r.get("event") != CREATE))
    for row in ordered:
        event, oid = row.get("event"), row.get("override_id")
        if event == CREATE:
            why = refusal(row, cfg)
            if why is None and oid in created:
                why = f"a second create of {oid}"
            if why is not None:
                refused.append((row, why))
                continue
            created[oid] = Override(oid, row["kind"], row["resource_type"], row["resource"],
                                    None if row.get("limit_qps") is None else float(row["limit_qps"]),
                                    aware(row["starts_at"]), aware(row["ends_at"]), row["author"].strip(),
                                    row["reason"].strip(), aware(row.get("recorded_at")) or aware(row["starts_at"]))
        elif event == RELEASE:
            at = aware(row.get("recorded_at"))
            if oid not in created or at is None:
                refused.append((row, f"release of an unknown override {oid!r}" if at else "a release without a time"))
            elif created[oid].released_at is None:
                created[oid] = replace(created[oid], released_at=at, released_by=row.get("author") or "unknown")
        else:
            refused.append((row, f"unknown event {event!r} (create or release)"))
    return sorted(created.values(), key=Override.newness), refused


def in_force(overrides: Iterable[Override], at: dt.datetime) -> dict[Key, Override]:
    """The override in force per resource at ``at`` (UTC): of several, the newest (:meth:`Override.newness`)."""
    out: dict[Key, Override] = {}
    for o in overrides:
        if o.in_force(at) and (o.key not in out or o.newness() > out[o.key].newness()):
            out[o.key] = o
    return out


def tag(reason: str | None) -> str | None:
    """The id of the override a ``gold/limits`` reason was decided under (:data:`TAG`), None for the rules alone."""
    found = TAG.search(reason) if reason and "override ovr-" in reason else None
    return found.group(1) if found else None


def frontier(latest: Mapping[Key, Mapping]) -> dt.datetime | None:
    """The newest ``window_end`` among the newest ``gold/limits`` rows (the event time an override row between
    micro-batches takes, :meth:`Applied.standing`), None without."""
    ends = [aware(r["window_end"]) for r in latest.values() if r.get("window_end") is not None]
    return max(ends) if ends else None


def live(row: Mapping | None, now: dt.datetime) -> bool:
    """A ``gold/limits`` row in force at ``now``: not a lift, not expired."""
    return row is not None and row.get("action") != Action.LIFT and row.get("expires_at") is not None \
        and aware(row["expires_at"]) > aware(now)


class Applied:
    """The overrides' effect on one decision step (a micro-batch of either path, or the governor's override tick)
    at ``now``: what the fold starts from and gets, and what it gives.

    Args:
        overrides: every override (:func:`parse`); saved: the ``state/policy`` rows by key (their
            ``override_id`` is the regime each was saved under); latest: the newest ``gold/limits`` row by key.

    Use, in this order: :meth:`standing` (the override rows that make each resource's newest decision agree with
    the overrides in force), :meth:`saved` and :meth:`candidates` (the fold's inputs), then :meth:`fold_out` (its
    outputs), :meth:`shape` (every other row of the step), :meth:`mark` (the ``state/policy`` rows).
    """

    def __init__(self, overrides: Iterable[Override], now: dt.datetime, saved: Mapping[Key, Mapping],
                 latest: Mapping[Key, Mapping], cfg: GovernorConfig) -> None:
        self.now, self.cfg = aware(now), cfg
        self.overrides = list(overrides)
        self.active = in_force(self.overrides, self.now)
        self.by_id = {o.override_id: o for o in self.overrides}
        self.latest = dict(latest)  # rows are never changed here, only replaced
        regimes = {k: r.get(OVERRIDE_ID) for k, r in saved.items() if r.get(OVERRIDE_ID)}
        #: resources whose saved state is of another regime than now's (started, ended or replaced override)
        self.changed = {k for k in set(regimes) | set(self.active)
                        if regimes.get(k) != (self.active[k].override_id if k in self.active else None)}
        self.ended = {k: self.by_id.get(regimes[k]) for k in self.changed if k not in self.active and k in regimes}
        #: the newest row by key once :meth:`standing` has run (what the reconciliation reads)
        self.newest = dict(self.latest)

    def __bool__(self) -> bool:
        return bool(self.active or self.changed)

    def pinned(self, key: Key) -> Override | None:
        return o if (o := self.active.get(key)) is not None and o.kind == PIN else None

    # --- the override rows ----------------------------------------------------------------------------------------
    def standing(self, frontier: dt.datetime | None = None,
                 traffic: Callable[[], Mapping[tuple, Mapping[str, float]]] | None = None) -> list[dict]:
        """The ``gold/limits`` rows (basis ``override``) that make each resource's newest decision agree with the
        overrides in force: a pin's ``set`` where its row is not in force at its figure, is due for a refresh
        (``limits.refresh_seconds``) or can now be split by its traffic per broker (``traffic``: a callable giving
        msg/s per broker by (window_end, resource_type, resource),
        :func:`pipelines.decide.rules.evidence.broker_tps_of`; the newest window's, called only for a pin without a
        split); a ``lift`` of an enforced limit in force on an exempted resource; a ``lift`` of a limit left by an
        override no longer in force. ``frontier``: the newest window end the step knows (UTC; the rows' ``window_end``
        and version, with the resource's newest row's)."""
        out = []
        keys = set(self.active) | {k for k, r in self.latest.items() if self._left(r)}
        for key in sorted(keys):
            o, row = self.active.get(key), self.latest.get(key)
            on = live(row, self.now)
            if o is not None and o.kind == PIN:
                split = self._split(o, row, lambda: self._newest(traffic, key))
                mine = on and tag(row.get("reason")) == o.override_id and row.get("action") == Action.SET \
                    and close(row["limit_qps"], o.limit_qps)
                refresh = dt.timedelta(seconds=self.cfg.limits.refresh_seconds)
                due = mine and self.now - aware(row["decided_at"]) >= refresh
                if not mine or due or (split and not figures(row.get("broker_limits"))):
                    why = "refresh" if mine else "held"
                    out.append(self._row(key, Action.SET, o.limit_qps, split, frontier, f"{o.label()}: {why} at "
                                         f"{fixed(o.limit_qps, 1)} msg/s cluster-wide; the rules are paused until it "
                                         "ends", mode(key[1], self.cfg.limits), until=o.until))
            elif o is not None and on and (row.get("mode") == Mode.ENFORCE or tag(row.get("reason")) not in
                                           (None, o.override_id)):
                out.append(self._row(key, Action.LIFT, row["limit_qps"], {}, frontier, (
                    f"{o.label()}: the {row['mode']} limit of {fixed(row['limit_qps'], 1)} msg/s is lifted, brokers "
                    "fall back to their defaults; the rules go on in advisory records until it ends"), row["mode"]))
            elif o is None and self._left(row):
                gone = self.by_id.get(tag(row.get("reason")))
                why = gone.ending(self.now) if gone is not None else "no longer in force"
                out.append(self._row(key, Action.LIFT, row["limit_qps"], {}, frontier, (
                    f"override {tag(row.get('reason'))} ({gone.kind if gone else 'pin'} by "
                    f"{gone.author if gone else 'unknown'}) {why}: its limit of {fixed(row['limit_qps'], 1)} msg/s is "
                    "lifted; the rules take over from the current evidence"), row["mode"]))
        self.newest = dict(self.latest)
        return out

    def _left(self, row: Mapping | None) -> bool:
        """A limit an override no longer in force left: the row names it, and is in force or was to be until the
        override's end (a pin's row expires at its end at the latest)."""
        gone = self.by_id.get(tag(row.get("reason"))) if row is not None else None
        if row is None or row.get("action") == Action.LIFT or tag(row.get("reason")) is None:
            return False
        return live(row, self.now) or (gone is not None and aware(row["expires_at"]) >= gone.until)

    def _newest(self, traffic, key: Key) -> dict[str, float]:
        seen = sorted((end, tps) for (end, rtype, resource), tps in (traffic() if traffic else {}).items()
                      if (rtype, resource) == key and shares_of(tps))
        return dict(seen[-1][1]) if seen else {}

    def _split(self, o: Override, row: Mapping | None, traffic: Callable[[], dict]) -> dict[str, float]:
        """A pin's per-broker figures: its own row's, else by the resource's traffic per broker (``traffic()``),
        else the shares of the limit it replaces; {} without any (every broker then applies the cluster-wide
        figure, docs/contracts.md §3)."""
        previous = figures(row.get("broker_limits")) if row is not None else {}
        if row is not None and tag(row.get("reason")) == o.override_id and previous:
            return previous
        seen = traffic()
        if seen:
            return broker_limits(o.limit_qps, shares_of(seen))
        listed = shares_from_figures(previous, row["limit_qps"]) \
            if row is not None and live(row, self.now) and row.get("limit_qps") else {}
        return broker_limits(o.limit_qps, listed) if listed else {}

    def _row(self, key: Key, action: str, limit: float, split: Mapping[str, float], frontier: dt.datetime | None,
             reason: str, mode_: str, until: dt.datetime | None = None) -> dict:
        row = self.latest.get(key)
        ends = [aware(x) for x in (frontier, row.get("window_end") if row else None) if x is not None]
        window_end = max(ends) if ends else None
        version = max(decision_version(window_end, OVERRIDE_RANK) if window_end else OVERRIDE_RANK,
                      row["version"] + 1 if row else 0)
        expires = self.now + dt.timedelta(seconds=self.cfg.limits.ttl_seconds)
        out = {"decided_at": self.now, "window_end": window_end, "resource_type": key[0], "resource": key[1],
               "limit_qps": float(limit), "burst": burst_for(limit, self.cfg.limits),
               "previous_qps": None if row is None or row.get("action") == Action.LIFT else row.get("limit_qps"),
               "action": action, "mode": mode_, "expires_at": min(expires, until) if until else expires,
               "reason": f"[{BASIS_OVERRIDE}] {reason}", "version": version, "basis": BASIS_OVERRIDE,
               "broker_limits": dict(split) or None if action != Action.LIFT else None}
        self.latest[key] = out
        return out

    # --- the fold -------------------------------------------------------------------------------------------------
    def saved(self, saved: Mapping[Key, Mapping]) -> dict[Key, dict]:
        """The state the fold starts from: a resource whose saved state is of another regime starts afresh; a pinned
        one from its pin (the rules judge its windows in shadow, :meth:`fold_out`)."""
        if not self:
            return saved
        out = {k: r for k, r in saved.items() if k not in self.changed}
        for key, o in self.active.items():
            if o.kind == PIN and (key in self.changed or key not in out):
                out[key] = self._pin_state(o)
        return out

    def _pin_state(self, o: Override) -> dict:
        """A pin as the policy's state: at its figure since its row's window, by its row's shares."""
        row = self.latest.get(o.key)
        mine = row is not None and tag(row.get("reason")) == o.override_id
        shares = shares_from_figures(figures(row.get("broker_limits")) if mine else {}, o.limit_qps)
        at = naive(aware(row["window_end"]) if row is not None and row.get("window_end") is not None else self.now)
        state = LimitPolicy.pin(o.key, o.limit_qps, mode(o.resource, self.cfg.limits), shares, at)
        return {**state_row(state), OVERRIDE_ID: o.override_id}

    def candidates(self, candidates: Iterable[Keyed]) -> list[Keyed]:
        """The fold's candidates: an exempted resource's are advisory (as for ``limits.advisory_resources``)."""
        if not self:
            return list(candidates)
        out = []
        for k in candidates:
            o = self.active.get((k.resource_type, k.resource))
            if o is not None and o.kind == EXEMPT and k.candidate.mode == Mode.ENFORCE:
                k = replace(k, candidate=replace(k.candidate, mode=Mode.ADVISORY))
            out.append(k)
        return out

    def fold_out(self, folded: Folded) -> Folded:
        """The fold's outputs under the overrides: a pinned resource's decisions are dropped (its evidence stays)
        and its state is its pin's; a resource with no fold this step whose regime changed gets a fresh state (so
        its ``state/policy`` row carries the regime now in force)."""
        if not self:
            return folded
        folded.decisions = [d for d in folded.decisions if self.pinned((d.resource_type, d.resource)) is None]
        states = {(s.resource_type, s.resource): s for s in folded.states}
        for key in self.changed | {k for k in self.active if self.pinned(k)}:
            o = self.pinned(key)
            if o is not None:
                states[key] = state_of(self._pin_state(o))
            elif key not in states:
                states[key] = ResourceState(*key)
        folded.states = [states[k] for k in sorted(states)]
        return folded

    def shape(self, rows: list[dict]) -> list[dict]:
        """The step's other ``gold/limits`` rows (the fold's, the reconciliation's) under the overrides: an exempted
        resource's name the exemption and are never enforced; the first after an override's end name it; a row not
        above the resource's newest when that is an override row takes the version after it."""
        for row in rows:
            key = (row["resource_type"], row["resource"])
            basis, _, text = row["reason"].partition("] ")
            o, gone = self.active.get(key), self.ended.get(key)
            if o is not None and o.kind == EXEMPT:
                row["reason"] = f"{basis}] {o.label()}: advisory only; the rules' decision: {text}"
                if row["action"] != Action.LIFT:
                    row["mode"] = Mode.ADVISORY
            elif key in self.ended:
                row["reason"] = (f"{basis}] after override {gone.override_id if gone else '(unknown)'} "
                                 f"{gone.ending(self.now) if gone else 'ended'}, from the current evidence: {text}")
            newest = self.latest.get(key)
            if newest is not None and newest.get("basis") == BASIS_OVERRIDE and row["version"] <= newest["version"]:
                row["version"] = newest["version"] + 1
            if newest is None or row["version"] >= newest["version"]:
                self.latest[key] = row
        return rows

    def mark(self, state: pa.Table) -> pa.Table:
        """``state/policy`` rows (Arrow) → the same with ``override_id`` (the override in force; null: none)."""
        if not self.active:
            return state
        ids = [o.override_id if (o := self.active.get(key)) is not None else None
               for key in zip(state.column("resource_type").to_pylist(), state.column("resource").to_pylist())]
        at = state.schema.get_field_index(OVERRIDE_ID)
        return state.set_column(at, OVERRIDE_ID, pa.array(ids, pa.string()))
