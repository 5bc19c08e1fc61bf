"""Backtest inputs: the config (``conf/backtest.toml``), the timing of a decision, and the traffic + decisions the
broker model replays, either generated (scenario → landing directory → the governor's real pipeline) or read
from a lake a governor already wrote.

Timing, kept together here: :func:`governor_config` (the governor config as shipped: the backtest has no watermark
or trigger of its own) and :class:`Timing` (when each decision would have been in force at the brokers under the
product's two speeds; ``decided_at`` is the replay's wall clock and is not used).

Lake tables are read through the lake's table registry (:func:`pipelines.io.lake.open_lake`).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import Field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines import rocketmq as rmq
from pipelines.config import ConfigError, ConfigSection, read_toml, throwaway_signing_key, validate_model
from pipelines.io.lake import Lake, open_lake
from pipelines.sim import broker_model as bm
from pipelines.sim.render import render_landing
from pipelines.sim.spec import Incident, ScenarioSpec
from pipelines.sim.traffic import build_traffic

#: Default sizes per scenario (CLI flags override). Small enough for a laptop, long enough for the storm to matter.
SCENARIO_SIZES: dict[str, dict[str, int]] = {
    "retry_storm": {"minutes": 90, "onset_minute": 30},
    "steady": {"minutes": 60},
    "flash_sale": {"minutes": 60, "onset_minute": 30},
    "noisy_neighbour": {"minutes": 90, "onset_minute": 30},
    "normal_day": {"minutes": 90},
    "large_mix": {"minutes": 60, "onset_minute": 30, "brokers": 50, "topics": 10_000, "groups": 2_000},
}


class BacktestError(Exception):
    """A bad backtest config, a missing lake table, or a lake that already holds another run."""


# ====================================================================================================================
# Config (conf/backtest.toml, own typed loader: the governor's config module is not touched)
# ====================================================================================================================
@dataclass(frozen=True)
class BacktestConfig:
    governor_conf: str = "conf/local.toml"
    line_lag_seconds: float = 60.0
    shipping_seconds: float = 5.0
    micro_batch_seconds: float = 5.0
    propagation_seconds: float = 10.0
    broker: bm.BrokerModelConfig = field(default_factory=bm.BrokerModelConfig)


class _TimingSection(ConfigSection):
    line_lag_seconds: float = Field(default=60.0, ge=0)
    shipping_seconds: float = Field(default=5.0, ge=0)
    micro_batch_seconds: float = Field(default=5.0, ge=0)
    propagation_seconds: float = Field(default=10.0, ge=0)


class _BacktestFile(ConfigSection):
    governor_conf: str = "conf/local.toml"
    timing: _TimingSection = _TimingSection()
    broker: bm.BrokerModelConfig = bm.BrokerModelConfig()


def load_backtest_config(path: str | Path | None) -> BacktestConfig:
    """Load ``conf/backtest.toml`` (or defaults when ``path`` is None). Unknown keys and bad values raise
    :class:`BacktestError` naming the setting (validated like the governor's own config)."""
    if path is None:
        return BacktestConfig()
    try:
        data = validate_model(_BacktestFile, read_toml(path))
    except ConfigError as exc:
        raise BacktestError(str(exc)) from None
    return BacktestConfig(
        governor_conf=data.governor_conf,
        line_lag_seconds=data.timing.line_lag_seconds,
        shipping_seconds=data.timing.shipping_seconds,
        micro_batch_seconds=data.timing.micro_batch_seconds,
        propagation_seconds=data.timing.propagation_seconds,
        broker=data.broker,
    )


def governor_config(bcfg: BacktestConfig, landing: str | None, lake: str | None):
    """The governor's config (``bcfg.governor_conf``, its timing as shipped) with the paths, without per-batch GX
    validation."""
    from pipelines.config import load_config

    cfg = load_config(bcfg.governor_conf).with_paths(landing, lake)
    # a replay needs the decisions, not GX's per-batch validation results (row-level expectations still apply)
    return cfg.model_copy(update={"quality": cfg.quality.model_copy(update={"validate_every_n_batches": 0})})




@dataclass(frozen=True)
class Timing:
    """When a decision is in force at the brokers, in seconds after the end of the window it was decided on.

    A window's minute lines are printed at its end and land ``shipping_seconds`` later. The fast path decides a
    ``set`` on the open window as soon as they have landed: it waits for the next trigger (at most
    ``trigger_seconds``), runs one micro-batch and the limit propagates (``fast_seconds``). Recovery (``relax``,
    ``lift``) needs windows known to be free of the anomaly, i.e. finalized: the watermark passes a window once
    lines stamped ``line_lag + watermark`` after its end have landed, Spark applies it from the next micro-batch
    (two triggers at most), then one micro-batch and propagation (``final_seconds``).

    In the simulated cluster every broker prints at the same instant, so an open window's census is complete as
    soon as its lines land and every rule can act on the fast path (docs/contracts.md §2, ``gold/limits.basis``).
    """

    fast_seconds: float
    final_seconds: float

    @classmethod
    def of(cls, inputs: "Inputs", bcfg: BacktestConfig) -> "Timing":
        batch = bcfg.shipping_seconds + bcfg.micro_batch_seconds + bcfg.propagation_seconds
        return cls(
            fast_seconds=inputs.trigger_seconds + batch,
            final_seconds=bcfg.line_lag_seconds + inputs.watermark_seconds + 2 * inputs.trigger_seconds + batch,
        )

    def delays(self, limits: pd.DataFrame) -> pd.Series:
        """Per ``gold/limits`` row: seconds from its ``window_end`` to being in force (``set`` on the fast path,
        recovery on the final path)."""
        if limits is None or not len(limits):
            return pd.Series(dtype=float)
        fast = limits["action"].eq("set")
        return fast.map({True: self.fast_seconds, False: self.final_seconds}).astype(float)


# ====================================================================================================================
# Inputs: generated (scenario + governor run) or replayed (a recorded lake)
# ====================================================================================================================
@dataclass
class Inputs:
    """Everything the broker model and the report need. Frames are pandas; times are UTC."""

    scenario: str
    seed: int | None
    stats: pd.DataFrame  # minute stats rows: minute_start, broker, stat_name, stats_key, sum
    limits: pd.DataFrame  # gold/limits
    anomalies: pd.DataFrame  # gold/anomalies
    topic_tps: pd.DataFrame  # gold/topic_tps
    group_tps: pd.DataFrame  # gold/group_tps
    onset: pd.Timestamp | None
    incident_resources: set[tuple[str, str]]  # resources the scenario made misbehave
    should_limit: set[tuple[str, str]]  # resources a correct governor limits (empty: none)
    incident_brokers: set[str]
    incident_detail: str
    window_seconds: int
    watermark_seconds: int
    trigger_seconds: int
    governor_seconds: float | None = None
    ground_truth: bool = True


def read_table(lake: Lake, table: str) -> pd.DataFrame:
    """A registered lake table (:data:`pipelines.io.lake.TABLES`) as pandas, timestamps UTC-aware; an empty frame
    with the table's columns when it does not exist yet."""
    return _pandas(lake.read(table))


def _pandas(df: DataFrame) -> pd.DataFrame:
    """Collect ``df`` (a few thousand rows: gold tables, minute stats) through Arrow, timestamps UTC-aware."""
    frame = df.toPandas()
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]) and frame[column].dt.tz is None:
            frame[column] = frame[column].dt.tz_localize("UTC")  # Spark collects naive times of the UTC session
    return frame


