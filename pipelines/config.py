"""Typed configuration of rate-governor, loaded from a TOML file in ``conf/``.

Every setting has a default here and a comment in ``conf/local.toml``. Unknown keys are an error, so a typo in a
config file is caught at start-up instead of silently falling back to a default.

Example:
    >>> cfg = load_config("conf/local.toml")
    >>> cfg.windows.length_seconds
    60
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(Exception):
    """The configuration file is missing, not TOML, or has an invalid setting (the message names it)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: Base of every config section: unknown keys are errors, values are immutable.
ConfigSection = _Section
_M = TypeVar("_M", bound=BaseModel)


class KafkaSourceConfig(_Section):
    """Spark Kafka source settings (production transport). ``options`` are passed through, e.g. SASL/SSL."""

    bootstrap_servers: str = ""
    stats_topic: str = "rmq-broker-stats"
    failures_topic: str = "rmq-send-failures"
    starting_offsets: str = "latest"
    max_offsets_per_trigger: int = Field(default=0, ge=0)
    options: dict[str, str] = Field(default_factory=dict)


class SourceConfig(_Section):
    kind: Literal["files", "kafka"] = "files"
    landing: str = "landing"
    max_files_per_trigger: int = Field(default=0, ge=0)
    kafka: KafkaSourceConfig = KafkaSourceConfig()


class LakeConfig(_Section):
    path: str = "lake"
    writer: Literal["auto", "delta-rs", "delta-spark"] = "auto"
    checkpoint_dir: str = ""
    #: One governor per lake: a lease (pipelines/io/lease.py) renewed every ttl/3 s; a crashed holder's lease
    #: expires after this long (at once when it ran on the same host).
    lease_ttl_seconds: int = Field(default=60, ge=3)
    #: delta-rs lake: an ingest append of more rows than this is written by Spark's executors and committed by
    #: delta-rs; smaller ones go through the driver as Arrow (pipelines/io/lake/delta_rs.py DeltaRsLake).
    executor_write_rows: int = Field(default=200_000, ge=0)


class StatsConfig(_Section):
    """Parsing of stats.log lines. The GMT+8 default is RocketMQ's logback pattern (docs/rocketmq-formats.md §1)."""

    timezone: str = "GMT+8"
    max_line_chars: int = Field(default=4096, gt=0)
    #: A line stamped further ahead of its ingestion is quarantined (a broker clock running fast). Keep it below
    #: ``windows.watermark_seconds`` minus the shipping delay: an accepted line of a clock s seconds fast moves the
    #: watermark s seconds ahead, and the other brokers' lines count as late once s exceeds the watermark delay.
    max_future_seconds: int = Field(default=60, ge=0)
    max_age_days: int = Field(default=3650, ge=0)


class BrokersConfig(_Section):
    addresses: dict[str, str] = Field(default_factory=dict)


class WindowsConfig(_Section):
    """Event-time windows. 60 s matches RocketMQ's minute stats (StatsItem ``Stats In One Minute``)."""

    length_seconds: int = Field(default=60, gt=0)
    watermark_seconds: int = Field(default=120, ge=0)
    trigger_seconds: int = Field(default=10, gt=0)
    #: When the fast path (preliminary decisions on open windows, :mod:`pipelines.flows.fast`) runs: in the
    #: continuous job only (a backlog run with --once decides every window on the final path), always, or never.
    fast_path: Literal["continuous", "always", "never"] = "continuous"

    def fast_path_on(self, once: bool) -> bool:
        """Whether the fast query runs in a run with (``once``) or without --once."""
        return self.fast_path == "always" or (self.fast_path == "continuous" and not once)


class DetectionConfig(_Section):
    retry_ratio_threshold: float = Field(default=0.5, gt=0)
    retry_floor_tps: float = Field(default=50.0, ge=0)
    surge_factor: float = Field(default=4.0, gt=1)
    surge_floor_tps: float = Field(default=50.0, ge=0)
    baseline_quantile: float = Field(default=0.5, gt=0, lt=1)
    baseline_windows: int = Field(default=30, gt=0)
    baseline_min_windows: int = Field(default=5, gt=0)
    busy_failures_floor: int = Field(default=10, gt=0)
    failure_rate_threshold: float = Field(default=0.05, gt=0, le=1)
    failure_floor: int = Field(default=20, gt=0)
    critical_factor: float = Field(default=4.0, ge=1)

    @model_validator(mode="after")
    def _min_le_windows(self) -> "DetectionConfig":
        if self.baseline_min_windows > self.baseline_windows:
            raise ValueError("detection.baseline_min_windows must be <= detection.baseline_windows")
        return self


