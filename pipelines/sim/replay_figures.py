"""A replay's figures per resource: what the governor would have done to each resource it limited in closed loop,
or that the recording flags, and what that did to the other resources on its brokers.

Per resource (a topic's puts, a consumer group's send-backs), times UTC, from the replay's closed loop
(:class:`pipelines.sim.loop.SimResult`) and the spans the recording flags it (``spans``: its anomaly windows,
:func:`pipelines.sim.replay_brokers.recorded_incident`; the cause is "on" in them):

* ``first_in_force``: the first instant a limit on it is in force at a broker (the brokers' timeline, propagation
  included); ``first_limit_after_onset_s``: that − the start of its first flagged window; ``first_limit_qps``;
* ``changes``: changes of the value in force (a new value, or gone at every broker) after the first limit, while the
  cause is on (:func:`pipelines.sim.values_in_force.value_events`);
* ``admitted_over_target``: what its brokers admitted of it ÷ the cluster-wide limit in force, summed over the
  seconds a limit is in force while the cause is on;
* ``lifted_at`` and ``lift_after_cause_end_min``: when no limit on it is in force at any broker any more, − the end
  of its last flagged window (None: still in force when the recording ends);
* bystanders: every other resource on the brokers carrying it. ``bystander_rejected``: the attempts their brokers
  rejected (fast failure or a limiter) while the cause is on, in the replay (``replayed``), in the same cluster with
  no governor (``no_governor``: the model of the recording) and the refused-send lines the recording holds for them
  (``recorded``: a floor, as far as producers log); each also per minute of the cause;
* ``flag``: limited in the replay, but the recording flags no anomaly for it; ``why``: the reason of its first
  enforced decision (``gold/limits.reason``: the rule, its numbers).
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import polars as pl

from pipelines.sim.values_in_force import value_events


def resources(result, spans: dict) -> list[tuple[str, str]]:
    """Every resource limited (enforced) at some broker in the replay, and every resource with recorded ``spans``."""
    limited = {(rt, r) for _t, snap in result.in_force for _b, rt, r in snap}
    return sorted(limited | set(spans))


def _second(c, t) -> int:
    return int(np.ceil((pd.Timestamp(t) - c.start).total_seconds() - 1e-9))


def span_mask(c, spans: list) -> np.ndarray:
    """Per second of the run: inside one of ``spans`` (UTC ``[start, end)``)."""
    mask = np.zeros(c.T * 60, dtype=bool)
    for a, b in spans:
        mask[max(_second(c, a), 0):max(min(_second(c, b), c.T * 60), 0)] = True
    return mask


def target_per_second(c, events: list) -> np.ndarray:
    """The cluster-wide limit in force per second (NaN: none) from
    :func:`~pipelines.sim.values_in_force.value_events`."""
    out = np.full(c.T * 60, np.nan)
    times = [_second(c, t) for t, _v in events] + [c.T * 60]
    for (t, v), lo, hi in zip(events, times, times[1:]):
        out[max(lo, 0):max(min(hi, c.T * 60), 0)] = v
    return out


def pair_masks(c, key: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """(the resource's pairs, its bystanders' pairs: the other non-background pairs on the brokers carrying it)."""
    own = ((c.pairs["resource_type"] == key[0]) & (c.pairs["resource"] == key[1])).to_numpy()
    hosts = set(c.pairs.loc[own, "broker"])
    others = ~own & (c.pairs["kind"].isin(["topic", "group"])).to_numpy() & c.pairs["broker"].isin(hosts).to_numpy()
    return own, others


def bystander_rejected(cluster, key: tuple[str, str], mask: np.ndarray) -> float:
    """Attempts ``cluster`` rejected of ``key``'s bystanders in the seconds of ``mask``."""
    _own, others = pair_masks(cluster, key)
    return float(cluster.second_rejected[mask][:, others].sum()) if mask.any() else 0.0