def _with_backtest_key(cfg, lake: Path):
    """Enforce mode needs a signing key; the backtest's limits.json never reaches a broker, so when none is
    configured a throw-away key is written to ``<lake>/backtest/signing.key``
    (:func:`pipelines.config.throwaway_signing_key`)."""
    key = throwaway_signing_key(cfg.limits, lake / "backtest" / "signing.key")
    if key is None:
        return cfg
    return cfg.model_copy(update={"limits": cfg.limits.model_copy(update={"signing_key_file": str(key)})})


def build_spec(name: str, overrides: dict[str, Any]) -> ScenarioSpec:
    """The scenario's spec: :data:`SCENARIO_SIZES` with the CLI's non-None ``overrides``, starting 2026-11-22 08:00
    UTC unless given. Raises ValueError for a bad spec (:class:`ScenarioSpec`)."""
    sizes = dict(SCENARIO_SIZES.get(name, {}))
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    if "start" not in sizes:
        sizes["start"] = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
    return ScenarioSpec(name=name, **sizes)


def _truth(spec: ScenarioSpec, incident: Incident | None, stats: pd.DataFrame
           ) -> tuple[set, set, set]:
    """Ground truth: (resources the scenario made misbehave, resources a correct governor limits, their brokers)."""
    if incident is None:
        return set(), set(), set()
    if incident.kind in ("retry_storm", "large_mix"):
        res = {("group", incident.culprit_group)}
        return res, res, {incident.culprit_broker}
    if incident.kind == "noisy_neighbour":
        res = {("topic", incident.culprit_topic)}
        return res, res, {incident.culprit_broker}
    if incident.kind == "flash_sale":
        hosts = set(stats.loc[(stats["stat_name"] == rmq.TOPIC_PUT_NUMS)
                              & (stats["stats_key"] == incident.culprit_topic), "broker"].astype(str))
        return {("topic", incident.culprit_topic)}, set(), hosts
    return set(), set(), {incident.culprit_broker} if incident.culprit_broker else set()


