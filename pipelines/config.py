"""Typed configuration of rate-governor, loaded from a TOML file in ``conf/``.

Every setting has a default and its documentation here (``Field(description=...)``: units and where the default
comes from) and a comment in ``conf/local.toml`` (``tests/test_config.py`` keeps the two equal). Unknown keys are an
error, so a typo in a config file is caught at start-up instead of silently falling back to a default. The sinks'
sections are :mod:`pipelines.config_sinks`, Spark's :mod:`pipelines.config_spark`, ``[metrics]``
:mod:`pipelines.config_ops`, the section machinery :mod:`pipelines.config_base`; all importable from here.

Example:
    >>> cfg = load_config("conf/local.toml")
    >>> cfg.windows.length_seconds
    60
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipelines.config_base import ConfigError, ConfigSection, read_toml, validate_model
from pipelines.config_base import ConfigSection as _Section
from pipelines.config_ops import MetricsConfig, OverridesConfig
from pipelines.config_sinks import CURRENT_FORK_DEFAULT_QPS, KafkaSinkConfig, RocketMQSinkConfig, SinkConfig
from pipelines.config_spark import DECISION_QUERY_CONF, SparkConfig

__all__ = [
    "ConfigError", "ConfigSection", "read_toml", "validate_model", "CURRENT_FORK_DEFAULT_QPS", "KafkaSinkConfig",
    "RocketMQSinkConfig", "SinkConfig", "KafkaSourceConfig", "SourceConfig", "LakeConfig", "StatsConfig",
    "BrokersConfig", "WindowsConfig", "DetectionConfig", "LimitsConfig", "SparkConfig", "DEFAULT_PANDAS_MAX_ROWS",
    "QualityConfig", "MetricsConfig", "OverridesConfig", "GovernorConfig", "DECISION_QUERY_CONF", "parse_config",
    "load_config", "throwaway_signing_key",
]


class KafkaSourceConfig(_Section):
    """Spark Kafka source settings (production transport), used when ``source.kind = "kafka"``."""

    bootstrap_servers: str = Field("", description="Kafka bootstrap servers, comma-separated ``host:port``.")
    stats_topic: str = Field("rmq-broker-stats", description=(
        "Topic of the stats.log records (raw lines or JSON envelopes, docs/contracts.md §1.1); the name is this "
        "project's convention."))
    failures_topic: str = Field("rmq-send-failures", description=(
        "Topic of the send-failure JSON lines (docs/contracts.md §1.2); the name is this project's convention."))
    starting_offsets: str = Field("latest", description=(
        "Spark Kafka source ``startingOffsets`` of a new checkpoint (``latest``, ``earliest`` or a JSON offsets "
        "object); Spark's own default for streaming queries."))
    max_offsets_per_trigger: int = Field(default=0, ge=0, description=(
        "Spark ``maxOffsetsPerTrigger``: records per micro-batch over all partitions; 0 = no limit (Spark's "
        "default)."))
    options: dict[str, str] = Field(default_factory=dict, description=(
        "Passed to the Spark Kafka source as ``kafka.<key>`` options unchanged, e.g. SASL/SSL settings."))


class SourceConfig(_Section):
    """Where the raw records come from (docs/contracts.md §1)."""

    kind: Literal["files", "kafka"] = Field("files", description=(
        "``files`` (Spark's file source over ``<landing>/broker_stats`` and ``<landing>/send_failures``, the "
        "embedded default) or ``kafka`` (:class:`KafkaSourceConfig`, production)."))
    landing: str = Field("landing", description=(
        "Landing directory of the file source (relative to the working directory); the CLI's ``--landing`` "
        "overrides it."))
    max_files_per_trigger: int = Field(default=0, ge=0, description=(
        "Files per micro-batch of the file source (Spark ``maxFilesPerTrigger``); 0 = no limit, everything that "
        "has landed. With a limit the gold query reads one ingest batch's metric events per micro-batch."))
    kafka: KafkaSourceConfig = Field(KafkaSourceConfig(), description="The Kafka source (``[source.kafka]``).")


class LakeConfig(_Section):
    """The lake: Delta tables, checkpoints and ``control/limits.json``."""

    path: str = Field("lake", description=(
        "Root of the Delta tables and of ``control/limits.json`` (local path or URI); the CLI's ``--lake`` "
        "overrides it."))
    writer: Literal["auto", "delta-rs", "delta-spark"] = Field("auto", description=(
        "Delta writer: ``auto`` (delta-spark when the Delta jars are on the classpath, else delta-rs), "
        "``delta-rs`` or ``delta-spark`` (:mod:`pipelines.dataplane.lake`)."))
    checkpoint_dir: str = Field("", description="Streaming checkpoints; empty = ``<lake>/_checkpoints``.")
    lease_ttl_seconds: int = Field(default=60, ge=3, description=(
        "Seconds a governor's lease on the lake (``<lake>/_governor.lease``, :mod:`pipelines.job.lease`) stays "
        "valid; renewed every ttl/3 s, a crashed holder's lease is taken over after it (at once on the same host). "
        "60 s: this project's choice, a few trigger intervals."))
    executor_write_rows: int = Field(default=200_000, ge=0, description=(
        "delta-rs lake only: an append of more rows than this is written as Parquet by Spark's executors and "
        "committed by delta-rs; smaller ones go through the driver as Arrow "
        "(:class:`pipelines.dataplane.lake.delta_rs.DeltaRsLake`). Rows; 0 = always from the executors. The default "
        "keeps a micro-batch collected on the driver well inside a 4 GiB driver (docs/performance.md)."))


class StatsConfig(_Section):
    """Parsing of stats.log lines (docs/rocketmq-formats.md §1)."""

    timezone: str = Field("GMT+8", description=(
        "Zone of stats.log timestamps: RocketMQ's logback pattern ``%d{yyy-MM-dd HH:mm:ss,GMT+8}`` "
        "(``logback_broker.xml``, docs/rocketmq-formats.md §1)."))
    max_line_chars: int = Field(default=4096, gt=0, description=(
        "Characters; a longer line is quarantined (a real stats line is under 300)."))
    max_future_seconds: int = Field(default=60, ge=0, description=(
        "Seconds; a record stamped further ahead of its ingestion is quarantined (a broker clock running fast). "
        "Keep it below ``windows.watermark_seconds`` minus the shipping delay: an accepted line of a clock s "
        "seconds fast moves the watermark s seconds ahead, and the other brokers' lines count as late once s "
        "exceeds the watermark delay."))
    max_age_days: int = Field(default=3650, ge=0, description=(
        "Days; a record older than this at ingestion is quarantined; 0 disables the check."))


class BrokersConfig(_Section):
    """Broker names, and which brokers are evidence (:mod:`pipelines.dataplane.known_brokers`,
    docs/contracts.md §1)."""

    addresses: dict[str, str] = Field(default_factory=dict, description=(
        "``ip:port`` → broker name, for send failures that name a broker by address (docs/contracts.md §1.2); an "
        "address not listed is an unknown broker whenever the known brokers are listed."))
    known: tuple[str, ...] = Field((), description=(
        "The brokers whose stats lines and send failures are evidence when no name server lists them (the RocketMQ "
        "sink off, or its name servers unreachable at start): names or fnmatch-style patterns, ``*`` any run of "
        "characters, ``?`` one character, case-sensitive, no character classes (``broker-*``). Empty, with no name "
        "server: every broker name is trusted (logged at start)."))
    refresh_seconds: float = Field(default=30.0, gt=0, description=(
        "Seconds between two reads of the brokers from the name servers (``GET_BROKER_CLUSTER_INFO``) when the "
        "RocketMQ sink is on: a broker registers every 30 s (RocketMQ ``BrokerConfig.registerNameServerPeriod``)."))

    @field_validator("known")
    @classmethod
    def _plain_patterns(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            if not entry or any(c.isspace() or c in "[]" for c in entry):
                raise ValueError(f"brokers.known: {entry!r} is not a broker name or pattern (no spaces, no "
                                 "character classes: use * and ?)")
        return entries


class WindowsConfig(_Section):
    """Event-time windows."""

    length_seconds: int = Field(default=60, gt=0, description=(
        "Window length, seconds: RocketMQ's minute statistics (``StatsItem`` ``Stats In One Minute``, "
        "docs/rocketmq-formats.md §1)."))
    watermark_seconds: int = Field(default=120, ge=0, description=(
        "Seconds to wait for late lines before a window is final. A minute line is printed at the end of the "
        "minute it covers; the watermark runs over stats and failure events alike, so while failure lines flow a "
        "minute line counts only while it lands at most about 65 s later than usual, with none flowing up to 3 "
        "minutes behind the fastest broker (docs/backtest.md §6.1); the fast path does not wait for it."))
    trigger_seconds: int = Field(default=10, gt=0, description=(
        "Processing-time trigger of the continuous job, seconds (ignored with --once): the three queries' "
        "micro-batches of one stats minute finish within it on 2 cores (docs/performance.md)."))
    fast_trigger_seconds: int = Field(default=2, gt=0, description=(
        "Micro-batch trigger interval of the fast query, seconds (continuous job): it reads the metric events the "
        "ingest query writes, so it finds a micro-batch's events at its next trigger after they are written; 2 s "
        "keeps containment within about one ``trigger_seconds`` of the lines landing, and a trigger that finds "
        "nothing new costs a directory listing."))
    fast_path: Literal["continuous", "always", "never"] = Field("continuous", description=(
        "When the fast path (preliminary decisions on open windows, :mod:`pipelines.job.flows.fast`) runs: in the "
        "continuous job only (a backlog run with --once decides every window on the final path), always, or "
        "never."))

    def fast_path_on(self, once: bool) -> bool:
        """Whether the fast query runs in a run with (``once``) or without --once."""
        return self.fast_path == "always" or (self.fast_path == "continuous" and not once)


class DetectionConfig(_Section):
    """Thresholds of the anomaly rules (:mod:`pipelines.decide.catalogue`, docs/decisions.md §2). The
    defaults are this project's choices, sized against article 001's incident unless a description says more."""

    retry_ratio_threshold: float = Field(default=0.5, gt=0, description=(
        "RUNAWAY_RETRY: a group's retry TPS (``SNDBCK_PUT_NUMS``) at least this share (ratio, 0.5 = 50 %) of its "
        "consume TPS (``GROUP_GET_NUMS``) on its non-retry topics."))
    retry_floor_tps: float = Field(default=50.0, ge=0, description=(
        "RUNAWAY_RETRY: and at least this many retries per second (msg/s); article 001's storm ran at 785."))
    surge_factor: float = Field(default=4.0, gt=1, description=(
        "TRAFFIC_SURGE: put TPS at least this many times (factor) the resource's own baseline; article 001's "
        "broker rose 8x."))
    busy_surge_factor: float = Field(default=2.5, gt=1, description=(
        "TRAFFIC_SURGE of a topic whose own sends were refused as busy in the window (at ``busy_failures_floor``): "
        "this factor instead of ``surge_factor``. A busy broker writes its capacity and fast-fails the rest, so "
        "the surge it hides shows capped (a 4.0x surge showed 3.3x admitted with a tenth of its refusals logged; "
        "docs/decisions.md §4)."))
    surge_floor_tps: float = Field(default=50.0, ge=0, description=(
        "TRAFFIC_SURGE: and at least this many messages per second (msg/s), so tiny topics going 0 → 5 msg/s "
        "do not fire."))
    baseline_quantile: float = Field(default=0.5, gt=0, lt=1, description=(
        "Baseline: this quantile (0.5 = the median) of the resource's put TPS over its previous "
        "``baseline_windows`` finalized windows."))
    baseline_windows: int = Field(default=30, gt=0, description=(
        "Baseline: finalized windows it is taken over (30 one-minute windows = half an hour)."))
    baseline_min_windows: int = Field(default=5, gt=0, description=(
        "Baseline: windows needed at least; with fewer, TRAFFIC_SURGE does not fire."))
    busy_failures_floor: int = Field(default=10, gt=0, description=(
        "BROKER_BUSY: busy failures (``[TIMEOUT_CLEAN_QUEUE]``, ``[PCBUSY_CLEAN_QUEUE]``, ``[REJECTREQUEST]``, "
        "``[OVERLOAD]``, ``[PC_SYNCHRONIZED]``: the broker's ``SYSTEM_BUSY`` remarks, docs/rocketmq-formats.md "
        "§4-5) of one broker in one window, count."))
    failure_rate_threshold: float = Field(default=0.05, gt=0, le=1, description=(
        "FAILURE_SPIKE: a topic's failures ÷ (failures + puts) in a window at least this (ratio, 0.05 = 5 %); "
        "``RATE_LIMITED`` rejections never count."))
    failure_floor: int = Field(default=20, gt=0, description="FAILURE_SPIKE: and at least this many failures (count).")
    critical_factor: float = Field(default=4.0, ge=1, description=(
        "Severity is ``critical`` when the observed value is at least this many times (factor) the rule's "
        "threshold, else ``warning``; a critical anomaly may cut past ``limits.max_cut_pct`` and the cool-down."))

    @model_validator(mode="after")
    def _min_le_windows(self) -> "DetectionConfig":
        if self.baseline_min_windows > self.baseline_windows:
            raise ValueError("detection.baseline_min_windows must be <= detection.baseline_windows")
        return self


class LimitsConfig(_Section):
    """How limits are decided, issued and lifted (:mod:`pipelines.decide`, docs/decisions.md §4)."""

    mode: Literal["enforce", "advisory"] = Field("enforce", description=(
        "``enforce`` (brokers apply the limits) or ``advisory`` (shadow mode: decisions are recorded, brokers only "
        "log them); the control record's ``mode`` (docs/contracts.md §3)."))
    allowed_retry_share: float = Field(default=0.1, gt=0, le=1, description=(
        "A runaway group's retry traffic is limited to this share (ratio, 0.1 = 10 %) of its consume TPS on its "
        "non-retry topics (never below ``min_limit_qps``)."))
    min_limit_qps: float = Field(default=1.0, gt=0, description=(
        "Floor of every limit, msg/s (cluster-wide; counted once, not per broker)."))
    surge_headroom: float = Field(default=2.0, ge=1, description=(
        "A surging topic on a busy broker is limited to its baseline times this factor; an advisory surge record "
        "is never below its observed rate times it."))
    surge_squeeze_headroom: float = Field(default=1.5, ge=1, description=(
        "A surge limit squeezed while a carrier stays busy at its cap is cut no lower than its frozen baseline "
        "times this factor (≤ ``surge_headroom``): above the topic's normal traffic, which its fix returns to."))
    surge_burst_share: float = Field(default=0.7, gt=0, le=1, description=(
        "A surge limit's per-broker share on a carrier that was busy keeps the carrier's writes (its other writes "
        "plus the share) at most this share (ratio) of what it wrote busy: the first limit and every probe "
        "(:class:`pipelines.decide.limits.surge.SurgeLimit`). A limiter rejecting most of the demand opens its "
        "breaker, and each time it closes a second of tokens (``burst_seconds``) reaches the broker's 200 ms send "
        "queue at once: in the simulator carriers went busy at 0.79-0.90 of their busy writes and stayed healthy at "
        "0.58-0.66 (docs/decisions.md §4)."))
    surge_floor_yield_share: float = Field(default=0.79, gt=0, le=1, description=(
        "A surge's first limit yields its floor (``surge_squeeze_headroom`` x the baseline) when at that floor a "
        "carrier that was busy, its other senders back at their normal, would write more than this share (ratio) "
        "of what it wrote busy and they alone would not: the lowest share at which the breaker's bursts were seen "
        "to keep a carrier busy (0.79, the ``surge_burst_share`` measurements). At 0.9 a carrier at 0.874 of its "
        "busy writes kept its floor and its bystanders lost 1.91 % of their sends after containment; where the "
        "other senders alone write more than the share, a yield would only hold the topic under its normal "
        "traffic (docs/decisions.md §4)."))
    storm_room_share: float = Field(default=0.95, gt=0, le=1, description=(
        "A retry storm's first limit on a busy carrier keeps the carrier's writes (its usual senders at their "
        "normal plus the storms) at most this share (ratio) of what it wrote busy "
        "(:meth:`pipelines.decide.limits.retry_storm.RetryStormLimit.first_bound`): filled to the whole of it, a "
        "carrier stays busy (a limiter rejecting most of a storm bursts as its breaker closes). On a broker of 1.37x "
        "headroom its bystanders lost 1.63 % of their sends after containment at 1.0, 0.48 % at 0.95; on one of "
        "1.10x, at 0.9 a fixed group's legitimate retries (16 msg/s) stayed over its 4.4 msg/s limit and it was "
        "never lifted, at 0.95 (23 msg/s) it was lifted 5.9 min after its fix (docs/decisions.md §4)."))
    ttl_seconds: int = Field(default=600, gt=0, description=(
        "Seconds after its decision that a limit expires unless refreshed (fail open when the governor stops): "
        "two refresh periods."))
    burst_seconds: float = Field(default=1.0, gt=0, description=(
        "Token-bucket burst in seconds of ``limit_qps`` (``burst = max(1, ceil(limit_qps × burst_seconds))``): "
        "one second, the default capacity of RocketMQ's ``TokenBucketRateLimiter`` (article 001)."))
    breaker_open_ms: int = Field(default=1000, ge=0, description=(
        "Milliseconds the broker limiter's circuit breaker stays open after a rejection: "
        "``circuitBreakerOpenTime``, 1 s by default (article 001, Sohu ``RateLimitHandler``)."))
    max_limit_qps: float = Field(default=1_000_000.0, gt=0, description="Ceiling of every limit, msg/s.")
    hysteresis_pct: float = Field(default=10.0, ge=0, lt=100, description=(
        "Percent: a tighter limit within this much of the current one is not recorded (hysteresis)."))
    cooldown_windows: int = Field(default=2, ge=0, description=(
        "Windows after a change during which a resource's limit is not tightened again (unless critical)."))
    max_cut_pct: float = Field(default=50.0, gt=0, le=100, description=(
        "Percent: one decision cuts at most this much of the current limit (or observed rate) unless critical."))
    refresh_seconds: int = Field(default=300, gt=0, description=(
        "Seconds of event time after which a limit is re-issued (new ``expires_at``) while its anomaly lasts."))
    recovery_windows: int = Field(default=3, gt=0, description=(
        "Windows: a limit is lifted this many clear windows (below ``bound_share`` of the cap and the rule silent "
        "on the visible demand) after the last window that kept it (the cause seen, or its demand hidden at the "
        "cap); a surge limit at its cap on healthy brokers this long is probed upward; a probe the demand "
        "followed is not tried again for this many windows × 2^n."))
    relax_factor: float = Field(default=1.5, gt=1, description=(
        "Factor of one upward probe of a limit at its cap (NSQ's RDY policy, article 003): a surge limit's, and "
        "a retry-storm limit's whose demand is hidden."))
    bound_share: float = Field(default=0.9, gt=0, le=1, description=(
        "Closed loop (:mod:`pipelines.decide.limits.base`): a limited resource whose cluster-wide admitted rate "
        "is at least this share (ratio) of its cluster-wide limit runs at its cap, where the limit hides the "
        "demand: ``bound`` when the rule fires on what shows (the cause persists, refreshed), else ``capped`` "
        "(unknown: never a clear window, probed). Below it the demand is visible and the rule itself judges it."))
    surge_max_changes: int = Field(default=3, ge=1, description=(
        "A surge limit's value changes at most this many times while its cause lasts (a first cut down to its "
        "target, probes and their step-backs): a probe is taken only when its possible step-back still fits."))
    probe_max_windows: int = Field(default=2, ge=1, description=(
        "Windows: the most a retry-storm limit's probe stays raised when no whole window under it has answered: "
        "its undo is published at most this many windows after the probe was (decided at the first trigger one "
        "``windows.trigger_seconds`` before), however late its carriers' evidence. With ``relax_factor`` it is "
        "a probe's stated cost: at most this many windows at ``relax_factor`` times the level before."))
    probe_headroom_share: float = Field(default=0.9, gt=0, le=1, description=(
        "A probe never raises a carrier's predicted writes above this share (ratio) of what that broker wrote in "
        "the last window it was busy (a busy broker writes about its capacity and fast-fails the rest); a surge's "
        "probe at most ``surge_burst_share`` of it."))
    max_held_seconds: int = Field(default=3600, gt=0, description=(
        "Seconds of event time; a limit held longer is flagged on the status page and logged once (WARNING) for "
        "a person to look at."))
    max_at_cap_seconds: int = Field(default=1800, gt=0, description=(
        "Seconds of event time: a limit held at its cap (``bound`` or ``capped``; a few windows under it do not count, "
        "``recovery_windows`` clear in a row do) this long "
        "is named for a person (``RateGovernorLimitAtCap``, the status page): a group whose fixed consumer keeps "
        "retrying 20-47 % of what it consumes under a cap of 10 % looks the same at the cap as its storm, and no "
        "probe can tell them apart (its demand takes every raise). 30 minutes: longer than any storm of the "
        "backtest's kinds is held through its probes, short enough to page within the hour."))
    max_recovery_windows: int = Field(default=12, ge=1, description=(
        "Windows: the most clear windows a lift needs, however many recurrences. Flap damping doubles "
        "``recovery_windows`` per recurrence within ``recurrence_windows`` of the last lift (3, 6, 12 with the "
        "shipped settings), up to max(``recovery_windows``, this) (at or below ``recovery_windows``: no "
        "doubling): a storm that came back once keeps its limit through quiet spells of up to 6 minutes, twice "
        "through 12. 12, not more: a cause's lift lands about its clear windows plus 3-4 minutes (the watermark, a "
        "trigger, the publication) after its final fix, and a cause that came back twice or more must be lifted "
        "within 20 minutes of its final fix (24 windows would not be). The choice and the range tried: "
        "docs/decisions.md."))
    recurrence_windows: int = Field(default=30, ge=0, description=(
        "Windows: recurrence memory (flap damping, :meth:`pipelines.decide.limits.base.LimitPolicy.recurrence`). An "
        "anomaly within this many final windows of its resource's last lift is a recurrence: the limit goes "
        "straight to the target remembered from before, and each recurrence doubles the clear windows the next lift "
        "needs (``recovery_windows`` × 2^n, at most max(``recovery_windows``, ``max_recovery_windows``)); 0 = no "
        "memory. 30 one-minute windows: half an hour, as the surge baseline."))
    advisory_resources: tuple[str, ...] = Field((), description=(
        "Topics and groups that get advisory records even when ``mode = \"enforce\"`` (shadow mode per "
        "resource)."))
    signing_key_env: str = Field("RATE_GOVERNOR_SIGNING_KEY", description=(
        "Environment variable holding the HMAC-SHA256 key of the control records (wins over "
        "``signing_key_file``); in enforce mode a missing key is a start-up error."))
    signing_key_file: str = Field("", description=(
        "File holding the signing key (never in the repository), read when the variable is unset; \"\" = none."))
    protected: tuple[str, ...] = Field((
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRACE_TOPIC",
        "TBW102",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    ), description=(
        "Resources never limited: RocketMQ's system topics (``TopicValidator``: the delay-level topic, the trace "
        "topic, the auto-create template ``TBW102``, the transaction half and op topics)."))


DEFAULT_PANDAS_MAX_ROWS = 500_000


class QualityConfig(_Section):
    """Data quality (pipelines/dataplane/quality/): row-level enforcement of the GX suites and GX validation cadence."""

    enforce: bool = Field(True, description=(
        "Rows of ``silver/*`` that fail an expectation of the GX suites go to quarantine (``expectation failed: "
        "<expectation>(<column>)``); false = only the parse's own reasons quarantine."))
    validate_every_n_batches: int = Field(default=1, ge=0, description=(
        "GX validates the candidate silver rows of every Nth ingest micro-batch (``quality/validation_results``, "
        "``quality/validation_runs``); 0 = never (enforcement and reconciliation still run)."))
    pandas_max_rows: int = Field(default=DEFAULT_PANDAS_MAX_ROWS, ge=0, description=(
        "Rows: GX validates a micro-batch of up to this many with its pandas engine on the driver (several times "
        "faster than its Spark engine at micro-batch sizes, docs/performance.md), a larger one with its Spark "
        "engine."))


class GovernorConfig(_Section):
    """The whole configuration. Sections mirror the TOML tables of ``conf/local.toml``."""

    source: SourceConfig = Field(SourceConfig(), description="``[source]``: where the raw records come from.")
    lake: LakeConfig = Field(LakeConfig(), description="``[lake]``: the Delta tables, checkpoints and limits.json.")
    stats: StatsConfig = Field(StatsConfig(), description="``[stats]``: parsing of stats.log lines.")
    brokers: BrokersConfig = Field(BrokersConfig(), description="``[brokers]``: broker names, known brokers.")
    windows: WindowsConfig = Field(WindowsConfig(), description="``[windows]``: event-time windows and triggers.")
    detection: DetectionConfig = Field(DetectionConfig(), description="``[detection]``: the anomaly rules' thresholds.")
    limits: LimitsConfig = Field(LimitsConfig(), description="``[limits]``: how limits are decided and issued.")
    sink: SinkConfig = Field(SinkConfig(), description="``[sink]``: the write-back sinks.")
    spark: SparkConfig = Field(SparkConfig(), description="``[spark]``: the Spark session.")
    quality: QualityConfig = Field(QualityConfig(), description="``[quality]``: data quality.")
    metrics: MetricsConfig = Field(MetricsConfig(), description="``[metrics]``: the Prometheus endpoint.")
    overrides: OverridesConfig = Field(OverridesConfig(), description="``[overrides]``: operators' overrides.")

    def with_paths(self, landing: str | None = None, lake: str | None = None) -> "GovernorConfig":
        """Return a copy with the landing directory and/or lake root replaced (CLI overrides)."""
        source = self.source.model_copy(update={"landing": landing}) if landing else self.source
        lake_cfg = self.lake.model_copy(update={"path": lake}) if lake else self.lake
        return self.model_copy(update={"source": source, "lake": lake_cfg})

    @property
    def checkpoint_root(self) -> str:
        """Directory of the streaming checkpoints: ``lake.checkpoint_dir`` or ``<lake>/_checkpoints``."""
        return self.lake.checkpoint_dir or str(Path(self.lake.path) / "_checkpoints")


def parse_config(data: dict) -> GovernorConfig:
    """Validate a config mapping (the parsed TOML). Raises :class:`ConfigError` naming the bad setting."""
    return validate_model(GovernorConfig, data)


def load_config(path: str | Path) -> GovernorConfig:
    """Load and validate a TOML config file.

    Raises:
        ConfigError: the file does not exist, is not valid TOML, or has an invalid setting.
    """
    return parse_config(read_toml(path))


def throwaway_signing_key(limits: LimitsConfig, key_file: str | Path) -> Path | None:
    """A random signing key for a run whose control records never reach a real broker (the demo, a backtest).

    When ``limits`` names no key (``signing_key_file`` empty and the ``signing_key_env`` variable unset or empty),
    writes 32 random bytes as hex to ``key_file`` (mode 0600, parent directories created) and returns its path;
    otherwise returns None and writes nothing. The key is no secret of any cluster: production keys come from the
    environment or a key file named in the config, never from this function.
    """
    import os
    import secrets

    if limits.signing_key_file or os.environ.get(limits.signing_key_env):
        return None
    path = Path(key_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(secrets.token_hex(32), encoding="utf-8")
    path.chmod(0o600)
    return path
