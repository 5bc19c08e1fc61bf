"""Backtest outputs for people: the Markdown report (``report-<scenario>.md``), its PNG (``backtest-<scenario>.png``:
per broker and per resource TPS with anomalies and limits, without | with the governor) and the console summary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.backtest.inputs import BacktestConfig
from pipelines.backtest.metrics import CLASSES, Outcome, classify, metric_value


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
        return metric_value(m, gov, c, name)

    lines = [f"# Backtest: {i.scenario}", "",
             f"Run `{run_id}`, seed {i.seed}. Incident: {i.incident_detail}.",
             f"Onset: {i.onset:%Y-%m-%dT%H:%M:%SZ}." if i.onset is not None else "Onset: none.", "",
             "## Timing assumptions", "",
             f"The governor's own timing (watermark {i.watermark_seconds} s, trigger {i.trigger_seconds} s, window "
             f"{i.window_seconds} s). A `set` is in force {outcome.timing.fast_seconds:.0f} s after its window ends "
             f"(fast path: shipping {bcfg.shipping_seconds:.0f} s + trigger wait {i.trigger_seconds} s + micro-batch "
             f"{bcfg.micro_batch_seconds:.0f} s + propagation {bcfg.propagation_seconds:.0f} s); recovery (`relax`, "
             f"`lift`) {outcome.timing.final_seconds:.0f} s after (final path: line lag {bcfg.line_lag_seconds:.0f} s "
             f"+ watermark + two triggers + the same shipping, micro-batch and propagation). Broker capacity "
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
              "schedule write and re-put (work per request from the stats). See `pipelines/sim/broker_model.py`.", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def summary_lines(outcome: Outcome) -> list[str]:
    """The console summary of a backtest: timing, headline numbers and the done checks, one line each."""
    m = outcome.metrics

    def val(gov: str, c: str, name: str) -> float:
        return metric_value(m, gov, c, name)

    i = outcome.inputs
    out = [f"backtest {i.scenario}: limits in force {outcome.timing.fast_seconds:.0f} s (set, fast path) / "
           f"{outcome.timing.final_seconds:.0f} s (recovery, final path) after their window, model "
           f"{outcome.model_seconds:.1f} s"
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
