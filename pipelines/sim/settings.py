"""The closed-loop backtest's settings: its config (``conf/backtest.toml``, typed, own loader: the governor's config
module is not touched), the scenario sizes it runs by default, and the governor config as shipped.

Nothing here is a governor setting: the governor runs ``governor_conf`` (``conf/local.toml``) exactly as shipped —
its trigger, watermark, fast path, thresholds and per-micro-batch GX validation. What the backtest adds is the
world around it: when lines land (the
shippers), how long a published limit takes to reach the brokers (propagation), the brokers (capacity, send queue,
tick) and the clients' answers to a rejection.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from pydantic import Field

from pipelines.config import ConfigError, ConfigSection, read_toml, throwaway_signing_key, validate_model
from pipelines.sim.broker_model import BrokerModelConfig
from pipelines.sim.cluster import ClientConfig
from pipelines.sim.spec import ScenarioSpec

#: The closed-loop scenarios and their default sizes (CLI flags override): 20-25 minutes, long enough for a storm's
#: limit to be decided, held (or relaxed: the final path relaxes three windows and the 3-minute watermark after the
#: first limit) and lifted after a fix, short enough for 2 cores (``bench/closed_loop.py`` prints what the suite
#: costs). Surges need a baseline of ``detection.baseline_min_windows`` finalized windows before their onset.
_CLUSTER = {"brokers": 4, "topics": 10, "groups": 6}
SCENARIO_SIZES: dict[str, dict[str, Any]] = {
    "persisting_storm": {**_CLUSTER, "minutes": 20, "onset_minute": 6, "culprit_topic_brokers": 2},
    "storm_fixed": {**_CLUSTER, "minutes": 24, "onset_minute": 6, "culprit_topic_brokers": 2, "storm_fix_minute": 14},
    "storm_fixed_legit_retry": {**_CLUSTER, "minutes": 26, "onset_minute": 6, "culprit_topic_brokers": 2,
                                "storm_fix_minute": 14, "fixed_retry_share": 0.06},
    "intermittent_storm": {**_CLUSTER, "minutes": 40, "onset_minute": 6, "culprit_topic_brokers": 2,
                           "storm_on_minutes": 4, "storm_off_minutes": 4, "storm_episodes": 3},
    "intermittent_short": {**_CLUSTER, "minutes": 34, "onset_minute": 6, "culprit_topic_brokers": 2,
                           "storm_on_minutes": 4, "storm_off_minutes": 2, "storm_episodes": 3},
    "spread_storm": {**_CLUSTER, "brokers": 5, "minutes": 20, "onset_minute": 6, "culprit_topic_brokers": 4},
    "flash_sale": {**_CLUSTER, "minutes": 25, "onset_minute": 12},
    "noisy_neighbour": {**_CLUSTER, "minutes": 22, "onset_minute": 12, "noisy_put_tps": 800.0,
                        "culprit_broker_normal_put_per_min": 15_000, "culprit_topic_tps": 150.0},
    "noisy_neighbour_long": {**_CLUSTER, "minutes": 54, "onset_minute": 12, "noisy_put_tps": 800.0, "noisy_minutes": 32,
                             "culprit_broker_normal_put_per_min": 15_000, "culprit_topic_tps": 150.0},
    "normal_day": {**_CLUSTER, "minutes": 20},
    # consumer clients without the fallback send (SCENARIO_WORLDS): nothing the governor reads shows the refused
    # demand of a storm at its cap
    "persisting_no_fallback": {**_CLUSTER, "minutes": 24, "onset_minute": 6, "culprit_topic_brokers": 2},
    "storm_late_broker": {**_CLUSTER, "minutes": 24, "onset_minute": 6, "culprit_topic_brokers": 2},
    "storm_governor_killed": {**_CLUSTER, "minutes": 26, "onset_minute": 6, "culprit_topic_brokers": 2},
    "intermittent_no_fallback": {**_CLUSTER, "brokers": 5, "minutes": 46, "onset_minute": 6, "culprit_topic_brokers": 3,
                                 "culprit_topic_shares": (0.5, 0.3, 0.2), "storm_on_minutes": 4, "storm_off_minutes": 3,
                                 "storm_episodes": 3},
    "storm_irregular_evidence": {**_CLUSTER, "brokers": 5, "minutes": 30, "onset_minute": 6, "onset_second": 30,
                                 "culprit_topic_brokers": 3, "storm_fix_minute": 17, "fixed_retry_share": 0.09},
}
#: The world around a named scenario where it differs from ``conf/backtest.toml``'s regular one: ``clients``
#: (:class:`pipelines.sim.cluster.ClientConfig` fields) and ``irregular`` (:class:`pipelines.sim.irregular.
#: Irregularity` fields; brokers by name, seconds from the run's start). The Spark-free loop and the Spark backtest
#: run each scenario in its world (:func:`scenario_world`).
_CPP = {"fallback_send": False}
SCENARIO_WORLDS: dict[str, dict[str, dict[str, Any]]] = {
    "persisting_no_fallback": {"clients": _CPP},
    "storm_late_broker": {"clients": _CPP, "irregular": {"stats_delay_seconds": {"broker-d": 185.0}}},
    "storm_governor_killed": {"clients": _CPP, "irregular": {"governor_restart_second": (6 + 4) * 60 + 180.0,
                                                             "governor_down_seconds": 180.0}},
    "intermittent_no_fallback": {"clients": _CPP},
    "storm_irregular_evidence": {"clients": _CPP, "irregular": {
        "apply_delay_seconds": {"broker-b": 120.0}, "dropped_minutes": [("broker-a", 8)],
        "duplicated_minutes": [("broker-c", 9, 90.0)]}},
}
#: What each named scenario stands for (the role its name abbreviates).
SCENARIO_ROLES: dict[str, str] = {
    "persisting_storm": "persisting storm", "storm_fixed": "storm fixed after N minutes",
    "storm_fixed_legit_retry": "storm fixed, then a legitimate 6 % retry level",
    "intermittent_storm": "intermittent storm",
    "intermittent_short": "intermittent storm, quiet spells shorter than a lift",
    "spread_storm": "storm on a topic spread over 3+ brokers",
    "flash_sale": "legit flash sale (healthy brokers)", "noisy_neighbour": "busy broker from a surging topic",
    "noisy_neighbour_long": "busy broker from a topic surging for half an hour", "normal_day": "normal day",
    "persisting_no_fallback": "persisting storm, consumer clients without the fallback send",
    "storm_late_broker": "persisting storm beside a broker shipping 3 minutes late, no fallback send",
    "storm_governor_killed": "persisting storm, the governor killed 4 minutes in and restarted 3 minutes later",
    "intermittent_no_fallback": "storm 4 minutes on, 3 off, on 3 of 5 brokers, no fallback send",
    "storm_irregular_evidence": "storm from mid-minute on 3 of 5 brokers, a carrier applying 2 minutes late, a "
                                "minute dropped and one doubled, fixed to a 9 % retry",
}


class BacktestError(Exception):
    """A bad backtest config or scenario, or a lake that already holds a run."""


class ShippingConfig(ConfigSection):
    """When the lines reach the governor's landing directory (the log shippers)."""

    stats_seconds: float = Field(default=5.0, ge=0)  # a minute line's print (end of its minute) → landed, s
    failures_seconds: float = Field(default=5.0, ge=0)  # a failed send → its line landed, s
    failures_batch_seconds: float = Field(default=0.0, ge=0)  # the failure shipper sends every N s (0: as logged)


