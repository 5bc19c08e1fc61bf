"""The limits in force as control records (docs/contracts.md §3), without Spark: the latest ``gold/limits`` row per
resource that is not a ``lift`` and has not expired, each as the record every write-back path publishes. Used by
the publisher (:mod:`pipelines.writeback.publish`) and the closed-loop simulator (:mod:`pipelines.sim.loop`)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from control import record as control_record
from pipelines.config import LimitsConfig
from pipelines.decide.words import Action


def current_rows(latest: list[dict[str, Any]], now: dt.datetime) -> list[dict[str, Any]]:
    """:func:`current_limits` on the driver: the latest rows per resource (dicts, timestamps UTC-aware, from
    :meth:`pipelines.dataplane.lake.Lake.latest_rows`) → those in force at ``now`` (naive = UTC), by resource."""
    at = now.replace(tzinfo=dt.timezone.utc) if now.tzinfo is None else now
    live = [
        r for r in latest
        if r["action"] is not None and r["action"] != Action.LIFT and r["expires_at"] is not None
        and r["expires_at"] > at
    ]
    # Python orders str by code point, as Spark orders UTF-8 strings by byte: the same order.
    return sorted(live, key=lambda r: (r["resource_type"], r["resource"]))


def broker_figures(split: Any, cfg: LimitsConfig) -> dict[str, dict[str, Any]] | None:
    """``gold/limits.broker_limits`` (a map broker → msg/s, as a dict or Arrow's list of pairs) → the control
    record's ``brokers`` field: ``{broker: {"limit_qps": q, "burst": max(1, ceil(q × burst_seconds))}}``; None
    without a split (every broker then applies ``limit_qps``, docs/contracts.md §3)."""
    if not split:
        return None
    pairs = split.items() if isinstance(split, dict) else split
    return {str(b): {"limit_qps": float(q), "burst": max(1, math.ceil(float(q) * cfg.burst_seconds))}
            for b, q in sorted(pairs)}


def _record(row, cfg: LimitsConfig, expires_at_text: str) -> dict[str, Any]:
    brokers = broker_figures(row["broker_limits"], cfg)
    return {
        "resource_type": row["resource_type"],
        "resource": row["resource"],
        "limit_qps": float(row["limit_qps"]),
        "burst": int(row["burst"]),
        "breaker_open_ms": cfg.breaker_open_ms,
        "mode": row["mode"],
        "expires_at": expires_at_text,
        "version": int(row["version"]),
        "reason": row["reason"],
        **({control_record.BROKERS_FIELD: brokers} if brokers else {}),
    }


def records_from_rows(rows: list[dict[str, Any]], cfg: LimitsConfig, key: bytes | None) -> list[dict[str, Any]]:
    """Rows of :func:`current_rows` → control records, as :func:`control_records` makes them from a DataFrame."""
    records = []
    for row in rows:
        record = _record(row, cfg, row["expires_at"].astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        records.append(control_record.sign(record, key) if key else record)
    return records
