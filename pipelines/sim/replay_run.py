"""A recording replayed in closed loop: its demand (:mod:`pipelines.sim.replay_demand`) offered to a cluster of its
own brokers (:mod:`pipelines.sim.replay_brokers`) against the governor's decision plane, minute by minute, as the
sweep runs a scenario (:func:`pipelines.sim.loop.simulate`: the shipped triggers, the shipping delays and the
write-back delay of ``conf/backtest.toml``; every published limit applied by the brokers), and the same cluster run
with no governor (the model of the recording, to hold against what it recorded).

The governor's config is the operator's with ``limits.mode = "enforce"``: the replay answers what enforcing would
have done (``limits.advisory_resources`` stay advisory, as they would). The recording's own failures that no limit
or queue causes (client timeouts …) are replayed as they were recorded.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

import polars as pl

from pipelines.config import GovernorConfig
from pipelines.sim import replay_brokers as rb
from pipelines.sim import replay_demand as rd
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.loop import SimResult, Timing, simulate
from pipelines.sim.replay_enforced import Hidden, bucket_puts, hidden_demand, limits_per_second
from pipelines.sim.replay_figures import all_figures, cause_spans
from pipelines.sim.replay_input import Recording, recorded_counts
from pipelines.sim.replay_refused import Refused, refused_messages

#: Whole minutes a replay needs beyond ``detection.baseline_min_windows``: a surge's baseline, one window to judge
#: and one for its limit to reach the brokers.
EXTRA_MINUTES = 2


class ReplayError(Exception):
    """A replay that cannot run as asked (a ``--capacity`` for a broker the recording lacks); one line."""


def min_minutes(cfg: GovernorConfig) -> int:
    """The shortest recording a replay runs on, minutes: ``detection.baseline_min_windows`` + :data:`EXTRA_MINUTES`."""
    return cfg.detection.baseline_min_windows + EXTRA_MINUTES


@dataclass
class Outcome:
    """Everything a replay produced: the ``recording``, the ``refused`` messages, the ``demand``, the ``hidden``
    demand under enforced limits (None without ``--limits-lake``), each broker's ``capacity``, the closed loop
    (``result``), the no-governor ``baseline`` cluster, the recorded ``offered`` requests, each cause's ``spans``,
    the per-resource ``figures`` (:mod:`pipelines.sim.replay_figures`) and ``timings`` (wall seconds per step)."""

    recording: Recording
    refused: Refused
    demand: rd.Demand
    hidden: Hidden | None
    capacity: pl.DataFrame
    result: SimResult
    baseline: ClosedLoopCluster
    offered: pl.DataFrame
    spans: dict
    figures: list[dict]
    timings: dict = field(default_factory=dict)


def topic_brokers(offered: pl.DataFrame) -> dict[str, tuple[str, ...]]:
    """Each topic's brokers in the recording (its puts' pairs), sorted."""
    puts = offered.filter(pl.col("resource_type") == "topic")
    return {t: tuple(sorted(set(g["broker"].to_list())))
            for (t,), g in puts.group_by(["resource"], maintain_order=True)}


def build_demand(rec: Recording, offered: pl.DataFrame, bcfg, enforced: pl.DataFrame | None, cfg: GovernorConfig,
                 ) -> tuple[rd.Demand, Refused, Hidden | None]:
    """The replay's demand from the recording (:mod:`pipelines.sim.replay_demand`)."""
    hosts = topic_brokers(offered)
    refused = refused_messages(rec.refused, hosts, rec.start, bcfg.clients.producer_attempts,
                               bcfg.clients.retrying_share)
    added, left_out = rd.refused_demand(offered, refused, hosts)
    hidden, recorded = None, rd.pair_rows(rec.stats, rec.start)
    if enforced is not None:
        per = limits_per_second(enforced, rec.start, rec.minutes, bcfg.propagation_seconds)
        hidden = hidden_demand(per, offered, bucket_puts(recorded), cfg.limits.bound_share)
    merged = rd.merge_estimates(added, hidden.demand if hidden is not None else added.head(0))
    rows = rd.apply_demand(recorded, offered, merged)
    demand = rd.Demand(rd.traffic_frame(rows, rec.start), float(refused.added["messages"].sum()),
                       float(refused.delivered["messages"].sum()), left_out)
    return demand, refused, hidden


def replay_recording(rec: Recording, cfg: GovernorConfig, bcfg, capacity: dict[str, float],
                     enforced: pl.DataFrame | None = None, timing: Timing | None = None) -> Outcome:
    """Replay ``rec`` in closed loop (module docstring). ``cfg``: the operator's governor config; ``bcfg``:
    ``conf/backtest.toml``; ``capacity``: ``--capacity`` figures (broker → write units/s); ``enforced``: the
    enforcing governor's ``gold/limits`` (:func:`pipelines.sim.replay_input.read_enforced`).

    Raises:
        ReplayError: ``capacity`` names a broker the recording has no stats of.
    """
    unknown = sorted(set(capacity) - set(rec.brokers))
    if unknown:
        raise ReplayError(f"--capacity {unknown[0]}: no stats of that broker in the recording (brokers: "
                          f"{', '.join(rec.brokers[:8])}{' …' if len(rec.brokers) > 8 else ''})")
    timing, clock = timing or Timing(), time.monotonic()
    offered = rd.recorded_offered(rec.stats, rec.start, bcfg.broker)
    demand, refused, hidden = build_demand(rec, offered, bcfg, enforced, cfg)
    caps = rb.estimate_capacity(offered, rec.anomalies, rec.brokers, bcfg.broker, capacity, rec.start)
    end = rec.start + dt.timedelta(minutes=rec.minutes)
    incident = rb.recorded_incident(rec.anomalies, hidden.held if hidden else {}, rec.start, end, rec.judged_until)
    count = recorded_counts(rec.stats)
    spec = rb.recorded_spec(rec.start, rec.minutes, rec.brokers, count["topic"], count["group"])
    cluster = rb.recorded_cluster(spec, demand.traffic, incident, caps, bcfg, timing.tick_seconds)
    baseline = rb.recorded_cluster(spec, demand.traffic, incident, caps, bcfg, timing.tick_seconds)
    timings = {"demand_seconds": time.monotonic() - clock}
    clock = time.monotonic()
    enforce = cfg.model_copy(update={"limits": cfg.limits.model_copy(update={"mode": "enforce"})})
    background = rec.background.to_pandas() if rec.background is not None else None
    result = simulate(spec, enforce, bcfg, timing, cluster=cluster, background=background)
    timings["closed_loop_seconds"] = time.monotonic() - clock
    clock = time.monotonic()
    baseline.advance_to(baseline.end)
    timings["no_governor_seconds"] = time.monotonic() - clock
    spans = cause_spans(cluster)
    figures = all_figures(result, spans, baseline, rec.refused)
    return Outcome(rec, refused, demand, hidden, caps, result, baseline, offered, spans, figures, timings)
