"""Demand evidence of limitable resources: what each broker admitted of a resource's limited traffic, what its
limiter rejected, and whether the brokers carrying it were healthy, per window.

A limit changes the traffic the governor reads next (closed loop): under a limit the stats show the cap, not the
demand, so a limited resource is judged by its rule on this evidence
(:meth:`pipelines.decide.limits.base.LimitPolicy.judge`).
Per rule (the resource a rule limits and the traffic its limiter counts; the per-broker rows are reduced by Spark,
:func:`pipelines.decide.rules.windows.resource_traffic`):

* ``RUNAWAY_RETRY`` limits a consumer group's retry traffic: one limiter per broker keyed ``%RETRY%<group>``
  (sohutv/rocketmq 5.3.1-sohu-01 ``RateLimitHandler``) counts the group's send-backs (``SNDBCK_PUT_NUMS``) and the
  plain sends to ``%RETRY%<group>`` a consumer falls back to (``TOPIC_PUT_NUMS`` of the retry topic): per broker
  the larger of the two; rejections are ``RATE_LIMITED`` failures of ``%RETRY%<group>``.
* ``TRAFFIC_SURGE`` limits a topic's puts: its ``TOPIC_PUT_NUMS`` per broker; rejections are its ``RATE_LIMITED``
  failures.

Where the RocketMQ admin sink is on, the views it reads at every publish carry each limiter's last rejection
(:func:`limiter_traffic`): a limiter that rejected in a window is evidence too. On the fast path the open windows'
partial sums give the same evidence so far (:func:`open_evidence`, the final path's lift veto).

Units: ``tps`` and ``observed_tps`` are messages per second (per broker, or summed over brokers: cluster-wide);
``rejected`` counts failed send attempts in the window.
"""

from __future__ import annotations

import datetime as dt

import polars as pl
import pyarrow as pa

from pipelines import columns
from pipelines import rocketmq as rmq
from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.decide.arrow import naive, to_polars, micros, when
from pipelines.decide.rules.facts import busy_fires, rate, retry_traffic
from pipelines.decide.records.resource import Observation
from pipelines.decide.rules.preliminary import census, newest_final_window, waited_for
from pipelines.decide.rules.anomalies import broker_writes, group_retry

#: The per-broker traffic rows Spark reduces (:data:`pipelines.columns.WINDOW_TRAFFIC`) as a polars schema.
TRAFFIC = dict(to_polars(None, columns.WINDOW_TRAFFIC).schema)
KEYS = ["window_end", "resource_type", "resource"]


def limiter_traffic(rejections: pl.DataFrame, windows: WindowsConfig) -> pl.DataFrame:
    """``control/limiter_rejections`` rows (the in-broker limiters' last rejections as the RocketMQ admin sink's
    views report them) → :data:`TRAFFIC` rows: one per window × resource × broker whose limiter rejected a send in
    the window, ``tps`` 0, ``rejected`` 0 and ``carries`` null: the view tells that the limiter rejected, not how
    much (:func:`demand` turns the null into ``viewed``). The limiter key ``%RETRY%<group>`` is the group's retry
    traffic; any other key is a topic."""
    if rejections.height == 0:
        return pl.DataFrame(schema=TRAFFIC)
    length = f"{windows.length_seconds}s"
    key = pl.col("resource")
    is_retry = key.str.starts_with(rmq.RETRY_TOPIC_PREFIX)
    start = pl.col("last_rejected_at").dt.truncate(length)
    return rejections.select(
        start.alias("window_start"), start.dt.offset_by(length).alias("window_end"),
        pl.when(is_retry).then(pl.lit("group")).otherwise(pl.lit("topic")).alias("resource_type"),
        pl.when(is_retry).then(key.str.slice(len(rmq.RETRY_TOPIC_PREFIX))).otherwise(key).alias("resource"),
        "broker",
    ).unique().with_columns(pl.lit(0.0).alias("tps"), pl.lit(0, pl.Int64).alias("rejected"),
                            pl.lit(None, pl.Boolean).alias("carries"),
                            pl.lit(None, pl.Float64).alias("sendback_tps"),
                            pl.lit(1.0).alias("acceptance")).select(list(TRAFFIC))


