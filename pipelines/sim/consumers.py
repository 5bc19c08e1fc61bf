"""A working consumer sends back a share of what it consumes (:class:`Consumers`), in the closed-loop cluster
(:class:`pipelines.sim.cluster.ClosedLoopCluster`).

The World sets each group's send-back demand as a share of the demanded puts of the topics it consumes
(:mod:`pipelines.sim.traffic`). A consumer consumes what the brokers admitted of them, though: under a limit on a
topic, or its busy broker, a working consumer receives less and sends back its share of that. So its send-back
demand follows the admitted share of its topics' demand, per second. A broken consumer's does not: it re-consumes
its failed messages locally and sends them back whatever it receives (apache/rocketmq
``ConsumeMessageConcurrentlyService.submitConsumeRequestLater``; :mod:`pipelines.sim.cluster`).

Without this rule a working consumer of a limited topic reads as a retry storm: a topic limited from 9,892 to
29.9 msg/s whose consumer kept sending back 1 % of the demand (54.6 msg/s) beside the 29.9 msg/s it consumed
(docs/decisions.md §7).
"""

from __future__ import annotations

import numpy as np

from pipelines import rocketmq as rmq


class Consumers:
    """Per consumer group with retry traffic: its pairs, the pairs of the topics it consumes (its ``GROUP_GET_NUMS``
    keys, retry topics left out) and the minutes it is broken. ``scale`` (per pair, 1 = the World's demand): the
    share of its send-back demand a group's pair sends now; ``scaled``: some pair's is under 1."""

    def __init__(self, groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]], pairs: int) -> None:
        self.groups = groups
        self.scale = np.ones(pairs)
        self.scaled = False

    @classmethod
    def of(cls, cluster) -> Consumers:
        """The consumer groups of a :class:`~pipelines.sim.cluster.ClosedLoopCluster` (its ``traffic``, ``pairs``
        and :meth:`~pipelines.sim.cluster.ClosedLoopCluster.broken`)."""
        rows = cluster.traffic[cluster.traffic["stat_name"].astype(str) == rmq.GROUP_GET_NUMS]
        consumed: dict[str, set[str]] = {}
        for key in rows["stats_key"].astype(str).unique():
            topic, _, group = key.rpartition("@")
            if topic and not topic.startswith(rmq.RETRY_TOPIC_PREFIX):
                consumed.setdefault(group, set()).add(topic)
        kind, name = cluster.pairs["resource_type"].to_numpy(), cluster.pairs["resource"].to_numpy()
        groups = []
        for group, topics in sorted(consumed.items()):
            own = np.flatnonzero((kind == "group") & (name == group))
            if own.size:
                groups.append((own, np.flatnonzero((kind == "topic") & np.isin(name, sorted(topics))),
                               cluster.broken(group)))
        return cls(groups, len(cluster.pairs))

    def follow(self, offered: np.ndarray, admitted: np.ndarray, m: int) -> None:
        """``scale`` in minute ``m`` from the cluster's ``offered`` and ``admitted`` (minute × pair × stream): a
        working group's pairs at the share of its topics' demand (stream 0) the brokers admitted so far in the
        minute (the minute before, before any; at most 1); a broken group's, and every other pair's, at 1."""
        scale = self.scale
        scale[:] = 1.0
        for group_pairs, topic_pairs, broken in self.groups:
            if broken[m] or not topic_pairs.size:
                continue
            minute = m if offered[m, topic_pairs, 0].sum() > 0 else m - 1
            if minute < 0:
                continue
            wanted = offered[minute, topic_pairs, 0].sum()
            if wanted > 0:
                scale[group_pairs] = min(admitted[minute, topic_pairs].sum() / wanted, 1.0)
        self.scaled = bool((scale < 1.0).any())

    def reset(self) -> None:
        """Every pair at the World's demand (a tick that admits every request: the consumers receive it all)."""
        if self.scaled:
            self.scale[:] = 1.0
            self.scaled = False

    def demand(self, cluster, k: int, per_tick: np.ndarray) -> np.ndarray:
        """Tick ``k``'s demand of the cluster's pairs (requests per tick; ``per_tick``: its minute's, the World's),
        each working group's at :attr:`scale`, followed (:meth:`follow`) at the first tick of each second."""
        if k == 0 or int(k * cluster.dt + 1e-9) != int((k - 1) * cluster.dt + 1e-9):
            self.follow(cluster.offered, cluster.admitted, k // cluster.ticks_per_minute)
        return per_tick * self.scale if self.scaled else per_tick
