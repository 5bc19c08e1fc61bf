"""The fast path's evidence: the rules on *open* windows, before the watermark finalizes them.

RocketMQ prints a broker's minute lines at the end of the minute they cover, all keys at once
(docs/rocketmq-formats.md §2), so a broker's SUM for a window is final when its line lands; lines of other brokers
only add to the window's sums, and send failures count as they land. Spark keeps the running sums per window ×
resource (:func:`pipelines.dataplane.transforms.fast.open_window_sums`: ``puts``, ``broker_puts``, ``consumed``,
``retried``, ``failures``, ``busy_failures``, ``rate_limited``, ``broker_amounts``, and a ``cluster`` row whose
``brokers`` is the census); this module judges them:

- ``BROKER_BUSY`` (a count floor) and ``TRAFFIC_SURGE`` (a floor and a factor of a baseline taken from finalized
  windows only) act on any partial window: more lines can only raise the sums;
- ``RUNAWAY_RETRY`` (retry ÷ consume) and ``FAILURE_SPIKE`` (failures ÷ attempts) act early only when the window
  is *complete by census*: every broker that reported in the newest finalized window has reported in this one, so
  the consume and put sums are final and later input can only add retries or failures (which strengthen the
  rule). Otherwise they wait for the final window.

A preliminary decision that the final window does not confirm is reversed by the final path
(:func:`pipelines.decide.paths.reconcile.reconcile_preliminary`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterable

import polars as pl
import pyarrow as pa

from pipelines import columns
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.decide.arrow import naive, micros, to_polars, when
from pipelines.decide.records.inputs import GroupHistory
from pipelines.decide.rules.candidates import Keyed
from pipelines import rocketmq as rmq
from pipelines.decide.rules.facts import (
    FALLBACK_ATTEMPTS, acceptance, busy_fires, failure_rate, per_second, rate, retry_may_fire, retry_ratio,
    retry_traffic, sendback_acceptance, spike_fires, through_busy,
)
from pipelines.decide.rules.anomalies import (
    WINDOW_KEYS, Rule, anomalies_frame, broker_busy,
    broker_writes, consume_basis, failure_spike, group_retry, runaway_retry, traffic_surge,
    shows_demand, unlimited, with_retry_traffic,
)
from pipelines.decide.rules.baselines import baselines, surge_may_fire, surge_values
from pipelines.decide.rules.crowding import crowded_demand, crowded_reach, open_topic_brokers
from pipelines.decide.rules.open_retry import groups_heard, limited_groups, logged_puts, open_retry_traffic

#: ``resource_type`` of the census row of a window (:func:`pipelines.dataplane.transforms.fast.open_window_sums`).
CLUSTER = "cluster"


def census(open_rows: pl.DataFrame, expected: list[str]) -> dict[dt.datetime, tuple[int, bool]]:
    """Census rows → per window start: (brokers reported, complete: every broker of ``expected`` — those of the
    newest finalized window — has reported). With no expected broker (a new lake) no window is complete."""
    return census_rows(open_rows.filter(pl.col("resource_type") == CLUSTER).iter_rows(named=True), expected)


def census_rows(rows: Iterable[dict], expected: list[str]) -> dict[dt.datetime, tuple[int, bool]]:
    """:func:`census` over open-window rows as dicts (other rows than the census rows are skipped)."""
    out = {}
    for r in rows:
        if r["resource_type"] != CLUSTER:
            continue
        brokers = set(r["brokers"] or ())
        out[r["window_start"]] = (len(r["brokers"] or ()), bool(expected) and set(expected) <= brokers)
    return out


#: How many windows older than the newest open one a broker must be missing from for the fast path to stop waiting
#: for it (:func:`waited_for`): a broker shipping within the watermark is in every window a minute old or more.
SILENT_WINDOWS = 2


def waited_for(expected: list[str], rows: Iterable[dict], length_seconds: int) -> tuple[list[str], list[str]]:
    """(the brokers of ``expected`` a window's census waits for, those it does not). ``rows``: the fast path's open
    rows (dicts, every window it remembers). A broker absent from the census of every open window that started
    :data:`SILENT_WINDOWS` windows or more before the newest one, where another broker did report, is silent to the
    fast path: its lines land behind the fast query's watermark (a broker shipping minutes late) or it stopped
    shipping. Waited for, it would keep every open window incomplete, and the ratio rules (and the probes and lift
    proofs that need a complete window) would wait for the final path while the other brokers' evidence already
    supports them. Its lines, when they land in time, still count in the
    sums; the final path waits for the watermark whatever the census. None silent when no such window is
    remembered yet, or when every broker would be."""
    census: dict = {}
    for r in rows:
        if r["resource_type"] == CLUSTER and r["window_start"] is not None:
            census.setdefault(r["window_start"], set()).update(r["brokers"] or ())
    if not census or not expected:
        return list(expected), []
    newest = max(census)
    old = [start for start in census if start <= newest - dt.timedelta(seconds=SILENT_WINDOWS * length_seconds)]
    heard = set().union(*(census[start] for start in old)) if old else set()
    silent = [b for b in expected if b not in heard]
    if not old or not heard or len(silent) == len(expected):
        return list(expected), []
    return [b for b in expected if b in heard], silent


def completed_rows(current: list[dict], remembered: Iterable[dict], expected: list[str]) -> list[dict]:
    """This micro-batch's open-window rows (dicts) → the ``remembered`` rows of earlier micro-batches (in their
    order) of each window whose census is complete in ``current``, where ``current`` has no newer row of the same
    window × resource: Spark emits only the rows a micro-batch's input touched, and a window completed by the last
    broker's lines without a line of some group must still be judged on that group
    (:func:`pipelines.decide.paths.fast.prepare_fast` adds them)."""
    done = {start for start, (_n, complete) in census_rows(current, expected).items() if complete}
    if not done:
        return []
    newer = {(r["window_start"], r["resource_type"], r["resource"]) for r in current}
    return [r for r in remembered
            if r["window_start"] in done and (r["window_start"], r["resource_type"], r["resource"]) not in newer]


def _failures_by_class() -> pl.Expr:
    """The fast path counts failures as busy / other (the final window has them by class)."""
    return pl.struct(pl.col("busy_failures").alias("busy"),
                     (pl.col("failures") - pl.col("busy_failures")).alias("other")).alias("failures_by_class")




def rules_that_may_fire(rows: list[dict], topic_history: pl.DataFrame, broker_history: pl.DataFrame,
                        complete: list, windows: WindowsConfig, cfg: DetectionConfig, cache: dict | None = None,
                        until: dt.datetime | None = None, limited: Collection[str] = ()) -> frozenset[Rule]:
    """The rules that can fire on open-window rows (dicts): a necessary condition of each, checked before the rules
    themselves (most micro-batches prove nothing, and each rule costs several polars operations). ``BROKER_BUSY``
    needs the busy floor; ``RUNAWAY_RETRY`` its floor (retries only grow); ``FAILURE_SPIKE`` its floor in a window
    complete by census;
    ``TRAFFIC_SURGE`` of a topic (:attr:`~pipelines.decide.rules.anomalies.Rule.TOPIC_SURGE`) or a broker
    (:attr:`~pipelines.decide.rules.anomalies.Rule.BROKER_SURGE`) needs a window at its
    floor (:func:`pipelines.decide.rules.baselines.surge_may_fire`, ``cache`` its memo) in the history up to the window
    starting at ``until`` (default all of it), a topic's without its limited windows. A rule left out would return
    nothing. Rates are per ``windows.length_seconds``; ``limited``: as :func:`preliminary_anomalies`'."""
    length = windows.length_seconds
    topics, brokers, retries, out, accepted, sent_back, retry_puts = {}, {}, {}, set(), {}, {}, {}
    rows = list(rows)
    logged = logged_puts(rows)
    for r in rows:
        kind = r["resource_type"]
        if kind == "broker":
            if busy_fires(r["busy_failures"] or 0, cfg):
                out.add(Rule.BUSY)
            share = acceptance(logged[(r["window_start"], r["resource"])], r["busy_failures"] or 0)
            accepted[r["window_start"]] = min(share, accepted.get(r["window_start"], 1.0))
            writes = rate(r["broker_puts"] if r["broker_puts"] is not None else r["puts"], length)
            brokers.setdefault(r["resource"], []).append((r["window_start"], writes))
        elif kind == "topic":
            puts, busy = rate(r["puts"], length), r["busy_failures"] or 0
            topics.setdefault(r["resource"], []).append(
                (r["window_start"], puts, None if busy_fires(busy, cfg) else puts))
            if r["window_start"] in complete and spike_fires(1.0, r["failures"] or 0, cfg):  # the count decides
                out.add(Rule.SPIKE)
            if r["resource"].startswith(rmq.RETRY_TOPIC_PREFIX):
                key = (r["window_start"], r["resource"][len(rmq.RETRY_TOPIC_PREFIX):])
                retries[key] = retries.get(key, 0) + (r["puts"] or 0)  # the fallback sends (open_retry_traffic)
                retry_puts[key] = retry_puts.get(key, 0) + (r["puts"] or 0)
        elif kind == "group":
            key = (r["window_start"], r["resource"])
            retries[key] = retries.get(key, 0) + (r["retried"] or 0)
            sent_back[key] = sent_back.get(key, 0) + (r["retried"] or 0)
    # send-backs plus fallback sends bound the larger of the two per broker, and read through the busiest broker's
    # acceptance, or the least the fallback sends can reveal (open_retry_traffic's fallback sends are at most the
    # retry topic's puts; the refused share they read rises with them, up to FALLBACK_ATTEMPTS x the send-backs),
    # they bound what open_retry_traffic reads through each broker's
    # (a group under a limit through its brokers' acceptance alone: open_retry_traffic)
    unread = limited_groups(limited)
    if any(retry_may_fire(through_busy(rate(x, length), accepted.get(k[0], 1.0) if k[1] in unread else
                                       sendback_acceptance(accepted.get(k[0], 1.0), sent_back.get(k, 0) + min(
                                           retry_puts.get(k, 0), FALLBACK_ATTEMPTS * sent_back.get(k, 0)),
                                           sent_back.get(k, 0))), cfg) for k, x in retries.items()):
        out.add(Rule.RETRY)
    up_to = None if until is None else when("window_start") <= micros(until)
    demand_rows = shows_demand(topic_history, cfg)
    topic_rows = demand_rows if up_to is None else up_to & demand_rows
    if Rule.BUSY in out or surge_may_fire(topics, topic_history, "topic", pl.col("put_tps"), cfg,
                                                         cache, topic_rows):  # or read through a crowded broker
        out.add(Rule.TOPIC_SURGE)
    if surge_may_fire(brokers, broker_history, "broker", broker_writes(), cfg, cache, up_to):
        out.add(Rule.BROKER_SURGE)
    return frozenset(out)


