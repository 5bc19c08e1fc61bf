"""The sends a recording's failure logs show refused, each refused message counted once (for
:mod:`pipelines.sim.replay_demand`, which adds them back to the demand).

A failure line is one failed attempt on the broker it names (docs/contracts.md §1.2). A producer whose send a
broker refuses with ``SYSTEM_BUSY`` (code 2: fast failure or the limiter) may send it again at once to another broker
of the topic (apache/rocketmq ``DefaultMQProducerImpl.sendDefaultImpl``: up to 1 + ``retryTimesWhenSendFailed`` = 3
attempts within ``sendMsgTimeout``, 3000 ms, ``selectOneMessageQueue`` avoiding the last broker; code 2 retried by
Java clients from 5.3.0, PR #5845, never by the Go client, docs/rocketmq-formats.md §6-7). Its attempts leave one
line each. Without a message id in the line, one message's attempts are told apart by **chains**:

* lines of one client (``client``), producer group and topic, in time order;
* a line joins the oldest open chain of that key whose last line is at most :data:`RETRY_GAP_MS` before it, whose
  first line is at most :data:`SEND_TIMEOUT_MS` before it, that has fewer than ``attempts`` lines and whose last
  line names another broker (the same broker only for a topic on one broker); else it starts a chain;
* a line without a client, and the Java client's final exception (``... BrokersSent: [...]``: the whole send in
  one line), are a chain of their own.

Each chain is one refused message, counted at the broker and minute of its first attempt. A chain that ended with
attempts left was retried once more and not refused again: the message was admitted on another broker of the topic,
where the recording's stats already count it. That is certain for a chain of two or more lines (its client retries
code 2) and likely, with the ``retrying_share`` of ``conf/backtest.toml`` ``[clients]``, for a chain of one line (a
client that does not retry code 2 loses the message). Those expected deliveries are returned too, to be taken off
the other brokers' demand. Where a client's refused attempts follow each other closer than the retry gap on several
brokers, chains of different messages can merge: the count is then a lower bound.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from dataclasses import dataclass, field

import polars as pl

#: The longest wait between a failed attempt's line and the next attempt's, ms: a producer retries at once
#: ("resend at once"); a busy broker answers after ``waitTimeMillsInSendQueue`` (200 ms) plus its queue's period.
RETRY_GAP_MS = 1000
#: ``DefaultMQProducer.sendMsgTimeout``: every attempt of one send lies within this many ms of the first.
SEND_TIMEOUT_MS = 3000
#: The Java client's final exception of a send whose every attempt failed names the brokers it tried.
WHOLE_SEND_MARK = "BrokersSent:"
ADDED = {"minute": pl.Int64, "broker": pl.Utf8, "topic": pl.Utf8, "messages": pl.Float64}
DELIVERED = {"minute": pl.Int64, "last_broker": pl.Utf8, "topic": pl.Utf8, "messages": pl.Float64}


@dataclass
class _Chain:
    topic: str
    first_ms: int
    first_broker: str
    last_ms: int
    last_broker: str
    lines: int = 1
    whole: bool = False
    version: int = 0


@dataclass
class Refused:
    """Refused messages (``added``: :data:`ADDED` columns, per minute index from the recording's start, the broker
    of the first attempt and the topic), the expected deliveries on other brokers (``delivered``: :data:`DELIVERED`,
    per minute of the chain's last line, its broker and topic) and counts for the report (``lines``, ``chains``,
    ``chains_by_lines``: attempts per chain → chains)."""

    added: pl.DataFrame
    delivered: pl.DataFrame
    lines: int = 0
    chains: int = 0
    chains_by_lines: dict = field(default_factory=dict)


class _Key:
    """The open chains of one (client, producer group, topic): per broker, the chains a line there may join, oldest
    first (:meth:`offer` puts a chain under every broker but its last one)."""

    def __init__(self, brokers: tuple[str, ...]) -> None:
        self.brokers, self.waiting = brokers, {}

    def join(self, ms: int, broker: str, attempts: int) -> _Chain | None:
        queue = self.waiting.get(broker)
        while queue:
            chain, version = queue[0]
            queue.popleft()
            if (version != chain.version or chain.lines >= attempts or ms - chain.last_ms > RETRY_GAP_MS
                    or ms - chain.first_ms > SEND_TIMEOUT_MS):
                continue  # changed since it was offered here, full, or too old
            chain.lines, chain.last_ms, chain.last_broker, chain.version = chain.lines + 1, ms, broker, version + 1
            return chain
        return None

    def offer(self, chain: _Chain) -> None:
        """``chain`` may take a next attempt on the topic's other brokers (on its one broker when alone)."""
        others = [b for b in self.brokers if b != chain.last_broker] or [chain.last_broker]
        for b in others:
            self.waiting.setdefault(b, deque()).append((chain, chain.version))


