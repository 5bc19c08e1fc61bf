"""The brokers and clients of a replay, from the recording: each broker's capacity, the consumer groups that were
broken and when, and the closed-loop cluster (:class:`pipelines.sim.cluster.ClosedLoopCluster`) that runs the
recorded demand with the simulator's own rules (fast failure and the in-broker limiter, :mod:`pipelines.sim.ticks`;
producers' retries and consumers' fallbacks, :mod:`pipelines.sim.cluster`).

**Capacity** (write units per second, as :func:`pipelines.sim.broker_model.offered_from_stats` counts them: a put 1,
a send-back its recorded writes), per broker, the first rule that applies:

1. ``--capacity BROKER=N`` on the command line, then ``[broker] capacity_tps`` of ``conf/backtest.toml``;
2. **busy**: the broker has ``BROKER_BUSY`` windows in the recording (``gold/anomalies``): its highest per-minute
   write rate. A broker never writes faster than it serves, and while its fast failure refuses sends it serves at its
   capacity (``BrokerFastFailure``, docs/rocketmq-formats.md §5);
3. **never busy**: ``[broker] capacity_factor`` × the median write rate of its first ``capacity_baseline_minutes``
   minutes with traffic and no anomaly of the broker, at least ``capacity_min_tps`` (the simulator's own rule,
   :func:`pipelines.sim.broker_model.broker_capacity`), and never below its highest recorded minute (it served that
   without refusing).

**Broken consumers**: a group is broken (it sends back whatever it receives, :meth:`ClosedLoopCluster.broken`) in the
windows the recording flags ``RUNAWAY_RETRY`` for it and in the minutes an enforced limit held it at its cap
(:mod:`pipelines.sim.replay_enforced`); a topic flagged ``TRAFFIC_SURGE`` is a surge cause in those windows. Both are
the incident the cluster carries (:class:`pipelines.sim.spec.Incident`, kind ``recording``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pandas as pd
import polars as pl

from pipelines.decide.words import Anomaly
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.spec import Cause, Incident, ScenarioSpec

#: The incident kind of a recording (its causes are what the rules flagged, not a ground truth).
RECORDING = "recording"


@dataclass(frozen=True)
class RecordedSpec(ScenarioSpec):
    """A :class:`ScenarioSpec` for a recording's cluster: its start, minutes and broker names (``recorded_brokers``,
    in the order the cluster indexes them) and the clients' failure texts; the scenario shape ``name`` is never
    built (the cluster is given the recording's demand) and the background failures are off (the trickle rates 0)."""

    recorded_brokers: tuple[str, ...] = ()

    @property
    def broker_names(self) -> list[str]:
        return list(self.recorded_brokers)


def recorded_spec(start: dt.datetime, minutes: int, brokers: tuple[str, ...], topics: int, groups: int,
                  seed: int = 0) -> RecordedSpec:
    """The spec of a recording of ``minutes`` minutes from ``start`` (UTC) on ``brokers``."""
    return RecordedSpec(name="steady", seed=seed, start=start, minutes=max(int(minutes), 2), brokers=len(brokers),
                        topics=max(topics, 1), groups=max(groups, 1), trickle_timeouts_per_broker_min=0.0,
                        trickle_topic_not_exist_per_broker_min=0.0, recorded_brokers=tuple(brokers))


def write_rates(offered: pl.DataFrame) -> pl.DataFrame:
    """Per broker and minute index ``m``: ``write_tps``, the write units per second the recorded rows offered."""
    return (offered.with_columns(w=pl.col("requests") * pl.col("work_per_request") / 60.0)
            .group_by(["broker", "m"]).agg(write_tps=pl.col("w").sum()).sort(["broker", "m"]))


def estimate_capacity(offered: pl.DataFrame, anomalies: pl.DataFrame, brokers: tuple[str, ...], cfg,
                      given: dict[str, float], start: dt.datetime) -> pl.DataFrame:
    """Each broker's capacity (module docstring): columns ``broker``, ``capacity_tps`` (write units/s), ``rule``,
    ``busy_windows``, ``peak_write_tps``, ``normal_write_tps`` (the never-busy rule's median, else null).
    ``cfg``: ``[broker]`` of ``conf/backtest.toml`` (:class:`~pipelines.sim.broker_model.BrokerModelConfig`)."""
    rates = write_rates(offered)
    own = anomalies.filter(pl.col("resource_type") == "broker").with_columns(
        m=((pl.col("window_start") - pl.lit(start).cast(pl.Datetime("us", "UTC"))).dt.total_seconds() // 60)
        .cast(pl.Int64))
    rows = []
    for b in brokers:
        r = rates.filter(pl.col("broker") == b)
        mine = own.filter(pl.col("resource") == b)
        busy = mine.filter(pl.col("anomaly") == Anomaly.BROKER_BUSY.value)["m"].n_unique()
        peak = float(r["write_tps"].max() or 0.0)
        quiet = r.filter(~pl.col("m").is_in(mine["m"].to_list()) & (pl.col("write_tps") > 0))
        normal = float(np.median(quiet["write_tps"].head(cfg.capacity_baseline_minutes).to_numpy())) \
            if quiet.height else None
        if b in given or b in cfg.capacity_tps:
            cap, rule = float(given.get(b, cfg.capacity_tps.get(b))), (
                "--capacity" if b in given else "conf/backtest.toml [broker] capacity_tps")
        elif busy:
            cap, rule = peak, f"busy in {busy} window(s): its highest write rate"
        else:
            base = cfg.capacity_factor * (normal or 0.0)
            cap = max(base, cfg.capacity_min_tps, peak)
            rule = (f"never busy: {cfg.capacity_factor:g} x its normal rate" if cap == base else
                    "never busy: its highest write rate" if cap == peak else "never busy: the capacity floor")
        rows.append((b, cap, rule, busy, peak, normal))
    return pl.DataFrame(rows, schema={"broker": pl.Utf8, "capacity_tps": pl.Float64, "rule": pl.Utf8,
                                      "busy_windows": pl.Int64, "peak_write_tps": pl.Float64,
                                      "normal_write_tps": pl.Float64}, orient="row")


def recorded_incident(anomalies: pl.DataFrame, held: dict, start: dt.datetime, end: dt.datetime,
                      judged_until: dt.datetime | None) -> Incident | None:
    """The incident a recording shows: a storm cause per group flagged ``RUNAWAY_RETRY`` (its windows and its
    minutes held at an enforced cap, merged), a surge cause per business topic flagged ``TRAFFIC_SURGE`` (a retry
    topic's traffic is its group's); None without any. A cause flagged in the last window the job judged
    (``judged_until``: the recording's tail behind the watermark is never judged) lasts to the recording's ``end``."""
    spans: dict[tuple[str, str, str], list] = {}
    for kind, rtype, anomaly in (("storm", "group", Anomaly.RUNAWAY_RETRY), ("surge", "topic", Anomaly.TRAFFIC_SURGE)):
        part = anomalies.filter((pl.col("resource_type") == rtype) & (pl.col("anomaly") == anomaly.value)
                                & ~pl.col("resource").str.starts_with("%"))
        for res, a, b in zip(part["resource"], part["window_start"], part["window_end"]):
            spans.setdefault((kind, rtype, res), []).append((a, end if judged_until is not None and b >= judged_until
                                                             else b))
    for (rtype, res), minutes in held.items():
        if rtype == "group":
            spans.setdefault(("storm", rtype, res), []).extend(
                (start + dt.timedelta(minutes=m), start + dt.timedelta(minutes=m + 1)) for m in minutes)
    causes = tuple(Cause(rtype, res, kind, tuple(merge_spans(s))) for (kind, rtype, res), s in sorted(spans.items()))
    if not causes:
        return None
    onset = min(c.active[0][0] for c in causes)
    return Incident(RECORDING, onset, None, None, None, "what the recording's rules flagged", causes=causes)


def merge_spans(spans: list) -> list[tuple[dt.datetime, dt.datetime]]:
    """UTC ``[start, end)`` spans sorted, those that touch or overlap merged."""
    out: list = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def recorded_cluster(spec: RecordedSpec, traffic: pd.DataFrame, incident: Incident | None, capacity: pl.DataFrame,
                     bcfg, tick_seconds: float) -> ClosedLoopCluster:
    """The closed-loop cluster of a recording: ``traffic`` its demand (:mod:`pipelines.sim.replay_demand`), the
    brokers of ``capacity`` (:func:`estimate_capacity`), ``bcfg`` the world of ``conf/backtest.toml`` (brokers,
    clients) at the closed loop's tick (``tick_seconds``)."""
    traffic.attrs["incident"] = incident
    cap = pd.Series(capacity["capacity_tps"].to_numpy(), index=capacity["broker"].to_list(), name="capacity_tps")
    return ClosedLoopCluster(spec, bcfg.broker.model_copy(update={"tick_seconds": tick_seconds}), bcfg.clients,
                             capacity=cap, traffic=traffic)
