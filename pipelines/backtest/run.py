"""Backtest: replay traffic through a broker model with and without the governor's limits.

Usage::

    python -m pipelines.backtest --scenario NAME --lake DIR [--conf conf/backtest.toml] [--seed 7] [--minutes N]
                                 [--onset N] [--brokers N] [--topics N] [--groups N] [--strict]
    python -m pipelines.backtest --from-lake SRC --lake DIR [--conf conf/backtest.toml] [--scenario LABEL]

``--scenario``: generate the scenario (:data:`pipelines.sim.scenarios.SCENARIOS`) into
``DIR/backtest/landing-<scenario>``, run the governor's real pipeline on it (:func:`pipelines.governor.run`,
``--once``, tables in ``DIR``), then run the broker model (:mod:`pipelines.broker_model`) twice on the scenario's
traffic: without limits and with the enforced limits of ``gold/limits``. ``--from-lake SRC``: replay what a governor
already recorded in ``SRC`` (``silver/broker_stats`` for the traffic, ``gold/limits``, ``gold/anomalies``,
``gold/topic_tps``, ``gold/group_tps``); results go to ``DIR``. Without ground truth, the limited resources are
taken as the incident and the ``BROKER_BUSY`` brokers as its brokers.

Outputs (``DIR/backtest/``):

* Delta table ``results`` (:data:`pipelines.schemas.BACKTEST_RESULTS`, also in :data:`pipelines.lake.TABLES`):
  one row per run × governor (with/without/both) × resource class × metric, appended per run (``run_id``).
* ``report-<scenario>.md``: onset → first enforced limit (windows, seconds), rejected sends per class with and
  without the governor, false limits, limits below the observed peak, limits over time, the done checks.
* ``backtest-<scenario>.png``: per broker and per resource TPS with anomalies and limits, without | with.

A limit reaches the brokers at ``window_end + line_lag + watermark + trigger + propagation`` (``conf/backtest.toml``;
``decided_at`` is the replay's wall clock and is not used) and stays until its next decision arrives, it is lifted,
or it expires (``expires_at − decided_at`` after arrival).
"""

from __future__ import annotations

import datetime as dt
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from pydantic import Field

from pipelines.sim import broker_model as bm
from pipelines import rocketmq as rmq
from pipelines.sim.render import render_landing
from pipelines.sim.scenarios import SCENARIOS
from pipelines.sim.spec import Incident, ScenarioSpec
from pipelines.sim.traffic import build_traffic
from pipelines.cli import OneLineParser, fail
from pipelines.config import ConfigError, ConfigSection, read_toml, validate_model

PROG = "python -m pipelines.backtest"
RESULTS_TABLE = "backtest/results"
CLASSES = ("incident", "bystander", "other")

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
    watermark_seconds: int | None = None  # None → the governor config's value
    trigger_seconds: int | None = None
    line_lag_seconds: float = 60.0
    propagation_seconds: float = 10.0
    broker: bm.BrokerModelConfig = field(default_factory=bm.BrokerModelConfig)


class _GovernorSection(ConfigSection):
    watermark_seconds: int | None = Field(default=None, ge=0)
    trigger_seconds: int | None = Field(default=None, gt=0)


class _TimingSection(ConfigSection):
    line_lag_seconds: float = Field(default=60.0, ge=0)
    propagation_seconds: float = Field(default=10.0, ge=0)


class _BacktestFile(ConfigSection):
    governor_conf: str = "conf/local.toml"
    governor: _GovernorSection = _GovernorSection()
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
        watermark_seconds=data.governor.watermark_seconds,
        trigger_seconds=data.governor.trigger_seconds,
        line_lag_seconds=data.timing.line_lag_seconds,
        propagation_seconds=data.timing.propagation_seconds,
        broker=data.broker,
    )


def governor_config(bcfg: BacktestConfig, landing: str | None, lake: str | None):
    """The governor's config (``bcfg.governor_conf``) with the backtest's watermark/trigger and the paths, without
    per-batch GX validation."""
    from pipelines.config import load_config

    cfg = load_config(bcfg.governor_conf).with_paths(landing, lake)
    update = {}
    if bcfg.watermark_seconds is not None:
        update["watermark_seconds"] = bcfg.watermark_seconds
    if bcfg.trigger_seconds is not None:
        update["trigger_seconds"] = bcfg.trigger_seconds
    if update:
        cfg = cfg.model_copy(update={"windows": cfg.windows.model_copy(update=update)})
    # a replay needs the decisions, not GX's per-batch validation results (row-level expectations still apply)
    return cfg.model_copy(update={"quality": cfg.quality.model_copy(update={"validate_every_n_batches": 0})})


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


