"""The fast path's decisions of one micro-batch as one function: the open windows Spark emitted (running sums per
window × resource, :func:`pipelines.dataplane.transforms.fast.open_window_sums`), the finalized history, the saved
state and the limits in force → preliminary ``gold/limits`` rows (only ``set`` decisions that change a limit; no
policy state: the final path stays the only owner of ``state/policy`` and reconciles what this path decided).

Entry points: :func:`prepare_fast` (:class:`~pipelines.decide.records.inputs.FastInputs` → the candidates, outside the
decision lock) and :func:`decide_fast` (:class:`~pipelines.decide.records.inputs.LockedInputs` → the rows, under it).

Spark emits only the rows a micro-batch's input touched (``update`` mode). :class:`OpenRows` remembers the rows of
open windows on the driver (one per window × resource, replaced by a newer one), so that a window completed by the
last expected broker's lines is judged on all its resources, whichever micro-batches its files fell into
(:func:`pipelines.decide.rules.preliminary.completed_rows`); the same memory is the final path's lift
veto evidence (:func:`pipelines.decide.rules.evidence.open_evidence`). The memory is the flow's, not the checkpoint's:
after a restart a window whose brokers' lines straddle it waits for the final path.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipelines import columns
from pipelines.config import GovernorConfig
from pipelines.decide.rules import preliminary as pre
from pipelines.decide.arrow import aware, from_rows, micros, naive, rows_of, to_polars, when
from pipelines.decide.rules.candidates import candidate_limits
from pipelines.decide.rules.crowding import busy_normals
from pipelines.decide.rules.anomalies import broker_writes
from pipelines.decide.words import Action, Basis
from pipelines.decide.paths.fold_all import fold_all
from pipelines.decide.records.inputs import FastInputs, LockedInputs
from pipelines.decide.limits.steps import Params
from pipelines.decide.records.limit_rows import check, finish
from pipelines.decide.paths.overrides import Applied
from pipelines.decide.paths.open_split import (
    complete_split, complete_traffic, held_for_brokers_to_report, still_to_report, topics_heard,
)
from pipelines.decide.paths.reconcile import latest_per_resource, preliminary_state
from pipelines.decide.paths.final import rows_by_key


def after_window(rows: pa.Table, newest_final: dt.datetime | None) -> pa.Table:
    """Open-window rows → those of windows starting after ``newest_final`` (UTC; None: all of them)."""
    if newest_final is None:
        return rows
    bound = pa.scalar(aware(newest_final), type=rows.schema.field("window_start").type)
    return rows.filter(pc.greater(rows["window_start"], bound))


class OpenRows:
    """The open-window rows Spark has emitted to the fast path (one per window × resource, the newest), kept on the
    driver for the windows the final path has not decided yet (module docstring): by key, in the order they came (a
    replaced row moves to the end), each as its micro-batch's Arrow row and the dict of its :data:`LIGHT` columns
    (what the gate and the census read); as one Arrow table when asked (:attr:`rows`).

    Example:
        >>> memory = OpenRows()
        >>> memory.remember(batch_rows, newest_final)    # Arrow rows of open_window_sums, UTC datetime or None
        >>> memory.rows                                   # what is remembered (None: nothing yet)
    """

    KEYS = ("window_start", "resource_type", "resource")
    #: The columns read as Python values (:func:`pipelines.decide.rules.preliminary.rules_that_may_fire`, the census).
    LIGHT = ("window_start", "window_end", "resource_type", "resource", "puts", "broker_puts", "retried", "failures",
             "busy_failures", "brokers")

    def __init__(self) -> None:
        self.by_key: dict[tuple, tuple[int, int, dict]] = {}  # key → (micro-batch number, row, light row)
        self.sources: dict[int, pa.Table] = {}  # micro-batch number → its rows
        self.schema: pa.Schema | None = None  # of the first rows remembered
        self._table: pa.Table | None = None
        self._batches = 0
        self._history: tuple | None = None  # (topic history, broker history, what was derived of them)

    def history(self, topic_history: pl.DataFrame, broker_history: pl.DataFrame) -> dict:
        """What the fast path derives from the finalized history: the newest final window (``newest``) and its
        brokers (``expected``), the gate's memo (``memo``) and, when asked (:func:`_decided`), the history up to the
        newest final window (``topics``, ``brokers``); kept while the caller passes the same frames (polars frames
        do not change): a caller that keeps its history derives it once per gold batch, not per micro-batch."""
        kept = self._history
        if kept is None or kept[0] is not topic_history or kept[1] is not broker_history:
            newest, expected = pre.newest_final_window(broker_history)
            kept = self._history = (topic_history, broker_history, {
                "newest": newest, "expected": expected, "memo": {}, "all": (topic_history, broker_history)})
        return kept[2]

    @classmethod
    def light(cls, rows: pa.Table) -> list[dict]:
        """Open-window rows → dicts of their :data:`LIGHT` columns."""
        return rows_of(rows.select([c for c in cls.LIGHT if c in rows.column_names]))

    @property
    def rows(self) -> pa.Table | None:
        """The remembered rows as Arrow (:attr:`schema`); None before any."""
        if self.schema is None:
            return None
        if self._table is None:
            self._table = self.take(list(self.by_key.values()))
        return self._table

    def take(self, entries: list[tuple[int, int, dict]]) -> pa.Table:
        """Remembered rows (entries of :attr:`by_key`) as one Arrow table of :attr:`schema`, in their order."""
        used = sorted({n for n, _i, _r in entries})
        first, at = {}, 0
        for n in used:
            first[n], at = at, at + self.sources[n].num_rows
        parts = [self.sources[n].cast(self.schema) for n in used]
        table = pa.concat_tables(parts) if parts else self.schema.empty_table()
        return table.take(pa.array([first[n] + i for n, i, _r in entries], type=pa.int64()))

    def remember(self, fresh: pa.Table, newest_final: dt.datetime | None, light: list[dict] | None = None) -> None:
        """Keep ``fresh`` and the remembered rows ``fresh`` does not replace, of windows after ``newest_final``
        (``light``: :meth:`light` of ``fresh``, when the caller has it)."""
        if self.schema is None:
            self.schema = fresh.schema
        n, memory = self._batches, self.by_key
        self._batches += 1
        self.sources[n] = fresh
        for i, row in enumerate(self.light(fresh) if light is None else light):
            key = (row["window_start"], row["resource_type"], row["resource"])
            memory.pop(key, None)
            memory[key] = (n, i, row)
        if newest_final is not None:
            bound = aware(newest_final)
            for key in [k for k in memory if k[0] is None or k[0] <= bound]:
                del memory[key]
        used = {m for m, _i, _r in memory.values()}
        self.sources = {m: t for m, t in self.sources.items() if m in used}
        self._table = None


@dataclass(frozen=True)
class FastPrepared:
    """What the fast path derives from a micro-batch before it needs the decisions' memory (outside the decision
    lock, :func:`prepare_fast`): the candidates it may act on (:class:`pipelines.decide.rules.candidates.Keyed`), the
    end of its newest open window (UTC; None: nothing to decide) and the ends of the windows complete by census
    (naive UTC, as the candidates' ``window_end``)."""

    candidates: list
    horizon_end: dt.datetime | None
    complete_ends: frozenset = frozenset()  # the ends of the open windows complete by census (naive UTC)


def prepare_fast(inputs: FastInputs, memory: OpenRows, cfg: GovernorConfig) -> FastPrepared:
    """The anomalies the open windows already prove and their candidates (no state read); moves ``memory``
    (:class:`OpenRows`) forward. No candidate: nothing to decide. The rules that may fire are known from the rows
    as dicts (:func:`pipelines.decide.rules.preliminary.rules_that_may_fire`) before any frame of them is built: most
    micro-batches prove nothing and cost no more."""
    windows = cfg.windows
    history = memory.history(to_polars(inputs.topic_history, columns.GOLD_TOPIC_TPS),
                             to_polars(inputs.broker_history, columns.GOLD_BROKER_TPS))
    newest_final, expected = history["newest"], history["expected"]
    if inputs.known is not None:
        expected = [b for b in expected if inputs.known(b)]  # a broker that left the cluster is not waited for
    remembered = list(memory.by_key.values())
    fresh = OpenRows.light(inputs.open_rows) if inputs.open_dicts is None else inputs.open_dicts
    memory.remember(inputs.open_rows, newest_final, fresh)
    bound = aware(newest_final) if newest_final is not None else None
    current = fresh if bound is None else [r for r in fresh if r["window_start"] is not None
                                           and r["window_start"] > bound]
    if not current:
        return FastPrepared([], None)
    census = [r for (_s, kind, _r), (_n, _i, r) in memory.by_key.items() if kind == pre.CLUSTER]
    expected, _silent = pre.waited_for(expected, census, windows.length_seconds)
    older = pre.completed_rows(current, [r for _n, _i, r in remembered], expected)
    complete = [start for start, (_n, ok) in pre.census_rows(current + older, expected).items() if ok]
    rules = pre.rules_that_may_fire(current + older, *history["all"], complete, windows, cfg.detection, history["memo"],
                                    until=newest_final, limited=inputs.limited)
    if not rules:
        return FastPrepared([], None)
    topic_history, broker_history = _decided(history)
    opened = after_window(inputs.open_rows, newest_final)
    if older:
        entry = {id(r): (n, i, r) for n, i, r in remembered}
        opened = pa.concat_tables([opened, memory.take([entry[id(r)] for r in older]).cast(opened.schema)])
    open_windows = pl.from_arrow(opened)
    first_open = min(r["window_start"] for r in current)
    anomalies = pre.preliminary_anomalies(open_windows, topic_history, broker_history, expected, windows,
                                          cfg.detection, first_open=first_open,
                                          rules=rules, group_history=inputs.group_history, limited=inputs.limited,
                                          earlier=lambda: memory.rows)
    if anomalies.height == 0:
        return FastPrepared([], None)
    length = dt.timedelta(seconds=windows.length_seconds)
    complete_ends = {aware(start) + length for start in complete}
    shares = pre.with_earlier_carriers(pre.open_broker_tps(open_windows, windows),
                                       pl.from_arrow(memory.rows) if memory.rows is not None else None,
                                       complete_ends, windows)
    to_report = still_to_report(census, expected, windows.length_seconds)
    candidates = candidate_limits(anomalies, pre.topic_carriers(open_windows), cfg.limits, shares, busy_normals(
        anomalies, broker_history, first_open, windows, cfg.detection, broker_writes()))
    heard = topics_heard(candidates, memory.rows, to_report)  # their brokers still to report carry none of them
    candidates = [k if (k.resource_type, k.resource, k.candidate.window_end) in heard
                  else held_for_brokers_to_report([k], to_report)[0] for k in candidates]
    return FastPrepared(pre.cut_bounded_by_final_rates(candidates, open_windows, expected, windows, heard),
                        max(r["window_end"] for r in current), frozenset(naive(e) for e in complete_ends))


def _decided(history: dict) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The finalized topic and broker windows up to the newest final one (the windows after it are the final
    path's business), kept in ``history`` (:meth:`OpenRows.history`)."""
    if "topics" not in history:
        topics, brokers = history["all"]
        if history["newest"] is not None:
            topics = topics.filter(when("window_start") <= micros(history["newest"]))
            brokers = brokers.filter(when("window_start") <= micros(history["newest"]))
        history["topics"], history["brokers"] = topics, brokers
    return history["topics"], history["brokers"]


def decide_fast(prepared: FastPrepared, locked: LockedInputs, cfg: GovernorConfig, now: dt.datetime, *,
                origin: str) -> tuple[pa.Table, pa.Table]:
    """The candidates folded from the saved state with the newer preliminary limits in force
    (:func:`pipelines.decide.paths.reconcile.preliminary_state`) → (accepted preliminary ``gold/limits`` rows: the
    ``set`` decisions, refused ``quarantine`` rows); the part run under the decision lock. ``now``: processing time
    (UTC); ``origin``: the quarantine rows' ``origin`` (``<app id>:<batch id>``)."""
    if not prepared.candidates:
        return from_rows([], columns.GOLD_LIMITS), from_rows([], columns.QUARANTINE)
    saved = rows_by_key(locked.policy_state)
    latest = latest_per_resource(list(rows_by_key(locked.latest_limits).values()))
    view = Applied(locked.overrides, now, saved, latest, cfg)  # the operators' overrides (their rows come first)
    standing = view.standing(prepared.horizon_end) if view else []
    complete = complete_traffic(prepared.candidates, prepared.complete_ends)
    folded = view.fold_out(fold_all(view.candidates(prepared.candidates),
                                    preliminary_state(view.saved(saved), view.latest, complete), prepared.horizon_end,
                                    Params.from_config(cfg), recover=False))
    sets = [d for d in folded.decisions if d.action == Action.SET]
    decided = {(r["resource_type"], r["resource"]) for r in standing} | {(d.resource_type, d.resource) for d in sets}
    resplit = complete_split({k: r for k, r in view.latest.items() if k not in view.active}, complete, decided,
                             cfg, now)
    rows = finish(sets, cfg.limits, now, Basis.PRELIMINARY) + resplit
    accepted, refused = check(standing + view.shape(rows), origin, now)
    return from_rows(accepted, columns.GOLD_LIMITS), from_rows(refused, columns.QUARANTINE)

