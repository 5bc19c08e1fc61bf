"""A preliminary limit's per-broker split while its window is open: held for the brokers still to report, then split
again by the window's complete traffic once the census completes.

Each broker's token bucket is its own (Sohu's ``RateLimitHandler``, docs/decisions.md §5): a broker applies its own
entry of the record's ``brokers``, else the ``*`` entry, the smallest listed share. The fast path decides a storm
on a busy broker at once, on an open window some brokers have not reported yet, and a split over the brokers heard
from so far adds up to a multiple of the limit once a carrier still to report applies ``*``: 2.00x for two minutes
after a governor restart, when no earlier open window names the carriers, 1.50x where a storm's carriers had no
traffic before it (docs/decisions.md §8).

* :func:`held_for_brokers_to_report`: the brokers the census still waits for are listed too, holding together
  :data:`TO_REPORT_SHARE` of the limit, so the figures of every broker that may carry the resource add up to the
  limit, and the brokers heard from keep nearly all of it (a storm's carriers admit the limit cluster-wide while a
  carrier still to report holds a trickle: seconds, until its stats land);
* :func:`complete_split`: once the window is complete by census, the same limit split by its complete traffic
  (basis ``preliminary``, version rank :data:`~pipelines.decide.records.limit_rows.RESPLIT_RANK`), as the final path
  will split it, minutes before the final path would; the state the fast path folds from freezes those shares too
  (:func:`pipelines.decide.paths.reconcile.preliminary_state`).

Rows are dicts by column (``gold/limits``); times UTC.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import replace

from pipelines.columns import Key
from pipelines.config import GovernorConfig
from pipelines.decide.rules import facts
from pipelines.decide.arrow import aware, figures, naive
from pipelines.decide.rules.candidates import Keyed
from pipelines.decide.records.limit_rows import RESPLIT_RANK, VERSION_RANK, burst_for, decision_version
from pipelines.decide.rules.preliminary import CLUSTER
from pipelines.decide.paths.reconcile import same_figures
from pipelines.decide.text import fixed, stamp
from pipelines.decide.words import Action, Basis


#: What the brokers still to report hold together of a preliminary limit decided before its window is complete by
#: census (:func:`held_for_brokers_to_report`); the brokers heard from share the rest by their traffic.
TO_REPORT_SHARE = 0.05


def still_to_report(rows: Iterable[dict], expected: list[str], length_seconds: int) -> dict[dt.datetime, list[str]]:
    """Census rows (dicts, :attr:`pipelines.decide.paths.fast.OpenRows.by_key`'s; other rows skipped) → per window end
    (naive UTC): the brokers of ``expected`` (the census's, :func:`pipelines.decide.rules.preliminary.waited_for`) it
    has not heard from yet. A broker's stats line has all its keys: one heard from without a line of a resource does
    not carry it in the window."""
    heard: dict = {}
    for r in rows:
        if r["resource_type"] == CLUSTER and r["window_start"] is not None:
            heard.setdefault(naive(r["window_start"]), set()).update(r["brokers"] or ())
    length = dt.timedelta(seconds=length_seconds)
    return {start + length: [b for b in expected if b not in seen] for start, seen in heard.items()}


def held_for_brokers_to_report(candidates: list[Keyed], to_report: dict[dt.datetime, list[str]]) -> list[Keyed]:
    """Candidates of open windows → the same, where a candidate's window has brokers still to report
    (``to_report``: :func:`still_to_report`) that its traffic per broker does not list (neither heard from nor
    named by an earlier open window, :func:`pipelines.decide.rules.preliminary.with_earlier_carriers`), with those
    brokers listed, holding together :data:`TO_REPORT_SHARE` of the limit: its shares
    (:func:`pipelines.decide.rules.facts.shares_of`) are taken from the traffic per broker. A candidate without traffic
    is left as it is; its criticality (a busy carrier) was judged on the brokers heard from, before this."""
    out = []
    for k in candidates:
        tps = k.candidate.broker_tps
        missing = [b for b in to_report.get(k.candidate.window_end, ()) if b not in tps]
        total = sum(v for v in tps.values() if v is not None and v > 0 and math.isfinite(v))
        if missing and total > 0:
            each = total * TO_REPORT_SHARE / (1 - TO_REPORT_SHARE) / len(missing)
            k = replace(k, candidate=replace(k.candidate, broker_tps={**tps, **{b: each for b in missing}}))
        out.append(k)
    return out


def complete_traffic(candidates: Iterable[Keyed], complete_ends) -> dict[tuple, dict[str, float]]:
    """The fast path's candidates → ``(resource_type, resource, window_end)`` → msg/s per broker, for those of a
    window complete by census (``complete_ends``: their ends, naive UTC): a window's complete traffic, the shares
    the final path will freeze."""
    return {(k.resource_type, k.resource, k.candidate.window_end): dict(k.candidate.broker_tps)
            for k in candidates if k.candidate.window_end in complete_ends and facts.shares_of(k.candidate.broker_tps)}


def complete_split(latest: dict[Key, dict], complete: dict[tuple, dict[str, float]], decided: set,
                   cfg: GovernorConfig, now: dt.datetime) -> list[dict]:
    """The fast path's answer to its own preliminary ``set`` decided before its window was complete by census, once
    it is (``complete``: :func:`complete_traffic`; ``latest``: the newest ``gold/limits`` row by key): the same
    limit split by the window's complete traffic, where that split differs → ``gold/limits`` rows, basis
    ``preliminary``, ``version`` of the window with :data:`~pipelines.decide.records.limit_rows.RESPLIT_RANK` (once per
    decision: a split already answered is not answered again). ``decided``: the keys this micro-batch decided
    otherwise (their rows stand)."""
    decided_at = aware(now)
    out = []
    for key in sorted(latest):
        p = latest[key]
        if (p["basis"] != Basis.PRELIMINARY or p["action"] != Action.SET or p["limit_qps"] is None or key in decided
                or p["version"] % 10 != VERSION_RANK[Basis.PRELIMINARY]):
            continue
        traffic = complete.get((*key, naive(p["window_end"])))
        whole = facts.split(p["limit_qps"], facts.shares_of(traffic or {}))
        if not whole or same_figures(figures(p.get("broker_limits")) or None, whole):
            continue
        reason = (f"[preliminary] the open window ending {stamp(aware(p['window_end']))} is complete by census: the "
                  f"{fixed(p['limit_qps'], 1)} msg/s limit split over its brokers by their complete traffic (the "
                  "first split held a share for each broker still to report)")
        out.append({
            "decided_at": decided_at, "window_end": aware(p["window_end"]), "resource_type": key[0],
            "resource": key[1], "limit_qps": p["limit_qps"], "burst": burst_for(p["limit_qps"], cfg.limits),
            "previous_qps": p["limit_qps"], "action": Action.SET, "mode": p["mode"],
            "expires_at": decided_at + dt.timedelta(seconds=cfg.limits.ttl_seconds), "reason": reason,
            "version": decision_version(p["window_end"], RESPLIT_RANK), "basis": Basis.PRELIMINARY,
            "broker_limits": whole,
        })
    return out


def topics_heard(candidates: Iterable[Keyed], remembered, to_report: dict[dt.datetime, list[str]]) -> frozenset:
    """Topic candidates of open windows not complete by census → the ``(resource_type, resource, window_end)`` of
    those whose carriers in the newest earlier open window the fast path remembers (``remembered``:
    :attr:`pipelines.decide.paths.fast.OpenRows.rows`, Arrow or polars; the brokers with puts of the topic there) have
    all reported in the candidate's window (none of them in ``to_report``: :func:`still_to_report`). Such a
    topic's put rate is that of every broker known to carry it, which the brokers still to report are unlikely
    to change (as a retry storm's fallback sends, :func:`pipelines.decide.rules.open_retry.groups_heard`): its first cut
    (bounded by ``max_cut_pct`` of it) may act before the census completes, not waiting for a broker that carries
    none of it. A topic seen nowhere earlier is not heard."""
    import polars as pl

    topics = {k.resource for k in candidates if k.resource_type == "topic"}
    if remembered is None or not topics:
        return frozenset()
    frame = remembered if isinstance(remembered, pl.DataFrame) else pl.from_arrow(remembered)
    carried: dict[str, dict] = {}  # topic → window end → its carriers there (a window's newest row)
    for r in frame.filter((pl.col("resource_type") == "topic") & pl.col("resource").is_in(sorted(topics))).select(
            "window_end", "resource", "broker_amounts").iter_rows(named=True):
        brokers = {b for b, v in dict(r["broker_amounts"] or {}).items() if v}
        if brokers:
            carried.setdefault(r["resource"], {})[naive(r["window_end"])] = brokers
    out = set()
    for k in candidates:
        end = k.candidate.window_end
        last = facts.newest_carriers(carried.get(k.resource, {}), end)
        if k.resource_type == "topic" and last and end in to_report and not set(to_report[end]) & last:
            out.add((k.resource_type, k.resource, end))
    return frozenset(out)