def preliminary_anomalies(open_rows: pl.DataFrame, topic_history: pl.DataFrame, broker_history: pl.DataFrame,
                          expected: list[str], windows: WindowsConfig, cfg: DetectionConfig,
                          first_open: dt.datetime | None = None, rules: frozenset[Rule] | None = None,
                          group_history: GroupHistory | None = None, limited: Collection[str] = (),
                          earlier: Callable[[], pa.Table | None] | None = None) -> pl.DataFrame:
    """Running sums of open windows → ``gold/anomalies``-shaped rows that the partial evidence already proves, the
    ``detail`` ending with the census of the window. ``rules``: those that may fire (:func:`rules_that_may_fire`
    of the same rows; computed here when None); the others are not run. ``group_history``: finalized
    ``gold/group_tps`` rows (:data:`~pipelines.decide.records.inputs.GroupHistory`: a retry limit's consume basis,
    :func:`pipelines.decide.rules.anomalies.consume_basis`). ``limited``: ``"<resource_type>\\x1f<resource>"`` keys
    of the resources with a limit in the saved state (:attr:`pipelines.decide.records.inputs.FastInputs.limited`): a
    group among them is read through its brokers' logged acceptance alone (:func:`open_retry_traffic`).
    ``earlier``: a function returning the open-window rows the fast path remembers
    (:attr:`pipelines.decide.paths.fast.OpenRows.rows`, Arrow or None), read only for a retry storm's window not
    complete by census (:func:`groups_heard`)."""
    if open_rows.height == 0:
        return anomalies_frame([])
    counts = census(open_rows, expected)
    complete = [start for start, (_n, ok) in counts.items() if ok]
    if rules is None:
        rules = rules_that_may_fire(open_rows.to_dicts(), topic_history, broker_history, complete, windows, cfg,
                                    limited=limited)
    if not rules:
        return anomalies_frame([])
    first_open = open_rows["window_start"].min() if first_open is None else first_open
    done = [micros(x) for x in complete]
    brokers, topics = _open_brokers(open_rows, rules), _open_topics(open_rows, rules)
    ends = open_rows.select(*WINDOW_KEYS).unique()
    rows: list[dict] = []
    # MONOTONE rules (pipelines/decide/catalogue.py)
    if Rule.BUSY in rules:
        rows += broker_busy(brokers, windows, cfg)
    if Rule.TOPIC_SURGE in rules:
        rows += _topic_surges(open_rows, topics, brokers, ends, topic_history, broker_history, first_open, windows,
                              cfg, crowding=Rule.BUSY in rules)
    if Rule.BROKER_SURGE in rules:
        broker_values = surge_values(broker_history, brokers, "broker", broker_writes())
        broker_base = baselines(broker_values, "broker", first_open, windows, cfg, cfg.surge_floor_tps).join(
            brokers.select("window_start", "broker", broker_writes().alias("put_tps")), on=["window_start", "broker"],
            how="inner").join(ends, on="window_start", how="inner")
        rows += traffic_surge(broker_base, "broker", "broker", cfg)
    if Rule.RETRY in rules:  # a RATIO rule: on windows complete by census, or where the evidence already supports it
        rows += _retry_storms(open_rows, complete, group_history, first_open, windows, cfg, limited, earlier)
    if Rule.SPIKE in rules:
        rows += failure_spike(topics.filter(when("window_start").is_in(done)), windows, cfg)
    for row in rows:
        seen = counts.get(row["window_start"])
        row["detail"] += (f" [preliminary: open window, {seen[0]} of {len(expected)} expected brokers reported]"
                          if seen is not None else " [preliminary: open window]")
    return anomalies_frame(rows)


