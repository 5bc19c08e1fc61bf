"""Backtest metrics: the broker model run twice on the executors (without and with the governor's enforced limits,
:mod:`udfs.broker_model`), each model row classified (incident, bystander, other, background), the metrics and the
issue's done checks, and the metrics appended to the lake's ``backtest/results`` table.

Metrics (:data:`pipelines.schemas.BACKTEST_RESULTS`, one row per governor × resource class × metric): per class
``resources``, ``offered``, ``limiter_rejected``, ``busy_rejected``, ``rejected``, ``admitted`` (msgs); per run
``enforced_limit_resources``, ``enforced_limit_decisions``, ``false_limits``, ``onset_to_first_limit_window``
(windows), ``onset_to_enforced_limit`` (s), ``rejected_cut`` (pct), ``limits_below_observed_peak_unwarranted``,
``fast_path_delay`` and ``final_path_delay`` (s, :class:`pipelines.backtest.inputs.Timing`).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.backtest.inputs import BacktestConfig, Inputs, Timing
from pipelines.io.lake import Lake
from pipelines.sim import broker_model as bm
from udfs.broker_model import simulate_per_broker

RESULTS_TABLE = "backtest/results"
CLASSES = ("incident", "bystander", "other")


@dataclass
class Outcome:
    """Both model runs of a backtest, the limit schedule they used and what was measured."""

    inputs: Inputs
    timing: Timing
    schedule: pd.DataFrame
    without: bm.ModelResult
    with_: bm.ModelResult
    capacity: pd.Series
    metrics: pd.DataFrame  # governor, resource_class, metric, value, unit
    checks: list[tuple[str, bool, str]]
    model_seconds: float


def metric_value(metrics: pd.DataFrame, governor: str, resource_class: str, metric: str) -> float:
    """One value of a metrics frame (columns governor, resource_class, metric, value); NaN when absent."""
    hit = metrics[(metrics["governor"] == governor) & (metrics["resource_class"] == resource_class)
                  & (metrics["metric"] == metric)]
    return float(hit["value"].iloc[0]) if len(hit) else float("nan")


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


def model_on_executors(spark: SparkSession, offered: pd.DataFrame, schedule: pd.DataFrame | None,
                       cfg: bm.BrokerModelConfig, capacity: pd.Series) -> bm.ModelResult:
    """:func:`pipelines.sim.broker_model.simulate` of ``offered`` (:data:`~pipelines.sim.broker_model.OFFERED_COLUMNS`)
    with ``schedule`` on the executors: the brokers hashed into one bucket per core (``defaultParallelism``, at most
    one broker per bucket), each bucket one group of ``applyInPandas`` with the UDF of :mod:`udfs.broker_model`
    (whole brokers per group, so the result is the driver's), collected into a
    :class:`~pipelines.sim.broker_model.ModelResult` in the driver run's row order. ``capacity``: units/s per
    broker, computed once for both runs."""
    minutes = pd.date_range(offered["minute_start"].min(), offered["minute_start"].max(), freq="min")
    buckets = max(1, min(offered["broker"].nunique(), spark.sparkContext.defaultParallelism))
    df = spark.createDataFrame(offered[list(bm.OFFERED_COLUMNS)], schema=schemas.BROKER_MODEL_OFFERED)
    rows = (df.withColumn("broker_bucket", F.pmod(F.hash("broker"), F.lit(buckets)))
            .groupBy("broker_bucket")
            .applyInPandas(simulate_per_broker(schedule, cfg, capacity, minutes), schema=schemas.BROKER_MODEL_RESULT)
            .toPandas())
    stamps = pd.to_datetime(rows["minute_start"])
    rows["minute_start"] = stamps.dt.tz_localize("UTC") if stamps.dt.tz is None else stamps.dt.tz_convert("UTC")
    res = rows[rows["row_kind"] == "resource"].sort_values(["minute_start", "broker", "resource_type", "resource"],
                                                          kind="mergesort")
    brk = rows[rows["row_kind"] == "broker"].sort_values(["broker", "minute_start"], kind="mergesort")
    resource_cols = ["minute_start", "broker", "resource_type", "resource", "offered", "limited_rejected",
                     "busy_rejected", "admitted", "limit_qps"]
    broker_cols = ["minute_start", "broker", "offered_work", "admitted_work", "served_work", "capacity_tps",
                   "reject_share", "max_wait_ms"]
    return bm.ModelResult(resources=res[resource_cols].reset_index(drop=True),
                          brokers=brk[broker_cols].reset_index(drop=True))


def run_models(spark: SparkSession, inputs: Inputs, bcfg: BacktestConfig) -> Outcome:
    """The two model runs (without limits, with the enforced limits of ``inputs.limits``), the metrics per class
    and the done checks."""
    t0 = time.monotonic()
    timing = Timing.of(inputs, bcfg)
    offered = bm.offered_from_stats(inputs.stats, bcfg.broker)
    schedule = bm.limit_schedule(inputs.limits, delay_seconds=timing.delays(inputs.limits))
    capacity = bm.broker_capacity(offered, bcfg.broker)
    without = model_on_executors(spark, offered, None, bcfg.broker, capacity)
    with_ = model_on_executors(spark, offered, schedule, bcfg.broker, capacity)
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
        return metric_value(metrics, gov, c, m)

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
    run_rows.append(("both", "all", "fast_path_delay", timing.fast_seconds, "s"))
    run_rows.append(("both", "all", "final_path_delay", timing.final_seconds, "s"))
    metrics = pd.concat([metrics, pd.DataFrame(run_rows, columns=metrics.columns)], ignore_index=True)

    checks = _checks(inputs, metrics, first_window, cut, false_limits, below, len(enforced_res), first_s)
    return Outcome(inputs, timing, schedule, without, with_, capacity, metrics, checks, took)


def _checks(inputs: Inputs, metrics: pd.DataFrame, first_window: float, cut: float, false_limits: list,
            below: list, enforced: int, first_s: float = float("nan")) -> list[tuple[str, bool, str]]:
    """The issue's done criteria for the scenario (name, passed, measured)."""
    kind = inputs.scenario
    out: list[tuple[str, bool, str]] = []
    if kind in ("retry_storm", "noisy_neighbour", "large_mix"):
        out.append(("incident resource limited within 2 windows of onset",
                    bool(np.isfinite(first_window) and first_window <= 2), f"{first_window:.0f} windows"))
        if kind == "retry_storm":
            out.append(("limit in force <= 100 s after onset", bool(np.isfinite(first_s) and first_s <= 100.0),
                        f"{first_s:.0f} s"))
        floor = 97.0 if kind == "retry_storm" else 95.0
        out.append((f"bystanders' rejected sends cut by >= {floor:.0f} %", bool(np.isfinite(cut) and cut >= floor),
                    f"{cut:.1f} %"))
        out.append(("zero enforced limits on healthy resources", len(false_limits) == 0,
                    f"{len(false_limits)} ({', '.join(f'{t}:{r}' for t, r in false_limits[:5])})"))
    elif kind == "flash_sale":
        out.append(("no enforced limit below the observed peak", len(below) == 0,
                    f"{len(below)} limits below peak ({enforced} enforced limits)"))
    elif kind in ("normal_day", "steady"):
        out.append(("no enforced limit at all", enforced == 0, f"{enforced} enforced limits"))
    return out


def write_results(lake: Lake, outcome: Outcome, run_id: str, recorded_at: dt.datetime) -> str:
    """Append the metrics to the lake's ``backtest/results`` (:data:`pipelines.schemas.BACKTEST_RESULTS`) as one
    commit tagged with the transaction ``(backtest-<run_id>, 0)``, so a retried write of the same run adds nothing;
    a non-finite value is stored as null. Returns the table path."""
    m = outcome.metrics
    rows = [(recorded_at, run_id, outcome.inputs.scenario, outcome.inputs.seed, g, c, name,
             float(v) if np.isfinite(v) else None, unit)
            for g, c, name, v, unit in zip(m["governor"], m["resource_class"], m["metric"], m["value"], m["unit"])]
    df = lake.spark.createDataFrame(rows, schema=schemas.BACKTEST_RESULTS)
    lake.append(df, RESULTS_TABLE, app_id=f"backtest-{run_id}", version=0)
    return lake.path(RESULTS_TABLE)