def generate_inputs(spark, spec: ScenarioSpec, bcfg: BacktestConfig, lake: Path) -> Inputs:
    """Render the scenario's landing directory, run the governor on it (tables in ``lake``), collect the inputs."""
    from pipelines import governor

    if (lake / "_checkpoints").exists() or (lake / "gold").exists():
        raise BacktestError(f"lake {lake} already holds governor tables; use a fresh --lake or --from-lake {lake}")
    landing = lake / "backtest" / f"landing-{spec.name}"
    render_landing(spec, landing)
    gcfg = _with_backtest_key(governor_config(bcfg, str(landing), str(lake)), lake)
    t0 = time.monotonic()
    governor.run(spark, gcfg, once=True)
    took = time.monotonic() - t0
    traffic = build_traffic(spec)
    incident: Incident | None = traffic.attrs.get("incident")
    stats = traffic.loc[traffic["period"] == "minute", ["minute_start", "broker", "stat_name", "stats_key", "sum"]]
    stats = stats.assign(broker=stats["broker"].astype(str), stat_name=stats["stat_name"].astype(str),
                         stats_key=stats["stats_key"].astype(str))
    inc_res, should, brokers = _truth(spec, incident, stats)
    tables = open_lake(spark, lake, gcfg.lake.writer)
    return Inputs(
        scenario=spec.name, seed=spec.seed, stats=stats,
        limits=read_table(tables, "gold/limits"), anomalies=read_table(tables, "gold/anomalies"),
        topic_tps=read_table(tables, "gold/topic_tps"), group_tps=read_table(tables, "gold/group_tps"),
        onset=pd.Timestamp(incident.onset) if incident else None,
        incident_resources=inc_res, should_limit=should, incident_brokers=brokers,
        incident_detail=incident.detail if incident else "no incident",
        window_seconds=gcfg.windows.length_seconds, watermark_seconds=gcfg.windows.watermark_seconds,
        trigger_seconds=gcfg.windows.trigger_seconds, governor_seconds=took,
    )


def replay_inputs(spark, src: Path, bcfg: BacktestConfig, label: str) -> Inputs:
    """Inputs from a lake a governor already wrote: silver/broker_stats (traffic) and gold tables (decisions).

    Raises:
        BacktestError: ``src`` has no silver/broker_stats table.
    """
    gcfg = governor_config(bcfg, None, None)
    tables = open_lake(spark, src, gcfg.lake.writer)
    if not tables.exists("silver/broker_stats"):
        raise BacktestError(f"no silver/broker_stats table in {src}")
    silver = _pandas(tables.read("silver/broker_stats")
                     .where((F.col("period") == "minute") & F.col("sum").isNotNull())
                     .select("event_time", "broker", "stat_name", "stats_key", "sum"))
    stats = pd.DataFrame({
        "minute_start": pd.to_datetime(silver["event_time"], utc=True) - pd.Timedelta(seconds=60),
        "broker": silver["broker"].astype(str), "stat_name": silver["stat_name"].astype(str),
        "stats_key": silver["stats_key"].astype(str), "sum": silver["sum"].astype(float),
    }).drop_duplicates(["minute_start", "broker", "stat_name", "stats_key"])
    limits, anomalies = read_table(tables, "gold/limits"), read_table(tables, "gold/anomalies")
    enforced = limits[(limits.get("action", pd.Series(dtype=str)) != "lift")
                      & (limits.get("mode", pd.Series(dtype=str)) == "enforce")] if len(limits) else limits
    inc_res = set(zip(enforced["resource_type"], enforced["resource"])) if len(enforced) else set()
    busy = anomalies[anomalies["anomaly"] == "BROKER_BUSY"] if len(anomalies) else anomalies
    onset = None
    if len(busy):
        onset = pd.to_datetime(busy["window_start"], utc=True).min()
    elif len(anomalies):
        onset = pd.to_datetime(anomalies["window_start"], utc=True).min()
    window = 60
    if len(anomalies):
        window = int((pd.to_datetime(anomalies["window_end"]) - pd.to_datetime(anomalies["window_start"]))
                     .dt.total_seconds().iloc[0])
    return Inputs(
        scenario=label, seed=None, stats=stats, limits=limits, anomalies=anomalies,
        topic_tps=read_table(tables, "gold/topic_tps"), group_tps=read_table(tables, "gold/group_tps"), onset=onset,
        incident_resources=inc_res, should_limit=set(inc_res),
        incident_brokers=set(busy["resource"].astype(str)) if len(busy) else set(),
        incident_detail=f"replay of {src} (no ground truth: limited resources taken as the incident)",
        window_seconds=window, watermark_seconds=gcfg.windows.watermark_seconds,
        trigger_seconds=gcfg.windows.trigger_seconds, ground_truth=False,
    )
