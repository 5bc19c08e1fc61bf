"""A recording made while a governor enforced limits: where its stats under-read demand, and the demand the replay
uses there instead (for :mod:`pipelines.sim.replay_demand`).

Under an enforced limit a broker prints what its limiter admitted, at most the limit. What it refused shows only
as the producers' ``[RateLimit]`` lines, as far as they log and ship them, and a consumer's refused send-backs never
show (docs/backtest.md §1). So where the limit binds, the stats are a floor of the demand, not the demand.

The limits in force come from the enforcing governor's own ``gold/limits`` (:func:`pipelines.sim.replay_input.
read_enforced`): a ``set`` or ``relax`` row with ``mode`` ``enforce`` is in force at the brokers from ``decided_at``
+ the write-back delay (``conf/backtest.toml`` ``propagation_seconds``) until the resource's next row arrives or
``expires_at``, whichever is first; a ``lift`` ends it. Only minutes limited in every second count.

In a minute where what the resource's limiter admitted, summed over brokers, is at its cap (at least
``limits.bound_share`` × the cluster-wide limit, the governor's own test of a binding limit, docs/decisions.md §4;
a topic's puts, or a group's retry-topic puts: its send-backs and its consumers' fallback sends share one bucket,
sohutv/rocketmq ``RateLimitHandler``), its demand on each
broker is taken as the larger of what that broker admitted and what it printed in the last whole minute before the
limit came into force (what the governor saw when it decided; a broken consumer's send-backs do not fall while it
stays broken). A limit in force from the recording's first minute has no such minute: its demand stays under-read
there, and the report says so.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from pipelines import rocketmq as rmq
from pipelines.sim.replay_demand import KEYS


@dataclass
class Hidden:
    """The demand estimated under enforced limits (``demand``: ``KEYS``, ``requests``, ``demand`` per minute, pairs
    it raises), the (resource_type, resource) → minute indexes held at the cap (``held``) and the resources whose
    limit was in force from the first minute (``unread``)."""

    demand: pl.DataFrame
    held: dict = field(default_factory=dict)
    unread: list = field(default_factory=list)


def limits_per_second(limits: pl.DataFrame, start: dt.datetime, minutes: int,
                      propagation_seconds: float) -> dict[tuple[str, str], np.ndarray]:
    """Per resource: the cluster-wide enforced limit (msg/s) in force at the brokers in each second of the recording
    (NaN: none), from ``gold/limits`` rows ordered by ``version`` (module docstring)."""
    out: dict = {}
    delay = dt.timedelta(seconds=propagation_seconds)
    for (rtype, res), rows in limits.sort("version").group_by(["resource_type", "resource"], maintain_order=True):
        per = np.full(minutes * 60, np.nan)
        recs = rows.to_dicts()
        for i, r in enumerate(recs):
            if r["action"] == "lift" or r["mode"] != "enforce":
                continue
            until = min([r["expires_at"]] + ([recs[i + 1]["decided_at"] + delay] if i + 1 < len(recs) else []))
            lo = int(np.ceil((r["decided_at"] + delay - start).total_seconds() - 1e-9))
            hi = int(np.ceil((until - start).total_seconds() - 1e-9))
            per[max(lo, 0):max(min(hi, minutes * 60), 0)] = float(r["limit_qps"])
        if not np.isnan(per).all():
            out[(rtype, res)] = per
    return out


def minute_caps(per_second: np.ndarray) -> np.ndarray:
    """Per minute: the mean limit of a minute limited in every second (msg/s), NaN for any other minute."""
    whole = per_second.reshape(-1, 60)
    return np.where(np.isnan(whole).any(axis=1), np.nan, np.nanmean(np.where(np.isnan(whole), 0.0, whole), axis=1))


def bucket_puts(rows: pl.DataFrame) -> pl.DataFrame:
    """What each resource's limiter admitted per minute and broker (``KEYS``, ``admitted`` messages): a topic's
    ``TOPIC_PUT_NUMS``, a group's ``TOPIC_PUT_NUMS [%RETRY%<group>]`` (``rows``: :func:`pipelines.sim.replay_demand.
    pair_rows`)."""
    return (rows.filter((pl.col("stat_name") == rmq.TOPIC_PUT_NUMS) & pl.col("resource_type").is_not_null())
            .group_by(KEYS).agg(admitted=pl.col("sum").sum()))


def hidden_demand(per_second: dict, offered: pl.DataFrame, puts: pl.DataFrame, bound_share: float) -> Hidden:
    """The demand of each (minute, broker) pair of a resource held at its cap (module docstring). ``per_second``:
    :func:`limits_per_second`; ``offered``: the recorded requests per minute (``KEYS``, ``requests``); ``puts``:
    :func:`bucket_puts`; ``bound_share``: ``limits.bound_share``. The reference of a stretch of limited seconds from
    second ``f`` is the minute before the one ``f`` falls in, the last one wholly before the limit."""
    rows, held, unread = [], {}, []
    for (rtype, res), limit in per_second.items():
        own = offered.filter((pl.col("resource_type") == rtype) & (pl.col("resource") == res))
        by = {(m, b): q for m, b, q in zip(own["m"], own["broker"], own["requests"])}
        mine = puts.filter((pl.col("resource_type") == rtype) & (pl.col("resource") == res))
        bucket = mine.group_by("m").agg(pl.col("admitted").sum())
        admitted = dict(zip(bucket["m"], bucket["admitted"]))
        brokers, caps = sorted(set(own["broker"])), minute_caps(limit)
        for first, end in _runs(~np.isnan(limit)):
            if first // 60 - 1 < 0:
                unread.append((rtype, res))
                continue
            before = {b: by.get((first // 60 - 1, b), 0.0) for b in brokers}
            for m in range(-(-first // 60), end // 60):
                if admitted.get(m, 0.0) < bound_share * caps[m] * 60.0:
                    continue
                held.setdefault((rtype, res), []).append(m)
                rows += [(m, b, rtype, res, by.get((m, b), 0.0), before[b]) for b in brokers
                         if before[b] > by.get((m, b), 0.0)]
    demand = pl.DataFrame(rows, schema={"m": pl.Int64, "broker": pl.Utf8, "resource_type": pl.Utf8,
                                        "resource": pl.Utf8, "requests": pl.Float64, "demand": pl.Float64},
                          orient="row").select(KEYS + ["requests", "demand"])
    return Hidden(demand, held, unread)


def _runs(on: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of True in ``on``."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], on.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))
