"""``gold/limits`` rows (docs/contracts.md §2) from the fold's decisions, their event-time versions, and the
``gold/limits`` expectations (the same suite GX validates, applied row by row: a refused decision becomes a
``quarantine`` row with its reason).

Versions: ``unix seconds of window_end × 10 + rank``, so versions grow per resource across restarts and across
lakes (brokers refusing stale versions, ``control/applier.py``, keep accepting a new governor's records), and a
window's final decision (rank 5) and the final path's answer to a preliminary decision (rank 6) outrank the
preliminary decision of the same window (rank 1) and the fast path's split of it once the window is complete by
census (rank 2).
"""

from __future__ import annotations

import datetime as dt
import json
import math

from pipelines.config import LimitsConfig
from pipelines.decide.arrow import aware, epoch_seconds
from pipelines.decide.records.resource import Decision
from pipelines.decide.words import Basis

#: Last digit of a decision's ``version`` by basis (see the module docstring).
VERSION_RANK = {Basis.PRELIMINARY: 1, Basis.FINAL: 5}
#: Rank of the final path's confirmation or reversal of a preliminary decision.
RECONCILE_RANK = 6
#: Rank of the fast path's split of its own preliminary decision by the window's complete traffic
#: (:func:`pipelines.decide.paths.open_split.complete_split`).
RESPLIT_RANK = 2
#: Ranks of a final decision of a window that already had one of this resource (the final path decides on the fast
#: path's open windows every trigger, each as a decision of the newest final window): the second, third and fourth
#: such decision. Above the reconciliation's rank, below the next window's preliminary one (its ``+ 1``): a later
#: decision of the same window outranks the earlier, and a newer window's preliminary decision still outranks it.
EXTRA_RANKS = (7, 8, 9)
#: The ``source`` of a refused decision's ``quarantine`` row.
LIMITS_SOURCE = "gold/limits"


def decision_version(window_end: dt.datetime, rank: int) -> int:
    """The ``version`` of a decision of the window ending ``window_end`` (UTC) with ``rank`` (module docstring)."""
    return epoch_seconds(window_end) * 10 + rank


def rank_of(decision: Decision, basis: str) -> int:
    """The version rank of ``decision`` (module docstring): its basis's, or for the ``nth`` final decision of a
    window (1-3), :data:`EXTRA_RANKS`. Raises ValueError past them (the policies take at most that many decisions
    of one window: :meth:`pipelines.decide.limits.base.LimitPolicy.may_decide_again`)."""
    if decision.nth == 0 or basis != Basis.FINAL:
        return VERSION_RANK[basis]
    if decision.nth > len(EXTRA_RANKS):
        raise ValueError(f"{decision.resource_type} {decision.resource}: decision {decision.nth + 1} of the window "
                         f"ending {decision.window_end}, more than {len(EXTRA_RANKS) + 1}")
    return EXTRA_RANKS[decision.nth - 1]


def after_latest(decision: Decision, version: int, floors: dict) -> int:
    """``version``, or the next above the newest version of the resource (``floors``: by key, updated) when that
    one is of the same window and not lower: a final decision taken after the reconciliation or an earlier
    decision of that window (rank 6, or an extra rank) must outrank it at the brokers, which refuse a lower
    version (``control/applier.py``). A decision of a later window keeps its own."""
    key = (decision.resource_type, decision.resource)
    floor = floors.get(key)
    if floor is not None and floor // 10 == version // 10 and floor >= version:
        version = floor + 1
    floors[key] = max(version, floor) if floor is not None else version
    return version


def burst_for(limit_qps: float, cfg: LimitsConfig) -> int:
    """Token-bucket burst for a limit: ``ceil(limit_qps × burst_seconds)``, at least 1 (a non-finite limit, which
    the expectations refuse, gets the long range's bound, as a cast saturates)."""
    value = limit_qps * cfg.burst_seconds
    if math.isnan(value):
        return 1
    if math.isinf(value):
        return 2**63 - 1 if value > 0 else 1
    return max(1, math.ceil(value))


