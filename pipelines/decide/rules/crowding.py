"""A surging topic read through the busy brokers it crowds (:func:`crowded_demand`), for ``TRAFFIC_SURGE``: a busy
broker writes its capacity and fast-fails each request that waits too long, whoever sent it (apache/rocketmq
``BrokerFastFailure``), so a topic whose own puts grew while the rest of its broker shrank sent about its puts ÷ the
share the rest kept (:func:`pipelines.decide.rules.facts.crowded_acceptance`). Its producers' busy lines cannot tell it:
a client's log throttle keeps a few hundred a minute of each. The final path reads the
final windows' per-broker puts (:func:`pipelines.decide.rules.windows.per_broker_traffic`), the fast path the open
windows' (:func:`open_topic_brokers`)."""

from __future__ import annotations

import datetime as dt

import polars as pl

from pipelines.config import DetectionConfig, WindowsConfig
from pipelines.decide.rules.baselines import baselines, surge_values
from pipelines.decide.rules.facts import MIN_ACCEPTANCE, busy_fires, crowded_acceptance, rate, refused_demand
from pipelines.decide.words import Anomaly


def crowded_reach(cfg: DetectionConfig, crowding: bool = True) -> pl.Expr:
    """The most the surge rule may read of a ``gold/topic_tps`` row (msg/s): a topic whose own sends were refused as
    busy (``busy_failures_floor``) its demand with those refused sends
    (:func:`~pipelines.decide.rules.facts.refused_demand`) and, where ``crowding`` (:func:`crowded_demand` reads it), up
    to its puts ÷ :data:`~pipelines.decide.rules.facts.MIN_ACCEPTANCE`, the larger; any other its puts. The surge
    rule's floor (``surge_floor_tps``) is of the demand it reads, so a topic its crushed broker admits under the floor
    is read too (a topic of 3 msg/s surging to 365 msg/s on a broker of 200 msg/s capacity, admitted 47 msg/s, 15.7x
    its baseline, was otherwise never limited)."""
    put, refused = pl.col("put_tps"), refused_reading(cfg)
    most = pl.max_horizontal(put / MIN_ACCEPTANCE, refused) if crowding else refused
    return pl.when(refused.is_not_null()).then(most).otherwise(put)


def refused_reading(cfg: DetectionConfig) -> pl.Expr:
    """A ``gold/topic_tps`` row's demand with the sends its busy brokers refused (msg/s,
    :func:`~pipelines.decide.rules.facts.refused_demand` of ``put_tps``, ``busy_failures`` and the window's length)
    where they reach ``busy_failures_floor``; null elsewhere (its puts show all of it)."""
    busy = pl.col("busy_failures").fill_null(0)
    seconds = (pl.col("window_end") - pl.col("window_start")).dt.total_seconds()
    return pl.when(busy_fires(busy, cfg)).then(refused_demand(pl.col("put_tps"), busy, seconds))


def crowded_demand(topic_base: pl.DataFrame, topic_brokers: pl.DataFrame | None, brokers: pl.DataFrame,
                   broker_history: pl.DataFrame, first_window: dt.datetime, windows: WindowsConfig,
                   cfg: DetectionConfig) -> pl.DataFrame:
    """A topic's demand read through the busy brokers it crowds: ``topic_base`` (``window_start``, ``topic``,
    ``put_tps``, ``baseline_tps``: its cluster-wide puts and baseline, msg/s) with ``topic_brokers``
    (``window_start``, ``topic``, ``broker``, ``tps``: its puts per broker) and the window's ``gold/broker_tps``
    rows → ``window_start``, ``topic``, ``crowded_tps``: its puts, each busy broker's (``busy_failures_floor``)
    divided by the :func:`~pipelines.decide.rules.facts.crowded_acceptance` of that broker (its topics' puts,
    ``put_tps``, against their surge baseline over its windows that were not busy; the topic's share of it taken
    as its baseline times its share of its puts now). Empty without a busy broker, a broker baseline (fewer than
    ``baseline_min_windows`` windows) or ``topic_brokers``."""
    empty = pl.DataFrame(schema={"window_start": pl.Datetime("us", "UTC"), "topic": pl.String,
                                 "crowded_tps": pl.Float64})
    if topic_brokers is None or not topic_brokers.height or not brokers.height:
        return empty
    not_busy = ~busy_fires(pl.col("busy_failures").fill_null(0), cfg)
    busy = brokers.filter(~not_busy).select("window_start", "broker", pl.col("put_tps").alias("_w"))
    if not busy.height:
        return empty
    normal = normal_writes(brokers, broker_history, first_window, windows, cfg, pl.col("put_tps")).rename(
        {"normal_tps": "_n"})
    rows = topic_brokers.join(busy, on=["window_start", "broker"], how="inner").join(
        normal, on=["window_start", "broker"], how="inner").join(
        topic_base.select("window_start", "topic", pl.col("put_tps").alias("_p"), pl.col("baseline_tps").alias("_b")),
        on=["window_start", "topic"], how="inner").filter((pl.col("_p") > 0) & pl.col("_b").is_not_null())
    if not rows.height:
        return empty
    share = crowded_acceptance(pl.col("_w"), pl.col("_n"), pl.col("tps"), pl.col("_b") * pl.col("tps") / pl.col("_p"))
    return rows.group_by("window_start", "topic").agg(
        (pl.col("_p").first() + (pl.col("tps") / share - pl.col("tps")).sum()).alias("crowded_tps"))