class LimitsConfig(_Section):
    @model_validator(mode="after")
    def _clear_below_bound(self) -> "LimitsConfig":
        if self.clear_share >= self.bound_share:
            raise ValueError("limits.clear_share must be below limits.bound_share")
        return self

    mode: Literal["enforce", "advisory"] = "enforce"
    allowed_retry_share: float = Field(default=0.1, gt=0, le=1)
    min_limit_qps: float = Field(default=1.0, gt=0)
    surge_headroom: float = Field(default=2.0, ge=1)
    ttl_seconds: int = Field(default=600, gt=0)
    burst_seconds: float = Field(default=1.0, gt=0)
    breaker_open_ms: int = Field(default=1000, ge=0)
    max_limit_qps: float = Field(default=1_000_000.0, gt=0)
    hysteresis_pct: float = Field(default=10.0, ge=0, lt=100)
    cooldown_windows: int = Field(default=2, ge=0)
    max_cut_pct: float = Field(default=50.0, gt=0, le=100)
    refresh_seconds: int = Field(default=300, gt=0)
    recovery_windows: int = Field(default=3, gt=0)
    relax_factor: float = Field(default=1.5, gt=1)
    #: Closed loop (pipelines/transforms/fold.py): a limited resource whose cluster-wide observed rate is at least
    #: this share of its cluster-wide limit runs at its cap (its anomaly persists) ...
    bound_share: float = Field(default=0.9, gt=0, le=1)
    #: ... and recovery counts only windows at most this share of the limit with no limiter rejection.
    clear_share: float = Field(default=0.5, gt=0, lt=1)
    #: A limit held longer than this (seconds of event time) is flagged on the status page and in the log.
    max_held_seconds: int = Field(default=3600, gt=0)
    #: Recurrence memory (flap damping, pipelines/transforms/fold.py): an anomaly within this many windows of its
    #: resource's last lift is a recurrence: straight to the remembered target, and each recurrence doubles the clear
    #: windows the next lift needs (recovery_windows x 2^n, at most max(recovery_windows, recurrence_windows)).
    recurrence_windows: int = Field(default=30, ge=0)
    advisory_resources: tuple[str, ...] = ()
    signing_key_env: str = "RATE_GOVERNOR_SIGNING_KEY"
    signing_key_file: str = ""
    protected: tuple[str, ...] = (
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRACE_TOPIC",
        "TBW102",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    )


class KafkaSinkConfig(_Section):
    """Kafka write-back (kafka-python): a compacted topic, key ``<resource_type>:<resource>``, JSON value,
    tombstone on lift. ``options`` are passed to ``KafkaProducer`` (e.g. security_protocol, sasl_mechanism)."""

    enabled: bool = False
    bootstrap_servers: str = ""
    topic: str = "rate-governor-limits"
    #: Replication factor when the sink creates the (compacted, one-partition) topic.
    replication_factor: int = Field(default=1, ge=1)
    options: dict[str, str | int | bool] = Field(default_factory=dict)


#: ``BrokerConfig`` ``sendMsgRateLimitQps`` / ``sendRetryMsgRateLimitQps`` of the current sohutv/rocketmq line
#: (5.1.1-sohu-02/-03, 5.3.1-sohu-01), the sink's fallback defaults.
CURRENT_FORK_DEFAULT_QPS = (10000.0, 1000.0)


