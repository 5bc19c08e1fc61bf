"""A replay's report, for an SRE deciding whether to enforce (:mod:`pipelines.sim.replay`): the console summary, a
Markdown page (``report.md``: what the governor would have limited, when, how hard, what it saved the other
resources, when it lifted; a table per resource, the brokers' capacities, the model's fit to the recording, the
decisions), a picture per resource in the status page's style (``resource-<type>-<name>.png``, :mod:`pipelines.
sim.replay_plots`) and the same figures as JSON (``replay.json``) for scripts. Times UTC, rates msg/s.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from pipelines.sim.replay_plots import resource_png
from pipelines.sim.replay_run import Outcome


def _n(v, unit: str = "", digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "n/a"
    text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.{digits}f}"
    return f"{text} {unit}".rstrip()


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _t(v) -> str:
    return "n/a" if v is None else f"{pd.Timestamp(v):%H:%M:%S}"


def png_name(row: dict) -> str:
    """The picture's file name of a resource row (its name made safe for a file system)."""
    return f"resource-{row['resource_type']}-{re.sub(r'[^A-Za-z0-9_.-]', '_', row['resource'])}.png"


def resource_line(row: dict) -> str:
    """One sentence per resource: when, how hard, what it saved, when it lifted."""
    name = f"{row['resource_type']} {row['resource']}"
    cause = (f"flagged {_t(row['onset'])}-{_t(row['cause_end'])}" if row["onset"] else
             "NO ANOMALY IN THE RECORDING")
    if row["first_in_force"] is None:
        return f"  {name} ({cause}): never limited"
    lift = (f"lifted {_n(row['lift_after_cause_end_min'])} min after the cause ended"
            if row["lift_after_cause_end_min"] is not None else
            "lifted at " + _t(row["lifted_at"]) if row["lifted_at"] else "still limited when the recording ends")
    by = row["bystander_rejected_per_minute"]
    return (f"  {name} ({cause}): limit in force {_n(row['first_limit_after_onset_s'], 's', 0)} after onset at "
            f"{_n(row['first_limit_qps'])} msg/s, brokers admitted {_x(row['admitted_over_target'])} the "
            f"target, {row['changes']} change(s), {lift}; bystanders' rejected sends per cause minute: recorded "
            f"{_n(by['recorded'])} lines, modelled without governor {_n(by['no_governor'])}, replayed "
            f"{_n(by['replayed'])}")


def summary_lines(outcome: Outcome, meta: dict) -> list[str]:
    """The console summary: the recording, each resource's sentence, where the report is."""
    rec = outcome.recording
    out = [f"replay of {meta['landing']}: {rec.minutes} min from {rec.start:%Y-%m-%d %H:%M} UTC, "
           f"{len(rec.brokers)} brokers, {meta['topics']} topics, {meta['groups']} groups; "
           f"job {_n(meta.get('job_seconds'), 's', 0)}, closed loop "
           f"{_n(outcome.timings.get('closed_loop_seconds'), 's', 0)}"]
    rows = outcome.figures
    out += [resource_line(r) for r in rows] or ["  no resource limited in the replay, none flagged in the recording"]
    flagged = [r for r in rows if r["flag"]]
    if flagged:
        out.append(f"  {len(flagged)} resource(s) limited in the replay with no anomaly in the recording: read why "
                   "in the report before enforcing")
    out.append(f"report: {meta['report']}/report.md (+ replay.json, {len(rows)} PNG)")
    return out


#: The model of the recording (its cluster without a governor) and the recording disagree when the bystanders'
#: rejected sends of one differ from the other's by more than this factor, above :data:`MODEL_CHECK_FLOOR` a minute.
MODEL_CHECK_FACTOR = 2.0
MODEL_CHECK_FLOOR = 60.0