def _of(open_rows: pl.DataFrame, kind: str) -> pl.DataFrame:
    """The open rows of one ``resource_type``."""
    return open_rows.filter(pl.col("resource_type") == kind)


def _open_brokers(open_rows: pl.DataFrame, rules: frozenset[Rule]) -> pl.DataFrame | None:
    """The open broker rows as the broker rules read them (msg/s; failures as counts), for BUSY and BROKER_SURGE;
    None when neither may fire."""
    if not rules & {Rule.BUSY, Rule.BROKER_SURGE}:
        return None
    return _of(open_rows, "broker").select(
        *WINDOW_KEYS, pl.col("resource").alias("broker"), per_second(pl.col("puts")).alias("put_tps"),
        per_second(pl.col("broker_puts")).alias("broker_put_tps"), "failures", "busy_failures",
        _failures_by_class())


def _open_topics(open_rows: pl.DataFrame, rules: frozenset[Rule]) -> pl.DataFrame | None:
    """The open topic rows as the topic rules read them (``put_tps`` msg/s, ``failure_rate`` 0..1; the limiter's
    rejections left out: the open failures do not carry them), for TOPIC_SURGE and SPIKE; None otherwise."""
    if not rules & {Rule.TOPIC_SURGE, Rule.SPIKE}:
        return None
    return _of(open_rows, "topic").select(
        *WINDOW_KEYS, pl.col("resource").alias("topic"), per_second(pl.col("puts")).alias("put_tps"), "failures",
        "busy_failures", pl.lit(0, pl.Int64).alias("rate_limited"),
        _failures_by_class(),
        failure_rate(pl.col("puts"), pl.col("failures")).alias("failure_rate"),
    )


