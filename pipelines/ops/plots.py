"""The status page's pictures: matplotlib figures rendered to PNG bytes (Agg backend, no display needed).

Every function takes pandas DataFrames read from the lake (:mod:`pipelines.ops.status`) with UTC ``datetime64``
time columns and returns the PNG image as ``bytes``.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers and in CI

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from pipelines.decide.catalogue import Anomaly  # noqa: E402

#: One colour per anomaly kind (docs/contracts.md §2, ``gold/anomalies.anomaly``).
ANOMALY_COLOURS = {
    Anomaly.RUNAWAY_RETRY.value: "tab:red",
    Anomaly.TRAFFIC_SURGE.value: "tab:orange",
    Anomaly.BROKER_BUSY.value: "tab:purple",
    Anomaly.FAILURE_SPIKE.value: "tab:brown",
}
DECISION_COLOUR = "tab:blue"
DPI = 100


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _time_axis(ax) -> None:
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz="UTC"))
    ax.set_xlabel("UTC")
    ax.grid(True, alpha=0.3)


def timeline(anomalies: pd.DataFrame, limits: pd.DataFrame) -> bytes:
    """One row per resource (``resource_type:resource``): a bar per anomaly window (colour = kind) and a triangle
    per limit decision at its ``window_end``, labelled with the limit in msg/s.

    Args:
        anomalies: ``window_start``, ``window_end``, ``resource_type``, ``resource``, ``anomaly``.
        limits: ``window_end``, ``resource_type``, ``resource``, ``limit_qps``, ``action``.
    """
    keys = sorted(
        set(anomalies["resource_type"] + ":" + anomalies["resource"])
        | set(limits["resource_type"] + ":" + limits["resource"])
    )
    rows = {key: i for i, key in enumerate(keys)}
    fig, ax = plt.subplots(figsize=(11, 0.6 * max(len(keys), 2) + 1.4))
    kinds = sorted(set(anomalies["anomaly"]))
    height = 0.7 / max(len(kinds), 1)  # kinds side by side within a resource's row, so overlaps stay visible
    for k, kind in enumerate(kinds):
        part = anomalies[anomalies["anomaly"] == kind]
        y = [rows[f"{t}:{r}"] - 0.35 + height * (k + 0.5) for t, r in zip(part["resource_type"], part["resource"])]
        ax.barh(y, part["window_end"] - part["window_start"], left=part["window_start"], height=height * 0.9,
                color=ANOMALY_COLOURS.get(kind, "tab:gray"), alpha=0.8, label=kind)
    if len(limits):
        y = [rows[f"{t}:{r}"] for t, r in zip(limits["resource_type"], limits["resource"])]
        ax.scatter(limits["window_end"], y, marker="v", s=90, color=DECISION_COLOUR, zorder=3, label="limit decision")
        for x, yy, qps, action in zip(limits["window_end"], y, limits["limit_qps"], limits["action"]):
            ax.annotate(f"{action} {qps:.0f}/s", (x, yy), xytext=(0, 9), textcoords="offset points",
                        ha="center", fontsize=7, color=DECISION_COLOUR)
    ax.set_yticks(range(len(keys)), keys, fontsize=8)
    ax.set_ylim(-0.7, len(keys) - 0.3)
    ax.invert_yaxis()
    _time_axis(ax)
    ax.set_title("Anomalies (bars, one per window) and limit decisions (triangles)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


def tps(
    title: str,
    series: dict[str, pd.DataFrame],
    anomalies: pd.DataFrame,
    limits: pd.DataFrame,
) -> bytes:
    """TPS of one resource over time: one line per series, anomaly windows shaded, decisions as vertical lines,
    the limit as a step line.

    Args:
        series: label -> frame with ``window_start`` and ``tps`` (msg/s).
        anomalies: this resource's anomaly windows (``window_start``, ``window_end``, ``anomaly``).
        limits: this resource's decisions (``window_end``, ``limit_qps``, ``action``), empty for a flagged-only one.
    """
    fig, ax = plt.subplots(figsize=(11, 3.2))
    for label, frame in series.items():
        if len(frame):
            ax.plot(frame["window_start"], frame["tps"], label=label, linewidth=1.4)
    for kind, part in anomalies.groupby("anomaly"):
        for start, end in zip(part["window_start"], part["window_end"]):
            ax.axvspan(start, end, color=ANOMALY_COLOURS.get(kind, "tab:gray"), alpha=0.12, linewidth=0)
        ax.axvspan(part["window_start"].iloc[0], part["window_start"].iloc[0],
                   color=ANOMALY_COLOURS.get(kind, "tab:gray"), alpha=0.3, label=f"{kind} window")
    if len(limits):
        ordered = limits.sort_values("window_end")
        ax.step(ordered["window_end"], ordered["limit_qps"], where="post", color=DECISION_COLOUR, linestyle="--",
                label="limit (msg/s)")
        for x in ordered["window_end"]:
            ax.axvline(x, color=DECISION_COLOUR, alpha=0.25, linewidth=1)
    ax.set_ylabel("msg/s")
    ax.set_ylim(bottom=0)
    _time_axis(ax)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


def quarantine(by_reason: pd.DataFrame) -> bytes:
    """Horizontal bars of quarantined records per ``reason`` (one colour per ``source``).

    Args:
        by_reason: ``source``, ``reason``, ``n`` (records).
    """
    frame = by_reason.assign(label=lambda d: d["reason"].str.slice(0, 70))
    pivot = frame.pivot_table(index="label", columns="source", values="n", aggfunc="sum", fill_value=0)
    pivot = pivot.loc[pivot.sum(axis=1).sort_values().index]
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(pivot) + 1.5))
    pivot.plot.barh(stacked=True, ax=ax, width=0.7)
    ax.set_xlabel("records")
    ax.set_ylabel("")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("Quarantined records by reason")
    ax.legend(fontsize=8)
    return _png(fig)
