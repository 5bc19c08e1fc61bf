"""Causes in time and several at once: when a cause starts and stops at any second, ramps and is rolled out
(:func:`second_spans`, :func:`strength`, :func:`truth_spans`), and the compound scenario's shape
(:func:`shape_compound`: storms of consumer groups and surges of topics at once). The scenarios of
:mod:`pipelines.sim.scenarios` use the first; its registry names the second ``compound``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.sim.spec import Cause, Incident, ScenarioSpec
from pipelines.sim.world import World


def second_spans(spec: ScenarioSpec, on: np.ndarray, fixed_once: bool = False) -> list[tuple[float, float | None]]:
    """The True runs of a per-minute mask as cause spans in seconds from the run's start: each starts
    ``onset_second`` into its first minute and ends ``fix_second`` (a fix, ``fixed_once``) or ``onset_second``
    (an episode of a cause on and off) into the minute after its last; None: to the end of the run."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], on.astype(np.int8), [0]])))
    end_second = spec.fix_second if fixed_once else spec.onset_second
    return [(a * 60.0 + spec.onset_second, None if b >= spec.minutes else b * 60.0 + end_second)
            for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist())]


def strength(spec: ScenarioSpec, spans: list[tuple[float, float | None]], ramp_minutes: float | None = None,
             rollout_minutes: float | None = None) -> np.ndarray:
    """Per minute: the mean level of a cause over the minute, 0-1, second by second: 0 before a span, rising
    linearly over ``ramp_minutes`` from its start, 1, falling linearly over ``rollout_minutes`` from its end (the
    fix rolled out). Whole minutes without ramp or roll-out give exactly 0 or 1."""
    T = spec.minutes
    t = np.arange(T * 60) + 0.5
    ramp = (spec.ramp_minutes if ramp_minutes is None else ramp_minutes) * 60.0
    roll = (spec.rollout_minutes if rollout_minutes is None else rollout_minutes) * 60.0
    level = np.zeros(T * 60)
    for a, b in spans:
        up = np.clip((t - a) / ramp, 0.0, 1.0) if ramp > 0 else (t >= a).astype(float)
        down = np.ones_like(t) if b is None else (np.clip((b + roll - t) / roll, 0.0, 1.0) if roll > 0
                                                  else (t < b).astype(float))
        level = np.maximum(level, np.minimum(up, down))
    return level.reshape(T, 60).mean(axis=1)


def truth_spans(spec: ScenarioSpec, spans: list[tuple[float, float | None]]) -> tuple:
    """UTC [start, end) of each cause span: from its first second to the end of its fix's roll-out (or the run)."""
    start, end = pd.Timestamp(spec.start_utc), spec.minutes * 60.0
    return tuple((start + pd.Timedelta(seconds=a), start + pd.Timedelta(
        seconds=end if b is None else min(end, b + spec.rollout_minutes * 60.0))) for a, b in spans)


def _mix(full: np.ndarray, base: np.ndarray, level: np.ndarray) -> np.ndarray:
    """``base`` moved towards ``full`` by ``level`` (0-1); exactly ``full`` where the level is 1."""
    return np.where(level >= 1.0, full, base + (full - base) * level)


def shape_compound(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident | None:
    """Several causes at once (``spec.causes``, each ramped and rolled out as :func:`strength` says): storms of
    consumer groups of the catalog (each send-back level spread over the group's subscriptions by what it consumes,
    each send-back costing ``storm_write_amplification`` unattributed writes on its broker) and surges of topics
    (the level spread over the topic's brokers by their shares), and flash sales (a topic's legitimate demand, ramped
    over its own minutes: no cause). A resource with several spans is one cause that comes back. Topic 0
    (``culprit_topic``) is on
    ``culprit_topic_brokers`` brokers: the one to spread a surge over several. The ground truth lists every cause
    (:class:`Cause`); the incident's culprit fields name the first."""
    causes = []
    if not spec.causes:  # the cluster as it is (the sweep sizes its causes on it)
        return None
    for kind, index, a, b, amount, required in spec.causes:
        spans = [(float(a), None if b < 0 else float(b))]
        # a flash sale is no cause: its demand ramps over its own minutes (the last field) and it is never limited
        level = strength(spec, spans, float(required), 0.0) if kind == "flash" else strength(spec, spans)
        on = level > 0
        n = int(on.sum())
        noise = 1.0 + rng.uniform(-spec.storm_noise, spec.storm_noise, n)
        if kind == "storm":
            subs = np.flatnonzero(world.sp_group == index)
            consumed = world.put_rate[world.sp_place[subs]].mean(axis=1)
            share = consumed / consumed.sum() if consumed.sum() > 0 else np.full(subs.size, 1.0 / subs.size)
            for sp, sh in zip(subs.tolist(), share.tolist()):
                p = int(world.sp_place[sp])
                full = amount * sh * noise
                world.sp_sendback_rate[sp, on] = _mix(full, world.sp_retry_fraction[sp] * world.put_rate[p, on],
                                                      level[on])
                world.broker_unattributed_put_rate[int(world.pl_broker[p]), on] += (
                    spec.storm_write_amplification * full * level[on])
            hosts = tuple(sorted({world.brokers[int(world.pl_broker[world.sp_place[sp]])] for sp in subs}))
            resource = ("group", str(world.group[index]))
        else:
            places = np.flatnonzero(world.pl_topic == index)
            for p in places.tolist():
                full = amount * world.pl_share[p] * noise
                base = world.put_rate[p, on]
                world.put_rate[p, on] = _mix(np.maximum(full, base), base, level[on])
            hosts = tuple(sorted(world.brokers[int(x)] for x in world.pl_broker[places]))
            resource = ("topic", str(world.topic[index]))
        if kind == "flash":
            continue
        causes.append(Cause(*resource, kind, truth_spans(spec, spans), spec.ramp_minutes * 60.0, bool(required),
                            hosts))
    merged: dict = {}  # a cause that comes back (several spans of one resource) is one cause
    for c in causes:
        key = (c.resource_type, c.resource)
        merged[key] = c if key not in merged else Cause(
            c.resource_type, c.resource, c.kind, tuple(sorted(merged[key].active + c.active)), c.ramp_seconds,
            merged[key].required and c.required, tuple(sorted(set(merged[key].brokers) | set(c.brokers))))
    causes = list(merged.values())
    first = causes[0]
    onset = min(c.active[0][0] for c in causes)
    return Incident(
        kind="compound", onset=pd.Timestamp(onset).floor("min").to_pydatetime(),
        culprit_group=first.resource if first.resource_type == "group" else None,
        culprit_topic=first.resource if first.resource_type == "topic" else None,
        culprit_broker=first.brokers[0] if first.brokers else None, active=first.active, causes=tuple(causes),
        detail="; ".join(f"{c.kind} of {c.resource_type} {c.resource} on {', '.join(c.brokers)} "
                         + ", ".join(f"{x:%H:%M:%S}-{y:%H:%M:%S}" for x, y in c.active)
                         + ("" if c.required else " (0.9-1.1x capacity: a limit allowed, not required)")
                         for c in causes))


