"""A limit's values in force over a closed loop's run, from the brokers' timeline (``result.in_force``: at each
change, {(broker, resource_type, resource): (qps at that broker, record)}): the seconds each snapshot of the limits
in force lasts (:func:`in_force_spans`), every change of a resource's cluster-wide value (:func:`value_events`) and
the value in force at an instant (:func:`value_at`). The ground truth (:mod:`pipelines.sim.truth`) and the probes'
judgement (:mod:`pipelines.sim.probes`) both read them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

#: Two values in force within this relative distance are the same value (floating-point noise).
SAME_VALUE_REL = 1e-9


def in_force_spans(result) -> Iterator[tuple[int, int, dict]]:
    """Each snapshot of the brokers' limits in force (``result.in_force``: at each change, {(broker, resource_type,
    resource): (qps at that broker, record)}) with the seconds of the run it lasts: (first second, second after its
    last, snapshot), seconds from the cluster's start, to the next snapshot (the last: to the run's end, ``T``
    minutes); a snapshot taken mid-second holds from the next whole second. Spans of no second are left out."""
    c = result.cluster
    n = c.T * 60
    times = [t for t, _ in result.in_force] + [c.end]
    for (t, snap), t_next in zip(result.in_force, times[1:]):
        lo = max(0, int(np.ceil((t - c.start).total_seconds())))
        hi = min(n, int(np.ceil((t_next - c.start).total_seconds())))
        if hi > lo:
            yield lo, hi, snap


def value_events(result, resource: tuple[str, str], versions: dict | None = None) -> list[tuple[pd.Timestamp, float]]:
    """Every change of ``resource``'s value in force, from the brokers' timeline (``result.in_force``), whatever
    its duration: (time, cluster-wide ``limit_qps`` of the newest record in force at any broker, NaN: none at any
    broker). Consecutive equal values (within :data:`SAME_VALUE_REL`) are one. ``versions``: filled with each
    event's time → the version of the record that made it (None for a value gone)."""
    out: list = []
    for t, snap in result.in_force:
        recs = [rec for (_b, rt, r), (_qps, rec) in snap.items() if (rt, r) == resource]
        newest = max(recs, key=lambda rec: rec.get("version") or 0) if recs else None
        value = float(newest["limit_qps"]) if newest is not None else float("nan")
        if out:
            last = out[-1][1]
            if (np.isnan(last) and np.isnan(value)) or (
                    not np.isnan(last) and not np.isnan(value) and abs(value - last) <= SAME_VALUE_REL * abs(last)):
                continue
        out.append((pd.Timestamp(t), value))
        if versions is not None:
            versions[pd.Timestamp(t)] = int(newest["version"]) if newest is not None else None
    return out


def value_at(events: list, t: pd.Timestamp) -> float:
    """The value in force at ``t`` from :func:`value_events` (msg/s cluster-wide; NaN: none)."""
    value = float("nan")
    for at, v in events:
        if at > t:
            break
        value = v
    return value