def _topic_surges(open_rows: pl.DataFrame, topics: pl.DataFrame, brokers: pl.DataFrame | None, ends: pl.DataFrame,
                  topic_history: pl.DataFrame, broker_history: pl.DataFrame, first_open: dt.datetime,
                  windows: WindowsConfig, cfg: DetectionConfig, crowding: bool) -> list[dict]:
    """TRAFFIC_SURGE on open topic windows against their baselines; with BUSY possible (``crowding``), a topic is
    read through the brokers it crowds too (each broker's minute lands whole; a carrier still to report leaves the
    topic's puts short, which takes a larger share of each heard broker's normal writes as its own: a smaller
    reading, never a larger one)."""
    shown = pl.when(~busy_fires(pl.col("busy_failures").fill_null(0), cfg)).then(pl.col("put_tps"))
    topic_values = surge_values(unlimited(topic_history, cfg), topics, "topic", pl.col("put_tps"), shown,
                                crowded_reach(cfg, crowding))
    topic_base = baselines(topic_values, "topic", first_open, windows, cfg, cfg.surge_floor_tps).join(
        topics.select("window_start", "topic", "put_tps", "busy_failures"), on=["window_start", "topic"],
        how="inner").join(ends, on="window_start", how="inner")
    if crowding:
        topic_base = topic_base.join(crowded_demand(
            topic_base, open_topic_brokers(_of(open_rows, "topic"), windows), brokers, broker_history, first_open,
            windows, cfg), on=["window_start", "topic"], how="left")
    return traffic_surge(topic_base, "topic", "topic", cfg)