def model_check(rows: list[dict]) -> list[str]:
    """A warning per resource whose bystanders' rejected sends, modelled without a governor, differ from the refused
    lines the recording holds by more than :data:`MODEL_CHECK_FACTOR` (either way, above
    :data:`MODEL_CHECK_FLOOR` per cause minute): the brokers' capacities or the failure logs do not fit the
    recording, and the replay's savings are the model's, not the recording's."""
    out = []
    for r in rows:
        by = r["bystander_rejected_per_minute"]
        model, seen = by.get("no_governor"), by.get("recorded")
        if model is None or seen is None or max(model, seen) < MODEL_CHECK_FLOOR:
            continue
        if model > MODEL_CHECK_FACTOR * seen or seen > MODEL_CHECK_FACTOR * model:
            out.append(f"**Model check, {r['resource_type']} `{r['resource']}`:** without a governor the model "
                       f"rejects {_n(model)} sends of the other resources per cause minute where the recording shows "
                       f"{_n(seen)} refused lines: "
                       + ("the capacities are lower than the recording's brokers had, or the failure logs miss "
                          "refusals (shippers, sampling)." if model > seen else
                          "the capacities are higher than the recording's brokers had (set `--capacity`).")
                       + " Read the savings as the model's.")
    return out


def resource_table(rows: list[dict]) -> list[str]:
    """The Markdown table, one row per resource."""
    out = ["| resource | recorded anomaly (UTC) | first limit after onset | first limit | changes | admitted ÷ "
           "target | lift after the cause ends | bystanders' rejected sends per cause minute: recorded lines / "
           "model without governor / replayed |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        by = r["bystander_rejected_per_minute"]
        cause = f"{_t(r['onset'])}-{_t(r['cause_end'])}" if r["onset"] else "**none: check before enforcing**"
        lift = (f"{_n(r['lift_after_cause_end_min'])} min" if r["lift_after_cause_end_min"] is not None else
                "not lifted" if r["first_in_force"] else "n/a")
        out.append(f"| {r['resource_type']} `{r['resource']}` | {cause} | {_n(r['first_limit_after_onset_s'], 's', 0)}"
                   f" | {_n(r['first_limit_qps'], 'msg/s')} | {r['changes']} | {_x(r['admitted_over_target'])}"
                   f" | {lift} | {_n(by['recorded'])} / {_n(by['no_governor'])} / {_n(by['replayed'])} |")
    return out


def capacity_table(outcome: Outcome) -> list[str]:
    """The brokers' capacities: every broker carrying a resource of the report or ever busy, the rest counted."""
    pairs = outcome.result.cluster.pairs
    keys = set(zip(pairs["resource_type"], pairs["resource"]))
    shown_keys = {(r["resource_type"], r["resource"]) for r in outcome.figures} & keys
    own = {b for b, t, r in zip(pairs["broker"], pairs["resource_type"], pairs["resource"]) if (t, r) in shown_keys}
    caps = outcome.capacity
    shown = caps.filter(caps["broker"].is_in(sorted(own)) | (caps["busy_windows"] > 0))
    out = ["| broker | capacity (writes/s) | rule | busy windows | highest recorded writes/s |",
           "|---|---|---|---|---|"]
    out += [f"| {b} | {_n(c)} | {rule} | {busy} | {_n(peak)} |" for b, c, rule, busy, peak in zip(
        shown["broker"], shown["capacity_tps"], shown["rule"], shown["busy_windows"], shown["peak_write_tps"])]
    rest = caps.height - shown.height
    if rest:
        out.append(f"\n{rest} more broker(s), their rules: " + "; ".join(
            f"{n} {rule}" for rule, n in caps.filter(~caps["broker"].is_in(shown["broker"].to_list()))
            .group_by("rule").len().sort("rule").iter_rows()) + ".")
    return out


def recording_lines(outcome: Outcome, meta: dict) -> list[str]:
    """What the recording held and what the replay added to its demand."""
    rec, ref, dem = outcome.recording, outcome.refused, outcome.demand
    out = [f"* {rec.minutes} minutes from {rec.start:%Y-%m-%d %H:%M} UTC, {len(rec.brokers)} brokers, "
           f"{meta['topics']} topics, {meta['groups']} consumer groups; windows judged by the job up to "
           f"{_t(rec.judged_until)} (a cause flagged then is taken to last to the end).",
           f"* Refused sends: {ref.lines:,} lines of known brokers → {ref.chains:,} messages (attempts per message: "
           f"{', '.join(f'{k}: {v:,}' for k, v in ref.chains_by_lines.items()) or 'none'}); {_n(dem.added, '', 0)} "
           f"added to demand at their first broker, {_n(dem.taken_off)} taken off the brokers that admitted them on "
           f"a later attempt (their stats count them), {_n(dem.left_out, '', 0)} left out (a retry topic without "
           f"send-backs); {rec.failures_outside:,} lines outside the recording's brokers or minutes."]
    if rec.quarantine.height:
        out.append("* Quarantined by the job: " + "; ".join(
            f"{n:,} {src} records: {reason}" for src, reason, n in rec.quarantine.head(5).iter_rows()) + ".")
    if outcome.hidden is not None:
        held = sum(len(v) for v in outcome.hidden.held.values())
        out.append(f"* Enforced limits in the recording (`--limits-lake`): {held} resource-minute(s) at the cap, "
                   f"demand held at its level before the limit; under-read (limited from the first minute): "
                   f"{', '.join(f'{t} {r}' for t, r in outcome.hidden.unread) or 'none'}.")
    return out


def write_report(outcome: Outcome, out: Path, meta: dict) -> Path:
    """Write ``report.md`` and the pictures to ``out``; returns the Markdown page's path."""
    out.mkdir(parents=True, exist_ok=True)
    for row in outcome.figures:
        (out / png_name(row)).write_bytes(resource_png(outcome, row))
    lines = [f"# Replay: what the governor would have done on `{meta['landing']}`", "",
             *[f"* {x.strip()}" for x in summary_lines(outcome, meta)[1:-1]], "", "## The recording", "",
             *recording_lines(outcome, meta), "", "## The replay", "", meta["config_line"], "", "## Resources", "",
             *resource_table(outcome.figures), "", *[f"* Why {r['resource_type']} `{r['resource']}`: {r['why']}"
                                                         for r in outcome.figures if r.get("why")], "",
             *model_check(outcome.figures), ""]
    lines += [f"![{r['resource_type']} {r['resource']}]({png_name(r)})" for r in outcome.figures]
    lines += ["", "## Brokers", "", *capacity_table(outcome), "", "## Decisions (the replay's gold/limits)", ""]
    lines += decision_lines(outcome)
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out / "report.md"


def write_json(outcome: Outcome, out: Path, meta: dict) -> Path:
    """Write ``replay.json`` (:func:`to_json`) to ``out``; returns its path."""
    path = out / "replay.json"
    path.write_text(json.dumps(to_json(outcome, meta), default=str, indent=1), encoding="utf-8")
    return path


def decision_lines(outcome: Outcome, most: int = 40) -> list[str]:
    """The replay's decisions, oldest first, at most ``most``."""
    lim = outcome.result.limits
    if not len(lim):
        return ["No decision."]
    out = ["| decided (UTC) | resource | action | basis | limit (msg/s) | reason |", "|---|---|---|---|---|---|"]
    for r in lim.sort_values("version").head(most).itertuples():
        out.append(f"| {pd.Timestamp(r.decided_at):%H:%M:%S} | {r.resource_type} `{r.resource}` | {r.action} | "
                   f"{r.basis} | {_n(r.limit_qps)} | {str(r.reason)[:140].replace('|', '/')} |")
    if len(lim) > most:
        out.append(f"\n{len(lim) - most} more in replay.json.")
    return out


def to_json(outcome: Outcome, meta: dict) -> dict:
    """The report's figures for scripts: the run, the recording, the capacities, the resources, the decisions."""
    lim = outcome.result.limits
    return {"run": meta, "timings": outcome.timings,
            "recording": {"start": outcome.recording.start, "minutes": outcome.recording.minutes,
                          "brokers": list(outcome.recording.brokers), "judged_until": outcome.recording.judged_until,
                          "refused_lines": outcome.refused.lines, "refused_messages": outcome.refused.chains,
                          "attempts_per_message": outcome.refused.chains_by_lines,
                          "demand_added": outcome.demand.added, "demand_taken_off": outcome.demand.taken_off,
                          "demand_left_out": outcome.demand.left_out},
            "capacity": outcome.capacity.to_dicts(), "resources": outcome.figures,
            "decisions": lim.sort_values("version").to_dict(orient="records") if len(lim) else []}
