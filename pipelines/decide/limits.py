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
from pipelines.decide.fold_types import Decision
from pipelines.decide.words import Basis

#: Last digit of a decision's ``version`` by basis (see the module docstring).
VERSION_RANK = {Basis.PRELIMINARY: 1, Basis.FINAL: 5}
#: Rank of the final path's confirmation or reversal of a preliminary decision.
RECONCILE_RANK = 6
#: Rank of the fast path's split of its own preliminary decision by the window's complete traffic
#: (:func:`pipelines.decide.open_split.complete_split`).
RESPLIT_RANK = 2
#: The ``source`` of a refused decision's ``quarantine`` row.
LIMITS_SOURCE = "gold/limits"


def decision_version(window_end: dt.datetime, rank: int) -> int:
    """The ``version`` of a decision of the window ending ``window_end`` (UTC) with ``rank`` (module docstring)."""
    return epoch_seconds(window_end) * 10 + rank


def burst_for(limit_qps: float, cfg: LimitsConfig) -> int:
    """Token-bucket burst for a limit: ``ceil(limit_qps × burst_seconds)``, at least 1 (a non-finite limit, which
    the expectations refuse, gets the long range's bound, as a cast saturates)."""
    value = limit_qps * cfg.burst_seconds
    if math.isnan(value):
        return 1
    if math.isinf(value):
        return 2**63 - 1 if value > 0 else 1
    return max(1, math.ceil(value))


def finish(decisions: list[Decision], cfg: LimitsConfig, decided_at: dt.datetime, basis: str) -> list[dict]:
    """The fold's decisions → ``gold/limits`` rows: ``decided_at`` (processing time, UTC), ``expires_at`` =
    decided_at + ``ttl_seconds``, ``burst``, ``basis``, the event-time ``version``; the ``reason`` starts with
    ``[<basis>]`` (so does the control record's); ``broker_limits`` (each broker's share of ``limit_qps``, msg/s)
    null when empty."""
    now = aware(decided_at)
    expires = now + dt.timedelta(seconds=cfg.ttl_seconds)
    return [{
        "decided_at": now, "window_end": aware(d.window_end), "resource_type": d.resource_type,
        "resource": d.resource, "limit_qps": d.limit_qps, "burst": burst_for(d.limit_qps, cfg),
        "previous_qps": d.previous_qps, "action": d.action, "mode": d.mode, "expires_at": expires,
        "reason": f"[{basis}] {d.reason}", "version": decision_version(d.window_end, VERSION_RANK[basis]),
        "basis": basis, "broker_limits": dict(d.broker_limits) or None,
    } for d in decisions]


def _expectation_reasons() -> list[tuple[str, object]]:
    """The ``gold/limits`` expectations (:data:`pipelines.dataplane.quality.suites.GOLD_LIMITS_EXPECTATIONS`, the suite GX
    validates) as (reason, row predicate)
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