def _retry_storms(open_rows: pl.DataFrame, complete: list, group_history: GroupHistory | None,
                  first_open: dt.datetime, windows: WindowsConfig, cfg: DetectionConfig, limited: Collection[str],
                  earlier: Callable[[], pa.Table | None] | None) -> list[dict]:
    """RUNAWAY_RETRY on open group windows (:func:`open_group_ratios`, :func:`open_retry_traffic`), each row's
    ``detail`` saying when the consume rate was bounded by the group's last final window."""
    done = [micros(x) for x in complete]
    groups, bounded = open_group_ratios(_of(open_rows, "group"), done, group_history, first_open, windows, cfg)
    starts = [micros(x) for x in groups["window_start"].unique().to_list()]
    reported = {r["window_start"]: r["brokers"] or () for r in _of(open_rows, CLUSTER).select(
        "window_start", "brokers").iter_rows(named=True) if r["window_start"] not in set(complete)}
    heard = groups_heard(open_rows, earlier() if earlier is not None and reported else None, reported)
    retries = with_retry_traffic(groups, *open_retry_traffic(open_rows, starts, windows.length_seconds,
                                                             set(complete), limited_groups(limited), heard))
    rows = []
    for row in runaway_retry(retries, cfg, consume_basis(retries, group_history, first_open, windows, cfg)):
        last = bounded.get((row["window_start"], row["resource"]))
        if last is not None:
            row["detail"] += (f"; consume taken as at least its last final window's {last:.1f} msg/s (brokers "
                              "still to report can only add to it)")
        rows.append(row)
    return rows


