"""What the two deciding paths read, typed by phase and built with keywords only.

Each path decides in two phases (docs/decisions.md §1 "The decision lock"): what does not read the decisions'
memory is derived outside the decision lock (:class:`FinalInputs` →
:func:`pipelines.decide.paths.final.prepare_final`; :class:`FastInputs` →
:func:`pipelines.decide.paths.fast.prepare_fast`), then the fold on the memory runs inside it (:class:`LockedInputs` →
:func:`pipelines.decide.paths.final.decide_final`, :func:`pipelines.decide.paths.fast.decide_fast`).

Tables are Arrow tables of the named schemas (:mod:`pipelines.columns`); the history tables may be polars frames of
the same rows (:func:`pipelines.decide.arrow.to_polars`, kept by a caller that derives them once). Times are UTC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

#: Finalized ``gold/group_tps`` rows, or a function returning them (read only when a storm fires: a retry limit's
#: consume basis, :func:`pipelines.decide.rules.anomalies.consume_basis`).
GroupHistory = pa.Table | pl.DataFrame | Callable[[], pa.Table | pl.DataFrame]


@dataclass(frozen=True, kw_only=True)
class FinalInputs:
    """What the final path reads outside the decision lock, of one micro-batch of finalized windows.

    Attributes:
        topics, groups, brokers: the batch's ``gold/topic_tps`` (``limit_qps`` null), ``gold/group_tps`` and
            ``gold/broker_tps`` rows (:func:`pipelines.decide.rules.windows.reduce_windows`).
        traffic: the per-broker traffic rows with the window markers (``reduce_windows``' ``traffic``).
        topic_history, broker_history: earlier ``gold/topic_tps`` / ``gold/broker_tps`` rows (the baselines).
        limiter_rejections: ``control/limiter_rejections`` rows of the batch's windows; None: none.
        group_history: earlier ``gold/group_tps`` rows (:data:`GroupHistory`); None: none.
    """

    topics: pa.Table
    groups: pa.Table
    brokers: pa.Table
    traffic: pa.Table
    topic_history: pa.Table | pl.DataFrame
    broker_history: pa.Table | pl.DataFrame
    limiter_rejections: pa.Table | None = None
    group_history: GroupHistory | None = None


@dataclass(frozen=True, kw_only=True)
class FastInputs:
    """What the fast path reads outside the decision lock, of one micro-batch of open windows.

    Attributes:
        open_rows: this micro-batch's open-window rows (:func:`pipelines.dataplane.transforms.fast.open_window_sums`;
            not empty).
        topic_history, broker_history: finalized ``gold/topic_tps`` / ``gold/broker_tps`` rows since the baseline
            start of the oldest open window (the baselines, and the newest final window's broker census).
        known: whether a broker is still known (the census leaves out brokers that left); None: all are.
        open_dicts: the same open-window rows as dicts (at least :data:`pipelines.decide.paths.fast.OpenRows.LIGHT`'s
            columns, timestamps UTC-aware), when the caller built them in Python (the simulator); None: read from
            ``open_rows``.
        group_history: finalized ``gold/group_tps`` rows (:data:`GroupHistory`); None: none.
        limited: ``"<resource_type>\\x1f<resource>"`` keys of the resources with a limit in the saved
            ``state/policy`` (as the final path's :func:`pipelines.decide.rules.windows.reduce_windows` reads them): a
            group among them is not read through its fallback sends on the fast path
            (:func:`pipelines.decide.rules.open_retry.open_retry_traffic`).
    """

    open_rows: pa.Table
    topic_history: pa.Table | pl.DataFrame
    broker_history: pa.Table | pl.DataFrame
    known: Callable[[str], bool] | None = None
    open_dicts: list[dict] | None = None
    group_history: GroupHistory | None = None
    limited: tuple[str, ...] | frozenset[str] = ()


@dataclass(frozen=True, kw_only=True)
class LockedInputs:
    """What either path reads under the decision lock: the decisions' memory.

    Attributes:
        policy_state: the saved ``state/policy`` row per resource (of the batches before this one).
        latest_limits: the newest ``gold/limits`` row per resource.
        open_evidence: the final path's view of the fast path's open windows after its batch, per resource
            (:func:`pipelines.decide.rules.evidence.open_evidence`: the lift veto, a probe's evidence); None without
            (and always on the fast path).
        overrides: the operators' overrides (:func:`pipelines.decide.paths.overrides.parse`; :mod:`pipelines.decide.
            overrides` applies them around the fold); () without.
    """

    policy_state: pa.Table
    latest_limits: pa.Table
    open_evidence: dict | None = None
    overrides: tuple = ()
