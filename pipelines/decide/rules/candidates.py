"""Limit candidates: which resource should be limited in which window, to what, and why (``gold/anomalies`` rows and
which brokers carry which topic → :class:`~pipelines.decide.records.resource.Candidate` s).

* ``RUNAWAY_RETRY`` → the group's retry traffic: target = ``allowed_retry_share`` × the consume rate the anomaly
  is based on (its ``baseline_tps``: the window's, or the group's normal rate when larger); lifted only after
  clear windows (:mod:`pipelines.decide.limits.retry_storm`), never by a probe reaching a rate: no ``lift_at_qps``. A
  storm on a busy broker (``BROKER_BUSY`` on a broker carrying its retry traffic in the window) is critical: its
  first limit goes to the target at once, not a ``max_cut_pct`` step (a broker with little headroom stays busy
  under a first cut of half the storm), and no higher than the room its busy carriers leave
  (``busy_load``, ``busy_normal``: :meth:`pipelines.decide.limits.retry_storm.RetryStormLimit.first_bound`).
* ``TRAFFIC_SURGE`` of a topic with a ``BROKER_BUSY`` broker carrying it in the same window → enforce:
  target = ``surge_headroom`` × the topic's baseline (the first limit bounded by its busy carriers' writes,
  ``busy_load``: :meth:`pipelines.decide.limits.surge.SurgeLimit.first_bound`); ``lift_at_qps`` = the observed rate ×
  ``surge_headroom``: a probe whose step reaches it lifts the limit (:mod:`pipelines.decide.limits.surge`), else
  clear windows do.
* ``TRAFFIC_SURGE`` of a topic on healthy brokers → an advisory record only, never below the observed rate ×
  ``surge_headroom`` (``floor_qps``), so a legitimate surge is never cut.

Retry and DLQ topics are governed through their group; protected resources get no candidate. Targets are finite,
≥ ``min_limit_qps`` and ≤ ``max_limit_qps``; at most one candidate per resource and window (the lowest target).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

import polars as pl

from pipelines import rocketmq as rmq
from pipelines.config import LimitsConfig
from pipelines.decide.arrow import naive
from pipelines.decide.records.resource import Candidate
from pipelines.decide.text import fixed
from pipelines.decide.words import Anomaly, Mode, Severity


@dataclass(frozen=True)
class Keyed:
    """A candidate with its resource (the fold takes one resource's candidates at a time)."""

    resource_type: str
    resource: str
    candidate: Candidate


def bounded(target: float | None, cfg: LimitsConfig) -> float:
    """Clamp a target to [min_limit_qps, max_limit_qps]; a null or NaN target becomes the floor."""
    if target is None or math.isnan(target):
        target = cfg.min_limit_qps
    return min(max(target, cfg.min_limit_qps), cfg.max_limit_qps)


def mode(resource: str, cfg: LimitsConfig, advisory: bool = False) -> Mode:
    """``advisory`` for a whole advisory deployment, a listed resource, or an advisory-only rule; else enforce."""
    return Mode.ADVISORY if advisory or cfg.mode == Mode.ADVISORY or resource in cfg.advisory_resources \
        else Mode.ENFORCE


def candidate_limits(anomalies: pl.DataFrame, carriers: dict[tuple[dt.datetime, str], list[str]],
                     cfg: LimitsConfig, broker_tps: dict[tuple, dict[str, float]] | None = None,
                     busy_normal: dict[tuple, float] | None = None) -> list[Keyed]:
    """``gold/anomalies`` rows + which brokers carry which topic per window (``(window_start, topic)`` → brokers) →
    the candidates (module docstring), with each candidate's traffic per broker from ``broker_tps``
    (``(window_end, resource_type, resource)`` → msg/s per broker,
    :func:`pipelines.decide.rules.evidence.broker_tps_of`) and a storm's busy carriers' normal writes from
    ``busy_normal`` (``(window_start, broker)`` → msg/s, :func:`pipelines.decide.rules.crowding.busy_normals`)."""
    rows = list(anomalies.iter_rows(named=True)) if anomalies.height else []
    busy = {(r["window_start"], r["resource"]): r["baseline_tps"] for r in rows
            if r["anomaly"] == Anomaly.BROKER_BUSY.value}  # -> the busy broker's writes (msg/s)
    out: dict[tuple, Keyed] = {}
    tps = broker_tps or {}
    normal = busy_normal or {}

    def loads(r: dict, hot: list[str]) -> dict[str, float]:  # each busy carrier's writes in the row's window
        return {b: busy[(r["window_start"], b)] for b in hot if busy[(r["window_start"], b)] is not None}

    def normals(r: dict, hot: list[str]) -> dict[str, float]:  # what each busy carrier wrote before
        return {b: normal[(r["window_start"], b)] for b in hot if (r["window_start"], b) in normal}

    def add(resource_type: str, resource: str, r: dict, **kw) -> None:
        if resource in cfg.protected:
            return
        end = r["window_end"]
        cand = Candidate(naive(end), broker_tps=tps.get((end, resource_type, resource), {}), **kw)
        key = (resource_type, resource, end)
        if key not in out or cand.target_qps < out[key].candidate.target_qps:
            out[key] = Keyed(resource_type, resource, cand)

    for r in rows:
        critical = r["severity"] == Severity.CRITICAL
        if r["anomaly"] == Anomaly.RUNAWAY_RETRY.value:
            consume = r["baseline_tps"] or 0.0
            hot = sorted(b for b in tps.get((r["window_end"], "group", r["resource"]), {})
                         if (r["window_start"], b) in busy)
            busy_text = f" on a distressed broker ({', '.join(hot)} busy), at once" if hot and not critical else ""
            add("group", r["resource"], r, target_qps=bounded(consume * cfg.allowed_retry_share, cfg),
                floor_qps=cfg.min_limit_qps, observed_tps=r["observed_tps"],
                critical=critical or bool(hot), mode=mode(r["resource"], cfg),
                reason=(f"RUNAWAY_RETRY: {r['detail']}; retry traffic limited to "
                        f"{fixed(cfg.allowed_retry_share * 100, 0)}% of the group's consume rate{busy_text}"),
                baseline_tps=consume,
                busy_load=loads(r, hot), busy_normal=normals(r, hot))
        elif (r["anomaly"] == Anomaly.TRAFFIC_SURGE.value and r["resource_type"] == "topic"
              and not r["resource"].startswith((rmq.RETRY_TOPIC_PREFIX, rmq.DLQ_TOPIC_PREFIX))):
            hot = sorted({b for b in carriers.get((r["window_start"], r["resource"]), ())
                          if (r["window_start"], b) in busy})
            distressed = bool(hot)
            peak = bounded(r["observed_tps"] * cfg.surge_headroom if r["observed_tps"] is not None else None, cfg)
            if distressed:
                reason = (f"TRAFFIC_SURGE on a distressed broker ({', '.join(hot)} busy): {r['detail']}; limited to "
                          f"{fixed(cfg.surge_headroom, 1)}x baseline")
                target = bounded(r["baseline_tps"] * cfg.surge_headroom if r["baseline_tps"] is not None else None, cfg)
            else:
                reason = (f"TRAFFIC_SURGE on healthy brokers: {r['detail']}; advisory only, at "
                          f"{fixed(cfg.surge_headroom, 1)}x the observed rate")
                target = peak
            add("topic", r["resource"], r, target_qps=target, floor_qps=cfg.min_limit_qps if distressed else peak,
                lift_at_qps=peak, observed_tps=r["observed_tps"], critical=critical,
                mode=mode(r["resource"], cfg, advisory=not distressed), reason=reason, baseline_tps=r["baseline_tps"],
                busy_load=loads(r, hot), busy_normal=normals(r, hot))
    return [out[k] for k in sorted(out)]