class BacktestConfig(ConfigSection):
    """``conf/backtest.toml`` (every setting commented there). Unknown keys and bad values are errors."""

    governor_conf: str = "conf/local.toml"
    propagation_seconds: float = Field(default=10.0, ge=0)  # published limits.json → in force at the brokers, s
    poll_milliseconds: int = Field(default=100, gt=0)  # the queries' trigger while the harness steps (wall time)
    shipping: ShippingConfig = ShippingConfig()
    broker: BrokerModelConfig = BrokerModelConfig()
    clients: ClientConfig = ClientConfig()


def load_backtest_config(path: str | Path | None) -> BacktestConfig:
    """Load ``conf/backtest.toml`` (defaults when ``path`` is None).

    Raises:
        BacktestError: the file is missing or not TOML, or a setting is unknown or out of range (named).
    """
    if path is None:
        return BacktestConfig()
    try:
        return validate_model(BacktestConfig, read_toml(path))
    except ConfigError as exc:
        raise BacktestError(str(exc)) from None


def governor_config(bcfg: BacktestConfig, landing: str | None, lake: str | None):
    """The governor's config, ``bcfg.governor_conf`` exactly as shipped (GX validation per micro-batch included:
    its time is part of what a micro-batch costs), with the paths."""
    from pipelines.config import load_config

    return load_config(bcfg.governor_conf).with_paths(landing, lake)


def with_backtest_key(cfg, lake: Path):
    """Enforce mode needs a signing key; the backtest's brokers are simulated, so when none is configured a
    throw-away key is written to ``<lake>/backtest/signing.key`` (:func:`pipelines.config.throwaway_signing_key`)."""
    key = throwaway_signing_key(cfg.limits, lake / "backtest" / "signing.key")
    if key is None:
        return cfg
    return cfg.model_copy(update={"limits": cfg.limits.model_copy(update={"signing_key_file": str(key)})})


def scenario_world(name: str, bcfg: BacktestConfig):
    """The world named scenario ``name`` runs in (:data:`SCENARIO_WORLDS`): ``bcfg`` with its clients' settings, and
    its :class:`pipelines.sim.irregular.Irregularity` (the regular world for a scenario without an entry)."""
    from pipelines.sim.irregular import Irregularity

    world = SCENARIO_WORLDS.get(name, {})
    if world.get("clients"):
        bcfg = bcfg.model_copy(update={"clients": bcfg.clients.model_copy(update=world["clients"])})
    return bcfg, Irregularity(**world.get("irregular", {}))


def build_spec(name: str, overrides: dict[str, Any], now: dt.datetime | None = None) -> ScenarioSpec:
    """The scenario's spec: :data:`SCENARIO_SIZES` with the non-None ``overrides``. Unless ``start`` is given the
    run ends a few minutes before ``now`` (UTC): the governor quarantines lines stamped more than
    ``stats.max_future_seconds`` after their ingestion, which is wall-clock time.

    Raises:
        BacktestError: unknown scenario or a bad spec (the message names it).
    """
    if name not in SCENARIO_SIZES:
        raise BacktestError(f"unknown scenario {name!r} (known: {', '.join(sorted(SCENARIO_SIZES))})")
    sizes = dict(SCENARIO_SIZES[name])
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    if "start" not in sizes:
        now = now or dt.datetime.now(dt.timezone.utc)
        sizes["start"] = (now - dt.timedelta(minutes=int(sizes.get("minutes", 25)) + 10)).replace(second=0,
                                                                                                   microsecond=0)
    try:
        return ScenarioSpec(name=name, **sizes)
    except (TypeError, ValueError) as exc:
        raise BacktestError(f"scenario {name}: {exc}") from None