def recorded_lines(refused: pl.DataFrame, cluster, key: tuple[str, str], spans: list) -> float:
    """The recording's refused-send lines of ``key``'s bystander topics on its brokers inside ``spans``."""
    own, _ = pair_masks(cluster, key)
    hosts = sorted(set(cluster.pairs.loc[own, "broker"]))
    name = key[1] if key[0] == "topic" else "%RETRY%" + key[1]
    total = 0
    for a, b in spans:
        total += refused.filter(pl.col("broker").is_in(hosts) & (pl.col("topic") != name)
                                & (pl.col("event_time") >= a) & (pl.col("event_time") < b)).height
    return float(total)


def resource_figures(result, key: tuple[str, str], spans: list, baseline=None,
                     refused: pl.DataFrame | None = None) -> dict:
    """The figures of one resource (module docstring) as a dict of plain values (UTC datetimes, floats, None)."""
    c = result.cluster
    events = value_events(result, key)
    limited = [(t, v) for t, v in events if not np.isnan(v)]
    first = limited[0] if limited else None
    onset = spans[0][0] if spans else None
    end = spans[-1][1] if spans else None
    on = span_mask(c, spans)
    minutes_on = on.sum() / 60.0
    target = target_per_second(c, events)
    own, _ = pair_masks(c, key)
    after = np.arange(c.T * 60) >= (_second(c, first[0]) if first else c.T * 60)
    bound = on & after & ~np.isnan(target)
    admitted = c.second_admitted[:, own].sum(axis=1)
    lifted = events[-1][0] if events and limited and np.isnan(events[-1][1]) else None
    replayed = bystander_rejected(c, key, on)
    row = {
        "resource_type": key[0], "resource": key[1], "flag": bool(limited) and not spans,
        "onset": onset, "cause_end": end, "spans": [list(x) for x in spans],
        "first_in_force": first[0].to_pydatetime() if first else None,
        "first_limit_qps": float(first[1]) if first else None,
        "first_limit_after_onset_s": (first[0] - pd.Timestamp(onset)).total_seconds() if first and onset else None,
        "changes": sum(1 for t, _v in events if first and first[0] < t and (end is None or t < pd.Timestamp(end))),
        "admitted_over_target": float(admitted[bound].sum() / target[bound].sum()) if bound.any() else None,
        "lifted_at": lifted.to_pydatetime() if lifted is not None else None,
        "lift_after_cause_end_min": (lifted - pd.Timestamp(end)).total_seconds() / 60.0
        if lifted is not None and end is not None else None,
        "peak_demand_tps": float(c.demand[own].sum(axis=0).max()) if own.any() else 0.0,
        "cause_minutes": minutes_on,
        "bystander_rejected": {"replayed": replayed,
                               "no_governor": bystander_rejected(baseline, key, on) if baseline is not None else None,
                               "recorded": recorded_lines(refused, c, key, spans) if refused is not None else None},
    }
    row["why"] = first_reason(result, key)
    row["bystander_rejected_per_minute"] = {k: (v / minutes_on if v is not None and minutes_on else None)
                                            for k, v in row["bystander_rejected"].items()}
    return row


def first_reason(result, key: tuple[str, str]) -> str | None:
    """The ``reason`` of ``key``'s first enforced ``set`` decision in the replay (None: none)."""
    lim = result.limits
    if not len(lim):
        return None
    mine = lim[(lim["resource_type"] == key[0]) & (lim["resource"] == key[1]) & (lim["action"] == "set")
               & (lim["mode"] == "enforce")].sort_values("version")
    return str(mine["reason"].iloc[0]) if len(mine) else None


def all_figures(result, spans: dict, baseline=None, refused: pl.DataFrame | None = None) -> list[dict]:
    """:func:`resource_figures` of every resource of :func:`resources`; ``spans``: (type, name) → its recorded
    spans."""
    return [resource_figures(result, key, spans.get(key, []), baseline, refused) for key in resources(result, spans)]


def cause_spans(cluster) -> dict[tuple[str, str], list[tuple[dt.datetime, dt.datetime]]]:
    """(type, name) → the spans of each cause of the cluster's incident (a recording's flagged windows)."""
    inc = cluster.incident
    return {(cz.resource_type, cz.resource): list(cz.active) for cz in (inc.causes if inc is not None else ())}