def open_group_ratios(groups: pl.DataFrame, done: list[int], group_history: GroupHistory | None,
                      first_open: dt.datetime,
                      windows: WindowsConfig, cfg: DetectionConfig) -> tuple[pl.DataFrame, dict[tuple, float]]:
    """Open-window group rows → (:func:`pipelines.decide.rules.anomalies.group_retry`-shaped rows the ratio rule may
    judge, the windows judged on a bounded consume rate). A window complete by census (``done``: microseconds of its
    start) has its final consume rate. One that is not (a broker late, or its stats stopped) is judged only where its
    evidence already supports the rule: its retries so far (they only grow) against the larger of its consume so
    far and the group's consume in its newest finalized window (``group_history``, read only when a window is
    incomplete), which brokers still to report can only approach; without history it waits for its census."""
    rates = groups.select(*WINDOW_KEYS, pl.col("resource").alias("consumer_group"),
                          per_second(pl.col("retried")).alias("retry_tps"),
                          per_second(pl.col("consumed")).alias("consume_tps"))
    complete = when("window_start").is_in(done)
    partial = rates.filter(~complete)
    last = {}
    if partial.height and group_history is not None:
        history = group_history() if callable(group_history) else group_history
        history = to_polars(history, columns.GOLD_GROUP_TPS)
        names = partial["consumer_group"].unique().to_list()
        per_window = group_retry(history.filter(pl.col("consumer_group").is_in(names)
                                                & (when("window_start") < micros(first_open))))
        newest = per_window.sort("window_start").group_by("consumer_group").last()
        last = dict(zip(newest["consumer_group"].to_list(), newest["consume_tps"].to_list()))
    bounded = {}
    if last:
        known = pl.DataFrame({"consumer_group": list(last), "_last": list(last.values())},
                             schema={"consumer_group": pl.String, "_last": pl.Float64})
        partial = partial.join(known, on="consumer_group", how="inner").with_columns(
            pl.col("consume_tps").alias("_so_far"), pl.max_horizontal("consume_tps", "_last").alias("consume_tps"))
        bounded = {(r["window_start"], r["consumer_group"]): r["_last"] for r in partial.iter_rows(named=True)
                   if r["_last"] > 0 and (r["_so_far"] is None or r["_last"] >= r["_so_far"])}  # the final's taken
        partial = partial.drop("_last", "_so_far")
    else:
        partial = partial.clear()
    out = pl.concat([rates.filter(complete), partial], how="vertical_relaxed").with_columns(
        retry_ratio(pl.col("retry_tps"), pl.col("consume_tps")).alias("retry_ratio"))
    return out, bounded


def topic_carriers(open_rows: pl.DataFrame) -> dict[tuple[dt.datetime, str], list[str]]:
    """Which brokers carry which topic in an open window: ``(window_start, topic)`` → brokers with a put line."""
    topics = open_rows.filter(pl.col("resource_type") == "topic")
    return {(r["window_start"], r["resource"]): list(r["carriers"] or ())
            for r in topics.select("window_start", "resource", "carriers").iter_rows(named=True)}


def cut_bounded_by_final_rates(candidates: list[Keyed], open_rows: pl.DataFrame, expected: list[str],
                               windows: WindowsConfig, heard: Collection[tuple] = ()) -> list[Keyed]:
    """Candidates of open windows → those the fast path may act on: a non-critical candidate's first cut is bounded
    by ``max_cut_pct`` of the observed rate (:meth:`pipelines.decide.limits.base.LimitPolicy.start`), and a partial
    window's rate is below the true one, so a non-critical candidate waits until its window is complete by census, or
    until every broker known to carry it has reported (``heard``: ``(resource_type, resource, window_end)``,
    :func:`pipelines.decide.paths.open_split.topics_heard`); critical ones act at once."""
    length = dt.timedelta(seconds=windows.length_seconds)
    complete = {naive(start + length) for start, (_n, ok) in census(open_rows, expected).items() if ok}
    return [k for k in candidates if k.candidate.critical or k.candidate.window_end in complete
            or (k.resource_type, k.resource, k.candidate.window_end) in heard]


