"""Scenario generator: synthetic RocketMQ ``stats.log`` lines and producer send failures for a landing directory.

Usage::

    python -m pipelines.sim --out DIR [--scenario retry_storm] [--seed 7] [--minutes 90]
                                 [--start 2022-02-08T06:39:00Z] [--brokers 3] [--topics 30] [--groups 20]
                                 [--envelope-share 0.3]

What it writes (``docs/contracts.md`` §1)::

    DIR/broker_stats/<broker>/stats.log          raw stats.log lines (the folder names the broker)
    DIR/broker_stats/shipper/<broker>.jsonl      the same lines in log-shipper JSON envelopes, for a share of brokers
    DIR/send_failures/failures-<broker>.jsonl    one failed send per JSON line (§1.2 fields)

The model, in three layers
--------------------------
1. **Catalog** (scenario independent, drawn first from the seed so that every scenario with the same seed has the
   same cluster): brokers ``broker-a``, ``broker-b`` …; topics, each hosted by one or two brokers (two with
   probability ``two_broker_topic_share``) with a base put rate drawn log-uniformly in
   [``base_tps_min``, ``base_tps_max``] msgs/s and an average message size; consumer groups, each subscribing one or
   two topics. Topic 0 is always ``culprit_topic`` (``pugc-content``) pinned to ``broker-a`` and group 0 is always
   ``culprit_group`` (``get-pugc-to-ai-consumer``) subscribing it alone (article 001).
2. **Rates** (msgs/s per topic placement × minute): base rate × ``1 ± put_noise`` (uniform, independent per
   minute, so a steady series never moves more than (1+n)/(1-n) ≈ 1.22x minute to minute). A scenario function from
   :data:`SCENARIOS` then edits the rate arrays of a :class:`World` (put rates, send-back rates, retry consumption,
   unattributed broker writes, pull latency factors) and names its incident. Renderers never look at scenarios.
3. **Realisation** into the model frame of :func:`build_traffic`, one row per
   (minute, broker, stat_name, stats_key) — the numbers RocketMQ would print (``docs/rocketmq-formats.md`` §2-3):

   * ``TOPIC_PUT_NUMS`` / ``TOPIC_PUT_SIZE`` per hosted topic (AVGPT 1.00 msgs per put; SIZE: SUM = bytes,
     TPS = bytes/s, AVGPT = bytes per put).
   * ``GROUP_GET_NUMS`` / ``GROUP_GET_SIZE`` per ``topic@group``: the group keeps up with the put rate
     (``1 ± get_noise``); AVGPT = msgs (bytes) per pull, a pull returning at most ``max_msgs_per_pull`` (32).
   * ``SNDBCK_PUT_NUMS`` per ``topic@group``: a fraction in [0, ``normal_retry_fraction_max``] (0-1 %) of the
     consumed messages for ``retrying_subscription_share`` of the subscriptions. The key keeps the *original*
     topic even for retries of retries (``PROPERTY_RETRY_TOPIC``, §3). Every sent-back message is re-put into
     ``%RETRY%<group>`` on the same broker when its delay level expires (ScheduleMessageService increments
     ``TOPIC_PUT_NUMS`` and ``BROKER_PUT_NUMS`` for that re-put), and the group consumes it again
     (``GROUP_GET_NUMS [%RETRY%g@g]``). Delay levels (10 s … 2 h) are ignored: the re-put lands in the same minute.
   * ``GROUP_GET_LATENCY`` per ``queueId@topic@group`` (``queues_per_topic`` = 4 queues, 1 for retry topics):
     ``TIMES: n AVGRT: x`` on brokers >= 4.9.3 (odd broker indexes: ``broker-b``, ``broker-d`` …) and
     ``SUM/TPS/AVGPT`` (SUM = total ms, AVGPT = ms per pull) on <= 4.9.2 brokers (even indexes: ``broker-a`` …) (§2).
   * ``GROUP_GET_FALL_SIZE`` ``Stats Every 5 Minutes, Value: n`` per ``queueId@topic@group`` at stamps whose minute
     is a multiple of 5: bytes behind (a random lag for ``lagging_queue_share`` of the queues; the real retry
     backlog for retry topics). The model row of a 5-minute line has ``minute_start`` = stamp − 1 min.
   * ``BROKER_PUT_NUMS`` / ``BROKER_GET_NUMS`` keyed by the cluster name (``brokerClusterName``, not the broker),
     AVGPT 0.00 (value only, times never incremented); SUM = the broker's topic puts / gets ± ``broker_stat_jitter``
     (different item, different sampling instants: real logs show 1290 vs 1291), plus any unattributed writes.

   Items are created lazily (§2): a series prints from the first minute it has traffic, then every minute (SUM 0
   when idle). The first minute of every broker is its start: every minute line prints
   ``SUM: 0 TPS: NaN AVGPT: 0.00`` (``TIMES: 0 AVGRT: 0.00``), as seen in real logs (§2, §8).

Rendering (``docs/rocketmq-formats.md`` §1-2, §8)
-----------------------------------
``%d{yyy-MM-dd HH:mm:ss,GMT+8} %p - %m%n``: the stamp is UTC + ``gmt_offset_hours`` (8), second precision.
A minute line stamped T covers the minute [T − 60 s, T), i.e. ``stamp = minute_start + 1 min``. Formats are
``String.format("SUM: %d TPS: %.2f AVGPT: %.2f")`` with TPS = SUM / 60 s (Java rounds half-up; values are nudged by
1e-12 relative so that exact binary ties round like Java), ``TIMES: %d AVGRT: %.2f`` and ``Value: %d``.
At each hour boundary ``Stats In One Hour,`` lines for ``TOPIC_PUT_NUMS`` (window: the last 60 minutes the broker
has been up; TPS: NaN when it has been up < 10 minutes, the hour list then holding one snapshot); at midnight GMT+8
``Stats In One Day,`` lines (NaN when up < 60 minutes). Lines of one stamp are shuffled (hash-map order, hour/day
lines interleaved with that minute's lines); stamps are in time order.

The ``retry_storm`` scenario (article 001, ``docs/background.md``)
----------------------------------------------------------------------
Before the onset (default minute ``minutes * 2 // 3``) ``broker-a`` writes about ``culprit_broker_normal_put_per_min``
= 30,000 msgs/min (its topics are scaled to that; ``pugc-content`` is ``culprit_topic_tps`` = 330 msgs/s of it).
From the onset the group stops acknowledging: the consumer runs at its capacity ``culprit_consume_tps`` (790
msgs/s: the original topic at its put rate, the rest of the capacity spent on its own retry topic) and sends back
``storm_sendback_fraction`` of everything it consumes, so ``SNDBCK_PUT_NUMS [pugc-content@get-pugc-to-ai-consumer]``
and ``TOPIC_PUT_NUMS [%RETRY%get-pugc-to-ai-consumer]`` ≈ 785.32 TPS = SUM 47,119/min (the article's line),
``GROUP_GET_NUMS [%RETRY%…@…]`` jumps from ~1 to ~460 msgs/s, and the retry backlog grows (FALL_SIZE).
The article gives broker-a's write volume as 30,000 → 225,400 msgs/min (~7.5x) but attributes only the 47,119 of
the retry topic; RocketMQ's own stats explain no more (a send-back is written to ``SCHEDULE_TOPIC_XXXX`` without a
``BROKER_PUT_NUMS`` increment). The model therefore adds the remainder to broker-a's ``BROKER_PUT_NUMS`` as
*unattributed* writes (no topic line) so that no false culprit topic appears: during the storm broker-a's
``BROKER_PUT_NUMS`` ≈ 225,400/min while the sum of its ``TOPIC_PUT_NUMS`` lines is ≈ 77,000/min. Pull latency on
broker-a rises ``storm_latency_factor``-fold. From onset + 1 minute producers of broker-a's business topics get
``[TIMEOUT_CLEAN_QUEUE]broker busy`` (code 2, ``waitTimeMillsInSendQueue`` = 200 ms, §5) at about
``busy_failures_per_min`` per minute, in Java (``CODE: 2  DESC: … BROKER: ip:port`` + FAQ url, §6) and Go
(``CODE: 2, DESC: …``, §7) text, ``code`` null for ``null_code_share`` of them.
Every scenario also has a trickle of ordinary failures on every broker: ``RemotingTimeoutException: wait response on
the channel <ip:port> timeout, 3000(ms)`` / Go ``request timeout`` (code null) and a few ``TOPIC_NOT_EXIST`` (17).
``steady`` is the same cluster, same seed-drawn traffic and trickle, without the incident.

Randomness: one ``numpy.random.default_rng(seed)`` spawns a child generator per stage (:data:`RNG_STREAMS`), so a
scenario that draws more numbers does not shift the catalog or the base noise. Same spec (with ``start``) →
byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

# --- RocketMQ names (docs/rocketmq-formats.md §3) -------------------------------------------------------------------------------
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
GROUP_GET_LATENCY = "GROUP_GET_LATENCY"
GROUP_GET_FALL_SIZE = "GROUP_GET_FALL_SIZE"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
RETRY_PREFIX = "%RETRY%"  # MixAll.RETRY_GROUP_TOPIC_PREFIX

#: Line styles (docs/rocketmq-formats.md §2): StatsItem ``SUM/TPS/AVGPT``, RTStatsItem ``TIMES/AVGRT``, MomentStatsItem ``Value``.
STYLE_SUM, STYLE_TIMES, STYLE_VALUE = "SUM", "TIMES", "VALUE"
#: ``period`` values, as in silver/broker_stats (docs/contracts.md §2).
PERIOD_TEXT: dict[str, str] = {
    "minute": "Stats In One Minute",
    "hour": "Stats In One Hour",
    "day": "Stats In One Day",
    "5min": "Stats Every 5 Minutes",
}
#: Columns of the model frame returned by :func:`build_traffic`.
TRAFFIC_COLUMNS: tuple[str, ...] = (
    "minute_start", "broker", "stat_name", "stats_key", "period", "style", "sum", "tps", "avgpt", "times",
)
#: Columns of the send-failure frame: docs/contracts.md §1.2, then two helpers that are not written to the landing.
FAILURE_COLUMNS: tuple[str, ...] = (
    "ts", "topic", "broker", "producer_group", "client", "code", "message", "latency_ms",
)
FAILURE_EXTRA_COLUMNS: tuple[str, ...] = ("event_time", "expected_class")
#: One child generator per stage, spawned from ``default_rng(seed)`` in this order.
RNG_STREAMS: tuple[str, ...] = ("catalog", "traffic", "scenario", "realise", "failures", "render")

_MINUTE = pd.Timedelta(minutes=1)
_JAVA_HALF_UP = 1.0 + 1e-12  # relative nudge so that exact binary ties round half-up like java.util.Formatter
_TOPIC_WORDS = (
    ("order", "payment", "user", "inventory", "search", "feed", "comment", "push", "risk", "coupon",
     "logistics", "video", "audio", "ad", "im", "profile", "review", "cart", "refund", "live"),
    ("created", "updated", "events", "sync", "notify", "log", "changed", "audit", "index", "stream"),
)
_GROUP_WORDS = (
    ("bi", "search", "notify", "audit", "ml", "cache", "sync", "report", "billing", "crm"),
    ("order", "payment", "user", "inventory", "feed", "comment", "push", "risk", "coupon", "video"),
)


# ====================================================================================================================
# Spec
# ====================================================================================================================
@dataclass(frozen=True)
class ScenarioSpec:
    """Everything that determines a generated landing directory. Same spec (with ``start``) → same bytes."""

    # --- run -------------------------------------------------------------------------------------------------------
    name: str = "retry_storm"  # key of SCENARIOS
    seed: int = 7  # numpy.random.default_rng(seed)
    start: datetime | None = None  # UTC start of the first minute; None → current UTC minute − minutes
    minutes: int = 90  # minutes of traffic (one minute line per series per minute)
    brokers: int = 3  # broker-a, broker-b, …
    topics: int = 30  # business topics (topic 0 = culprit_topic)
    groups: int = 20  # consumer groups (group 0 = culprit_group)
    cluster: str = "DefaultCluster"  # brokerClusterName: the key of BROKER_PUT_NUMS / BROKER_GET_NUMS (docs/rocketmq-formats.md §3)
    envelope_share: float = 0.3  # share of brokers whose lines arrive in shipper JSON envelopes (docs/contracts.md §1.1)
    gmt_offset_hours: int = 8  # stats.log stamps are rendered in GMT+8 whatever the host zone (docs/rocketmq-formats.md §1)

    # --- steady traffic (brief: log-uniform 1-300 msgs/s, ±10 % noise) ---------------------------------------------
    base_tps_min: float = 1.0  # lowest base put rate of a topic, msgs/s
    base_tps_max: float = 300.0  # highest base put rate of a topic, msgs/s
    put_noise: float = 0.10  # per-minute multiplicative noise on put rates (uniform ±)
    get_noise: float = 0.05  # per-minute noise of consumption around the put rate (consumers keep up)
    size_noise: float = 0.02  # per-minute noise of the average message size
    msg_bytes_min: int = 256  # smallest average message size of a topic, bytes (log-uniform)
    msg_bytes_max: int = 8192  # largest average message size of a topic, bytes
    two_broker_topic_share: float = 0.5  # share of topics hosted by two brokers (each topic on 1-2 brokers)
    two_topic_group_share: float = 0.5  # share of groups subscribing two topics (each group 1-2 topics)
    retrying_subscription_share: float = 0.5  # share of subscriptions with a small steady retry rate
    normal_retry_fraction_max: float = 0.01  # steady SNDBCK_PUT_NUMS ≤ 1 % of what the group consumes
    queues_per_topic: int = 4  # read queues per topic per broker (defaultTopicQueueNums)
    retry_queues: int = 1  # %RETRY% topics have one queue
    max_msgs_per_pull: int = 32  # pullBatchSize: a pull returns at most this many messages
    max_pulls_per_queue_per_s: float = 5.0  # pull cadence of a busy queue (sets AVGPT of GROUP_GET_NUMS)
    pull_rt_ms_min: float = 0.2  # GROUP_GET_LATENCY: per-subscription base ms per pull (log-uniform)
    pull_rt_ms_max: float = 3.0
    pull_rt_noise: float = 0.2  # per-minute noise of pull latency
    lagging_queue_share: float = 0.2  # share of consumer queues with a non-zero GROUP_GET_FALL_SIZE
    lag_seconds_max: float = 2.0  # such a queue lags up to this many seconds of its traffic
    broker_stat_jitter: float = 0.001  # BROKER_*_NUMS vs the sum of topic items (different sampling instants)
    fall_print_every_minutes: int = 5  # MomentStatsItem prints "Stats Every 5 Minutes"

    # --- the article-001 cluster (used by retry_storm and steady) --------------------------------------------------
    culprit_group: str = "get-pugc-to-ai-consumer"  # article 001
    culprit_topic: str = "pugc-content"  # the topic the culprit consumes (brief)
    culprit_broker_index: int = 0  # broker-a
    culprit_topic_tps: float = 330.0  # pugc-content put rate, msgs/s: the largest share of broker-a's 500 msgs/s
    culprit_normal_retry_fraction: float = 0.002  # the group's steady send-back share (a %RETRY% line exists early)
    culprit_broker_normal_put_per_min: int = 30_000  # article 001: broker-a wrote ~30,000 msgs/min before
    culprit_broker_storm_put_per_min: int = 225_400  # article 001: … and 225,400 msgs/min during the storm

    # --- the retry storm ---------------------------------------------------------------------------------------------
    onset_minute: int | None = None  # first storm minute (index); None → minutes * 2 // 3 (60 of 90)
    culprit_consume_tps: float = 790.0  # consumer capacity during the storm (originals + its own retries), msgs/s
    storm_sendback_fraction: float = 785.32 / 790.0  # share sent back → 785.32 TPS = SUM 47,119 (article line)
    storm_noise: float = 0.03  # per-minute noise of the storm streams
    storm_latency_factor: float = 6.0  # pull latency multiplier on the busy broker
    busy_failures_per_min: float = 120.0  # mean TIMEOUT_CLEAN_QUEUE failures per minute ("tens to hundreds")
    busy_failures_spread: float = 0.5  # per-minute mean drawn in busy_failures_per_min × (1 ± spread)
    busy_period_ms_min: int = 200  # waitTimeMillsInSendQueue default (docs/rocketmq-formats.md §5): requests waited ≥ 200 ms
    busy_period_ms_max: int = 300  # exclusive upper bound of "period in queue: 2xxms"
    busy_queue_size_min: int = 50  # "size of queue: n" range
    busy_queue_size_max: int = 3000

    # --- background send failures (every scenario) ---------------------------------------------------------------
    trickle_timeouts_per_broker_min: float = 0.3  # RemotingTimeoutException / Go "request timeout", code null
    trickle_topic_not_exist_per_broker_min: float = 0.05  # code 17 TOPIC_NOT_EXIST
    send_timeout_ms: int = 3000  # DefaultMQProducer.sendMsgTimeout (docs/rocketmq-formats.md §6)
    null_code_share: float = 0.3  # failures whose code is only inside message (docs/contracts.md §1.2)
    iso_ts_share: float = 0.2  # failures whose ts is an ISO-8601 string (…Z) instead of epoch millis
    go_client_share: float = 0.4  # failures logged by the Go client (CODE: n, DESC:) instead of Java
    broker_port: int = 10911  # broker listen port in ip:port addresses (BROKER: 10.0.0.1:10911)
    faq_url: str = "http://rocketmq.apache.org/docs/faq/"  # FAQUrl up to 5.0.x (docs/rocketmq-formats.md §6)

    # --- flash_sale: one business topic ramps up on healthy brokers (consumers keep up) --------------------------
    flash_topic_index: int = 1  # the topic that ramps (1 = the first non-culprit topic)
    flash_base_tps: float = 60.0  # its put rate before the onset, msgs/s (over all its brokers)
    flash_factor: float = 5.0  # ... ramped linearly to this multiple ...
    flash_ramp_minutes: int = 10  # ... over this many minutes from the onset, then held

    # --- noisy_neighbour: one topic saturates the broker it shares with others -----------------------------------
    noisy_base_tps: float = 20.0  # the noisy topic's put rate before the onset, msgs/s
    noisy_put_tps: float = 3000.0  # its put rate from the onset, msgs/s (the broker's ~500 msgs/s is swamped)

    # --- normal_day: diurnal traffic, noise, one broker restart -------------------------------------------------
    diurnal_amplitude: float = 0.35  # put rates × (1 + a·sin(2π·(t/day − 1/4))): trough at the start
    day_minutes: int | None = None  # period of the diurnal curve; None → the run's own length (a compressed day)
    restart_broker_index: int = 1  # broker-b restarts ...
    restart_minute: int | None = None  # ... at this minute (None → minutes // 2): its first minute prints NaN

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.name not in SCENARIOS:
            problems.append(f"unknown scenario {self.name!r} (known: {', '.join(sorted(SCENARIOS))})")
        if self.minutes < 2:
            problems.append(f"minutes must be >= 2, got {self.minutes}")
        for attr in ("brokers", "topics", "groups"):
            if getattr(self, attr) < 1:
                problems.append(f"{attr} must be >= 1, got {getattr(self, attr)}")
        if not 0.0 <= self.envelope_share <= 1.0:
            problems.append(f"envelope share must be within [0, 1], got {self.envelope_share}")
        if not 0 <= self.culprit_broker_index < max(self.brokers, 1):
            problems.append(f"culprit broker index {self.culprit_broker_index} outside 0..{self.brokers - 1}")
        if self.onset_minute is not None and not 1 <= self.onset_minute < self.minutes:
            problems.append(f"onset minute must be within 1..{self.minutes - 1}, got {self.onset_minute}")
        if not 0 < self.base_tps_min <= self.base_tps_max:
            problems.append("need 0 < base_tps_min <= base_tps_max")
        if self.culprit_topic_tps * 60 >= self.culprit_broker_normal_put_per_min:
            problems.append("culprit_topic_tps must be below the culprit broker's normal put rate")
        if self.cluster == "" or "@" in self.cluster:
            problems.append(f"bad cluster name {self.cluster!r}")
        if problems:
            raise ValueError("; ".join(problems))
        start = self.start
        if start is None:
            now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
            start = now - timedelta(minutes=self.minutes)
        elif start.tzinfo is None:
            start = start.replace(tzinfo=timezone.utc)
        start = start.astimezone(timezone.utc).replace(second=0, microsecond=0)
        object.__setattr__(self, "start", start)

    @property
    def start_utc(self) -> datetime:
        """Start of the first minute (UTC, tz-aware, whole minute)."""
        assert self.start is not None  # set by __post_init__
        return self.start

    @property
    def onset_index(self) -> int:
        """Index of the first incident minute."""
        return self.onset_minute if self.onset_minute is not None else self.minutes * 2 // 3

    @property
    def onset(self) -> datetime:
        """UTC start of the first incident minute (its stats line is stamped one minute later)."""
        return self.start_utc + timedelta(minutes=self.onset_index)

    @property
    def end(self) -> datetime:
        """UTC end of the last minute (= the last stamp)."""
        return self.start_utc + timedelta(minutes=self.minutes)

    @property
    def broker_names(self) -> list[str]:
        return broker_names(self.brokers)


@dataclass(frozen=True)
class Incident:
    """What a scenario did, for the summary line and for tests/backtests (ground truth)."""

    kind: str
    onset: datetime  # UTC start of the first incident minute
    culprit_group: str | None
    culprit_topic: str | None
    culprit_broker: str | None
    detail: str


# ====================================================================================================================
# Catalog and rate arrays
# ====================================================================================================================
def broker_names(n: int) -> list[str]:
    """``broker-a`` … ``broker-z``, ``broker-aa`` … (spreadsheet-column letters)."""
    names: list[str] = []
    for i in range(n):
        letters, k = "", i
        while True:
            letters = chr(ord("a") + k % 26) + letters
            k = k // 26 - 1
            if k < 0:
                break
        names.append(f"broker-{letters}")
    return names


def broker_address(spec: ScenarioSpec, broker_index: int) -> str:
    """``ip:port`` of a broker: broker-a → 10.0.0.1:10911, broker-b → 10.0.0.2:10911 …"""
    return f"10.0.{broker_index // 250}.{broker_index % 250 + 1}:{spec.broker_port}"


def latency_style(broker_index: int) -> str:
    """Version mix: GROUP_GET_LATENCY prints TIMES/AVGRT from 4.9.3 (odd brokers), SUM/TPS/AVGPT up to 4.9.2."""
    return STYLE_TIMES if broker_index % 2 == 1 else STYLE_SUM


def rng_streams(seed: int) -> dict[str, np.random.Generator]:
    """One child of ``numpy.random.default_rng(seed)`` per stage of :data:`RNG_STREAMS`."""
    return dict(zip(RNG_STREAMS, np.random.default_rng(seed).spawn(len(RNG_STREAMS))))


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


def build_world(spec: ScenarioSpec, rngs: Mapping[str, np.random.Generator] | None = None) -> World:
    """The scenario-independent catalog and steady rates (draws only from the ``catalog`` and ``traffic`` streams)."""
    rngs = rngs or rng_streams(spec.seed)
    rc, rt = rngs["catalog"], rngs["traffic"]
    B, N, G, T = spec.brokers, spec.topics, spec.groups, spec.minutes
    cb = spec.culprit_broker_index

    topic = np.array([spec.culprit_topic] + _word_names(rc, N - 1, _TOPIC_WORDS, "{}-{}"), dtype=object)
    group = np.array([spec.culprit_group] + _word_names(rc, G - 1, _GROUP_WORDS, "{}-{}-consumer"), dtype=object)
    base = _log_uniform(rc, spec.base_tps_min, spec.base_tps_max, N)
    size = _log_uniform(rc, spec.msg_bytes_min, spec.msg_bytes_max, N)

    # placements: each topic on one broker, or two (culprit topic pinned to the culprit broker alone)
    first = rc.integers(0, B, size=N)
    two = (rc.random(N) < spec.two_broker_topic_share) & (B > 1)
    second = _second_choice(rc, first, B)
    first[0], two[0] = cb, False
    pl_topic = np.concatenate([np.arange(N), np.flatnonzero(two)])
    pl_broker = np.concatenate([first, second[two]])
    pl_share = np.where(np.concatenate([two, two[two]]), 0.5, 1.0)
    order = np.lexsort((pl_topic, pl_broker))
    pl_topic, pl_broker, pl_share = pl_topic[order], pl_broker[order], pl_share[order]

    # subscriptions: each group 1-2 topics (culprit group: the culprit topic alone)
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
    sp_retry_fraction = np.where(retrying, rc.uniform(0.0, spec.normal_retry_fraction_max, n_sp), 0.0)
    sp_rt_ms = _log_uniform(rc, spec.pull_rt_ms_min, spec.pull_rt_ms_max, n_sp)
    sp_lagging = rc.random(n_sp) < spec.lagging_queue_share

    # retry topics: one per (group, broker) the group consumes on
    sp_broker = pl_broker[sp_place]
    gb_codes, gb_uniques = pd.factorize(pd.Series(sp_group * B + sp_broker), sort=True)
    gb_key = np.asarray(gb_uniques, dtype=np.int64)
    gb_group, gb_broker = gb_key // B, gb_key % B
    first_sp = pd.Series(np.arange(n_sp)).groupby(gb_codes).first().to_numpy()
    gb_bytes = size[pl_topic[sp_place[first_sp]]]
    gb_rt_ms = sp_rt_ms[first_sp]

    noise = 1.0 + rt.uniform(-spec.put_noise, spec.put_noise, size=(pl_topic.size, T))
    put_rate = (base[pl_topic] * pl_share)[:, None] * noise

    return World(
        spec=spec, brokers=broker_names(B),
        minute_starts=pd.date_range(spec.start_utc, periods=T, freq="min"),
        topic=topic, topic_base_tps=base, topic_bytes=size, group=group,
        pl_topic=pl_topic, pl_broker=pl_broker, pl_share=pl_share, put_rate=put_rate,
        sp_group=sp_group, sp_place=sp_place, sp_retry_fraction=sp_retry_fraction, sp_rt_ms=sp_rt_ms,
        sp_lagging=sp_lagging, sp_gb=gb_codes.astype(np.int64),
        gb_group=gb_group, gb_broker=gb_broker, gb_bytes=gb_bytes, gb_rt_ms=gb_rt_ms,
        sp_sendback_rate=np.full((n_sp, T), np.nan),
        gb_retry_get_rate=np.full((gb_key.size, T), np.nan),
        broker_unattributed_put_rate=np.zeros((B, T)),
        broker_latency_factor=np.ones((B, T)),
    )


# ====================================================================================================================
# Scenarios: functions that edit a World (traffic) and add failures. Renderers never see them.
# ====================================================================================================================
ShapeFn = Callable[[ScenarioSpec, World, np.random.Generator], Incident | None]
FailureFn = Callable[[ScenarioSpec, pd.Series, Incident | None, np.random.Generator], pd.DataFrame]


@dataclass(frozen=True)
class Scenario:
    """A registered scenario.

    ``shape(spec, world, rng)`` edits the World's rate arrays in place and returns its :class:`Incident` (or None).
    ``failures(spec, topic_rates, incident, rng)`` (optional) returns extra send failures beyond the background
    trickle, built with :func:`_failure_frame`; ``topic_rates`` is the mean TOPIC_PUT_NUMS SUM per
    (broker, business topic). ``rng`` is the scenario's own stream, so extra draws never shift the catalog."""

    description: str
    shape: ShapeFn
    failures: FailureFn | None = None


