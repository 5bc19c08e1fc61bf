"""What determines a generated landing directory: :class:`ScenarioSpec`, the ground truth :class:`Incident`,
broker names and the random streams; plus the small vocabulary shared by the other sim modules (line styles,
period texts).

Same spec (with ``start``) → byte-identical files. One ``numpy.random.default_rng(seed)`` spawns a child
generator per stage (:data:`RNG_STREAMS`), so a scenario that draws more numbers does not shift the catalog or
the base noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd

from pipelines import rocketmq as rmq

#: Line styles (docs/rocketmq-formats.md §2): StatsItem ``SUM/TPS/AVGPT``, RTStatsItem ``TIMES/AVGRT``,
#: MomentStatsItem ``Value`` (the ``style`` column of the model frame).
STYLE_SUM, STYLE_TIMES, STYLE_VALUE = "SUM", "TIMES", "VALUE"
#: ``period`` value (as in silver/broker_stats, docs/contracts.md §2) → its text in a line (``Stats In One Minute``),
#: from :data:`pipelines.rocketmq.PERIODS`.
PERIOD_TEXT: dict[str, str] = {period: f"Stats {text}" for text, period in rmq.PERIODS.items()}
#: One child generator per stage, spawned from ``default_rng(seed)`` in this order.
RNG_STREAMS: tuple[str, ...] = ("catalog", "traffic", "scenario", "realise", "failures", "render")
#: One stats.log minute.
MINUTE = pd.Timedelta(minutes=1)


@dataclass(frozen=True)
class ScenarioSpec:
    """Everything that determines a generated landing directory. Same spec (with ``start``) → same bytes."""

    # --- run -------------------------------------------------------------------------------------------------------
    name: str = "retry_storm"  # key of pipelines.sim.scenarios.SCENARIOS (checked where it is looked up)
    seed: int = 7  # numpy.random.default_rng(seed)
    start: datetime | None = None  # UTC start of the first minute; None → current UTC minute − minutes
    minutes: int = 90  # minutes of traffic (one minute line per series per minute)
    brokers: int = 3  # broker-a, broker-b, …
    topics: int = 30  # business topics (topic 0 = culprit_topic)
    groups: int = 20  # consumer groups (group 0 = culprit_group)
    cluster: str = "DefaultCluster"  # brokerClusterName: the key of BROKER_PUT_NUMS / BROKER_GET_NUMS
    #                                  (docs/rocketmq-formats.md §3)
    envelope_share: float = 0.3  # share of brokers whose lines arrive in shipper JSON envelopes
    #                              (docs/contracts.md §1.1)
    gmt_offset_hours: int = 8  # stats.log stamps are rendered in GMT+8 whatever the host zone
    #                            (docs/rocketmq-formats.md §1)

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
    busy_period_ms_min: int = 200  # waitTimeMillsInSendQueue default (docs/rocketmq-formats.md §5):
    #                                requests waited ≥ 200 ms
    busy_period_ms_max: int = 300  # exclusive upper bound of "period in queue: 2xxms"
    busy_queue_size_min: int = 50  # "size of queue: n" range
    busy_queue_size_max: int = 3000

    # --- broken consumer groups (persisting_storm, storm_fixed, intermittent_storm, spread_storm) ----------------
    culprit_topic_brokers: int = 1  # brokers hosting culprit_topic (and the group's retry topic):
    #                                 broker-a, broker-b, …
    culprit_topic_shares: tuple = ()  # ... and its share on each of them, in that order (fractions; () → equal)
    storm_consume_tps: float = 400.0  # culprit_topic's put rate = what the group consumes of it (all brokers), msgs/s
    storm_sendback_tps: float = 600.0  # send-backs while the group is broken (all brokers), msgs/s:
    #                                    1.5x its consumption
    storm_write_amplification: float = 3.15  # extra broker writes per send-back (schedule topic …): article 001's
    #                                          (225,400 − 30,000 − 47,119) / 47,119 unattributed writes per minute
    storm_fix_minute: int | None = None  # storm_fixed: the group is fixed from this minute
    #                                      (None → halfway after onset)
    storm_on_minutes: int = 4  # intermittent_storm: broken this many minutes …
    storm_off_minutes: int = 4  # … then fine this many, repeated from the onset …
    storm_episodes: int | None = None  # … this many times (None → to the end of the run)
    fixed_retry_share: float = 0.0  # once fixed (between episodes too), the group still sends back this share of
    #                                 what it consumes (transient errors: a legitimate retry level of a few percent)

    # --- when a cause starts and stops, at any second (the broken-consumer kinds, noisy_neighbour, compound) -------
    onset_second: int = 0  # the cause starts this many seconds into its onset minute (each episode's start too)
    ramp_minutes: float = 0.0  # ... and grows linearly to its full level over this many minutes (0: at once)
    fix_second: int = 0  # a fix (storm_fix_minute, the end of noisy_minutes) lands this many seconds into its minute
    rollout_minutes: float = 0.0  # ... and is rolled out linearly over this many minutes: the cause is over at its end

    # --- compound: several causes at once (scenario "compound") ----------------------------------------------------
    #: Each cause ``(kind, index, start_second, stop_second, level, required)``: ``kind`` "storm" (consumer group
    #: ``index`` of the catalog sends back ``level`` msgs/s over its subscriptions, each send-back costing
    #: ``storm_write_amplification`` unattributed broker writes) or "surge" (topic ``index`` is put at ``level``
    #: msgs/s over all its brokers); seconds from the run's start, ``stop_second`` < 0: to the end;
    #: ``required`` 0: a limit on it is allowed, not required (its broker's demand is within 0.9-1.1x capacity);
    #: "flash": topic ``index`` put at ``level`` legitimately (no cause, never to be limited), ramped over the last
    #: field's minutes. Several entries of one resource: a cause that comes back.
    causes: tuple = ()

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
    noisy_minutes: int | None = None  # how long the surge lasts (None → to the end of the run), minutes

    # --- normal_day: diurnal traffic, noise, one broker restart -------------------------------------------------
    diurnal_amplitude: float = 0.35  # put rates × (1 + a·sin(2π·(t/day − 1/4))): trough at the start
    day_minutes: int | None = None  # period of the diurnal curve; None → the run's own length (a compressed day)
    restart_broker_index: int = 1  # broker-b restarts ...
    restart_minute: int | None = None  # ... at this minute (None → minutes // 2): its first minute prints NaN

    def __post_init__(self) -> None:
        problems: list[str] = []
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
        if not 1 <= self.culprit_topic_brokers <= max(self.brokers, 1):
            problems.append(f"culprit topic brokers must be within 1..{self.brokers}, got {self.culprit_topic_brokers}")
        if self.culprit_topic_shares and (len(self.culprit_topic_shares) != self.culprit_topic_brokers or any(
                x <= 0 for x in self.culprit_topic_shares) or abs(sum(self.culprit_topic_shares) - 1.0) > 1e-9):
            problems.append(f"culprit topic shares must be {self.culprit_topic_brokers} fractions > 0 summing to 1, "
                            f"got {self.culprit_topic_shares}")
        if self.storm_fix_minute is not None and not self.onset_index < self.storm_fix_minute <= self.minutes:
            problems.append(f"storm fix minute must be within {self.onset_index + 1}..{self.minutes}, "
                            f"got {self.storm_fix_minute}")
        if self.storm_on_minutes < 1 or self.storm_off_minutes < 1:
            problems.append("storm on/off minutes must be >= 1")
        if self.storm_episodes is not None and self.storm_episodes < 1:
            problems.append(f"storm episodes must be >= 1, got {self.storm_episodes}")
        if not 0.0 <= self.fixed_retry_share < 1.0:
            problems.append(f"fixed retry share must be within [0, 1), got {self.fixed_retry_share}")
        if self.noisy_minutes is not None and self.noisy_minutes < 1:
            problems.append(f"noisy minutes must be >= 1, got {self.noisy_minutes}")
        if self.culprit_topic_tps * 60 >= self.culprit_broker_normal_put_per_min:
            problems.append("culprit_topic_tps must be below the culprit broker's normal put rate")
        if not 0 <= self.onset_second < 60 or not 0 <= self.fix_second < 60:
            problems.append("onset_second and fix_second must be within 0..59")
        if self.ramp_minutes < 0 or self.rollout_minutes < 0:
            problems.append("ramp_minutes and rollout_minutes must be >= 0")
        for cause in self.causes:
            if len(cause) != 6 or cause[0] not in ("storm", "surge", "flash"):
                problems.append(f"bad cause {cause!r}: (storm|surge|flash, index, start_second, stop_second, level, "
                                "required or, for a flash sale, its ramp in minutes)")
                continue
            limit = self.groups if cause[0] == "storm" else self.topics
            if not 0 <= cause[1] < limit or not 0 <= cause[2] < self.minutes * 60 or cause[4] <= 0 or (
                    0 <= cause[3] <= cause[2]):
                problems.append(f"bad cause {cause!r}")
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
    #: UTC [start, end) spans while the cause is active (a broken consumer before its fix); empty = from the onset
    #: to the end of the run.
    active: tuple[tuple[datetime, datetime], ...] = ()
    #: The ground truth, one entry per cause (a compound incident has several); empty: the one culprit above.
    causes: tuple["Cause", ...] = ()


@dataclass(frozen=True)
class Cause:
    """One cause of an incident, as a correct governor would limit it: the resource (``group``: a consumer group's
    retry traffic; ``topic``: a surging topic), ``kind`` (``storm`` or ``surge``), the UTC [start, end) spans while
    it is active (from its first second to the end of its fix's roll-out), ``ramp_seconds`` (it reaches its full
    level that long after each span's start: the onset clock starts there), ``required`` (False: a limit on it is
    allowed, not required: its broker's demand sits within 0.9-1.1x its capacity) and the brokers it loads."""

    resource_type: str
    resource: str
    kind: str
    active: tuple[tuple[datetime, datetime], ...]
    ramp_seconds: float = 0.0
    required: bool = True
    brokers: tuple[str, ...] = ()


def span_seconds(start, n: int, spans) -> np.ndarray:
    """Per second of a run starting at ``start`` (UTC) and lasting ``n`` seconds: whether it is inside one of
    ``spans`` (UTC ``[a, b)`` pairs; a span's first second from its start's whole second, its last up to the second
    its end falls in)."""
    mask = np.zeros(n, dtype=bool)
    for a, b in spans:
        lo = max(0, int((pd.Timestamp(a) - pd.Timestamp(start)).total_seconds()))
        hi = min(n, int(np.ceil((pd.Timestamp(b) - pd.Timestamp(start)).total_seconds())))
        mask[lo:hi] = True
    return mask


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


def rng_streams(seed: int) -> dict[str, np.random.Generator]:
    """One child of ``numpy.random.default_rng(seed)`` per stage of :data:`RNG_STREAMS`."""
    return dict(zip(RNG_STREAMS, np.random.default_rng(seed).spawn(len(RNG_STREAMS))))