def read_table(lake: str | Path, table: str) -> pd.DataFrame:
    """A lake table as pandas via delta-rs (empty frame when the table does not exist)."""
    from deltalake import DeltaTable

    path = str(Path(lake) / table)
    if not DeltaTable.is_deltatable(path):
        return pd.DataFrame()
    return DeltaTable(path).to_pandas()


def build_spec(name: str, overrides: dict[str, Any]) -> ScenarioSpec:
    sizes = dict(SCENARIO_SIZES.get(name, {}))
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    if "start" not in sizes:
        sizes["start"] = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)
    return ScenarioSpec(name=name, **sizes)


def _truth(spec: ScenarioSpec, incident: Incident | None, stats: pd.DataFrame
           ) -> tuple[set, set, set]:
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


def _with_backtest_key(cfg, lake: Path):
    """Enforce mode needs a signing key; the backtest's limits.json never reaches a broker, so when none is
    configured a throwaway random key is written to ``<lake>/backtest/signing.key`` (not a secret of any cluster)."""
    import os
    import secrets

    limits = cfg.limits
    env = getattr(limits, "signing_key_env", None)
    if not hasattr(limits, "signing_key_file") or limits.signing_key_file or (env and os.environ.get(env)):
        return cfg
    key = lake / "backtest" / "signing.key"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text(secrets.token_hex(32), encoding="utf-8")
    return cfg.model_copy(update={"limits": limits.model_copy(update={"signing_key_file": str(key)})})


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
    return Inputs(
        scenario=spec.name, seed=spec.seed, stats=stats,
        limits=read_table(lake, "gold/limits"), anomalies=read_table(lake, "gold/anomalies"),
        topic_tps=read_table(lake, "gold/topic_tps"), group_tps=read_table(lake, "gold/group_tps"),
        onset=pd.Timestamp(incident.onset) if incident else None,
        incident_resources=inc_res, should_limit=should, incident_brokers=brokers,
        incident_detail=incident.detail if incident else "no incident",
        window_seconds=gcfg.windows.length_seconds, watermark_seconds=gcfg.windows.watermark_seconds,
        trigger_seconds=gcfg.windows.trigger_seconds, governor_seconds=took,
    )


def replay_inputs(src: Path, bcfg: BacktestConfig, label: str) -> Inputs:
    """Inputs from a lake a governor already wrote: silver/broker_stats (traffic) and gold tables (decisions)."""
    silver = read_table(src, "silver/broker_stats")
    if silver.empty:
        raise BacktestError(f"no silver/broker_stats table in {src}")
    silver = silver[(silver["period"] == "minute") & silver["sum"].notna()]
    stats = pd.DataFrame({
        "minute_start": pd.to_datetime(silver["event_time"], utc=True) - pd.Timedelta(seconds=60),
        "broker": silver["broker"].astype(str), "stat_name": silver["stat_name"].astype(str),
        "stats_key": silver["stats_key"].astype(str), "sum": silver["sum"].astype(float),
    }).drop_duplicates(["minute_start", "broker", "stat_name", "stats_key"])
    limits, anomalies = read_table(src, "gold/limits"), read_table(src, "gold/anomalies")
    gcfg = governor_config(bcfg, None, None)
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
        topic_tps=read_table(src, "gold/topic_tps"), group_tps=read_table(src, "gold/group_tps"), onset=onset,
        incident_resources=inc_res, should_limit=set(inc_res),
        incident_brokers=set(busy["resource"].astype(str)) if len(busy) else set(),
        incident_detail=f"replay of {src} (no ground truth: limited resources taken as the incident)",
        window_seconds=window, watermark_seconds=gcfg.windows.watermark_seconds,
        trigger_seconds=gcfg.windows.trigger_seconds, ground_truth=False,
    )


