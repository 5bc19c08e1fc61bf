"""The limiter's own view in the Spark-free closed loop: what the RocketMQ admin sink reads of the
brokers' limiters, simulated, for a world whose observation mode is ``limiter_view``
(:attr:`pipelines.sim.irregular.Irregularity.limiter_view`).

Production has two observation modes. With the file write-back alone (``control/limits.json``, no admin sink) the
governor knows of a limiter's rejections only what the producers log of them (``[RateLimit]`` send failures, as
complete as their logging and shipping: :class:`pipelines.sim.cluster.ClientConfig`); a consumer's rejected
send-backs and fallback sends leave nothing. Where the RocketMQ admin sink is on
(:class:`pipelines.writeback.rocketmq_sink.RocketMQAdminSink`), every publish reads each master's limiters (VIEW):
per limiter key (a topic, or ``%RETRY%<group>``) its ``lastRateLimitTimestamp``, the time of the last send it
rejected; :meth:`pipelines.writeback.sinks.SinkSet.rejection_rows` turns each move of it into a
``control/limiter_rejections`` row, which the gold flow reads for its windows (``FinalInputs.limiter_rejections``).

:class:`AdminSinkView` is that sink against :class:`pipelines.sim.cluster.ClosedLoopCluster`: its token buckets count
the sends each one rejected (its own ``RATE_LIMITED`` rejections, never a busy broker's fast failures) and the tick
of the last one. The poll period is the real sink's, with no setting of its own: it reads the limiters within each
publish (:meth:`pipelines.writeback.sinks.SinkSet.publish_all`), so the loop polls wherever it publishes (every gold
micro-batch that finalized windows, every fast one that decided; ``windows.trigger_seconds`` and
``windows.fast_trigger_seconds``), and the rows are those of ``SinkSet.rejection_rows`` (tests/sim/test_limiter_view.py
holds them equal): a row only for a limiter whose last rejection moved since the poll before, read by the next gold
batch, not by the one that polled.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from pipelines import columns
from pipelines import rocketmq as rmq
from pipelines.decide.arrow import from_rows
from pipelines.sim.cluster import ClosedLoopCluster

NAMES = [name for name, _ in columns.LIMITER_REJECTIONS]


class AdminSinkView:
    """The RocketMQ admin sink's view of ``cluster``'s limiters (module docstring). ``name``, ``status`` and
    :attr:`last_rejections` are those of :class:`pipelines.writeback.sinks.ReadsLimiters`."""

    name = "rocketmq"

    def __init__(self, cluster: ClosedLoopCluster) -> None:
        self.cluster = cluster
        self.status: dict[str, str] = {}
        self.last_rejections: dict[tuple[str, str], int] = {}
        self.keys = [(b, rmq.RETRY_TOPIC_PREFIX + r if t == "group" else r) for b, t, r in zip(
            cluster.pairs["broker"], cluster.pairs["resource_type"], cluster.pairs["resource"])]
        self.rows: list[tuple] = []
        self._recorded: dict[tuple[str, str], int] = {}  # (broker, key) → the last rejection already recorded

    def read(self) -> None:
        """One VIEW of every broker: per limiter key its last rejection (epoch ms, UTC, the middle of the tick
        it rejected in, as its failure lines are stamped; -1: none yet), as the cluster has run so far."""
        c = self.cluster
        start_ms = int(c.start.value // 1_000_000)
        self.last_rejections = {key: (start_ms + int(round((tick + 0.5) * c.dt * 1000.0)) if tick >= 0 else -1)
                                for key, tick in zip(self.keys, c.limiter_last_tick.tolist())}

    def poll(self, now: dt.datetime, batch_id: int) -> list[tuple]:
        """A publish at ``now`` (UTC) of micro-batch ``batch_id``: read the limiters, keep the
        :data:`pipelines.schemas.LIMITER_REJECTIONS` rows of the last rejections that moved; returns them."""
        self.read()
        seen_at, new = _naive(now), []
        for (broker, key), at_ms in sorted(self.last_rejections.items()):  # as SinkSet.rejection_rows
            if at_ms <= 0 or self._recorded.get((broker, key)) == at_ms:
                continue
            self._recorded[(broker, key)] = at_ms
            at = dt.datetime.fromtimestamp(at_ms / 1000.0, dt.timezone.utc).replace(tzinfo=None)
            new.append((seen_at, self.name, broker, key, at, batch_id))
        self.rows += new
        return new

    def table(self, since: dt.datetime, before: dt.datetime) -> pa.Table:
        """The rows polled so far whose ``last_rejected_at`` is in ``[since, before)`` (UTC), as the gold flow reads
        ``control/limiter_rejections`` for its windows."""
        lo, hi = _naive(since), _naive(before)
        rows = [r for r in self.rows if lo <= r[4] < hi]
        return from_rows([dict(zip(NAMES, r)) for r in rows], columns.LIMITER_REJECTIONS)


def _naive(t: dt.datetime) -> dt.datetime:
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo else t

