"""Closed-loop backtest outputs for people: the console summary, the Markdown report (``report-<scenario>.md``) and
its picture (``closed-loop-<scenario>.png``: the culprit's demand, admitted traffic and the limit in force; the
bystanders' rejected sends; the brokers' send-queue wait)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.sim.figures import Figures, targets_in_force, truth
from pipelines.sim.settings import SCENARIO_ROLES


def _fmt(v: float, unit: str = "") -> str:
    if v is None or not np.isfinite(v):
        return "n/a"
    text = f"{v:,.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:,.2f}"
    return f"{text} {unit}".rstrip()


def config_line(result) -> str:
    """The config a run ran with, one line."""
    b, s = result.bcfg, result.spec
    return (f"closed loop, {b.governor_conf} as shipped (trigger {result.trigger_seconds} s, watermark "
            f"{result.watermark_seconds} s, fast path on); propagation {result.propagation_seconds:g} s; shipping "
            f"stats {b.shipping.stats_seconds:g} s, failures {b.shipping.failures_seconds:g} s"
            + (f" in batches of {b.shipping.failures_batch_seconds:g} s" if b.shipping.failures_batch_seconds else "")
            + f"; {s.brokers} brokers, {s.topics} topics, {s.groups} groups, {s.minutes} min, seed {s.seed}")


def summary_lines(result, figures: Figures) -> list[str]:
    """The console summary: config, the figures, the checks."""
    v = figures.value
    out = [f"backtest {result.spec.name} ({SCENARIO_ROLES.get(result.spec.name, result.spec.name)}): "
           + config_line(result),
           f"  onset -> limit in force: {_fmt(v('onset_to_limit_in_force'), 's')}; culprit admitted / decided "
           f"target: {_fmt(v('culprit_admitted_over_target'), 'x')} "
           f"({figures.details.get('culprit_admitted_over_target', 'n/a')})",
           f"  bystander rejected sends per storm minute: before {_fmt(v('bystander_rejected_per_minute_before'))}, "
           f"after {_fmt(v('bystander_rejected_per_minute_after'))} "
           f"({_fmt(v('bystander_after_pct_of_before'), '%')} of before; without a governor then: "
           f"{_fmt(v('bystander_rejected_per_minute_no_governor'))})",
           f"  limit changes while the cause persists: {_fmt(v('limit_changes_while_cause_persists'))}; fix -> lift: "
           f"{figures.details.get('fix_to_lift_minutes', 'n/a')} min; false limits: {_fmt(v('false_limits'))} "
           f"({figures.details.get('false_limits')}); decisions set/relax/lift {_fmt(v('decisions_set'))}/"
           f"{_fmt(v('decisions_relax'))}/{_fmt(v('decisions_lift'))}",
           f"  {_fmt(v('steps'))} steps, processing median {_fmt(v('step_seconds_median'), 's')}, max "
           f"{_fmt(v('step_seconds_max'), 's')}, {_fmt(v('steps_over_trigger'))} over the trigger; micro-batch "
           f"seconds ingest {_fmt(v('ingest_batch_seconds_total'))}, fast {_fmt(v('fast_batch_seconds_total'))}, "
           f"gold {_fmt(v('gold_batch_seconds_total'))}; "
           f"{_fmt(v('failure_lines'))} send-failure lines; wall {_fmt(v('wall_seconds'), 's')}"]
    out += [f"  [{'PASS' if ok else 'FAIL'}] {name}: {measured}" for name, ok, measured in figures.checks]
    return out


def limit_timeline(result) -> pd.DataFrame:
    """The limits in force at the brokers over time: one row per change per resource (simulated UTC ``at``,
    cluster-wide ``limit_qps`` of the record, the brokers' own figures, version, reason)."""
    rows, last = [], {}
    for at, snap in result.in_force:
        now: dict = {}
        for (b, rt, r), (qps, rec) in snap.items():
            d = now.setdefault((rt, r), {"limit_qps": rec["limit_qps"], "version": rec["version"],
                                         "reason": rec["reason"], "brokers": {}})
            d["brokers"][b] = qps
        for key in sorted(set(now) | set(last)):
            cur, prev = now.get(key), last.get(key)
            if cur == prev:
                continue
            rows.append({"at": at, "resource": f"{key[0]}:{key[1]}",
                         "limit_qps": cur["limit_qps"] if cur else np.nan,
                         "brokers": ", ".join(f"{b} {q:.1f}" for b, q in sorted(cur["brokers"].items())) if cur
                         else "none in force", "version": cur["version"] if cur else None,
                         "reason": (cur["reason"] if cur else "lifted or expired")[:160]})
        last = now
    return pd.DataFrame(rows, columns=["at", "resource", "limit_qps", "brokers", "version", "reason"])


def plot(result, path: Path) -> Path:
    """PNG: culprit demand / admitted / target in force per second (10 s means), bystanders' rejected sends per
    second, the send-queue wait per broker per minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = result.cluster
    culprits, spans = truth(result)
    key = list(zip(c.pairs["resource_type"], c.pairs["resource"]))
    is_culprit = np.array([k in culprits for k in key], dtype=bool)
    t = c.start + pd.to_timedelta(np.arange(c.T * 60), unit="s")
    fig, axes = plt.subplots(3, 1, figsize=(12, 10), sharex=True)
    ax = axes[0]
    if is_culprit.any():
        demand = np.repeat(c.demand[is_culprit].sum(axis=0), 60)
        admitted = pd.Series(c.second_admitted[:, is_culprit].sum(axis=1)).rolling(10, min_periods=1).mean()
        ax.plot(t, demand, ls=":", label="culprit demand (msgs/s)")
        ax.plot(t, admitted, label="culprit admitted, all brokers (10 s mean)")
        target, _ = targets_in_force(result, culprits)
        ax.plot(t, target, lw=2.5, alpha=0.6, label="decided target in force (cluster-wide limit_qps)")
    for a, b in spans:
        for x in axes:
            x.axvspan(a, b, color="red", alpha=0.05, lw=0)
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylabel("msgs/s")
    ax.set_title(f"{result.spec.name}: closed loop, propagation {result.propagation_seconds:g} s (red: cause active)")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[1]
    hosts = set(c.pairs.loc[is_culprit, "broker"]) or set(c.brokers)
    by = (~is_culprit) & c.pairs["broker"].isin(hosts).to_numpy() & (c.pairs["kind"] != "background").to_numpy()
    ax.plot(t, pd.Series(c.second_rejected[:, by].sum(axis=1)).rolling(10, min_periods=1).mean(),
            label="bystanders' rejected attempts (10 s mean)")
    ax.set_ylabel("rejected/s")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[2]
    minutes = c.start + pd.to_timedelta(np.arange(c.T), unit="min")
    for i, b in enumerate(c.brokers):
        ax.plot(minutes, c.max_wait_ms[i], label=f"{b} longest send-queue wait (ms)")
    ax.set_ylabel("ms")
    ax.legend(fontsize=8, loc="upper left")
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def report(result, figures: Figures, png: Path, path: Path, run_id: str) -> Path:
    """Write the Markdown report (embeds ``png`` by relative name)."""
    inc = result.cluster.incident
    lines = [f"# Closed-loop backtest: {result.spec.name}", "",
             f"Run `{run_id}`. {SCENARIO_ROLES.get(result.spec.name, '')}. "
             f"Incident: {inc.detail if inc else 'none'}.", "", config_line(result) + ".", "",
             "## Checks", "", "| check | result | measured |", "|---|---|---|"]
    lines += [f"| {n} | {'PASS' if ok else 'FAIL'} | {m} |" for n, ok, m in figures.checks]
    lines += ["", "## Figures", "", "| figure | value | unit | detail |", "|---|---|---|---|"]
    lines += [f"| {k} | {_fmt(v)} | {u} | {figures.details.get(k, '')} |" for k, (v, u, _c) in figures.values.items()]
    lines += ["", "## Limits in force at the brokers", ""]
    tl = limit_timeline(result)
    if len(tl):
        lines += ["| at (UTC) | resource | limit_qps (cluster-wide) | per broker | version | reason |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r.at:%H:%M:%S} | {r.resource} | {_fmt(r.limit_qps)} | {r.brokers} | {r.version} | "
                  f"{str(r.reason).replace('|', '/')} |" for r in tl.itertuples()]
    else:
        lines.append("No enforced limit reached a broker.")
    lim = result.limits
    if len(lim):
        lines += ["", "## Decisions (gold/limits)", "", "| decided (sim UTC) | window end | resource | action | "
                  "basis | limit_qps |", "|---|---|---|---|---|---|"]
        for r in lim.sort_values(["version"]).head(60).itertuples():
            lines.append(f"| {pd.Timestamp(r.decided_at):%H:%M:%S} | {pd.Timestamp(r.window_end):%H:%M} | "
                         f"{r.resource_type}:{r.resource} | {r.action} | {r.basis} | {_fmt(r.limit_qps)} |")
    lines += ["", f"![closed loop]({png.name})", "",
              "Model: `pipelines/sim/cluster.py` (brokers, clients' retries and fallbacks), "
              "`pipelines/backtest/loop.py` (stepping, clock, propagation).", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def closed_loop(spec, cfg, backtest_conf: str | Path | None = None, out: Path | None = None):
    """``spec`` run in the Spark-free closed loop (:func:`pipelines.sim.loop.simulate`: the decision plane with
    ``cfg``, brokers that apply each published limit, the world of ``backtest_conf``, default ``conf/backtest.toml``)
    → (its :class:`~pipelines.sim.figures.Figures`, the PNG of :func:`plot` as bytes, written to ``out`` too when
    given). ``./run.sh`` draws it beside the replay of the same scenario.

    Raises:
        pipelines.sim.settings.BacktestError: ``backtest_conf`` is missing or invalid.
    """
    import tempfile

    from pipelines.sim.figures import compute
    from pipelines.sim.loop import simulate
    from pipelines.sim.settings import load_backtest_config

    if backtest_conf is None:
        backtest_conf = Path(__file__).resolve().parents[2] / "conf" / "backtest.toml"
    result = simulate(spec, cfg, load_backtest_config(backtest_conf))
    figures = compute(result)
    with tempfile.TemporaryDirectory() as tmp:
        png = plot(result, Path(out) if out else Path(tmp) / "closed-loop.png").read_bytes()
    return figures, png