# ====================================================================================================================
# The two model runs and their metrics
# ====================================================================================================================
@dataclass
class Outcome:
    inputs: Inputs
    delay_seconds: float
    schedule: pd.DataFrame
    without: bm.ModelResult
    with_: bm.ModelResult
    capacity: pd.Series
    metrics: pd.DataFrame  # governor, resource_class, metric, value, unit
    checks: list[tuple[str, bool, str]]
    model_seconds: float


def decision_delay(inputs: Inputs, bcfg: BacktestConfig) -> float:
    """Seconds from a window's end to its limit being applied by the brokers."""
    return bcfg.line_lag_seconds + inputs.watermark_seconds + inputs.trigger_seconds + bcfg.propagation_seconds


def classify(res: pd.DataFrame, inputs: Inputs) -> np.ndarray:
    """Resource class per model row: ``incident``, ``bystander`` (on an incident broker), ``other``, ``background``."""
    key = list(zip(res["resource_type"], res["resource"]))
    inc = np.fromiter((k in inputs.incident_resources for k in key), dtype=bool, count=len(key))
    by = res["broker"].isin(inputs.incident_brokers).to_numpy()
    bg = (res["resource_type"] == bm.BACKGROUND).to_numpy()
    return np.where(bg, "background", np.where(inc, "incident", np.where(by, "bystander", "other")))


def observed_peaks(inputs: Inputs) -> dict[tuple[str, str], float]:
    """Peak observed TPS per resource from the gold tables: topic put TPS, group retry TPS."""
    peaks: dict[tuple[str, str], float] = {}
    if len(inputs.topic_tps) and "put_tps" in inputs.topic_tps:
        for t, v in inputs.topic_tps.groupby("topic")["put_tps"].max().items():
            peaks[("topic", str(t))] = float(v)
    if len(inputs.group_tps):
        col = next((c for c in ("retry_tps", "sndbck_tps") if c in inputs.group_tps), None)
        gcol = "consumer_group" if "consumer_group" in inputs.group_tps else None
        if col and gcol:
            per = inputs.group_tps.groupby([gcol, "window_start"])[col].sum().groupby(level=0).max()
            for g, v in per.items():
                peaks[("group", str(g))] = float(v)
    return peaks


def run_models(inputs: Inputs, bcfg: BacktestConfig) -> Outcome:
    t0 = time.monotonic()
    delay = decision_delay(inputs, bcfg)
    offered = bm.offered_from_stats(inputs.stats, bcfg.broker)
    schedule = bm.limit_schedule(inputs.limits, delay_seconds=delay)
    capacity = bm.broker_capacity(offered, bcfg.broker)
    without = bm.simulate(offered, None, bcfg.broker, capacity)
    with_ = bm.simulate(offered, schedule, bcfg.broker, capacity)
    took = time.monotonic() - t0
    rows: list[tuple[str, str, str, float, str]] = []
    for name, result in (("without", without), ("with", with_)):
        r = result.resources
        cls = classify(r, inputs)
        for c in CLASSES:
            sel = r[cls == c]
            rows += [
                (name, c, "resources", float(sel[["resource_type", "resource"]].drop_duplicates().shape[0]), "count"),
                (name, c, "offered", float(sel["offered"].sum()), "msgs"),
                (name, c, "limiter_rejected", float(sel["limited_rejected"].sum()), "msgs"),
                (name, c, "busy_rejected", float(sel["busy_rejected"].sum()), "msgs"),
                (name, c, "rejected", float((sel["limited_rejected"] + sel["busy_rejected"]).sum()), "msgs"),
                (name, c, "admitted", float(sel["admitted"].sum()), "msgs"),
            ]
    metrics = pd.DataFrame(rows, columns=["governor", "resource_class", "metric", "value", "unit"])

    def val(gov: str, c: str, m: str) -> float:
        hit = metrics[(metrics.governor == gov) & (metrics.resource_class == c) & (metrics.metric == m)]
        return float(hit["value"].iloc[0]) if len(hit) else float("nan")

    run_rows: list[tuple[str, str, str, float, str]] = []
    enforced_res = set(zip(schedule["resource_type"], schedule["resource"])) if len(schedule) else set()
    false_limits = sorted(enforced_res - inputs.should_limit) if inputs.ground_truth else []
    run_rows.append(("with", "all", "enforced_limit_resources", float(len(enforced_res)), "count"))
    run_rows.append(("with", "all", "enforced_limit_decisions", float(len(schedule)), "count"))
    run_rows.append(("with", "all", "false_limits", float(len(false_limits)) if inputs.ground_truth else np.nan,
                     "count"))
    first_window = first_s = np.nan
    if inputs.onset is not None and len(schedule):
        target = schedule[[k in inputs.should_limit for k in zip(schedule["resource_type"], schedule["resource"])]]
        if len(target):
            first = target.sort_values("start").iloc[0]
            first_window = (first["window_end"] - inputs.onset).total_seconds() / inputs.window_seconds
            first_s = (first["start"] - inputs.onset).total_seconds()
    run_rows.append(("with", "incident", "onset_to_first_limit_window", first_window, "windows"))
    run_rows.append(("with", "incident", "onset_to_enforced_limit", first_s, "s"))
    by_without, by_with = val("without", "bystander", "rejected"), val("with", "bystander", "rejected")
    cut = 100.0 * (1.0 - by_with / by_without) if by_without > 0 else np.nan
    run_rows.append(("both", "bystander", "rejected_cut", cut, "pct"))
    peaks = observed_peaks(inputs)
    below = [(rt, r, q, peaks.get((rt, r), np.nan)) for rt, r, q in
             zip(schedule["resource_type"], schedule["resource"], schedule["limit_qps"])
             if (rt, r) not in inputs.should_limit and q < peaks.get((rt, r), -np.inf)] if len(schedule) else []
    run_rows.append(("with", "all", "limits_below_observed_peak_unwarranted", float(len(below)), "count"))
    run_rows.append(("both", "all", "decision_delay", delay, "s"))
    metrics = pd.concat([metrics, pd.DataFrame(run_rows, columns=metrics.columns)], ignore_index=True)

    checks = _checks(inputs, metrics, first_window, cut, false_limits, below, len(enforced_res))
    return Outcome(inputs, delay, schedule, without, with_, capacity, metrics, checks, took)