def open_broker_tps(open_rows: pl.DataFrame, windows: WindowsConfig) -> dict[tuple, dict[str, float]]:
    """Open windows → ``(window_end, resource_type, resource)`` → msg/s per broker of the resource's limited traffic
    so far, as the final path measures it (:func:`pipelines.decide.rules.windows.per_broker_traffic`): a topic's puts, a
    group's retry traffic (per broker :func:`~pipelines.decide.rules.facts.retry_traffic` of its send-backs and the
    plain sends to ``%RETRY%<group>``): the shares of a preliminary limit."""
    rows = open_rows.filter(pl.col("resource_type").is_in(["topic", "group"]))
    out, fallback = {}, {}
    for r in rows.select("window_end", "resource_type", "resource", "broker_amounts").iter_rows(named=True):
        per_broker = {b: rate(v, windows.length_seconds) for b, v in sorted((r["broker_amounts"] or {}).items())
                      if v is not None}
        out[(r["window_end"], r["resource_type"], r["resource"])] = per_broker
        if r["resource_type"] == "topic" and r["resource"].startswith(rmq.RETRY_TOPIC_PREFIX):
            fallback[(r["window_end"], "group", r["resource"][len(rmq.RETRY_TOPIC_PREFIX):])] = per_broker
    for key, plain in fallback.items():
        sent = out.get(key, {})
        out[key] = {b: retry_traffic(sent.get(b, 0.0), plain.get(b, 0.0)) for b in sorted(set(sent) | set(plain))}
    return out


def with_earlier_carriers(broker_tps: dict[tuple, dict[str, float]], remembered: pl.DataFrame | None,
                          complete: set, windows: WindowsConfig) -> dict[tuple, dict[str, float]]:
    """:func:`open_broker_tps` of open windows → the same, where a window is not complete by census (``complete``:
    the ends of those that are), with the brokers it has not heard from yet that carried the resource in the newest
    earlier open window the fast path remembers (``remembered``: :attr:`pipelines.decide.paths.fast.OpenRows.rows`), at
    that window's rate. A preliminary limit's shares then cover the carriers still to report: listed, each gets its
    share instead of the unlisted brokers' figure (``*``, the smallest listed share's), which for a resource seen
    on one broker so far is the whole limit (the shares would add up to a multiple of it). The brokers still to
    report that no earlier window names: :func:`pipelines.decide.paths.open_split.held_for_brokers_to_report`."""
    if remembered is None or remembered.height == 0:
        return broker_tps
    partial = {k for k in broker_tps if k[0] not in complete}
    if not partial:
        return broker_tps
    names = {(k[1], k[2]) for k in partial}
    rows = remembered.filter(pl.col("resource_type").is_in(["topic", "group"])).select(
        "window_end", "resource_type", "resource", "broker_amounts")
    earlier: dict[tuple, list] = {}
    for r in rows.iter_rows(named=True):
        if (r["resource_type"], r["resource"]) in names and r["broker_amounts"]:
            earlier.setdefault((r["resource_type"], r["resource"]), []).append((r["window_end"], r["broker_amounts"]))
    out = dict(broker_tps)
    for key in partial:
        before = sorted((e, a) for e, a in earlier.get((key[1], key[2]), ()) if e < key[0])
        if not before:
            continue
        seen = dict(out[key])
        for b, v in dict(before[-1][1]).items():
            if b not in seen and v:
                seen[b] = rate(v, windows.length_seconds)
        out[key] = dict(sorted(seen.items()))
    return out


def newest_final_window(broker_history: pl.DataFrame) -> tuple[dt.datetime | None, list[str]]:
    """``gold/broker_tps`` rows → (start of the newest finalized window, the brokers in it, sorted)."""
    if broker_history.height == 0:
        return None, []
    newest = broker_history.lazy().select("window_start", "broker").filter(
        pl.col("window_start") == pl.col("window_start").max()).collect()
    return newest["window_start"][0], sorted(set(newest["broker"].to_list()))