def normal_writes(brokers: pl.DataFrame, broker_history: pl.DataFrame, first_window: dt.datetime,
                  windows: WindowsConfig, cfg: DetectionConfig, value: pl.Expr,
                  busy_only: bool = False) -> pl.DataFrame:
    """A broker's normal writes: ``gold/broker_tps`` rows of the windows judged now (``window_start``, ``broker``,
    ``busy_failures`` and the columns ``value`` reads) and its earlier windows → ``window_start``, ``broker``,
    ``normal_tps``: the surge baseline (:func:`pipelines.decide.rules.baselines.baselines`) of ``value`` (msg/s per
    broker) over its previous windows that were not busy (``busy_failures_floor``), for each row judged now with at
    least ``baseline_min_windows`` of them. A busy broker writes its capacity; what it wrote before tells what its
    usual senders need of it (:func:`crowded_demand`; a retry storm's room, :meth:`pipelines.decide.limits.retry_storm.
    RetryStormLimit.first_bound`). ``busy_only``: ``brokers`` holds only ``window_start`` and ``broker`` of busy
    windows."""
    not_busy = ~busy_fires(pl.col("busy_failures").fill_null(0), cfg)
    history = broker_history.filter(not_busy) if broker_history.height else broker_history
    none = pl.lit(None, pl.Float64)
    values = surge_values(history, brokers, "broker", value, none if busy_only else pl.when(not_busy).then(value),
                          none if busy_only else None)
    return baselines(values, "broker", first_window, windows, cfg).filter(
        pl.col("baseline_windows") >= cfg.baseline_min_windows).select(
        "window_start", "broker", pl.col("baseline_tps").alias("normal_tps"))


def busy_normals(anomalies: pl.DataFrame, broker_history: pl.DataFrame, first_window: dt.datetime | None,
                 windows: WindowsConfig, cfg: DetectionConfig, value: pl.Expr) -> dict[tuple, float]:
    """``gold/anomalies`` rows → ``(window_start, broker)`` → the normal writes (:func:`normal_writes` of ``value``,
    msg/s) of each broker ``BROKER_BUSY`` in a window with a ``RUNAWAY_RETRY`` or a ``TRAFFIC_SURGE`` (their first
    limits' room: :meth:`pipelines.decide.limits.retry_storm.RetryStormLimit.first_bound`,
    :meth:`pipelines.decide.limits.surge.SurgeLimit.first_bound`); empty otherwise."""
    kinds = set(anomalies["anomaly"].unique().to_list()) if anomalies.height else set()
    if first_window is None or Anomaly.BROKER_BUSY.value not in kinds or not (
            {Anomaly.RUNAWAY_RETRY.value, Anomaly.TRAFFIC_SURGE.value} & kinds):
        return {}
    keys = anomalies.filter(pl.col("anomaly") == Anomaly.BROKER_BUSY.value).select(
        "window_start", pl.col("resource").alias("broker"))
    normal = normal_writes(keys, broker_history, first_window, windows, cfg, value, busy_only=True)
    return {(r[0], r[1]): r[2] for r in normal.iter_rows() if r[2] is not None}


def open_topic_brokers(topic_rows: pl.DataFrame, windows: WindowsConfig) -> pl.DataFrame:
    """Open topic rows → ``window_start``, ``topic``, ``broker``, ``tps`` (its puts per broker so far, msg/s over
    ``windows.length_seconds``) for :func:`crowded_demand`, as :func:`pipelines.decide.paths.final.prepare_final` hands
    it the final windows' (:func:`pipelines.decide.rules.windows.per_broker_traffic`). Empty for the gate's light rows
    (no ``broker_amounts``)."""
    out = []
    if "broker_amounts" in topic_rows.columns:
        for r in topic_rows.select("window_start", "resource", "broker_amounts").iter_rows(named=True):
            for b, v in sorted(dict(r["broker_amounts"] or {}).items()):
                if v is not None:
                    out.append((r["window_start"], r["resource"], b, rate(v, windows.length_seconds)))
    return pl.DataFrame(out, schema={"window_start": topic_rows.schema["window_start"], "topic": pl.String,
                                     "broker": pl.String, "tps": pl.Float64}, orient="row")