class RocketMQSinkConfig(_Section):
    """RocketMQ admin write-back (pipelines/io/rocketmq_sink.py): limits pushed to the master brokers of a Sohu
    RocketMQ cluster with MQCloud's rate-limit requests.

    The brokers' own default rates are read from each master (``GET_BROKER_CONFIG``, re-read every
    ``defaults_refresh_seconds``); ``default_topic_qps`` / ``default_retry_qps`` are only the fallback for a broker
    that cannot be read: the current fork line's ``BrokerConfig`` defaults 10000 / 1000 (sohutv/rocketmq
    5.1.1-sohu-02/-03, 5.3.1-sohu-01), the older line's 2000 / 100 (4.9.3-sohu, 5.1.1-sohu). ``request_codes``
    ``"330/329"`` exist only on 4.9.3-sohu builds before 2023-05-31 (older line): on 5.x, 329 is
    ``DELETE_EXPIRED_COMMITLOG``, so that choice with the current line's fallback defaults is refused here, and
    per broker at run time when its version is 5.x. One publish talks to up to ``max_parallel_brokers`` masters at
    once and gives up on the rest after ``publish_deadline_ms`` (a request: ``timeout_ms``). Connections idle for
    90 % of ``idle_timeout_seconds`` (the servers' ``serverChannelMaxIdleTimeSeconds``, 120) are renewed before use.
    ACL keys (``AclClientRPCHook`` signing) come from the two environment variables, else from ``acl_key_file``
    (``AccessKey=`` / ``SecretKey=`` lines); neither: requests go unsigned."""

    enabled: bool = False
    namesrv_addr: tuple[str, ...] = ()
    cluster: str = ""
    request_codes: Literal["9003/9002", "330/329"] = "9003/9002"
    timeout_ms: int = Field(default=3000, gt=0)
    publish_deadline_ms: int = Field(default=5000, gt=0)
    max_parallel_brokers: int = Field(default=16, gt=0, le=256)
    idle_timeout_seconds: float = Field(default=120.0, gt=0)
    defaults_refresh_seconds: float = Field(default=300.0, ge=0)
    default_topic_qps: float = Field(default=CURRENT_FORK_DEFAULT_QPS[0], gt=0)
    default_retry_qps: float = Field(default=CURRENT_FORK_DEFAULT_QPS[1], gt=0)
    acl_access_key_env: str = "RATE_GOVERNOR_ROCKETMQ_ACCESS_KEY"
    acl_secret_key_env: str = "RATE_GOVERNOR_ROCKETMQ_SECRET_KEY"
    acl_key_file: str = ""
    ledger_file: str = ""

    @model_validator(mode="after")
    def _namesrv_when_enabled(self) -> "RocketMQSinkConfig":
        if self.enabled and not self.namesrv_addr:
            raise ValueError("sink.rocketmq.namesrv_addr must list at least one name server when enabled")
        if self.request_codes == "330/329" and (self.default_topic_qps,
                                                self.default_retry_qps) == CURRENT_FORK_DEFAULT_QPS:
            raise ValueError(
                'sink.rocketmq.request_codes = "330/329" is for 4.9.3-sohu builds before 2023-05 (defaults 2000 / '
                "100); default_topic_qps / default_retry_qps 10000 / 1000 are the current 5.x line, where 329 is "
                'DELETE_EXPIRED_COMMITLOG: use "9003/9002", or set the older line\'s defaults')
        return self


class SinkConfig(_Section):
    kafka: KafkaSinkConfig = KafkaSinkConfig()
    rocketmq: RocketMQSinkConfig = RocketMQSinkConfig()


class SparkConfig(_Section):
    master: str = "local[2]"
    app_name: str = "rate-governor"
    shuffle_partitions: int = Field(default=4, gt=0)
    #: Keep the gold side's DataFrames (finalized windows) in one partition (pipelines.transforms.gold.partitioning).
    gold_single_partition: bool = True
    conf: dict[str, str] = Field(default_factory=dict)


#: GX validates a DataFrame of up to this many rows with its pandas engine on the driver, a larger one with its
#: Spark engine (pipelines/quality/validation.py Validator; the crossover measured in docs/performance.md).
DEFAULT_PANDAS_MAX_ROWS = 500_000


class QualityConfig(_Section):
    """Data quality (pipelines/quality/): row-level enforcement of the GX suites and GX validation cadence."""

    enforce: bool = True
    validate_every_n_batches: int = Field(default=1, ge=0)
    pandas_max_rows: int = Field(default=DEFAULT_PANDAS_MAX_ROWS, ge=0)


class GovernorConfig(_Section):
    """The whole configuration. Sections mirror the TOML tables of ``conf/local.toml``."""

    source: SourceConfig = SourceConfig()
    lake: LakeConfig = LakeConfig()
    stats: StatsConfig = StatsConfig()
    brokers: BrokersConfig = BrokersConfig()
    windows: WindowsConfig = WindowsConfig()
    detection: DetectionConfig = DetectionConfig()
    limits: LimitsConfig = LimitsConfig()
    sink: SinkConfig = SinkConfig()
    spark: SparkConfig = SparkConfig()
    quality: QualityConfig = QualityConfig()

    def with_paths(self, landing: str | None = None, lake: str | None = None) -> "GovernorConfig":
        """Return a copy with the landing directory and/or lake root replaced (CLI overrides)."""
        source = self.source.model_copy(update={"landing": landing}) if landing else self.source
        lake_cfg = self.lake.model_copy(update={"path": lake}) if lake else self.lake
        return self.model_copy(update={"source": source, "lake": lake_cfg})

    @property
    def checkpoint_root(self) -> str:
        """Directory of the streaming checkpoints: ``lake.checkpoint_dir`` or ``<lake>/_checkpoints``."""
        return self.lake.checkpoint_dir or str(Path(self.lake.path) / "_checkpoints")


def validate_model(model: type[_M], data: dict) -> _M:
    """Validate a mapping (parsed TOML) against a config model.

    Raises:
        ConfigError: a setting has the wrong type or range, or a key is unknown; the message names it.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid config: {problems}") from None


def parse_config(data: dict) -> GovernorConfig:
    """Validate a config mapping (the parsed TOML). Raises :class:`ConfigError` naming the bad setting."""
    return validate_model(GovernorConfig, data)


def read_toml(path: str | Path) -> dict:
    """Read a TOML config file.

    Raises:
        ConfigError: the file does not exist or is not valid TOML.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: {file}")
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None


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
