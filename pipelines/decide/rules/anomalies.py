"""The anomaly rules over windows → ``gold/anomalies`` rows (:data:`pipelines.columns.GOLD_ANOMALIES`); the kinds,
their evidence and their settings are catalogued in :mod:`pipelines.decide.catalogue`.

Rules (thresholds from ``[detection]``):

* ``RUNAWAY_RETRY`` (group): the group's retry TPS (``SNDBCK_PUT_NUMS``, summed over topics) is at least
  ``retry_ratio_threshold`` of its consume TPS on non-retry topics and at least ``retry_floor_tps`` (a group
  retrying at the floor with nothing consumed fires too). Article 001: ``%RETRY%get-pugc-to-ai-consumer`` at 785 TPS.
* ``TRAFFIC_SURGE`` (topic, broker): put TPS at least ``surge_factor`` × the resource's own baseline (the
  ``baseline_quantile`` of its put TPS over the previous ``baseline_windows`` windows, needing
  ``baseline_min_windows`` of them) and at least ``surge_floor_tps``. Article 001: one broker's writes rose ~8x.
* ``BROKER_BUSY`` (broker): at least ``busy_failures_floor`` busy failures (``[TIMEOUT_CLEAN_QUEUE]`` …) in a window.
* ``FAILURE_SPIKE`` (topic): failure rate at least ``failure_rate_threshold`` with at least ``failure_floor``
  failures in a window; rejections by the in-broker limiter (``RATE_LIMITED``) never count.

Windows in which a topic was under an enforced limit (``gold/topic_tps.limit_qps``) show the cap, not the demand:
they are kept out of the topic's surge baseline. Severity is ``critical`` when the observed value is at least
``critical_factor`` × the rule's floor, else ``warning``.

Frames are polars DataFrames with the columns of the gold tables; times are UTC. The detail texts format numbers
as Spark's ``format_string`` does (:mod:`pipelines.decide.text`).
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from pipelines import columns
from pipelines import rocketmq as rmq
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.decide.arrow import to_polars
from pipelines.decide.rules.baselines import baselines, surge_may_fire, surge_values
from pipelines.decide.rules.crowding import crowded_demand, crowded_reach, refused_reading
from pipelines.decide.rules import facts
from pipelines.decide.rules.facts import (
    TOLERANCE, busy_fires, rate, refused_demand, retry_fires, retry_may_fire, retry_ratio, severity,
    spike_fires, surge_fires,
)
from pipelines.decide.text import fixed, number
from pipelines.decide.words import Anomaly, Word

WINDOW_KEYS = ("window_start", "window_end")


class Rule(Word):
    """A rule as the gates name it (:func:`rules_to_run`,
    :func:`pipelines.decide.rules.preliminary.rules_that_may_fire`): an anomaly kind's rule, ``TRAFFIC_SURGE`` once per
    resource type it flags."""

    RETRY = Anomaly.RUNAWAY_RETRY.value
    TOPIC_SURGE = f"{Anomaly.TRAFFIC_SURGE.value}:topic"
    BROKER_SURGE = f"{Anomaly.TRAFFIC_SURGE.value}:broker"
    BUSY = Anomaly.BROKER_BUSY.value
    SPIKE = Anomaly.FAILURE_SPIKE.value


#: Every rule (:func:`detect` runs them all with it).
ALL_RULES = frozenset(Rule)
_ANOMALIES = to_polars(None, columns.GOLD_ANOMALIES)


def anomalies_frame(rows: list[dict]) -> pl.DataFrame:
    """Anomaly rows (dicts) → a frame of the ``gold/anomalies`` columns (empty rows → an empty, typed frame)."""
    if not rows:
        return _ANOMALIES.clear()
    return pl.DataFrame(rows, schema=_ANOMALIES.schema)


def group_retry(groups: pl.DataFrame) -> pl.DataFrame:
    """``gold/group_tps`` rows → one row per consumer group × window: ``consumer_group``, ``retry_tps`` (all
    topics), ``consume_tps`` (non-retry topics: what the group really consumes), ``retry_ratio`` (null when consume
    is 0)."""
    not_retry = ~pl.col("topic").fill_null("").str.starts_with(rmq.RETRY_TOPIC_PREFIX)
    sums = groups.group_by([*WINDOW_KEYS, "consumer_group"], maintain_order=True).agg(
        pl.col("retry_tps").sum().alias("retry_tps"),
        pl.when(not_retry).then(pl.col("consume_tps")).otherwise(0.0).sum().alias("consume_tps"),
    )
    return sums.with_columns(retry_ratio(pl.col("retry_tps"), pl.col("consume_tps")).alias("retry_ratio"))


def with_retry_traffic(groups: pl.DataFrame, traffic: dict[tuple, float] | None,
                       admitted: dict[tuple, float] | None = None) -> pl.DataFrame:
    """:func:`group_retry` rows + the groups' retry traffic the brokers admitted per window (``(window_start,
    group)`` → msg/s summed over brokers, per broker the larger of the send-backs and the plain sends to
    ``%RETRY%<group>`` a consumer falls back to when its broker refuses a send-back: the traffic rows of
    :func:`pipelines.decide.rules.evidence.demand`) → the same rows with ``retry_tps`` the larger of the two and the
    ratio again, ``sent_back_tps`` the send-backs alone. A broker busy with a storm's own writes fast-fails most of its
    send-backs: counted alone they fall under ``retry_floor_tps`` while the storm goes on through the fallback.
    The traffic may be read through the brokers' busy refusals (:func:`pipelines.decide.rules.facts.through_busy`):
    ``admitted`` (the same keys) is then what they admitted (``admitted_tps``, for the anomaly's detail)."""
    if not traffic or groups.height == 0:
        return groups
    keys = list(traffic)
    extra = pl.DataFrame({"window_start": [k[0] for k in keys], "consumer_group": [k[1] for k in keys],
                          "_traffic": [traffic[k] for k in keys],
                          "admitted_tps": [(admitted or traffic).get(k) for k in keys]},
                         schema={"window_start": groups.schema["window_start"], "consumer_group": pl.String,
                                 "_traffic": pl.Float64, "admitted_tps": pl.Float64})
    retry = facts.retry_traffic(pl.col("retry_tps"), pl.col("_traffic").fill_null(0.0))
    return groups.join(extra, on=["window_start", "consumer_group"], how="left", maintain_order="left").select(
        *[c for c in groups.columns if c not in ("retry_tps", "retry_ratio")],
        pl.col("retry_tps").alias("sent_back_tps"), retry.alias("retry_tps"),
        retry_ratio(retry, pl.col("consume_tps")).alias("retry_ratio"), "admitted_tps")


def retry_storms(groups: pl.DataFrame, cfg: DetectionConfig) -> pl.DataFrame:
    """:func:`group_retry` rows (or :func:`with_retry_traffic` rows) → those where RUNAWAY_RETRY fires
    (:func:`pipelines.decide.rules.facts.retry_fires` of their ``retry_tps`` and ``consume_tps``)."""
    fires = [retry_fires(retry, consume, cfg)
             for retry, consume in zip(groups["retry_tps"].to_list(), groups["consume_tps"].to_list())]
    return groups.filter(pl.Series(fires, dtype=pl.Boolean))


def consume_basis(groups: pl.DataFrame, group_history, first_window: dt.datetime, windows: WindowsConfig,
                  cfg: DetectionConfig) -> dict[tuple, tuple[float, int]]:
    """The groups' normal consume rates for the windows of ``groups`` (:func:`group_retry` rows of the windows
    judged now) where RUNAWAY_RETRY fires (:func:`retry_storms`), from the windows before each, the earlier ones
    judged now included (so that a backlog and a window at a time agree):
    ``(window_start, group)`` → (the ``baseline_quantile`` of its consume TPS on non-retry topics over its previous
    ``baseline_windows`` windows, how many), for groups with at least one of them (a governor minutes into a new
    lake has few: the windows before a storm show its normal rate).
    ``group_history``: earlier ``gold/group_tps`` rows (a polars frame, an Arrow table, or a function returning
    one: read only when a storm fires; None: none). A storm's own windows show a depressed consume rate (its busy
    broker refuses the puts the group would consume), so a retry limit is based on the larger of the window's and
    this one (:func:`runaway_retry`)."""
    firing = retry_storms(groups, cfg)
    if firing.height == 0:
        return {}
    names = firing["consumer_group"].unique().to_list()
    current = groups.filter(pl.col("consumer_group").is_in(names))
    parts = [current]
    if group_history is not None:
        history = group_history() if callable(group_history) else group_history
        parts.insert(0, group_retry(to_polars(history, columns.GOLD_GROUP_TPS).filter(
            pl.col("consumer_group").is_in(names))))
    values = pl.concat([f.select("window_start", "consumer_group", pl.col("consume_tps").alias("value"))
                        for f in parts], how="vertical_relaxed")
    base = baselines(values, "consumer_group", first_window, windows, cfg)
    wanted = set(firing.select("window_start", "consumer_group").iter_rows())
    return {(r["window_start"], r["consumer_group"]): (r["baseline_tps"], r["baseline_windows"])
            for r in base.iter_rows(named=True) if (r["window_start"], r["consumer_group"]) in wanted
            and r["baseline_tps"] is not None and r["baseline_windows"] >= 1}


def runaway_retry(groups: pl.DataFrame, cfg: DetectionConfig, basis: dict[tuple, tuple[float, int]] | None = None
                  ) -> list[dict]:
    """:func:`group_retry` rows (or :func:`with_retry_traffic` rows) → RUNAWAY_RETRY anomalies (resource_type
    ``group``; observed = retry TPS, baseline = the consume TPS a limit is based on: the window's, or the group's
    normal consume rate from ``basis`` (:func:`consume_basis`) when larger)."""
    firing = retry_storms(groups, cfg)
    out = []
    for r in firing.iter_rows(named=True):
        ratio = number(r["retry_ratio"], 2) if r["retry_ratio"] is not None else "n/a (nothing consumed)"
        sent, admitted = r.get("sent_back_tps"), r.get("admitted_tps")
        how = "(SNDBCK_PUT_NUMS)" if sent is None or sent >= r["retry_tps"] else (
            f"({fixed(sent, 1)} msg/s as SNDBCK_PUT_NUMS, the rest as the plain sends a consumer falls back to "
            "where its broker refused a send-back)")
        if admitted is not None and r["retry_tps"] > max(admitted, sent or 0.0) * (1.0 + TOLERANCE):
            how = (f"(its busy brokers admitted {fixed(admitted, 1)} msg/s, {fixed(sent or 0.0, 1)} of them as "
                   "SNDBCK_PUT_NUMS: read through the share of sends they accepted, the rest refused)")
        detail = (f"consumer group {r['consumer_group']} sent {fixed(r['retry_tps'], 1)} msg/s back to "
                  f"{rmq.RETRY_TOPIC_PREFIX}{r['consumer_group']} {how} against "
                  f"{fixed(r['consume_tps'], 1)} msg/s consumed: retry ratio {ratio} (rule: ratio >= "
                  f"{fixed(cfg.retry_ratio_threshold, 2)} and retry >= {fixed(cfg.retry_floor_tps, 1)} msg/s)")
        consume = r["consume_tps"]
        normal, n = (basis or {}).get((r["window_start"], r["consumer_group"]), (None, 0))
        if normal is not None and normal > consume:
            detail += (f"; its normal consume rate {fixed(normal, 1)} msg/s (p{int(round(cfg.baseline_quantile * 100))}"
                       f" of the previous {n} windows) is the basis of a limit")
            consume = normal
        out.append(_row(r, "group", r["consumer_group"], Anomaly.RUNAWAY_RETRY, r["retry_tps"], consume,
                        severity(r["retry_tps"], cfg.retry_floor_tps, cfg), detail))
    return out


def _row(r: dict, resource_type: str, resource: str, kind: Anomaly, observed, baseline, severity: str,
         detail: str) -> dict:
    return {"window_start": r["window_start"], "window_end": r["window_end"], "resource_type": resource_type,
            "resource": resource, "anomaly": kind.value,
            "observed_tps": None if observed is None else float(observed),
            "baseline_tps": None if baseline is None else float(baseline), "severity": severity, "detail": detail}


def broker_writes() -> pl.Expr:
    """A broker's writes per second for its ``TRAFFIC_SURGE`` baseline (msg/s per broker): its own
    ``BROKER_PUT_NUMS`` (``broker_put_tps``) when it prints one, since it counts every write (retry re-puts and
    schedule writes too: article 001's 8x while the topics it printed stayed flat); the sum of its topics' puts
    (``put_tps``) otherwise. Both paths use this."""
    return pl.coalesce(pl.col("broker_put_tps"), pl.col("put_tps"))


def traffic_surge(rows: pl.DataFrame, resource_type: str, key: str, cfg: DetectionConfig) -> list[dict]:
    """Rows with ``window_start``, ``window_end``, ``key``, ``put_tps``, ``baseline_tps``, ``baseline_windows``
    (and ``busy_failures``, a topic's sends refused as busy: ``busy_surge_factor`` where they reach
    ``busy_failures_floor``, judged on its puts and on its demand with those refused sends,
    :func:`pipelines.decide.rules.crowding.refused_reading`; and ``crowded_tps``, a topic's puts read through the
    brokers it crowds, :func:`pipelines.decide.rules.crowding.crowded_demand`: ``surge_factor`` on it) → TRAFFIC_SURGE
    anomalies."""
    has_busy = "busy_failures" in rows.columns
    busy = busy_fires(pl.col("busy_failures").fill_null(0), cfg) if has_busy else pl.lit(False)
    crowded = pl.col("crowded_tps") if "crowded_tps" in rows.columns else pl.lit(None, pl.Float64)
    refused = refused_reading(cfg) if has_busy else pl.lit(None, pl.Float64)
    read = surge_fires(crowded, pl.col("baseline_tps"), cfg).fill_null(False)
    firing = rows.with_columns(busy.alias("_busy"), crowded.alias("_crowded"), refused.alias("_refused")).filter(
        (pl.col("baseline_windows") >= cfg.baseline_min_windows)
        & (surge_fires(pl.col("put_tps"), pl.col("baseline_tps"), cfg, pl.col("_busy")).fill_null(False) | read
           | surge_fires(pl.col("_refused"), pl.col("baseline_tps"), cfg, pl.col("_busy")).fill_null(False)))
    out = []
    for r in firing.iter_rows(named=True):
        put, base = r["put_tps"], r["baseline_tps"]
        on_puts = surge_fires(put, base, cfg, r["_busy"])
        crowding = r["_crowded"] is not None and surge_fires(r["_crowded"], base, cfg)
        on_refused = not on_puts and r["_refused"] is not None and surge_fires(r["_refused"], base, cfg, True) and (
            not crowding or r["_refused"] >= r["_crowded"])  # the larger of the two readings that fire
        through = not on_puts and not on_refused  # fired on the crowding
        shown = r["_crowded"] if through else r["_refused"] if on_refused else put
        factor = number(shown / base, 1) if base > 0 else "inf"
        rule = facts.surge_factor(cfg, not through and bool(r["_busy"]))
        where = f" (its sends refused as busy: {r['busy_failures']} in the window)" if r["_busy"] else ""
        if on_refused:
            where = (f", {fixed(shown, 1)} msg/s with the sends refused as busy ({r['busy_failures']} lines in the "
                     f"window, each message at most {rmq.PRODUCER_SEND_ATTEMPTS} attempts)")
        if through:
            where = (f", {fixed(shown, 1)} msg/s read through the brokers it crowds (their other writes shrank "
                     f"under their normal: a busy broker refuses every sender alike){where}")
        detail = (f"{resource_type} {r[key]} put {fixed(put, 1)} msg/s{where}, {factor}x its baseline of "
                  f"{fixed(base, 1)} msg/s (p{int(round(cfg.baseline_quantile * 100))} of the previous "
                  f"{r['baseline_windows']} windows; rule: >= {fixed(rule, 1)}x"
                  f"{' on a busy broker' if r['_busy'] and not through else ''} and >= "
                  f"{fixed(cfg.surge_floor_tps, 1)} msg/s)")
        level = severity(shown / max(base, TOLERANCE), rule, cfg)  # a zero baseline: TOLERANCE msg/s
        out.append(_row(r, resource_type, r[key], Anomaly.TRAFFIC_SURGE, put, base, level, detail))
    return out


def class_counts(failures_by_class) -> str:
    """A ``failures_by_class`` map → ``"A: 1, B: 2"`` (entries sorted), ``null`` when absent (as Spark's
    ``format_string`` of a null)."""
    if failures_by_class is None:
        return "null"
    items = failures_by_class.items() if isinstance(failures_by_class, dict) else [
        (v["key"], v["value"]) if isinstance(v, dict) else v for v in failures_by_class]
    return ", ".join(f"{k}: {v}" for k, v in sorted(items))


def broker_busy(brokers: pl.DataFrame, windows: WindowsConfig, cfg: DetectionConfig) -> list[dict]:
    """``gold/broker_tps`` rows → BROKER_BUSY anomalies (observed = busy failures per second, baseline = the
    broker's writes, :func:`broker_writes`: a surge's first limit's burst bound, ``Candidate.busy_load``)."""
    out = []
    firing = brokers.filter(busy_fires(pl.col("busy_failures"), cfg))
    for r in firing.with_columns(broker_writes().alias("_writes")).iter_rows(named=True):
        detail = (f"broker {r['broker']} rejected {r['busy_failures']} sends as busy in the window "
                  f"({class_counts(r['failures_by_class'])}) while writing {fixed(r['put_tps'], 1)} msg/s "
                  f"(rule: >= {cfg.busy_failures_floor} busy failures per window)")
        out.append(_row(r, "broker", r["broker"], Anomaly.BROKER_BUSY,
                        rate(r["busy_failures"], windows.length_seconds), r["_writes"],
                        severity(r["busy_failures"], cfg.busy_failures_floor, cfg), detail))
    return out


def failure_spike(topics: pl.DataFrame, windows: WindowsConfig, cfg: DetectionConfig) -> list[dict]:
    """``gold/topic_tps`` rows → FAILURE_SPIKE anomalies (observed = failures per second, baseline = put TPS);
    failures rejected by the limiter (``rate_limited``) do not count."""
    faults = pl.col("failures") - pl.col("rate_limited").fill_null(0)
    firing = topics.with_columns(faults.alias("_faults")).filter(
        spike_fires(pl.col("failure_rate"), pl.col("_faults"), cfg))
    out = []
    for r in firing.iter_rows(named=True):
        detail = (f"topic {r['topic']} had {r['_faults']} failed sends besides the limiter's "
                  f"({class_counts(r['failures_by_class'])}), {fixed(r['failure_rate'] * 100, 1)}% of attempts, while "
                  f"{fixed(r['put_tps'], 1)} msg/s were put (rule: rate >= "
                  f"{fixed(cfg.failure_rate_threshold * 100, 1)}% and >= {cfg.failure_floor} failures per window)")
        out.append(_row(r, "topic", r["topic"], Anomaly.FAILURE_SPIKE, rate(r["_faults"], windows.length_seconds),
                        r["put_tps"], severity(r["_faults"], cfg.failure_floor, cfg), detail))
    return out


def shows_demand(frame: pl.DataFrame, cfg: DetectionConfig) -> pl.Expr:
    """Whether a ``gold/topic_tps`` window shows the topic's demand, for its surge baseline: no enforced limit in
    force (``limit_qps`` null: a capped window shows the limit, and a baseline fed with it would hold the limit up)
    and fewer than ``busy_failures_floor`` of its sends refused as busy (a busy broker writes its capacity and
    fast-fails the rest: a baseline fed with its windows would make the topic's recovery a surge)."""
    out = pl.lit(True)
    if "limit_qps" in frame.columns:
        out = out & pl.col("limit_qps").is_null()
    if "busy_failures" in frame.columns:
        out = out & ~busy_fires(pl.col("busy_failures").fill_null(0), cfg)
    return out


def unlimited(topic_history: pl.DataFrame, cfg: DetectionConfig | None = None) -> pl.DataFrame:
    """``gold/topic_tps`` history → the windows that show the topic's demand (:func:`shows_demand`; without
    ``cfg``, those without an enforced limit only)."""
    if cfg is None:
        return topic_history.filter(pl.col("limit_qps").is_null()) if "limit_qps" in topic_history.columns \
            else topic_history
    return topic_history.filter(shows_demand(topic_history, cfg))


def rules_to_run(topics: pl.DataFrame, groups: pl.DataFrame, brokers: pl.DataFrame, topic_history: pl.DataFrame,
                 broker_history: pl.DataFrame, cfg: DetectionConfig,
                 retry_traffic: dict[tuple, float] | None = None,
                 topic_brokers: pl.DataFrame | None = None) -> frozenset[Rule]:
    """The rules that can fire on a micro-batch of finalized windows (the arguments of :func:`detect`): a necessary
    condition of each, from the rows as dicts (a few polars operations instead of a few dozen; most micro-batches
    prove nothing). ``RUNAWAY_RETRY`` needs a group's retries summed over its topics (or its ``retry_traffic``,
    :func:`with_retry_traffic`) at ``retry_floor_tps``,
    ``BROKER_BUSY`` and ``FAILURE_SPIKE`` their floors, ``TRAFFIC_SURGE`` a window at its floor and factor
    (:func:`surge_may_fire`), or of a topic a busy broker where ``topic_brokers`` are given (a topic's puts read
    through the brokers it crowds, :func:`~pipelines.decide.rules.crowding.crowded_demand`). A rule left out would
    return nothing."""
    out = set()
    retries: dict = {}
    for r in groups.select("window_start", "consumer_group", "retry_tps").iter_rows():
        retries[r[0], r[1]] = retries.get((r[0], r[1]), 0.0) + (r[2] or 0.0)
    for k, x in (retry_traffic or {}).items():
        retries[k] = facts.retry_traffic(retries.get(k, 0.0), x)
    if any(retry_may_fire(x, cfg) for x in retries.values()):
        out.add(Rule.RETRY)
    topic_values: dict = {}
    for start, end, topic, put, failures, limited, busy in topics.select(
            "window_start", "window_end", "topic", "put_tps", "failures", "rate_limited", "busy_failures").iter_rows():
        if spike_fires(1.0, (failures or 0) - (limited or 0), cfg):  # at the largest rate there is: the count
            out.add(Rule.SPIKE)
        if put is not None:  # a topic refused as busy: judged on its demand with the refused sends, no baseline value
            refused = busy_fires(busy or 0, cfg)
            judged = refused_demand(put, busy, (end - start).total_seconds()) if refused else put
            topic_values.setdefault(topic, []).append((start, judged, None if refused else put))
    broker_values: dict = {}
    for start, broker, put, broker_put, busy in brokers.select(
            "window_start", "broker", "put_tps", "broker_put_tps", "busy_failures").iter_rows():
        if busy_fires(busy or 0, cfg):
            out.add(Rule.BUSY)
        writes = broker_put if broker_put is not None else put
        if writes is not None:
            broker_values.setdefault(broker, []).append((start, writes))
    if (Rule.BUSY in out and topic_brokers is not None and topic_brokers.height) or surge_may_fire(
            topic_values, unlimited(topic_history, cfg), "topic", pl.col("put_tps"), cfg):
        out.add(Rule.TOPIC_SURGE)
    if surge_may_fire(broker_values, broker_history, "broker", broker_writes(), cfg):
        out.add(Rule.BROKER_SURGE)
    return frozenset(out)


def detect(topics: pl.DataFrame, groups: pl.DataFrame, brokers: pl.DataFrame, topic_history: pl.DataFrame,
           broker_history: pl.DataFrame, windows: WindowsConfig, cfg: DetectionConfig,
           first_window: dt.datetime | None = None, rules: frozenset[Rule] | None = None,
           retry_traffic: dict[tuple, float] | None = None, group_history=None,
           retry_admitted: dict[tuple, float] | None = None,
           topic_brokers: pl.DataFrame | None = None) -> pl.DataFrame:
    """All rules over one micro-batch of finalized windows → ``gold/anomalies`` rows.

    Args:
        topics, groups, brokers: this batch's ``gold/topic_tps``, ``gold/group_tps``, ``gold/broker_tps``.
        topic_history, broker_history: earlier windows of ``gold/topic_tps`` and ``gold/broker_tps`` (baselines).
        first_window: start of this batch's first window (UTC); default the earliest of ``topics`` and ``brokers``.
        rules: the rules to run (:func:`rules_to_run`, its default; :data:`ALL_RULES`: every rule).
        retry_traffic: the groups' retry traffic the brokers admitted (:func:`with_retry_traffic`); None: their
            send-backs alone.
        group_history: earlier ``gold/group_tps`` rows, or a function returning them (:func:`consume_basis`).
        retry_admitted: what the brokers admitted of ``retry_traffic`` when that is read through their busy
            refusals (:func:`with_retry_traffic`); None: the same.
        topic_brokers: the topics' puts per broker (``window_start``, ``topic``, ``broker``, ``tps``), for a
            topic's demand read through the busy brokers it crowds
            (:func:`~pipelines.decide.rules.crowding.crowded_demand`); None: not read.
    """
    if first_window is None:
        starts = [f["window_start"].min() for f in (topics, brokers) if f.height]
        if not starts:
            return anomalies_frame([])
        first_window = min(starts)
    if rules is None:
        rules = rules_to_run(topics, groups, brokers, topic_history, broker_history, cfg, retry_traffic,
                             topic_brokers)
    rows = []
    if Rule.RETRY in rules:
        retries = with_retry_traffic(group_retry(groups), retry_traffic, retry_admitted)
        basis = consume_basis(retries, group_history, first_window, windows, cfg)
        rows = runaway_retry(retries, cfg, basis)
    if Rule.TOPIC_SURGE in rules:
        shown = pl.when(~busy_fires(pl.col("busy_failures").fill_null(0), cfg)).then(pl.col("put_tps"))
        crowding = topic_brokers is not None and topic_brokers.height and brokers.filter(
            busy_fires(pl.col("busy_failures").fill_null(0), cfg)).height
        topic_values = surge_values(unlimited(topic_history, cfg), topics, "topic", pl.col("put_tps"), shown,
                                    crowded_reach(cfg, bool(crowding)))
        topic_base = baselines(topic_values, "topic", first_window, windows, cfg, cfg.surge_floor_tps).join(
            topics.select(*WINDOW_KEYS, "topic", "put_tps", "busy_failures"), on=["window_start", "topic"], how="inner")
        topic_base = topic_base.join(crowded_demand(topic_base, topic_brokers, brokers, broker_history, first_window,
                                                    windows, cfg), on=["window_start", "topic"], how="left")
        rows += traffic_surge(topic_base, "topic", "topic", cfg)
    if Rule.BROKER_SURGE in rules:
        broker_values = surge_values(broker_history, brokers, "broker", broker_writes())
        broker_base = baselines(broker_values, "broker", first_window, windows, cfg, cfg.surge_floor_tps).join(
            brokers.select(*WINDOW_KEYS, "broker", broker_writes().alias("put_tps")), on=["window_start", "broker"],
            how="inner")
        rows += traffic_surge(broker_base, "broker", "broker", cfg)
    if Rule.BUSY in rules:
        rows += broker_busy(brokers, windows, cfg)
    if Rule.SPIKE in rules:
        rows += failure_spike(topics, windows, cfg)
    return anomalies_frame(rows)