def _checks(inputs: Inputs, metrics: pd.DataFrame, first_window: float, cut: float, false_limits: list,
            below: list, enforced: int) -> list[tuple[str, bool, str]]:
    """The issue's done criteria for the scenario (name, passed, measured)."""
    kind = inputs.scenario
    out: list[tuple[str, bool, str]] = []
    if kind in ("retry_storm", "noisy_neighbour", "large_mix"):
        out.append(("incident resource limited within 2 windows of onset",
                    bool(np.isfinite(first_window) and first_window <= 2), f"{first_window:.0f} windows"))
        out.append(("bystanders' rejected sends cut by >= 95 %", bool(np.isfinite(cut) and cut >= 95.0),
                    f"{cut:.1f} %"))
        out.append(("zero enforced limits on healthy resources", len(false_limits) == 0,
                    f"{len(false_limits)} ({', '.join(f'{t}:{r}' for t, r in false_limits[:5])})"))
    elif kind == "flash_sale":
        out.append(("no enforced limit below the observed peak", len(below) == 0,
                    f"{len(below)} limits below peak ({enforced} enforced limits)"))
    elif kind in ("normal_day", "steady"):
        out.append(("no enforced limit at all", enforced == 0, f"{enforced} enforced limits"))
    return out


# ====================================================================================================================
# Outputs: Delta table, PNG, Markdown
# ====================================================================================================================
def write_results(lake: Path, outcome: Outcome, run_id: str, recorded_at: dt.datetime) -> str:
    """Append the metrics to ``<lake>/backtest/results`` (delta-rs) and return the table path."""
    import pyarrow as pa
    from deltalake import write_deltalake

    m = outcome.metrics
    seed = outcome.inputs.seed
    schema = pa.schema([("recorded_at", pa.timestamp("us", tz="UTC")), ("run_id", pa.string()),
                        ("scenario", pa.string()), ("seed", pa.int64()), ("governor", pa.string()),
                        ("resource_class", pa.string()), ("metric", pa.string()), ("value", pa.float64()),
                        ("unit", pa.string())])
    n = len(m)
    table = pa.table({
        "recorded_at": pa.array([recorded_at] * n, type=pa.timestamp("us", tz="UTC")),
        "run_id": [run_id] * n, "scenario": [outcome.inputs.scenario] * n,
        "seed": pa.array([seed] * n, type=pa.int64()), "governor": m["governor"].tolist(),
        "resource_class": m["resource_class"].tolist(), "metric": m["metric"].tolist(),
        "value": pa.array([None if not np.isfinite(v) else float(v) for v in m["value"]], type=pa.float64()),
        "unit": m["unit"].tolist(),
    }, schema=schema)
    path = str(lake / RESULTS_TABLE)
    write_deltalake(path, table, mode="append")
    return path