def demand(traffic: pl.DataFrame, brokers: pl.DataFrame, cfg: DetectionConfig,
           groups: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per-broker traffic rows + ``gold/broker_tps`` rows of the same windows (+ ``gold/group_tps`` rows for a
    group's consume rate) → one row per window × resource: ``observed_tps`` cluster-wide (sum over brokers, msg/s),
    ``rejected`` (sum), ``broker_tps`` (dict broker → msg/s, brokers with traffic only: the shares of a new limit),
    ``healthy`` (no broker carrying the resource had ``busy_failures_floor`` busy failures in the window),
    ``carrier_load`` (dict carrier → the broker's writes, msg/s), ``busy_brokers`` (sorted), ``viewed`` (a limiter
    view reported rejections: a :func:`limiter_traffic` row), ``consume_tps`` (a group's consume rate on its
    non-retry topics; null for topics) and ``sendback_tps`` (a group's admitted send-backs alone, cluster-wide msg/s;
    null for topics)."""
    state = brokers.select("window_start", "broker",
                           busy_fires(pl.col("busy_failures"), cfg).alias("busy"),
                           broker_writes().alias("load"))
    joined = traffic.join(state, on=["window_start", "broker"], how="left").sort("broker")
    carrying = pl.col("tps") > 0
    rows = joined.group_by(["window_start", "window_end", "resource_type", "resource"], maintain_order=True).agg(
        pl.col("tps").sum().alias("observed_tps"),
        pl.col("rejected").sum().alias("rejected"),
        pl.struct("broker", "tps").filter(carrying).alias("_tps"),
        (~(pl.col("busy").filter(carrying).fill_null(False).any())).alias("healthy"),
        pl.struct("broker", "load").filter(carrying & pl.col("load").is_not_null()).alias("_load"),
        pl.col("broker").filter(carrying & pl.col("busy").fill_null(False)).alias("busy_brokers"),
        pl.col("carries").is_null().any().alias("viewed"),
        pl.when(pl.col("sendback_tps").is_not_null().any()).then(pl.col("sendback_tps").sum())
        .alias("sendback_tps"),
    )
    if groups is not None and groups.height:
        consume = group_retry(groups).select("window_start", pl.lit("group").alias("resource_type"),
                                             pl.col("consumer_group").alias("resource"), "consume_tps")
        rows = rows.join(consume, on=["window_start", "resource_type", "resource"], how="left")
    else:
        rows = rows.with_columns(pl.lit(None, pl.Float64).alias("consume_tps"))
    return rows


def _pairs(items, name: str) -> dict[str, float]:
    return {d["broker"]: float(d[name]) for d in items or []}


def observations(demand_rows: pl.DataFrame, resources: set[tuple[str, str]],
                 window_ends: list[dt.datetime] | None = None) -> dict[tuple[str, str], list[Observation]]:
    """:func:`demand` rows + the resources to observe (those with a limit in force or a candidate in the
    micro-batch) → per resource one :class:`~pipelines.decide.records.resource.Observation` per window of the
    micro-batch with resource traffic (``window_ends``, UTC; default those of ``demand_rows``); a resource without
    traffic in a window has ``observed_tps`` 0 (its limit is doing nothing there), no rejection, healthy carriers and no
    consume rate."""
    if not resources:
        return {}
    ends = sorted(set(demand_rows["window_end"].to_list()) | set(window_ends or ()))
    if not ends:
        return {}
    wanted = pl.DataFrame({"resource_type": [t for t, _ in resources], "resource": [r for _, r in resources]},
                          schema={"resource_type": pl.String, "resource": pl.String})
    mine = demand_rows.join(wanted, on=["resource_type", "resource"], how="semi")
    seen = {(r["resource_type"], r["resource"], r["window_end"]): r for r in mine.iter_rows(named=True)}
    out: dict[tuple[str, str], list[Observation]] = {}
    for key in sorted(resources):
        rows = []
        for end in ends:
            r = seen.get((*key, end))
            if r is None:
                rows.append(Observation(naive(end)))
                continue
            rows.append(Observation(naive(end), float(r["observed_tps"] or 0.0), int(r["rejected"] or 0),
                                    True if r["healthy"] is None else bool(r["healthy"]), r["consume_tps"],
                                    _pairs(r["_load"], "load"), tuple(r["busy_brokers"] or ()), bool(r["viewed"]),
                                    sendback_tps=r["sendback_tps"], broker_tps=_pairs(r["_tps"], "tps")))
        out[key] = rows
    return out


def broker_tps_of(demand_rows: pl.DataFrame) -> dict[tuple, dict[str, float]]:
    """(window_end, resource_type, resource) → the resource's traffic per broker in that window (the shares of a new
    limit, :func:`pipelines.decide.rules.facts.shares_of`)."""
    return {(r["window_end"], r["resource_type"], r["resource"]): _pairs(r["_tps"], "tps")
            for r in demand_rows.select(*KEYS, "_tps").iter_rows(named=True)}


def expected_brokers(brokers: pa.Table | None) -> list[str]:
    """``gold/broker_tps`` rows of a micro-batch → the brokers of its newest window (sorted): those an open window
    after it must have heard from to be complete by census (:func:`pipelines.decide.rules.preliminary.census`)."""
    if brokers is None or brokers.num_rows == 0:
        return []
    return newest_final_window(pl.from_arrow(brokers.select(["window_start", "broker"])))[1]


def open_evidence(rows: pa.Table | None, after: dt.datetime, window_seconds: int,
                  expected: list[str] | tuple[str, ...] = (),
                  detection: DetectionConfig | None = None) -> dict[tuple[str, str], list[Observation]]:
    """What the fast path's remembered open windows starting at or after ``after`` (UTC) show of every topic and
    group so far (:func:`pipelines.decide.rules.preliminary.open_window` rows): per resource one
    :class:`~pipelines.decide.records.resource.Observation` per open window with its limited traffic (cluster-wide
    msg/s: a topic's puts; a group's retry traffic, per broker the larger of its send-backs and the puts to
    ``%RETRY%<group>``), its limiter's rejections (the ``RATE_LIMITED`` failures of the topic, or of
    ``%RETRY%<group>``), a group's consume rate and send-backs alone so far (msg/s) and ``complete``: every broker of
    ``expected`` has reported in the window (:func:`pipelines.decide.rules.preliminary.census`; the consume rate is then
    final; a broker silent in every open window two minutes old or more is not waited for,
    :func:`pipelines.decide.rules.preliminary.
    waited_for`, as the fast path's anomalies do not wait for it). Partial
    sums: they only grow. With ``detection``, ``busy_brokers`` the carriers with ``busy_failures_floor`` busy
    failures so far and ``healthy`` none (a squeeze's evidence, :meth:`pipelines.decide.limits.base.LimitPolicy.
    squeeze`). The final path's lift veto (:func:`pipelines.decide.paths.walk.fold_resource`)."""
    if rows is None or rows.num_rows == 0:
        return {}
    frame = pl.from_arrow(rows.select(["window_start", "window_end", "resource_type", "resource", "rate_limited",
                                       "broker_amounts", "consumed", "brokers", "busy_failures"]))
    expected, _silent = waited_for(list(expected), frame.filter(pl.col("resource_type") == "cluster").select(
        "window_start", "resource_type", "brokers").iter_rows(named=True), window_seconds)
    frame = frame.filter(when("window_start") >= micros(after))
    done = {naive(start) for start, (_n, ok) in census(frame, list(expected)).items() if ok}
    heard = {naive(r["window_end"]): frozenset(r["brokers"] or ()) for r in frame.filter(
        pl.col("resource_type") == "cluster").select("window_end", "brokers").iter_rows(named=True)}
    busy: dict = {}
    if detection is not None:
        for end, broker, failures in frame.filter(pl.col("resource_type") == "broker").select(
                "window_end", "resource", "busy_failures").iter_rows():
            if busy_fires(failures or 0, detection):
                busy.setdefault(end, set()).add(broker)
    frame = frame.filter(pl.col("resource_type").is_in(["topic", "group"]))
    per: dict[tuple, dict] = {}

    def slot_of(key, row):
        return per.setdefault((key, row["window_end"]), {"sent": {}, "puts": {}, "rejected": 0, "consumed": None,
                                                          "complete": naive(row["window_start"]) in done})

    for row in frame.iter_rows(named=True):
        rtype, name = row["resource_type"], row["resource"]
        amounts = dict(row["broker_amounts"] or {})
        if rtype == "topic" and name.startswith(rmq.RETRY_TOPIC_PREFIX):  # a group's plain sends
            slot = slot_of(("group", name[len(rmq.RETRY_TOPIC_PREFIX):]), row)
            slot["puts"] = amounts
            slot["rejected"] += row["rate_limited"] or 0
            continue
        slot = slot_of((rtype, name), row)
        if rtype == "group":
            slot["sent"], slot["consumed"] = amounts, row["consumed"] or 0
        else:
            slot["puts"] = amounts
            slot["rejected"] += row["rate_limited"] or 0
    out: dict[tuple[str, str], list[Observation]] = {}
    for (key, end), slot in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        brokers = set(slot["sent"]) | set(slot["puts"])
        total = sum(retry_traffic(slot["sent"].get(b, 0), slot["puts"].get(b, 0)) for b in brokers) \
            if key[0] == "group" else sum(slot["puts"].values())
        consume = sendbacks = None
        if key[0] == "group":
            consume = rate(slot["consumed"] or 0, window_seconds)
            sendbacks = rate(sum(slot["sent"].values()), window_seconds)
        hot = tuple(sorted(b for b in brokers & busy.get(end, set())
                           if slot["sent"].get(b, 0) > 0 or slot["puts"].get(b, 0) > 0))
        per_broker = {b: rate(retry_traffic(slot["sent"].get(b, 0), slot["puts"].get(b, 0)) if key[0] == "group"
                              else slot["puts"].get(b, 0), window_seconds) for b in sorted(brokers)}
        out.setdefault(key, []).append(Observation(
            naive(end), rate(total, window_seconds), int(slot["rejected"]), healthy=not hot, consume_tps=consume,
            busy_brokers=hot, complete=slot["complete"], sendback_tps=sendbacks,
            broker_tps={b: v for b, v in per_broker.items() if v > 0},
            reported=None if slot["complete"] else heard.get(naive(end), frozenset(brokers))))
    return out
