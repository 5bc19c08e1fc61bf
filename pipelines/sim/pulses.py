"""Pulsed producers: while a surge cause is active, its topic's producers send in pulses, as a batch job
flushing its buffer does. The first ``pulse_on_seconds`` of every ``pulse_period_seconds`` (whole seconds from the
scenario's start, every broker of the topic at once) carry the minute's demand times ``period ÷ on``; the rest of
the period carries none, so the minute's mean is the stats' demand (:class:`pipelines.sim.cluster.ClientConfig`
``pulse_*``; 0: steady producers).

A minute line shows only that mean. A limit between the mean and the pulses' rate rejects in each pulse while the
minute's admitted rate stays well under the cap: only the producers' logged refusals tell the limit still binds.
The checks of the admitted rate judge the seconds the producers send (:func:`sending_nothing`): a limiter has
nothing to admit between the pulses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.sim.spec import span_seconds


@dataclass(frozen=True)
class Pulses:
    """A cluster's pulses: ``pairs`` (bool per pair: a surge cause's topic), ``active`` (pulsed pairs × seconds: its
    cause active), ``minute`` (bool per minute: a pulsed pair active in it), ``off`` (bool per second of the run: a
    pulsed pair active and between pulses); ``tick`` (s), ``every`` and ``on`` (the period and a pulse, in ticks),
    ``scale`` (the demand's factor in a pulse)."""

    pairs: np.ndarray
    active: np.ndarray
    minute: np.ndarray
    off: np.ndarray
    tick: float = 0.1
    every: int = 1
    on: int = 1
    scale: float = 1.0

    @classmethod
    def of(cls, cluster) -> "Pulses":
        """The pulses of ``cluster`` (a :class:`~pipelines.sim.cluster.ClosedLoopCluster`: its clients, incident,
        pairs, start, ``T`` minutes and tick); none without ``pulse_*`` settings or a surge cause."""
        n, L = cluster.T * 60, len(cluster.pairs)
        none = cls(np.zeros(L, dtype=bool), np.zeros((0, n), dtype=bool), np.zeros(cluster.T, dtype=bool),
                   np.zeros(n, dtype=bool))
        period, on = cluster.clients.pulse_period_seconds, cluster.clients.pulse_on_seconds
        inc = cluster.incident
        if not period or not on or on >= period or inc is None or not inc.causes:
            return none
        spans: dict[str, list] = {}
        for cz in inc.causes:
            if cz.kind == "surge" and cz.resource_type == "topic":
                spans.setdefault(cz.resource, []).extend(cz.active)
        key = list(zip(cluster.pairs["resource_type"], cluster.pairs["resource"]))
        pairs = np.array([rt == "topic" and r in spans for rt, r in key], dtype=bool)
        if not pairs.any():
            return none
        active = np.array([span_seconds(cluster.start, n, spans[key[i][1]]) for i in np.flatnonzero(pairs)])
        anywhere = active.any(axis=0)
        return cls(pairs, active, anywhere.reshape(cluster.T, 60).any(axis=1), anywhere & (np.arange(n) % period >= on),
                   cluster.dt, int(round(period / cluster.dt)), int(round(on / cluster.dt)), period / on)

    def demand(self, k: int, per_tick: np.ndarray) -> np.ndarray:
        """Tick ``k``'s demand (requests per tick per pair; ``per_tick``: its minute's, steady) with the pulses."""
        second = int(k * self.tick + 1e-9)
        if not self.minute[second // 60]:
            return per_tick
        out = per_tick.copy()
        out[np.flatnonzero(self.pairs)[self.active[:, second]]] *= self.scale if k % self.every < self.on else 0.0
        return out


def sending_nothing(cluster) -> np.ndarray:
    """Per second of the run: a pulsed producer of a surging topic is between pulses and sends nothing
    (:attr:`Pulses.off`; all False without pulses, or for a cluster that has none: the Spark backtest's)."""
    pulses = getattr(cluster, "pulses", None)
    return pulses.off if pulses is not None else np.zeros(cluster.T * 60, dtype=bool)
