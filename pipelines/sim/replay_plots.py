"""A replay's picture per resource, in the status page's style (:mod:`pipelines.ops.plots`: matplotlib's Agg
backend, 11 inches wide at 100 dpi, UTC ``HH:MM`` time axis, light grid, legend outside on the right, the limit as a
dashed blue step line, the flagged windows shaded), as PNG bytes.

Top: the resource's demand (the replay's input, per minute), what the brokers admitted of it in the replay (10 s
means) and as recorded (per minute), and the cluster-wide limit in force at the brokers. Bottom: the rejected sends
of the other resources on its brokers per minute: the recording's refused-send lines, the same cluster without a
governor (the model of the recording) and the replay. Rates msg/s; rejected sends per minute.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers and in CI

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import polars as pl  # noqa: E402

from pipelines.sim.replay_figures import pair_masks, target_per_second  # noqa: E402
from pipelines.sim.values_in_force import value_events  # noqa: E402

DPI = 100
LIMIT_COLOUR = "tab:blue"
FLAGGED_COLOUR = "tab:red"


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _time_axis(ax) -> None:
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz="UTC"))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)


def _per_minute(values: np.ndarray, minutes: int) -> np.ndarray:
    return values[: minutes * 60].reshape(minutes, 60).sum(axis=1)


def _recorded_admitted(outcome, key: tuple[str, str], minutes: int) -> np.ndarray:
    """What the brokers admitted of ``key`` per minute as recorded, msg/s."""
    own = outcome.offered.filter((pl.col("resource_type") == key[0]) & (pl.col("resource") == key[1]))
    out = np.zeros(minutes)
    for m, q in own.group_by("m").agg(pl.col("requests").sum()).iter_rows():
        if 0 <= m < minutes:
            out[m] = q / 60.0
    return out


def _recorded_lines(outcome, key: tuple[str, str], hosts: list[str], minutes: int) -> np.ndarray:
    """The recording's refused-send lines of ``key``'s bystander topics on ``hosts`` per minute."""
    rec = outcome.recording
    name = key[1] if key[0] == "topic" else "%RETRY%" + key[1]
    lines = rec.refused.filter(pl.col("broker").is_in(hosts) & (pl.col("topic") != name))
    out = np.zeros(minutes)
    idx = ((lines["event_time"].dt.epoch("s") - int(rec.start.timestamp())) // 60).to_numpy()
    np.add.at(out, idx[(idx >= 0) & (idx < minutes)], 1.0)
    return out


def resource_png(outcome, row: dict) -> bytes:
    """The picture of one resource row (:mod:`pipelines.sim.replay_figures`), PNG bytes (module docstring)."""
    c, key = outcome.result.cluster, (row["resource_type"], row["resource"])
    own, others = pair_masks(c, key)
    seconds = c.start + pd.to_timedelta(np.arange(c.T * 60), unit="s")
    minutes = c.start + pd.to_timedelta(np.arange(c.T), unit="min")
    fig, (top, low) = plt.subplots(2, 1, figsize=(11, 6.4), sharex=True)
    top.step(minutes, c.demand[own].sum(axis=0), where="post", color="tab:gray", linestyle=":",
             label="demand (replay input)")
    top.plot(minutes, _recorded_admitted(outcome, key, c.T), color="tab:orange", linewidth=1.2,
             drawstyle="steps-post", label="admitted, as recorded")
    top.plot(seconds, pd.Series(c.second_admitted[:, own].sum(axis=1)).rolling(10, min_periods=1).mean(),
             color="tab:green", linewidth=1.4, label="admitted, replayed (10 s mean)")
    top.plot(seconds, target_per_second(c, value_events(outcome.result, key)), color=LIMIT_COLOUR, linestyle="--",
             linewidth=2, label="limit in force (cluster-wide)")
    for ax in (top, low):
        for a, b in outcome.spans.get(key, []):
            ax.axvspan(a, b, color=FLAGGED_COLOUR, alpha=0.12, linewidth=0)
    top.set_ylabel("msg/s")
    top.set_yscale("symlog", linthresh=10)
    top.set_title(f"{key[0]} {key[1]}: replayed in closed loop (shaded: flagged in the recording)", fontsize=10)
    _time_axis(top)
    hosts = sorted(set(c.pairs.loc[own, "broker"]))
    low.plot(minutes, _recorded_lines(outcome, key, hosts, c.T), color="tab:orange", drawstyle="steps-post",
             label="recorded refused-send lines")
    low.plot(minutes, _per_minute(outcome.baseline.second_rejected[:, others].sum(axis=1), c.T), color="tab:gray",
             drawstyle="steps-post", linestyle=":", label="modelled without a governor")
    low.plot(minutes, _per_minute(c.second_rejected[:, others].sum(axis=1), c.T), color="tab:green",
             drawstyle="steps-post", label="replayed with the governor")
    low.set_ylabel("rejected sends / min")
    low.set_xlabel("UTC")
    low.set_title(f"other resources on {', '.join(hosts[:6])}{' …' if len(hosts) > 6 else ''}", fontsize=10)
    _time_axis(low)
    return _png(fig)