def chains(lines: pl.DataFrame, topic_brokers: dict[str, tuple[str, ...]], attempts: int) -> list[_Chain]:
    """The chains of ``lines`` (columns ``event_time`` UTC, ``broker``, ``topic``, ``producer_group``, ``client``,
    ``message``), in the order they started (module docstring). ``topic_brokers``: each topic's brokers in the
    recording (a topic missing: only the brokers its lines name)."""
    ordered = lines.with_columns(ms=pl.col("event_time").dt.epoch("ms")).sort(
        ["client", "producer_group", "topic", "ms"], nulls_last=True)
    out: list[_Chain] = []
    keys: dict[tuple, _Key] = {}
    for ms, broker, topic, group, client, message in zip(
            ordered["ms"], ordered["broker"], ordered["topic"], ordered["producer_group"], ordered["client"],
            ordered["message"]):
        whole = message is not None and WHOLE_SEND_MARK in message
        if client is None or whole:
            out.append(_Chain(topic, ms, broker, ms, broker, whole=whole))
            continue
        key = keys.get((client, group, topic))
        if key is None:
            key = keys[(client, group, topic)] = _Key(topic_brokers.get(topic) or (broker,))
        chain = key.join(ms, broker, attempts)
        if chain is None:
            chain = _Chain(topic, ms, broker, ms, broker)
            out.append(chain)
        key.offer(chain)
    return out


def refused_messages(lines: pl.DataFrame, topic_brokers: dict[str, tuple[str, ...]], start: dt.datetime,
                     attempts: int, retrying_share: float) -> Refused:
    """Each refused message once (:class:`Refused`; module docstring): ``lines`` the recording's refused lines,
    ``start`` its first minute (UTC), ``attempts`` the producers' attempts per send (``[clients] producer_attempts``),
    ``retrying_share`` the share of one-line chains whose client retried code 2 (``[clients] retrying_share``)."""
    found = chains(lines, topic_brokers, attempts)
    base = int(start.timestamp() * 1000)
    added, delivered, by_lines = [], [], {}
    for chain in found:
        topic = chain.topic
        by_lines[chain.lines] = by_lines.get(chain.lines, 0) + 1
        added.append(((chain.first_ms - base) // 60_000, chain.first_broker, topic, 1.0))
        if not chain.whole and chain.lines < attempts:
            share = 1.0 if chain.lines >= 2 else retrying_share
            if share > 0:
                delivered.append(((chain.last_ms - base) // 60_000, chain.last_broker, topic, share))
    add = pl.DataFrame(added, schema=ADDED, orient="row").group_by(["minute", "broker", "topic"]).agg(
        pl.col("messages").sum())
    dlv = pl.DataFrame(delivered, schema=DELIVERED, orient="row").group_by(["minute", "last_broker", "topic"]).agg(
        pl.col("messages").sum())
    return Refused(add, dlv, lines.height, len(found), dict(sorted(by_lines.items())))