def _limit_steps(schedule: pd.DataFrame, rt: str, r: str) -> tuple[list, list]:
    rows = schedule[(schedule["resource_type"] == rt) & (schedule["resource"] == r)].sort_values("start")
    xs, ys = [], []
    for s_, e_, q in zip(rows["start"], rows["end"], rows["limit_qps"]):
        xs += [s_, s_, e_, e_]
        ys += [np.nan, q, q, np.nan]
    return xs, ys


def plot(outcome: Outcome, path: Path) -> Path:
    """PNG: rows = broker work vs capacity, resource TPS with limits and anomalies, rejected sends/s per class;
    columns = without | with the governor (same y scales)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inputs = outcome.inputs
    sched = outcome.schedule
    bw = outcome.without.brokers
    peak = bw.groupby("broker")["reject_share"].max().sort_values(ascending=False)
    brokers = sorted(inputs.incident_brokers) or []
    brokers += [b for b in peak.index[:3] if b not in brokers and peak[b] > 0]
    if not brokers:
        brokers = list(bw.groupby("broker")["offered_work"].max().sort_values(ascending=False).index[:3])
    brokers = brokers[:4]
    res_w = outcome.without.resources
    limited = list(dict.fromkeys(zip(sched["resource_type"], sched["resource"]))) if len(sched) else []
    focus = list(dict.fromkeys(sorted(inputs.incident_resources) + limited))[:4]
    by = res_w[res_w["broker"].isin(brokers) & (res_w["resource_type"] == "topic")]
    top_by = [("topic", r) for r in by.groupby("resource")["offered"].sum().sort_values(ascending=False).index
              if ("topic", r) not in focus][:3]
    series = focus + top_by
    fig, axes = plt.subplots(3, 2, figsize=(15, 11), sharex=True, sharey="row")
    for col, (title, result) in enumerate((("without governor", outcome.without), ("with governor", outcome.with_))):
        b = result.brokers
        ax = axes[0, col]
        for name in brokers:
            d = b[b["broker"] == name]
            line, = ax.plot(d["minute_start"], d["admitted_work"], label=f"{name} arriving at send queue")
            ax.plot(d["minute_start"], d["served_work"], ls=":", color=line.get_color())
            ax.axhline(float(outcome.capacity.get(name, np.nan)), ls="--", color=line.get_color(), lw=0.8)
        if len(inputs.anomalies):
            busy = inputs.anomalies[(inputs.anomalies["anomaly"] == "BROKER_BUSY")
                                    & inputs.anomalies["resource"].isin(brokers)]
            for ws in pd.to_datetime(busy["window_start"], utc=True).unique():
                ax.axvspan(ws, ws + pd.Timedelta(seconds=inputs.window_seconds), color="red", alpha=0.06, lw=0)
        ax.set_title(f"{inputs.scenario}: {title}")
        ax.set_ylabel("broker writes/s (dashed: capacity,\ndotted: served; red: BROKER_BUSY)")
        ax.legend(fontsize=7, loc="upper left")
        ax = axes[1, col]
        r = result.resources
        for rt, name in series:
            d = r[(r["resource_type"] == rt) & (r["resource"] == name)].groupby("minute_start")[
                ["offered", "admitted"]].sum() / 60.0
            if d.empty:
                continue
            line, = ax.plot(d.index, d["admitted"], label=f"{rt}:{name} admitted")
            if rt == "group" or (rt, name) in inputs.incident_resources:
                ax.plot(d.index, d["offered"], ls=":", color=line.get_color(), label=f"{rt}:{name} offered")
            if col == 1:
                xs, ys = _limit_steps(sched, rt, name)
                if xs:
                    ax.plot(xs, ys, color=line.get_color(), lw=2.5, alpha=0.6, label=f"limit {rt}:{name}")
            if len(inputs.anomalies):
                a = inputs.anomalies[(inputs.anomalies["resource_type"] == rt) & (inputs.anomalies["resource"] == name)]
                if len(a):
                    ax.scatter(pd.to_datetime(a["window_start"], utc=True), a["observed_tps"], marker="x", s=18,
                               color=line.get_color())
        ax.set_ylabel("msgs/s (x: anomaly, observed TPS;\nthick: limit in force)")
        ax.set_yscale("symlog", linthresh=10)
        ax.legend(fontsize=6, loc="upper left")
        ax = axes[2, col]
        cls = classify(r, inputs)
        for c in CLASSES:
            d = r[cls == c]
            rej = (d["busy_rejected"] + d["limited_rejected"]).groupby(d["minute_start"]).sum() / 60.0
            ax.plot(rej.index, rej.values, label=f"{c}: rejected sends/s")
        ax.set_ylabel("rejected sends/s")
        ax.legend(fontsize=7, loc="upper left")
    t_lo, t_hi = bw["minute_start"].min(), bw["minute_start"].max() + pd.Timedelta(minutes=1)
    for ax in axes.ravel():
        ax.set_xlim(t_lo, t_hi)
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _fmt(v: float, unit: str = "") -> str:
    if v is None or not np.isfinite(v):
        return "n/a"
    return f"{v:,.0f}{unit}" if abs(v) >= 100 or float(v).is_integer() else f"{v:,.2f}{unit}"


def report(outcome: Outcome, bcfg: BacktestConfig, png: Path, path: Path, run_id: str) -> Path:
    """Write the Markdown report (embeds ``png`` by relative name)."""
    i, m = outcome.inputs, outcome.metrics

    def val(gov: str, c: str, name: str) -> float:
        hit = m[(m.governor == gov) & (m.resource_class == c) & (m.metric == name)]
        return float(hit["value"].iloc[0]) if len(hit) else float("nan")

    lines = [f"# Backtest: {i.scenario}", "",
             f"Run `{run_id}`, seed {i.seed}. Incident: {i.incident_detail}.",
             f"Onset: {i.onset:%Y-%m-%dT%H:%M:%SZ}." if i.onset is not None else "Onset: none.", "",
             "## Timing assumptions", "",
             f"A limit reaches the brokers {outcome.delay_seconds:.0f} s after its window ends = line lag "
             f"{bcfg.line_lag_seconds:.0f} s + watermark {i.watermark_seconds} s + trigger {i.trigger_seconds} s + "
             f"propagation {bcfg.propagation_seconds:.0f} s (window {i.window_seconds} s). Broker capacity "
             f"{bcfg.broker.capacity_factor}× its normal write rate (min {bcfg.broker.capacity_min_tps:.0f}/s), "
             f"waitTimeMillsInSendQueue {bcfg.broker.wait_time_ms_in_send_queue:.0f} ms, tick "
             f"{bcfg.broker.tick_seconds} s, breaker open {bcfg.broker.breaker_open_ms} ms.", ""]
    if i.governor_seconds is not None:
        lines += [f"Governor run (`governor.run(..., once=True)`): {i.governor_seconds:.0f} s; broker model (both runs): "
                  f"{outcome.model_seconds:.1f} s.", ""]
    else:
        lines += [f"Broker model (both runs): {outcome.model_seconds:.1f} s.", ""]
    lines += ["## Done checks", "", "| check | result | measured |", "|---|---|---|"]
    lines += [f"| {n} | {'PASS' if ok else 'FAIL'} | {v} |" for n, ok, v in outcome.checks] or ["| (none) | | |"]
    lines += ["", "## Headline numbers", "",
              f"* onset → first enforced limit on the incident: {_fmt(val('with', 'incident', 'onset_to_first_limit_window'))} "
              f"windows (decision window end), {_fmt(val('with', 'incident', 'onset_to_enforced_limit'))} s "
              "(in force at the brokers)",
              f"* bystanders' rejected sends: {_fmt(val('without', 'bystander', 'rejected'))} without → "
              f"{_fmt(val('with', 'bystander', 'rejected'))} with the governor "
              f"(cut {_fmt(val('both', 'bystander', 'rejected_cut'), ' %')})",
              f"* enforced limits: {_fmt(val('with', 'all', 'enforced_limit_resources'))} resources, "
              f"{_fmt(val('with', 'all', 'enforced_limit_decisions'))} decisions; false limits on healthy resources: "
              f"{_fmt(val('with', 'all', 'false_limits'))}; unwarranted limits below the observed peak: "
              f"{_fmt(val('with', 'all', 'limits_below_observed_peak_unwarranted'))}", "",
              "## Sends per resource class (msgs)", "",
              "| class | resources | offered | rejected w/o governor (busy) | rejected with governor (busy + limiter) |",
              "|---|---|---|---|---|"]
    for c in CLASSES:
        lines.append(f"| {c} | {_fmt(val('without', c, 'resources'))} | {_fmt(val('without', c, 'offered'))} | "
                     f"{_fmt(val('without', c, 'busy_rejected'))} | {_fmt(val('with', c, 'busy_rejected'))} + "
                     f"{_fmt(val('with', c, 'limiter_rejected'))} |")
    lines += ["", "`incident` = the resource(s) the scenario made misbehave; `bystander` = the other resources on the "
              "incident broker(s); `other` = resources elsewhere.", "", "## Limits over time (enforced, in force at "
              "the brokers)", ""]
    if len(outcome.schedule):
        lines += ["| resource | version | window end | in force from | until | limit (msgs/s) |", "|---|---|---|---|---|---|"]
        for _, s in outcome.schedule.sort_values(["start", "resource"]).head(40).iterrows():
            lines.append(f"| {s['resource_type']}:{s['resource']} | {s['version']} | {s['window_end']:%H:%M:%S} | "
                         f"{s['start']:%H:%M:%S} | {s['end']:%H:%M:%S} | {s['limit_qps']:.1f} |")
    else:
        lines.append("No enforced limit.")
    if len(i.limits):
        lines += ["", "All decisions in gold/limits:", "", "| version | resource | action | window end | limit | reason |",
                  "|---|---|---|---|---|---|"]
        for _, d in i.limits.sort_values(["resource", "version"]).head(40).iterrows():
            reason = str(d["reason"]).replace("|", "/")[:140]
            lines.append(f"| {d['version']} | {d['resource_type']}:{d['resource']} | {d['action']} | "
                         f"{pd.Timestamp(d['window_end']):%H:%M} | {d['limit_qps']:.1f} | {reason} |")
    if len(i.anomalies):
        a = i.anomalies.groupby(["anomaly", "resource_type", "resource"]).agg(
            windows=("window_start", "count"), peak=("observed_tps", "max")).reset_index().head(30)
        lines += ["", "## Anomalies", "", "| anomaly | resource | windows | peak observed |", "|---|---|---|---|"]
        lines += [f"| {r.anomaly} | {r.resource_type}:{r.resource} | {r.windows} | {r.peak:.1f} |"
                  for r in a.itertuples()]
    lines += ["", "## Plot", "", f"![TPS per resource, without and with the governor]({png.name})", "",
              "## Model limits", "",
              "Open loop: the governor saw the traffic of the run without limits; producer retries of rejected sends "
              "are not modelled; traffic is constant within a minute (stats.log resolution); a send-back costs its "
              "schedule write and re-put (work per request from the stats). See `pipelines/broker_model.py`.", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def summary_lines(outcome: Outcome) -> list[str]:
    m = outcome.metrics

    def val(gov: str, c: str, name: str) -> float:
        hit = m[(m.governor == gov) & (m.resource_class == c) & (m.metric == name)]
        return float(hit["value"].iloc[0]) if len(hit) else float("nan")

    i = outcome.inputs
    out = [f"backtest {i.scenario}: decision delay {outcome.delay_seconds:.0f} s, model {outcome.model_seconds:.1f} s"
           + (f", governor {i.governor_seconds:.0f} s" if i.governor_seconds is not None else ""),
           f"  onset -> first enforced limit: {_fmt(val('with', 'incident', 'onset_to_first_limit_window'))} windows, "
           f"{_fmt(val('with', 'incident', 'onset_to_enforced_limit'))} s",
           f"  bystander rejected sends: without {_fmt(val('without', 'bystander', 'rejected'))}, with "
           f"{_fmt(val('with', 'bystander', 'rejected'))} (cut {_fmt(val('both', 'bystander', 'rejected_cut'), ' %')})",
           f"  incident rejected sends: without {_fmt(val('without', 'incident', 'rejected'))}, with "
           f"{_fmt(val('with', 'incident', 'rejected'))}",
           f"  enforced limits: {_fmt(val('with', 'all', 'enforced_limit_resources'))} resources; false limits: "
           f"{_fmt(val('with', 'all', 'false_limits'))}; unwarranted limits below observed peak: "
           f"{_fmt(val('with', 'all', 'limits_below_observed_peak_unwarranted'))}"]
    out += [f"  [{'PASS' if ok else 'FAIL'}] {n}: {v}" for n, ok, v in outcome.checks]
    return out


def run_backtest(spark, *, lake: Path, bcfg: BacktestConfig, spec: ScenarioSpec | None = None,
                 from_lake: Path | None = None, label: str | None = None) -> dict[str, Any]:
    """Generate-or-replay, model both runs, write table + PNG + report. Returns paths, metrics and checks."""
    lake = Path(lake)
    if from_lake is not None:
        inputs = replay_inputs(Path(from_lake), bcfg, label or "replay")
    else:
        assert spec is not None
        inputs = generate_inputs(spark, spec, bcfg, lake)
    outcome = run_models(inputs, bcfg)
    run_id = uuid.uuid4().hex[:12]
    recorded = dt.datetime.now(dt.timezone.utc)
    out_dir = lake / "backtest"
    png = plot(outcome, out_dir / f"backtest-{inputs.scenario}.png")
    md = report(outcome, bcfg, png, out_dir / f"report-{inputs.scenario}.md", run_id)
    table = write_results(lake, outcome, run_id, recorded)
    return {"outcome": outcome, "png": png, "report": md, "table": table, "run_id": run_id}


# ====================================================================================================================
# CLI
# ====================================================================================================================
def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description="Backtest the governor's limits on replayed traffic (broker model).")
    src = p.add_mutually_exclusive_group(required=False)
    p.add_argument("--scenario", help=f"scenario to generate ({', '.join(sorted(SCENARIOS))}); with "
                                      "--from-lake, only a label")
    src.add_argument("--from-lake", help="replay a lake a governor already wrote (silver + gold tables)")
    p.add_argument("--lake", required=True, help="where the governor tables (generate mode) and results go")
    p.add_argument("--conf", default="conf/backtest.toml", help="backtest config (default conf/backtest.toml)")
    for flag in ("seed", "minutes", "onset", "brokers", "topics", "groups"):
        p.add_argument(f"--{flag}", type=int, help=f"scenario {flag} (default per scenario)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a done check fails")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.from_lake is None and args.scenario is None:
        parser.error("one of --scenario or --from-lake is required")
    if args.from_lake is None and args.scenario not in SCENARIOS:
        parser.error(f"argument --scenario: unknown scenario {args.scenario!r} "
                     f"(known: {', '.join(sorted(SCENARIOS))})")
    try:
        bcfg = load_backtest_config(args.conf)
        spec = None
        if args.from_lake is None:
            spec = build_spec(args.scenario, {"seed": args.seed, "minutes": args.minutes, "onset_minute": args.onset,
                                              "brokers": args.brokers, "topics": args.topics, "groups": args.groups})
            governor_config(bcfg, None, None)  # a bad governor config fails before Spark starts
        elif not Path(args.from_lake).is_dir():
            raise BacktestError(f"lake directory not found: {args.from_lake}")
    except (BacktestError, ValueError) as exc:
        return fail(PROG, exc)
    except Exception as exc:  # ConfigError of the governor's config
        return fail(PROG, exc)
    spark = None
    try:
        if spec is not None:
            from pipelines.session import build_session

            spark = build_session(governor_config(bcfg, None, None).spark)
        out = run_backtest(spark, lake=Path(args.lake), bcfg=bcfg, spec=spec,
                           from_lake=Path(args.from_lake) if args.from_lake else None, label=args.scenario)
    except BacktestError as exc:
        return fail(PROG, exc)
    for line in summary_lines(out["outcome"]):
        print(line)
    print(f"  report {out['report']}\n  plot {out['png']}\n  table {out['table']} (run {out['run_id']})")
    if args.strict and not all(ok for _, ok, _ in out["outcome"].checks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