def _prepare_article_cluster(spec: ScenarioSpec, world: World) -> None:
    """Size the culprit broker as in article 001: ``pugc-content`` at ``culprit_topic_tps`` and the other topics
    on that broker scaled so that its writes total ``culprit_broker_normal_put_per_min`` (best effort: no topic
    goes below ``base_tps_min``, so with thousands of topics the broker ends up larger)."""
    cb = spec.culprit_broker_index
    expected = world.topic_base_tps[world.pl_topic] * world.pl_share
    p0 = world.placement(0, cb)
    world.put_rate[p0] *= spec.culprit_topic_tps / expected[p0]
    others = np.flatnonzero((world.pl_broker == cb) & (world.pl_topic != 0))
    if others.size:
        budget = spec.culprit_broker_normal_put_per_min / 60.0 - spec.culprit_topic_tps
        target = np.maximum(expected[others] * budget / expected[others].sum(), spec.base_tps_min)
        world.put_rate[others] *= (target / expected[others])[:, None]
    world.sp_retry_fraction[world.subscription(0, p0)] = spec.culprit_normal_retry_fraction


def _shape_steady(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident | None:
    """The article-001 cluster on a quiet day: no incident."""
    _prepare_article_cluster(spec, world)
    return None


def _shape_retry_storm(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """Article 001: from the onset the culprit group sends back everything it consumes (see module docstring)."""
    _prepare_article_cluster(spec, world)
    cb, o, T = spec.culprit_broker_index, spec.onset_index, spec.minutes
    n = T - o
    p0 = world.placement(0, cb)
    sp0, gb0 = world.subscription(0, p0), world.retry_topic(0, cb)
    consume = spec.culprit_consume_tps * (1.0 + rng.uniform(-spec.storm_noise, spec.storm_noise, n))
    world.sp_sendback_rate[sp0, o:] = consume * spec.storm_sendback_fraction
    world.gb_retry_get_rate[gb0, o:] = np.maximum(consume - world.put_rate[p0, o:], 0.0)
    unattributed = (spec.culprit_broker_storm_put_per_min - spec.culprit_broker_normal_put_per_min) / 60.0 \
        - spec.culprit_consume_tps * spec.storm_sendback_fraction
    noise = 1.0 + rng.uniform(-spec.storm_noise, spec.storm_noise, n)
    world.broker_unattributed_put_rate[cb, o:] = max(unattributed, 0.0) * noise
    world.broker_latency_factor[cb, o:] = spec.storm_latency_factor
    retry_tps = spec.culprit_consume_tps * spec.storm_sendback_fraction
    return Incident(
        kind="retry_storm", onset=spec.onset, culprit_group=spec.culprit_group, culprit_topic=spec.culprit_topic,
        culprit_broker=world.brokers[cb],
        detail=(f"{spec.culprit_group} stops acknowledging: ~{retry_tps:.0f} msgs/s sent back to "
                f"{RETRY_PREFIX}{spec.culprit_group} on {world.brokers[cb]}, broker writes "
                f"{spec.culprit_broker_normal_put_per_min}/min -> {spec.culprit_broker_storm_put_per_min}/min"),
    )


def _busy_failures(spec: ScenarioSpec, topic_rates: pd.Series, incident: Incident | None,
                   rng: np.random.Generator) -> pd.DataFrame:
    """``[TIMEOUT_CLEAN_QUEUE]`` (code 2) for the *other* business topics of the busy broker (not the culprit's
    own topic: the brief's reading of article 001, "every topic on that broker failed"), onset + 1 min → end."""
    if incident is None or incident.culprit_broker is None:
        return _empty_failures()
    first = spec.onset_index + 1
    minutes = np.arange(first, spec.minutes)
    victims = topic_rates.drop(index=[(incident.culprit_broker, incident.culprit_topic)], errors="ignore")
    if minutes.size == 0 or incident.culprit_broker not in victims.index.get_level_values(0):
        return _empty_failures()
    lam = spec.busy_failures_per_min * (1.0 + rng.uniform(-spec.busy_failures_spread, spec.busy_failures_spread,
                                                          minutes.size))
    counts = rng.poisson(lam)
    minute = np.repeat(minutes, counts)
    n = minute.size
    broker_index = spec.broker_names.index(incident.culprit_broker)
    topics, topic_ids = _choose_topics(victims, incident.culprit_broker, n, rng, topic_rates)
    period = rng.integers(spec.busy_period_ms_min, spec.busy_period_ms_max, n)
    queue = rng.integers(spec.busy_queue_size_min, spec.busy_queue_size_max, n)
    go = rng.random(n) < spec.go_client_share
    addr = broker_address(spec, broker_index)
    desc = [f"[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: {p}ms, "
            f"size of queue: {q}" for p, q in zip(period.tolist(), queue.tolist())]
    message = [f"CODE: 2, DESC: {d}" if g else
               f"CODE: 2  DESC: {d} BROKER: {addr}\nFor more information, please visit the url, {spec.faq_url}"
               for d, g in zip(desc, go.tolist())]
    code = np.where(rng.random(n) < spec.null_code_share, -1, 2)
    latency = period + rng.integers(1, 30, n)
    return _failure_frame(spec, rng, minute, topics, topic_ids, incident.culprit_broker, code, message, latency,
                          "TIMEOUT_CLEAN_QUEUE")


def _flash_topic(spec: ScenarioSpec, world: World) -> int:
    """Index of the flash-sale topic (never the culprit topic 0 when there is another one)."""
    n = world.topic.size
    return min(max(spec.flash_topic_index, 1 if n > 1 else 0), n - 1)


def _apply_flash(spec: ScenarioSpec, world: World, t: int) -> None:
    """Scale topic ``t`` to ``flash_base_tps`` and ramp it linearly to ``flash_factor``× over ``flash_ramp_minutes``
    from the onset, then hold. Consumers keep up (GROUP_GET follows the put rate in :func:`_realise`)."""
    rows = np.flatnonzero(world.pl_topic == t)
    current = world.put_rate[rows].sum(axis=0).mean()  # after any earlier rescaling (article cluster sizing)
    world.put_rate[rows] *= spec.flash_base_tps / current
    o, T = spec.onset_index, spec.minutes
    ramp = np.ones(T)
    k = np.arange(T - o)
    ramp[o:] = 1.0 + (spec.flash_factor - 1.0) * np.minimum((k + 1) / max(spec.flash_ramp_minutes, 1), 1.0)
    world.put_rate[rows] *= ramp[None, :]


def _shape_flash_sale(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """A business topic ramps to ``flash_factor``× (5x) over ``flash_ramp_minutes`` (10) on healthy brokers; its
    consumers keep up; no broker is busy. The right answer is *no* limit below the peak."""
    _prepare_article_cluster(spec, world)
    t = _flash_topic(spec, world)
    _apply_flash(spec, world, t)
    hosts = sorted({world.brokers[b] for b in world.pl_broker[world.pl_topic == t]})
    return Incident(kind="flash_sale", onset=spec.onset, culprit_group=None, culprit_topic=str(world.topic[t]),
                    culprit_broker=None,
                    detail=(f"{world.topic[t]} ramps {spec.flash_base_tps:.0f} -> "
                            f"{spec.flash_base_tps * spec.flash_factor:.0f} msgs/s over {spec.flash_ramp_minutes} "
                            f"minutes on {', '.join(hosts)} (healthy, consumers keep up)"))


def _noisy_topic(spec: ScenarioSpec, world: World) -> int:
    """A business topic hosted by the culprit broker alone, other than the culprit topic when possible."""
    cb = spec.culprit_broker_index
    counts = np.bincount(world.pl_topic, minlength=world.topic.size)
    for t in world.pl_topic[world.pl_broker == cb].tolist():
        if t != 0 and counts[t] == 1:
            return int(t)
    return 0


def _shape_noisy_neighbour(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """One topic on ``broker-a`` jumps from ``noisy_base_tps`` to ``noisy_put_tps`` at the onset and saturates the
    broker it shares with the others (its producers hit ``[TIMEOUT_CLEAN_QUEUE]``, see :func:`_busy_failures`)."""
    _prepare_article_cluster(spec, world)
    cb, o, T = spec.culprit_broker_index, spec.onset_index, spec.minutes
    t = _noisy_topic(spec, world)
    p = world.placement(t, cb)
    world.put_rate[p] *= spec.noisy_base_tps / world.put_rate[p].mean()
    world.put_rate[p, o:] = spec.noisy_put_tps * (1.0 + rng.uniform(-spec.storm_noise, spec.storm_noise, T - o))
    return Incident(kind="noisy_neighbour", onset=spec.onset, culprit_group=None, culprit_topic=str(world.topic[t]),
                    culprit_broker=world.brokers[cb],
                    detail=(f"{world.topic[t]} jumps {spec.noisy_base_tps:.0f} -> {spec.noisy_put_tps:.0f} msgs/s on "
                            f"{world.brokers[cb]}, which it shares with {int((world.pl_broker == cb).sum()) - 1} "
                            "other topics"))


def _diurnal(spec: ScenarioSpec, T: int) -> np.ndarray:
    day = spec.day_minutes or T
    return 1.0 + spec.diurnal_amplitude * np.sin(2 * np.pi * (np.arange(T) / day - 0.25))


def _shape_normal_day(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> None:
    """A diurnal curve (``diurnal_amplitude``, trough at the start, peak mid-run) with the usual noise, and one
    broker restart at ``restart_minute``: its first minute after the restart prints ``SUM: 0 TPS: NaN``.
    No incident: the right answer is no limit at all."""
    _prepare_article_cluster(spec, world)
    world.put_rate *= _diurnal(spec, spec.minutes)[None, :]
    b = min(spec.restart_broker_index, spec.brokers - 1)
    r = spec.restart_minute if spec.restart_minute is not None else spec.minutes // 2
    restart = np.zeros((spec.brokers, spec.minutes), dtype=bool)
    if 0 < r < spec.minutes:
        restart[b, r] = True
    world.broker_restart = restart
    return None


def _shape_large_mix(spec: ScenarioSpec, world: World, rng: np.random.Generator) -> Incident:
    """A large cluster (use with ~10,000 topics, 50 brokers): a diurnal curve everywhere, the article-001 retry
    storm on ``broker-a`` and a flash sale of ``flash_topic_index`` (moved off ``broker-a`` when it is there)."""
    world.put_rate *= _diurnal(spec, spec.minutes)[None, :]
    incident = _shape_retry_storm(spec, world, rng)
    t = _flash_topic(spec, world)
    if t != 0:
        _apply_flash(spec, world, t)
    return Incident(kind="large_mix", onset=incident.onset, culprit_group=incident.culprit_group,
                    culprit_topic=incident.culprit_topic, culprit_broker=incident.culprit_broker,
                    detail=f"{incident.detail}; flash sale of {world.topic[t]} at the same onset")


#: Registered scenarios. Add new ones as functions here.
SCENARIOS: dict[str, Scenario] = {
    "retry_storm": Scenario("article 001: a consumer group that never acks floods its broker with retries",
                            _shape_retry_storm, _busy_failures),
    "steady": Scenario("the same cluster and traffic without an incident", _shape_steady, None),
    "flash_sale": Scenario("a topic ramps 5x over 10 minutes on healthy brokers, consumers keep up",
                           _shape_flash_sale, None),
    "noisy_neighbour": Scenario("one topic saturates the broker it shares with others", _shape_noisy_neighbour,
                                _busy_failures),
    "normal_day": Scenario("diurnal traffic with noise and one broker restart (NaN first minute), no incident",
                           _shape_normal_day, None),
    "large_mix": Scenario("a large cluster (10,000 topics, 50 brokers): diurnal traffic, a retry storm and a flash "
                          "sale", _shape_large_mix, _busy_failures),
}


# ====================================================================================================================
# Realisation: World → model frame
# ====================================================================================================================
def _count(x: np.ndarray) -> np.ndarray:
    """Non-negative integer counts (NaN → 0)."""
    return np.rint(np.clip(np.nan_to_num(x, nan=0.0), 0.0, None)).astype(np.int64)


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For series with ``counts[j]`` sub-items: (series index, sub-item index 0..counts[j]-1) per sub-item."""
    j = np.repeat(np.arange(counts.size), counts)
    q = np.arange(j.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return j, q


@dataclass
class _Block:
    stat: str
    period: str
    style: np.ndarray  # (n,) per series
    broker: np.ndarray  # (n,) broker index
    key: np.ndarray  # (n,) stats key
    sums: np.ndarray  # (n, T) int64
    times: np.ndarray  # (n, T) int64
    emit: np.ndarray  # (n, T) bool


def _lazy(active: np.ndarray) -> np.ndarray:
    """Items are created on first increment and print every minute afterwards (docs/rocketmq-formats.md §2)."""
    return np.logical_or.accumulate(active, axis=1)


def _realise(world: World, rng: np.random.Generator) -> list[_Block]:
    s, T, B = world.spec, world.T, len(world.brokers)

    def noisy(amp: float, shape: tuple[int, ...]) -> np.ndarray:
        return 1.0 + rng.uniform(-amp, amp, shape)

    topic, group = world.topic, world.group
    # --- puts of business topics, consumption, send-backs, retry re-puts and retry consumption ---
    put = _count(world.put_rate * 60.0)  # (P, T)
    get = _count(put[world.sp_place] * noisy(s.get_noise, (world.sp_place.size, T)))
    steady_sb = get * world.sp_retry_fraction[:, None] * noisy(s.put_noise, get.shape)
    sndbck = np.where(np.isnan(world.sp_sendback_rate), _count(steady_sb), _count(world.sp_sendback_rate * 60.0))
    retry_put = np.zeros((world.gb_group.size, T), dtype=np.int64)
    np.add.at(retry_put, world.sp_gb, sndbck)
    keep_up = _count(retry_put * noisy(s.get_noise, retry_put.shape))
    retry_get = np.where(np.isnan(world.gb_retry_get_rate), keep_up, _count(world.gb_retry_get_rate * 60.0))

    retry_topic = np.array([RETRY_PREFIX + g for g in group[world.gb_group]], dtype=object)
    sp_topic = topic[world.pl_topic[world.sp_place]]
    sp_broker = world.pl_broker[world.sp_place]

    # --- TOPIC_PUT_NUMS / TOPIC_PUT_SIZE ---
    tp_sum = np.vstack([put, retry_put])
    tp_broker = np.concatenate([world.pl_broker, world.gb_broker])
    tp_key = np.concatenate([topic[world.pl_topic], retry_topic])
    tp_bytes = np.concatenate([world.topic_bytes[world.pl_topic], world.gb_bytes])
    tp_size = _count(tp_sum * tp_bytes[:, None] * noisy(s.size_noise, tp_sum.shape))
    tp_emit = _lazy(tp_sum > 0)

    # --- GROUP_GET_NUMS / GROUP_GET_SIZE (pulls = "times") ---
    gg_sum = np.vstack([get, retry_get])
    gg_broker = np.concatenate([sp_broker, world.gb_broker])
    gg_group = np.concatenate([group[world.sp_group], group[world.gb_group]])
    gg_topic = np.concatenate([sp_topic, retry_topic])
    gg_key = np.array([f"{t}@{g}" for t, g in zip(gg_topic, gg_group)], dtype=object)
    gg_queues = np.concatenate([np.full(world.sp_place.size, s.queues_per_topic),
                                np.full(world.gb_group.size, s.retry_queues)]).astype(np.int64)
    gg_bytes = np.concatenate([world.topic_bytes[world.pl_topic[world.sp_place]], world.gb_bytes])
    batch = np.clip(gg_sum / 60.0 / (gg_queues[:, None] * s.max_pulls_per_queue_per_s), 1.0, s.max_msgs_per_pull)
    pulls = np.where(gg_sum > 0, np.ceil(gg_sum / batch), 0).astype(np.int64)
    gg_size = _count(gg_sum * gg_bytes[:, None] * noisy(s.size_noise, gg_sum.shape))
    gg_emit = _lazy(gg_sum > 0)

    # --- GROUP_GET_LATENCY and GROUP_GET_FALL_SIZE per queueId@topic@group ---
    j, q = _expand(gg_queues)
    q_pulls = pulls[j] // gg_queues[j, None] + (q[:, None] < pulls[j] % gg_queues[j, None])
    rt_base = np.concatenate([world.sp_rt_ms, world.gb_rt_ms])[j]
    rt = rt_base[:, None] * world.broker_latency_factor[gg_broker[j]] * noisy(s.pull_rt_noise, q_pulls.shape)
    lat_ms = _count(q_pulls * rt)
    q_key = np.array([f"{qq}@{k}" for qq, k in zip(q.tolist(), gg_key[j])], dtype=object)
    lat_style = np.array([latency_style(b) for b in gg_broker[j].tolist()], dtype=object)

    lag_draw = rng.uniform(0.0, s.lag_seconds_max, q_pulls.shape)
    n_sp = world.sp_place.size
    lagging = np.concatenate([world.sp_lagging, np.zeros(world.gb_group.size, dtype=bool)])[j]
    per_queue_rate = gg_sum[j] / 60.0 / gg_queues[j, None]
    fall = np.where(lagging[:, None], per_queue_rate * lag_draw * gg_bytes[j, None], 0.0)
    backlog = np.zeros((world.gb_group.size, T))
    level = np.zeros(world.gb_group.size)
    for m in range(T):  # retry backlog: what was re-put and not consumed yet (O(T) vector steps)
        level = np.maximum(level + retry_put[:, m] - retry_get[:, m], 0.0)
        backlog[:, m] = level
    is_retry_queue = j >= n_sp
    fall[is_retry_queue] = backlog[j[is_retry_queue] - n_sp] * world.gb_bytes[j[is_retry_queue] - n_sp, None]
    stamps = world.minute_starts + _MINUTE
    tick = np.asarray(stamps.minute % s.fall_print_every_minutes == 0)
    fall_sum = _count(fall) * tick[None, :]
    fall_sum[:, 0] = 0  # nothing measured yet at broker start
    fall_emit = _lazy(fall_sum > 0) & tick[None, :]

    # --- SNDBCK_PUT_NUMS ---
    sb_key = gg_key[:n_sp]

    # --- BROKER_PUT_NUMS / BROKER_GET_NUMS (cluster key, AVGPT 0.00) ---
    b_put = np.zeros((B, T))
    np.add.at(b_put, tp_broker, tp_sum)
    b_put += world.broker_unattributed_put_rate * 60.0
    b_get = np.zeros((B, T))
    np.add.at(b_get, gg_broker, gg_sum)
    b_put = _count(b_put * noisy(s.broker_stat_jitter, b_put.shape))
    b_get = _count(b_get * noisy(s.broker_stat_jitter, b_get.shape))
    b_idx = np.arange(B)
    b_key = np.full(B, s.cluster, dtype=object)
    always = np.ones((B, T), dtype=bool)

    def sum_style(n: int) -> np.ndarray:
        return np.full(n, STYLE_SUM, dtype=object)

    return [
        _Block(TOPIC_PUT_NUMS, "minute", sum_style(tp_key.size), tp_broker, tp_key, tp_sum, tp_sum, tp_emit),
        _Block(TOPIC_PUT_SIZE, "minute", sum_style(tp_key.size), tp_broker, tp_key, tp_size, tp_sum, tp_emit),
        _Block(GROUP_GET_NUMS, "minute", sum_style(gg_key.size), gg_broker, gg_key, gg_sum, pulls, gg_emit),
        _Block(GROUP_GET_SIZE, "minute", sum_style(gg_key.size), gg_broker, gg_key, gg_size, pulls, gg_emit),
        _Block(SNDBCK_PUT_NUMS, "minute", sum_style(n_sp), sp_broker, sb_key, sndbck, sndbck, _lazy(sndbck > 0)),
        _Block(GROUP_GET_LATENCY, "minute", lat_style, gg_broker[j], q_key, lat_ms, q_pulls, _lazy(q_pulls > 0)),
        _Block(GROUP_GET_FALL_SIZE, "5min", np.full(q_key.size, STYLE_VALUE, dtype=object), gg_broker[j], q_key,
               fall_sum, np.zeros_like(fall_sum), fall_emit),
        _Block(BROKER_PUT_NUMS, "minute", sum_style(B), b_idx, b_key, b_put, np.zeros_like(b_put), always),
        _Block(BROKER_GET_NUMS, "minute", sum_style(B), b_idx, b_key, b_get, np.zeros_like(b_get), always),
    ]


_STYLES: tuple[str, ...] = (STYLE_SUM, STYLE_TIMES, STYLE_VALUE)
_PERIODS: tuple[str, ...] = tuple(PERIOD_TEXT)


def _flatten(world: World, blocks: list[_Block]) -> pd.DataFrame:
    """Blocks → long model frame (string columns as categoricals: millions of rows share a few thousand keys),
    with the broker-start rule (minute 0: SUM 0, TPS NaN, AVGPT 0) applied."""
    key_codes, key_cats = pd.factorize(np.concatenate([blk.key for blk in blocks]))
    style_index = {st: i for i, st in enumerate(_STYLES)}
    parts: dict[str, list[np.ndarray]] = {c: [] for c in ("m", "broker", "stat", "key", "period", "style", "sum",
                                                          "times")}
    offset = 0
    for bi, blk in enumerate(blocks):
        series_key = key_codes[offset:offset + blk.key.size]
        offset += blk.key.size
        series_style = np.array([style_index[x] for x in blk.style.tolist()], dtype=np.int8)
        ii, mm = np.nonzero(blk.emit)
        parts["m"].append(mm)
        parts["broker"].append(blk.broker[ii].astype(np.int32))
        parts["stat"].append(np.full(ii.size, bi, dtype=np.int8))
        parts["key"].append(series_key[ii].astype(np.int32))
        parts["period"].append(np.full(ii.size, _PERIODS.index(blk.period), dtype=np.int8))
        parts["style"].append(series_style[ii])
        parts["sum"].append(blk.sums[ii, mm])
        parts["times"].append(blk.times[ii, mm])
    col = {k: np.concatenate(v) for k, v in parts.items()}
    order = np.lexsort((np.arange(col["m"].size), col["broker"], col["m"]))
    col = {k: v[order] for k, v in col.items()}
    m, style = col["m"], col["style"]
    sums, times = col["sum"].astype(np.int64), col["times"].astype(np.int64)
    start_minute = (m == 0) & (col["period"] == _PERIODS.index("minute"))
    sums[start_minute] = 0
    times[start_minute] = 0
    is_value = style == style_index[STYLE_VALUE]
    avgpt = np.where(times > 0, sums / np.maximum(times, 1), 0.0)
    avgpt[is_value] = np.nan
    tps = sums / 60.0
    tps[start_minute | is_value | (style == style_index[STYLE_TIMES])] = np.nan
    return pd.DataFrame({
        "minute_start": world.minute_starts[m],
        "broker": pd.Categorical.from_codes(col["broker"], categories=world.brokers),
        "stat_name": pd.Categorical.from_codes(col["stat"], categories=[blk.stat for blk in blocks]),
        "stats_key": pd.Categorical.from_codes(col["key"], categories=pd.Index(key_cats, dtype=object)),
        "period": pd.Categorical.from_codes(col["period"], categories=list(_PERIODS)),
        "style": pd.Categorical.from_codes(style, categories=list(_STYLES)),
        "sum": sums,
        "tps": tps,
        "avgpt": avgpt,
        "times": times,
    })


def build_traffic(spec: ScenarioSpec) -> pd.DataFrame:
    """The traffic *model*: one row per (minute_start UTC, broker, stat_name, stats_key), columns
    :data:`TRAFFIC_COLUMNS`: ``sum`` (int: msgs, bytes, total ms or the 5-minute value), ``tps`` (SUM/60, NaN at
    broker start and for TIMES/VALUE rows), ``avgpt`` (SUM/times), ``times`` (increments: puts, pulls), ``style``
    (SUM | TIMES | VALUE) and ``period`` (minute | 5min). ``frame.attrs["incident"]`` holds the scenario's
    :class:`Incident` or None. Hour and day lines are derived by :func:`build_period_rows`."""
    rngs = rng_streams(spec.seed)
    world = build_world(spec, rngs)
    incident = SCENARIOS[spec.name].shape(spec, world, rngs["scenario"])
    frame = _flatten(world, _realise(world, rngs["realise"]))
    if world.broker_restart is not None and world.broker_restart.any():
        frame = _apply_restarts(world, frame)
    frame.attrs["incident"] = incident
    return frame


def _apply_restarts(world: World, frame: pd.DataFrame) -> pd.DataFrame:
    """The broker-start rule at a restart: every minute line of a restarting broker in its restart minute prints
    ``SUM: 0 TPS: NaN AVGPT: 0.00`` (``TIMES: 0``), like minute 0 (docs/rocketmq-formats.md §2, §8)."""
    restart = world.broker_restart
    assert restart is not None
    b = frame["broker"].cat.codes.to_numpy()
    m = _minute_index(world.spec, frame["minute_start"])
    hit = restart[b, m] & (frame["period"] == "minute").to_numpy()
    if hit.any():
        frame = frame.copy()
        frame.loc[hit, "sum"] = 0
        frame.loc[hit, "times"] = 0
        frame.loc[hit, "tps"] = np.nan
        frame.loc[hit, "avgpt"] = 0.0
    return frame


def _minute_index(spec: ScenarioSpec, minute_start: pd.Series) -> np.ndarray:
    delta = minute_start - pd.Timestamp(spec.start_utc)
    return (delta // _MINUTE).to_numpy(dtype=np.int64)


def build_period_rows(spec: ScenarioSpec, traffic: pd.DataFrame) -> pd.DataFrame:
    """``Stats In One Hour`` / ``Stats In One Day`` rows for TOPIC_PUT_NUMS, derived from the minute rows: at each
    hour boundary (stamp minute 0) the last 60 minutes, at midnight GMT+8 the last 24 h, limited to the time the
    broker has been up; TPS NaN (SUM 0) while the hour list (10-min snapshots) or day list (1-h snapshots) holds a
    single snapshot. Same columns as :func:`build_traffic`; ``minute_start`` = stamp − 1 min."""
    tp = traffic[(traffic["stat_name"] == TOPIC_PUT_NUMS) & (traffic["period"] == "minute")]
    T = spec.minutes
    stamps = pd.date_range(spec.start_utc, periods=T, freq="min") + _MINUTE
    local = stamps + pd.Timedelta(hours=spec.gmt_offset_hours)
    hour_ticks = np.flatnonzero(np.asarray(local.minute == 0))
    day_ticks = np.flatnonzero(np.asarray((local.minute == 0) & (local.hour == 0)))
    if tp.empty or (hour_ticks.size == 0 and day_ticks.size == 0):
        return pd.DataFrame({c: pd.Series(dtype=traffic[c].dtype) for c in TRAFFIC_COLUMNS})
    codes = tp.groupby(["broker", "stats_key"], sort=False, observed=True).ngroup().to_numpy()
    n = int(codes.max()) + 1
    m = _minute_index(spec, tp["minute_start"])
    sums = np.zeros((n, T), dtype=np.int64)
    times = np.zeros((n, T), dtype=np.int64)
    present = np.zeros((n, T), dtype=bool)
    sums[codes, m] = tp["sum"].to_numpy()
    times[codes, m] = tp["times"].to_numpy()
    present[codes, m] = True
    first = pd.Series(np.arange(len(tp))).groupby(codes).first().to_numpy()
    brokers = tp["broker"].to_numpy()[first]
    keys = tp["stats_key"].to_numpy()[first]
    csum = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(sums, axis=1)], axis=1)
    ctimes = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(times, axis=1)], axis=1)
    rows: list[pd.DataFrame] = []
    for period, ticks, window, min_up in (("hour", hour_ticks, 60, 10), ("day", day_ticks, 1440, 60)):
        for t in ticks.tolist():
            lo = max(0, t - window + 1)
            up = t + 1  # minutes the broker has been up at this stamp
            idx = np.flatnonzero(present[:, t])
            if up < min_up:
                s_ = np.zeros(idx.size, np.int64)
                tm = np.zeros(idx.size, np.int64)
                tps = np.full(idx.size, np.nan)
            else:
                s_ = csum[idx, t + 1] - csum[idx, lo]
                tm = ctimes[idx, t + 1] - ctimes[idx, lo]
                tps = s_ / ((t + 1 - lo) * 60.0)
            rows.append(pd.DataFrame({
                "minute_start": pd.DatetimeIndex([stamps[t] - _MINUTE] * idx.size),
                "broker": brokers[idx], "stat_name": TOPIC_PUT_NUMS, "stats_key": keys[idx], "period": period,
                "style": STYLE_SUM, "sum": s_, "tps": tps,
                "avgpt": np.where(tm > 0, s_ / np.maximum(tm, 1), 0.0), "times": tm,
            }))
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=traffic[c].dtype) for c in TRAFFIC_COLUMNS})
    return pd.concat(rows, ignore_index=True)


# ====================================================================================================================
# Send failures
# ====================================================================================================================
def _empty_failures() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in FAILURE_COLUMNS + FAILURE_EXTRA_COLUMNS})


def _choose_topics(topic_rates: pd.Series, broker: str, n: int, rng: np.random.Generator,
                   catalog: pd.Series | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` topics of ``broker`` drawn in proportion to their put rate, with their index among all topics of
    ``catalog`` (default ``topic_rates``): a stable id for the producer's client address."""
    all_topics = (topic_rates if catalog is None else catalog).index.get_level_values(1).unique().sort_values()
    on_broker = topic_rates.loc[broker]
    weights = on_broker.to_numpy(dtype=float) + 1e-9
    pick = rng.choice(on_broker.size, size=n, p=weights / weights.sum())
    names = on_broker.index.to_numpy()[pick]
    return names, all_topics.get_indexer(names)


def _failure_frame(spec: ScenarioSpec, rng: np.random.Generator, minute: np.ndarray, topics: np.ndarray,
                   topic_ids: np.ndarray, broker: str | np.ndarray, code: np.ndarray, message: list[str],
                   latency: np.ndarray, expected_class: str) -> pd.DataFrame:
    """Assemble failures: time uniform within the minute (ms), client ``ip@pid`` of one of two producer
    instances per topic, ``code`` −1 meaning null."""
    n = minute.size
    offset_ms = rng.integers(0, 60_000, n)
    instance = rng.integers(0, 2, n)
    base_ms = int(pd.Timestamp(spec.start_utc).value // 1_000_000)
    epoch_ms = base_ms + minute.astype(np.int64) * 60_000 + offset_ms
    host = 2 * topic_ids + instance
    client = [f"10.1.{h // 250}.{h % 250 + 1}@{30000 + h}" for h in host.tolist()]
    return pd.DataFrame({
        "ts": epoch_ms,
        "topic": topics,
        "broker": broker,
        "producer_group": [f"{t}-producer" for t in topics],
        "client": client,
        "code": pd.array(np.where(code < 0, pd.NA, code).tolist(), dtype="Int64"),
        "message": message,
        "latency_ms": latency.astype(np.int64),
        "event_time": pd.to_datetime(epoch_ms, unit="ms", utc=True),
        "expected_class": expected_class,
    })


def _trickle_failures(spec: ScenarioSpec, topic_rates: pd.Series, rng: np.random.Generator) -> pd.DataFrame:
    """Background failures on every broker, whole range: client timeouts (code null) and TOPIC_NOT_EXIST (17)."""
    frames: list[pd.DataFrame] = []
    hosted = set(topic_rates.index.get_level_values(0))
    for b, broker in enumerate(spec.broker_names):
        if broker not in hosted:
            continue
        addr = broker_address(spec, b)
        # client timeouts
        minute = np.repeat(np.arange(spec.minutes), rng.poisson(spec.trickle_timeouts_per_broker_min, spec.minutes))
        topics, ids = _choose_topics(topic_rates, broker, minute.size, rng)
        go = rng.random(minute.size) < spec.go_client_share
        message = ["request timeout" if g else
                   f"RemotingTimeoutException: wait response on the channel <{addr}> timeout, "
                   f"{spec.send_timeout_ms}(ms)"
                   for g in go.tolist()]
        latency = spec.send_timeout_ms + rng.integers(0, 20, minute.size)
        frames.append(_failure_frame(spec, rng, minute, topics, ids, broker, np.full(minute.size, -1), message,
                                     latency, "CLIENT_TIMEOUT"))
        # a producer sending to a topic that was never created
        minute = np.repeat(np.arange(spec.minutes),
                           rng.poisson(spec.trickle_topic_not_exist_per_broker_min, spec.minutes))
        topics, ids = _choose_topics(topic_rates, broker, minute.size, rng)
        missing = np.array([f"{t}-v2" for t in topics], dtype=object)
        go = rng.random(minute.size) < spec.go_client_share
        desc = [f"topic[{t}] not exist, apply first please!" for t in missing]
        message = [f"CODE: 17, DESC: {d}" if g else
                   f"CODE: 17  DESC: {d} BROKER: {addr}\nFor more information, please visit the url, {spec.faq_url}"
                   for d, g in zip(desc, go.tolist())]
        code = np.where(rng.random(minute.size) < spec.null_code_share, -1, 17)
        latency = rng.integers(1, 15, minute.size)
        frames.append(_failure_frame(spec, rng, minute, missing, ids, broker, code, message, latency, "OTHER"))
    return pd.concat(frames, ignore_index=True) if frames else _empty_failures()


def _business_topic_rates(traffic: pd.DataFrame) -> pd.Series:
    """Mean TOPIC_PUT_NUMS SUM per (broker, topic) over business topics (not %RETRY%/%DLQ%)."""
    tp = traffic[(traffic["stat_name"] == TOPIC_PUT_NUMS) & (traffic["period"] == "minute")
                 & ~traffic["stats_key"].str.startswith("%")]
    keys = pd.DataFrame({"broker": _as_object(tp["broker"]), "stats_key": _as_object(tp["stats_key"]),
                         "sum": tp["sum"].to_numpy()})
    return keys.groupby(["broker", "stats_key"], sort=True)["sum"].mean()


def build_send_failures(spec: ScenarioSpec, traffic: pd.DataFrame) -> pd.DataFrame:
    """Send failures (docs/contracts.md §1.2 columns :data:`FAILURE_COLUMNS`, then ``event_time`` (UTC) and
    ``expected_class`` (ground truth, not written)). ``ts`` is epoch millis (int) or, for ``iso_ts_share`` of
    rows, an ISO-8601 string ending in ``Z``; ``code`` is nullable. Sorted by time."""
    rng = rng_streams(spec.seed)["failures"]
    rates = _business_topic_rates(traffic)
    incident = traffic.attrs.get("incident")
    frames = [_trickle_failures(spec, rates, rng)]
    extra = SCENARIOS[spec.name].failures
    if extra is not None:
        frames.append(extra(spec, rates, incident, rng))
    frames = [f for f in frames if len(f)]
    if not frames:
        return _empty_failures()
    out = pd.concat(frames, ignore_index=True)
    out = out.sort_values(["event_time", "broker", "topic"], kind="mergesort").reset_index(drop=True)
    iso = rng.random(len(out)) < spec.iso_ts_share
    millis = out["ts"].astype(np.int64)
    iso_text = out["event_time"].dt.strftime("%Y-%m-%dT%H:%M:%S.") + (millis % 1000).map("{:03d}".format) + "Z"
    out["ts"] = pd.Series(np.where(iso, iso_text.to_numpy(dtype=object), millis.to_numpy(dtype=object)),
                          dtype="object")
    return out[list(FAILURE_COLUMNS + FAILURE_EXTRA_COLUMNS)]


# ====================================================================================================================
# Rendering and landing
# ====================================================================================================================
def _fmt2(values: np.ndarray) -> list[str]:
    """Java ``%.2f`` (half-up; NaN → ``NaN``)."""
    return ["NaN" if v != v else "%.2f" % v for v in (values * _JAVA_HALF_UP).tolist()]


def _as_object(column: pd.Series) -> np.ndarray:
    """Values of a (possibly categorical) column as an object array, without per-row Python work."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return np.asarray(column.cat.categories, dtype=object)[column.cat.codes.to_numpy()]
    return column.to_numpy(dtype=object)


def _line_table(spec: ScenarioSpec, traffic: pd.DataFrame) -> dict[str, np.ndarray]:
    """Model rows plus hour/day rows as arrays in file order: broker, stamp, then shuffled (hash-map order)."""
    periods = build_period_rows(spec, traffic)
    parts = [traffic] + ([periods] if len(periods) else [])
    broker_order = {b: i for i, b in enumerate(spec.broker_names)}
    cols: dict[str, np.ndarray] = {}
    for name, get in (
        ("m", lambda f: _minute_index(spec, f["minute_start"])),
        ("broker", lambda f: _as_object(f["broker"])),
        ("stat", lambda f: _as_object(f["stat_name"])),
        ("key", lambda f: _as_object(f["stats_key"])),
        ("period", lambda f: _as_object(f["period"].map(PERIOD_TEXT))),
        ("style", lambda f: _as_object(f["style"])),
        ("sum", lambda f: f["sum"].to_numpy(dtype=np.int64)),
        ("times", lambda f: f["times"].to_numpy(dtype=np.int64)),
        ("tps", lambda f: f["tps"].to_numpy(dtype=float)),
        ("avgpt", lambda f: f["avgpt"].to_numpy(dtype=float)),
    ):
        cols[name] = np.concatenate([get(f) for f in parts])
    b_code = pd.Series(cols["broker"]).map(broker_order).to_numpy(dtype=np.int64)
    shuffle = rng_streams(spec.seed)["render"].random(cols["m"].size)
    order = np.lexsort((shuffle, cols["m"], b_code))
    return {k: v[order] for k, v in cols.items()}


def _format_lines(spec: ScenarioSpec, table: Mapping[str, np.ndarray], lo: int, hi: int) -> list[str]:
    """stats.log text of rows ``lo:hi`` of a line table (docs/rocketmq-formats.md §1-2)."""
    stamp_text = np.array((pd.date_range(spec.start_utc, periods=spec.minutes, freq="min") + _MINUTE
                           + pd.Timedelta(hours=spec.gmt_offset_hours)).strftime("%Y-%m-%d %H:%M:%S"), dtype=object)
    sl = slice(lo, hi)
    stamp = stamp_text[table["m"][sl]]
    tps, avg = _fmt2(table["tps"][sl]), _fmt2(table["avgpt"][sl])
    sums, times = table["sum"][sl].tolist(), table["times"][sl].tolist()
    return [
        f"{st} INFO - [{sn}] [{k}] {p}, " + (
            f"SUM: {s} TPS: {t} AVGPT: {a}" if sy == STYLE_SUM else
            f"TIMES: {n} AVGRT: {a}" if sy == STYLE_TIMES else f"Value: {s}")
        for st, sn, k, p, sy, s, t, a, n in zip(stamp, table["stat"][sl], table["key"][sl], table["period"][sl],
                                                table["style"][sl], sums, tps, avg, times)
    ]


def iter_broker_lines(spec: ScenarioSpec, traffic: pd.DataFrame) -> Iterator[tuple[str, list[str]]]:
    """(broker, its stats.log lines in file order), one broker at a time (bounded memory for big clusters)."""
    table = _line_table(spec, traffic)
    brokers = table["broker"]
    bounds = (np.flatnonzero(brokers[1:] != brokers[:-1]) + 1).tolist()
    for lo, hi in zip([0] + bounds, bounds + [brokers.size]):
        if hi > lo:
            yield str(brokers[lo]), _format_lines(spec, table, lo, hi)


def render_stats_lines(spec: ScenarioSpec, traffic: pd.DataFrame) -> pd.DataFrame:
    """Every stats.log line, columns ``broker`` and ``line``, ordered by broker, then stamp; lines of one stamp
    shuffled (hash-map order), hour/day lines (:func:`build_period_rows`) interleaved with that minute's lines."""
    brokers: list[str] = []
    lines: list[str] = []
    for broker, chunk in iter_broker_lines(spec, traffic):
        brokers.extend([broker] * len(chunk))
        lines.extend(chunk)
    return pd.DataFrame({"broker": brokers, "line": lines})


def envelope_brokers(spec: ScenarioSpec) -> list[str]:
    """The brokers whose lines ship in JSON envelopes: the last round(share × brokers) ones (broker-c of 3)."""
    n = int(math.floor(spec.envelope_share * spec.brokers + 0.5))
    return spec.broker_names[spec.brokers - n:] if n else []


def _failure_json(row: tuple) -> str:
    ts, topic, broker, group, client, code, message, latency = row
    return json.dumps({
        "ts": ts, "topic": topic, "broker": broker, "producer_group": group, "client": client,
        "code": None if code is pd.NA or code is None else int(code), "message": message,
        "latency_ms": None if latency is None else int(latency),
    })


def _write_atomic(path: Path, lines: Sequence[str]) -> None:
    """Write the whole file under a hidden temporary name (ignored by Spark's file source), then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        if lines:
            fh.write("\n".join(lines))
            fh.write("\n")
    os.replace(tmp, path)


def render_landing(spec: ScenarioSpec, out_dir: str | os.PathLike[str]) -> dict[str, object]:
    """Generate the scenario and write it under ``out_dir`` (docs/contracts.md §1). Returns ``{"stats_lines", "failure_lines",
    "files", "onset" (UTC datetime or None), "culprit_group" (str or None), "paths" (list of written files)}``."""
    out = Path(out_dir)
    traffic = build_traffic(spec)
    failures = build_send_failures(spec, traffic)
    enveloped = set(envelope_brokers(spec))
    paths: list[Path] = []
    stats_lines = 0
    cluster = json.dumps(spec.cluster)
    for broker, chunk in iter_broker_lines(spec, traffic):
        stats_lines += len(chunk)
        if broker in enveloped:
            path = out / "broker_stats" / "shipper" / f"{broker}.jsonl"
            head = f'{{"broker": {json.dumps(broker)}, "cluster": {cluster}, "line": '
            chunk = [f"{head}{json.dumps(x)}}}" for x in chunk]
        else:
            path = out / "broker_stats" / broker / "stats.log"
        _write_atomic(path, chunk)
        paths.append(path)
    for broker in spec.broker_names:
        sel = failures[failures["broker"] == broker]
        path = out / "send_failures" / f"failures-{broker}.jsonl"
        _write_atomic(path, [_failure_json(r) for r in sel[list(FAILURE_COLUMNS)].itertuples(index=False)])
        paths.append(path)
    incident: Incident | None = traffic.attrs.get("incident")
    return {
        "stats_lines": stats_lines,
        "failure_lines": len(failures),
        "files": len(paths),
        "onset": incident.onset if incident else None,
        "culprit_group": incident.culprit_group if incident else None,
        "paths": [str(p) for p in paths],
    }


# ====================================================================================================================
# CLI
# ====================================================================================================================
class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one stderr line (no usage block) and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def parse_start(text: str) -> datetime:
    """ISO-8601 start, UTC when no zone is given (``2022-02-08T06:39:00Z``, ``2022-02-08 06:39``)."""
    stamp = pd.Timestamp(text.strip())
    if stamp is pd.NaT:
        raise ValueError(f"not a time: {text!r}")
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return stamp.to_pydatetime()


def _parser() -> argparse.ArgumentParser:
    defaults = {f.name: f.default for f in fields(ScenarioSpec)}
    p = _OneLineParser(prog="python -m pipelines.sim",
                       description="Write a synthetic RocketMQ landing directory (broker stats + send failures).")
    p.add_argument("--out", required=True, help="landing directory to write into")
    p.add_argument("--scenario", default=defaults["name"], choices=sorted(SCENARIOS), help="scenario to generate")
    p.add_argument("--seed", type=int, default=defaults["seed"], help="random seed (numpy default_rng)")
    p.add_argument("--minutes", type=int, default=defaults["minutes"], help="minutes of traffic")
    p.add_argument("--start", default=None,
                   help="UTC start of the first minute, ISO-8601, truncated to the minute "
                        "(default: the current UTC minute minus --minutes)")
    p.add_argument("--brokers", type=int, default=defaults["brokers"], help="number of brokers")
    p.add_argument("--topics", type=int, default=defaults["topics"], help="number of business topics")
    p.add_argument("--groups", type=int, default=defaults["groups"], help="number of consumer groups")
    p.add_argument("--envelope-share", type=float, default=defaults["envelope_share"],
                   help="share of brokers shipping JSON envelopes instead of raw stats.log")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    prog = parser.prog
    try:
        start = parse_start(args.start) if args.start is not None else None
    except (ValueError, TypeError) as exc:
        parser.error(f"argument --start: {exc}")
    try:
        spec = ScenarioSpec(name=args.scenario, seed=args.seed, start=start, minutes=args.minutes,
                            brokers=args.brokers, topics=args.topics, groups=args.groups,
                            envelope_share=args.envelope_share)
    except ValueError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    try:
        result = render_landing(spec, args.out)
    except OSError as exc:
        sys.stderr.write(f"{prog}: error: cannot write landing directory {args.out}: "
                         f"{exc.strerror or exc} ({getattr(exc, 'filename', '') or args.out})\n")
        return 1
    onset = result["onset"]
    incident = (f"incident onset {onset:%Y-%m-%dT%H:%M:%SZ} UTC, culprit group {result['culprit_group']}"
                if isinstance(onset, datetime) else "no incident")
    print(f"simulate {spec.name} seed={spec.seed} start={spec.start_utc:%Y-%m-%dT%H:%M:%SZ} minutes={spec.minutes}: "
          f"{result['files']} files, {result['stats_lines']} stats lines, {result['failure_lines']} failure lines "
          f"in {args.out}; {incident}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