def finish(decisions: list[Decision], cfg: LimitsConfig, decided_at: dt.datetime, basis: str,
           latest: dict | None = None) -> list[dict]:
    """The fold's decisions → ``gold/limits`` rows: ``decided_at`` (processing time, UTC), ``expires_at`` =
    decided_at + ``ttl_seconds``, ``burst``, ``basis``, the event-time ``version``; the ``reason`` starts with
    ``[<basis>]`` (so does the control record's); ``broker_limits`` (each broker's share of ``limit_qps``, msg/s)
    null when empty. ``latest``: the newest ``gold/limits`` row per resource (by key) before these: a decision of
    the same window as it is ranked after it (:func:`after_latest`)."""
    now = aware(decided_at)
    expires = now + dt.timedelta(seconds=cfg.ttl_seconds)
    floors = {k: r["version"] for k, r in (latest or {}).items() if r.get("version") is not None}
    return [{
        "decided_at": now, "window_end": aware(d.window_end), "resource_type": d.resource_type,
        "resource": d.resource, "limit_qps": d.limit_qps, "burst": burst_for(d.limit_qps, cfg),
        "previous_qps": d.previous_qps, "action": d.action, "mode": d.mode, "expires_at": expires,
        "reason": f"[{basis}] {d.reason}", "version": after_latest(d, decision_version(d.window_end, rank_of(d, basis)),
                                                                      floors),
        "basis": basis, "broker_limits": dict(d.broker_limits) or None,
    } for d in decisions]


def _expectation_reasons() -> list[tuple[str, object]]:
    """The ``gold/limits`` expectations (:data:`pipelines.dataplane.quality.suites.GOLD_LIMITS_EXPECTATIONS`, the suite
    GX validates) as (reason, row predicate)
    pairs, in the suite's order, with GX's null semantics (column-map expectations other than not-null skip nulls,
    the pair expectation skips a row missing either value)."""
    from pipelines.dataplane.quality.data_docs import expectation_name
    from pipelines.dataplane.quality.suites import GOLD_LIMITS_EXPECTATIONS

    checks = []
    for kind, kwargs in GOLD_LIMITS_EXPECTATIONS:
        kw = {k: v for k, v in kwargs.items() if v is not None}
        reason = "expectation failed: " + expectation_name(kind, kw)
        if kind == "expect_column_values_to_not_be_null":
            pred = (lambda c: lambda r: r.get(c) is not None)(kw["column"])
        elif kind == "expect_column_values_to_be_between":
            def pred(r, c=kw["column"], kw=kw):
                v = r.get(c)
                if v is None:
                    return True
                ok = True
                if "min_value" in kw:
                    ok = ok and ((v > kw["min_value"]) if kw.get("strict_min") else (v >= kw["min_value"]))
                if "max_value" in kw:
                    ok = ok and ((v < kw["max_value"]) if kw.get("strict_max") else (v <= kw["max_value"]))
                return bool(ok)
        elif kind == "expect_column_values_to_be_in_set":
            pred = (lambda c, s: lambda r: r.get(c) is None or r.get(c) in s)(kw["column"], set(kw["value_set"]))
        elif kind == "expect_column_pair_values_a_to_be_greater_than_b":
            def pred(r, a=kw["column_A"], b=kw["column_B"], eq=kw.get("or_equal")):
                x, y = r.get(a), r.get(b)
                return x is None or y is None or (x >= y if eq else x > y)
        else:
            raise ValueError(f"no row predicate for {kind} in the gold/limits suite")
        checks.append((reason, pred))
    return checks


_CHECKS: list | None = None


def check(rows: list[dict], origin: str, at: dt.datetime) -> tuple[list[dict], list[dict]]:
    """``gold/limits`` rows → (accepted rows, unchanged; ``quarantine`` rows of the others: ``source``
    ``gold/limits``, ``raw`` the decision as JSON, ``raw_bytes`` null, ``reason`` the first failed expectation,
    ``origin`` as given (e.g. ``<app id>:<batch id>``), ``ingested_at`` = ``at`` (UTC))."""
    global _CHECKS
    if _CHECKS is None:
        _CHECKS = _expectation_reasons()
    accepted, refused = [], []
    for row in rows:
        reason = next((why for why, ok in _CHECKS if not ok(row)), None)
        if reason is None:
            accepted.append(row)
        else:
            refused.append({"source": LIMITS_SOURCE, "raw": json.dumps(row, default=_json, allow_nan=True),
                            "raw_bytes": None, "reason": reason, "origin": origin, "ingested_at": aware(at)})
    return accepted, refused


def _json(value):
    if isinstance(value, dt.datetime):
        return aware(value).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return str(value)
