"""The catalog and the steady rates of a generated cluster: layers 1 and 2 of the model (layer 3, the stats
lines, is :mod:`pipelines.sim.traffic`).

1. **Catalog** (scenario independent, drawn first from the seed so that every scenario with the same seed has the
   same cluster): brokers ``broker-a``, ``broker-b`` …; topics, each hosted by one or two brokers (two with
   probability ``two_broker_topic_share``) with a base put rate drawn log-uniformly in
   [``base_tps_min``, ``base_tps_max``] msgs/s and an average message size; consumer groups, each subscribing one or
   two topics. Topic 0 is always ``culprit_topic`` (``pugc-content``) pinned to ``broker-a`` (and the next
   ``culprit_topic_brokers − 1`` brokers, equal shares or ``culprit_topic_shares``) and group 0 is always
   ``culprit_group`` (``get-pugc-to-ai-consumer``) subscribing it alone (article 001).
2. **Rates** (msgs/s per topic placement × minute): base rate × ``1 ± put_noise`` (uniform, independent per
   minute, so a steady series never moves more than (1+n)/(1-n) ≈ 1.22x minute to minute). A scenario function from
   :data:`pipelines.sim.scenarios.SCENARIOS` then edits the rate arrays of a :class:`World` (put rates,
   send-back rates, retry consumption, unattributed broker writes, pull latency factors) and names its incident.
   Renderers never look at scenarios.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd

from pipelines.sim.spec import STYLE_SUM, STYLE_TIMES, ScenarioSpec, broker_names, rng_streams

#: Word lists of generated topic and group names (``order-created``, ``bi-order-consumer``).
_TOPIC_WORDS = (
    ("order", "payment", "user", "inventory", "search", "feed", "comment", "push", "risk", "coupon",
     "logistics", "video", "audio", "ad", "im", "profile", "review", "cart", "refund", "live"),
    ("created", "updated", "events", "sync", "notify", "log", "changed", "audit", "index", "stream"),
)
_GROUP_WORDS = (
    ("bi", "search", "notify", "audit", "ml", "cache", "sync", "report", "billing", "crm"),
    ("order", "payment", "user", "inventory", "feed", "comment", "push", "risk", "coupon", "video"),
)


def broker_address(spec: ScenarioSpec, broker_index: int) -> str:
    """``ip:port`` of a broker: broker-a → 10.0.0.1:10911, broker-b → 10.0.0.2:10911 …"""
    return f"10.0.{broker_index // 250}.{broker_index % 250 + 1}:{spec.broker_port}"


def latency_style(broker_index: int) -> str:
    """Version mix: GROUP_GET_LATENCY prints TIMES/AVGRT from 4.9.3 (odd brokers), SUM/TPS/AVGPT up to 4.9.2."""
    return STYLE_TIMES if broker_index % 2 == 1 else STYLE_SUM


@dataclass
class World:
    """The catalog and the per-minute rate arrays a scenario function may edit (shapes: P placements, SP
    subscription-placements, GB group×broker retry topics, B brokers, T minutes). Index helpers find rows."""

    spec: ScenarioSpec
    brokers: list[str]
    minute_starts: pd.DatetimeIndex  # (T,) UTC
    topic: np.ndarray  # (N,) names
    topic_base_tps: np.ndarray  # (N,) msgs/s over all its brokers
    topic_bytes: np.ndarray  # (N,) average message size
    group: np.ndarray  # (G,) names
    pl_topic: np.ndarray  # (P,) topic index of a placement (topic hosted on a broker)
    pl_broker: np.ndarray  # (P,) broker index
    pl_share: np.ndarray  # (P,) share of the topic's traffic on that broker
    put_rate: np.ndarray  # (P, T) msgs/s
    sp_group: np.ndarray  # (SP,) group index of a subscription on one placement
    sp_place: np.ndarray  # (SP,) placement index
    sp_retry_fraction: np.ndarray  # (SP,) steady share of consumed msgs sent back
    sp_rt_ms: np.ndarray  # (SP,) base ms per pull
    sp_lagging: np.ndarray  # (SP,) bool: queues of this subscription lag a little
    sp_gb: np.ndarray  # (SP,) index of the group×broker retry topic
    gb_group: np.ndarray  # (GB,) group index
    gb_broker: np.ndarray  # (GB,) broker index
    gb_bytes: np.ndarray  # (GB,) average size of the group's retry messages
    gb_rt_ms: np.ndarray  # (GB,) base ms per pull of the retry topic
    # --- scenario overlays (NaN = the steady rule) ---
    sp_sendback_rate: np.ndarray  # (SP, T) msgs/s sent back; NaN → retry fraction × consumed
    gb_retry_get_rate: np.ndarray  # (GB, T) msgs/s consumed from %RETRY%; NaN → keeps up with its re-puts
    broker_unattributed_put_rate: np.ndarray  # (B, T) writes counted in BROKER_PUT_NUMS under no topic line
    broker_latency_factor: np.ndarray  # (B, T) pull latency multiplier
    broker_restart: np.ndarray | None = None  # (B, T) bool: the broker (re)starts in that minute (SUM 0, TPS NaN)

    @property
    def T(self) -> int:
        return len(self.minute_starts)

    def placement(self, topic_index: int, broker_index: int) -> int:
        hit = np.flatnonzero((self.pl_topic == topic_index) & (self.pl_broker == broker_index))
        if hit.size == 0:
            raise KeyError(f"topic {self.topic[topic_index]} is not hosted on {self.brokers[broker_index]}")
        return int(hit[0])

    def subscription(self, group_index: int, placement_index: int) -> int:
        hit = np.flatnonzero((self.sp_group == group_index) & (self.sp_place == placement_index))
        if hit.size == 0:
            raise KeyError(f"group {self.group[group_index]} does not consume placement {placement_index}")
        return int(hit[0])

    def retry_topic(self, group_index: int, broker_index: int) -> int:
        hit = np.flatnonzero((self.gb_group == group_index) & (self.gb_broker == broker_index))
        if hit.size == 0:
            raise KeyError(f"group {self.group[group_index]} consumes nothing on {self.brokers[broker_index]}")
        return int(hit[0])


def _log_uniform(rng: np.random.Generator, low: float, high: float, size: int) -> np.ndarray:
    return np.exp(rng.uniform(math.log(low), math.log(high), size))


def _word_names(rng: np.random.Generator, n: int, words: tuple[Sequence[str], Sequence[str]], fmt: str) -> list[str]:
    """``n`` distinct names from a shuffled product of two word lists, suffixed ``-2``, ``-3`` … once exhausted."""
    combos = [fmt.format(a, b) for a in words[0] for b in words[1]]
    order = rng.permutation(len(combos))
    c = len(combos)
    return [combos[order[i % c]] + (f"-{i // c + 1}" if i >= c else "") for i in range(n)]


def _second_choice(rng: np.random.Generator, first: np.ndarray, n: int) -> np.ndarray:
    """A second index different from ``first`` (uniform over the others); ``first`` when n == 1."""
    if n < 2:
        return first.copy()
    return (first + rng.integers(1, n, size=first.size)) % n


class _Placements(NamedTuple):
    """Where each topic lives: one row per (topic, broker) placement, sorted by broker then topic, with the topic's
    share of its puts there."""

    topic: np.ndarray
    broker: np.ndarray
    share: np.ndarray


class _Subscriptions(NamedTuple):
    """One row per (group, placement of a topic it consumes), sorted by group then placement: its steady send-back
    fraction, its pull latency (ms per pull) and whether its queues lag."""

    group: np.ndarray
    place: np.ndarray
    retry_fraction: np.ndarray
    rt_ms: np.ndarray
    lagging: np.ndarray


def build_world(spec: ScenarioSpec, rngs: Mapping[str, np.random.Generator] | None = None) -> World:
    """The scenario-independent catalog and steady rates (draws only from the ``catalog`` and ``traffic`` streams)."""
    rngs = rngs or rng_streams(spec.seed)
    rc, rt = rngs["catalog"], rngs["traffic"]
    B, N, G, T = spec.brokers, spec.topics, spec.groups, spec.minutes

    topic = np.array([spec.culprit_topic] + _word_names(rc, N - 1, _TOPIC_WORDS, "{}-{}"), dtype=object)
    group = np.array([spec.culprit_group] + _word_names(rc, G - 1, _GROUP_WORDS, "{}-{}-consumer"), dtype=object)
    base = _log_uniform(rc, spec.base_tps_min, spec.base_tps_max, N)
    size = _log_uniform(rc, spec.msg_bytes_min, spec.msg_bytes_max, N)
    pl = _placements(spec, rc)
    sp = _subscriptions(spec, rc, pl.topic)
    n_sp = sp.group.size

    # retry topics: one per (group, broker) the group consumes on
    sp_broker = pl.broker[sp.place]
    gb_codes, gb_uniques = pd.factorize(pd.Series(sp.group * B + sp_broker), sort=True)
    gb_key = np.asarray(gb_uniques, dtype=np.int64)
    first_sp = pd.Series(np.arange(n_sp)).groupby(gb_codes).first().to_numpy()

    noise = 1.0 + rt.uniform(-spec.put_noise, spec.put_noise, size=(pl.topic.size, T))
    put_rate = (base[pl.topic] * pl.share)[:, None] * noise

    return World(
        spec=spec, brokers=broker_names(B),
        minute_starts=pd.date_range(spec.start_utc, periods=T, freq="min"),
        topic=topic, topic_base_tps=base, topic_bytes=size, group=group,
        pl_topic=pl.topic, pl_broker=pl.broker, pl_share=pl.share, put_rate=put_rate,
        sp_group=sp.group, sp_place=sp.place, sp_retry_fraction=sp.retry_fraction, sp_rt_ms=sp.rt_ms,
        sp_lagging=sp.lagging, sp_gb=gb_codes.astype(np.int64),
        gb_group=gb_key // B, gb_broker=gb_key % B, gb_bytes=size[pl.topic[sp.place[first_sp]]],
        gb_rt_ms=sp.rt_ms[first_sp],
        sp_sendback_rate=np.full((n_sp, T), np.nan),
        gb_retry_get_rate=np.full((gb_key.size, T), np.nan),
        broker_unattributed_put_rate=np.zeros((B, T)),
        broker_latency_factor=np.ones((B, T)),
    )


def _placements(spec: ScenarioSpec, rc: np.random.Generator) -> _Placements:
    """Each topic on one broker, or two (``two_broker_topic_share``, half its puts each); the culprit topic pinned to
    the culprit broker, or on ``culprit_topic_brokers`` brokers from it on (equal shares, or
    ``culprit_topic_shares``)."""
    B, N, cb = spec.brokers, spec.topics, spec.culprit_broker_index
    first = rc.integers(0, B, size=N)
    two = (rc.random(N) < spec.two_broker_topic_share) & (B > 1)
    second = _second_choice(rc, first, B)
    first[0], two[0] = cb, False
    pl_topic = np.concatenate([np.arange(N), np.flatnonzero(two)])
    pl_broker = np.concatenate([first, second[two]])
    pl_share = np.where(np.concatenate([two, two[two]]), 0.5, 1.0)
    k = spec.culprit_topic_brokers  # the culprit topic on k brokers from the culprit broker on, equal shares
    if k > 1:
        pl_topic = np.concatenate([pl_topic, np.zeros(k - 1, dtype=pl_topic.dtype)])
        pl_broker = np.concatenate([pl_broker, (cb + np.arange(1, k)) % B])
        pl_share = np.where(pl_topic == 0, 1.0 / k, np.concatenate([pl_share, np.zeros(k - 1)]))
        if spec.culprit_topic_shares:  # the culprit broker's share first, then the next brokers' in turn
            pl_share[pl_topic == 0] = np.asarray(spec.culprit_topic_shares, dtype=float)
    order = np.lexsort((pl_topic, pl_broker))
    return _Placements(pl_topic[order], pl_broker[order], pl_share[order])


def _subscriptions(spec: ScenarioSpec, rc: np.random.Generator, pl_topic: np.ndarray) -> _Subscriptions:
    """Each group consumes 1-2 topics (``two_topic_group_share``; the culprit group the culprit topic alone) on every
    broker that carries them; ``retrying_subscription_share`` of them send back up to ``normal_retry_fraction_max``,
    ``lagging_queue_share`` lag."""
    N, G = spec.topics, spec.groups
    t1 = rc.integers(0, N, size=G)
    has2 = (rc.random(G) < spec.two_topic_group_share) & (N > 1)
    t2 = _second_choice(rc, t1, N)
    t1[0], has2[0] = 0, False
    sub_group = np.concatenate([np.arange(G), np.flatnonzero(has2)])
    sub_topic = np.concatenate([t1, t2[has2]])
    subs = pd.DataFrame({"group": sub_group, "topic": sub_topic})
    places = pd.DataFrame({"topic": pl_topic, "place": np.arange(pl_topic.size)})
    sp = subs.merge(places, on="topic", how="inner").sort_values(["group", "place"], kind="mergesort")
    sp_group, sp_place = sp["group"].to_numpy(), sp["place"].to_numpy()
    n_sp = sp_group.size
    retrying = rc.random(n_sp) < spec.retrying_subscription_share
    retry_fraction = np.where(retrying, rc.uniform(0.0, spec.normal_retry_fraction_max, n_sp), 0.0)
    rt_ms = _log_uniform(rc, spec.pull_rt_ms_min, spec.pull_rt_ms_max, n_sp)
    lagging = rc.random(n_sp) < spec.lagging_queue_share
    return _Subscriptions(sp_group, sp_place, retry_fraction, rt_ms, lagging)
