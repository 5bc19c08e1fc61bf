"""A recording's demand as stats rows: what each broker would have printed had it admitted every send (the
``traffic`` of :class:`pipelines.sim.cluster.ClosedLoopCluster`, which the replay's cluster offers tick by tick and
prints scaled by what it admitted).

The recorded minute stats (:mod:`pipelines.sim.replay_input`) are what the brokers admitted. Demand adds to them,
per minute, broker and resource (a topic's puts, a consumer group's send-backs):

* **refused messages** (:mod:`pipelines.sim.replay_refused`): each at the broker of its first attempt; a message
  expected to have been admitted on another broker after a refusal is taken off that topic's other brokers in
  proportion to their recorded puts in that minute (their stats count it already). A refused send to a retry topic
  ``%RETRY%<group>`` adds to the group's send-backs on that broker; where the group printed none there it is left
  out (counted);
* **hidden demand under an enforced limit** (:mod:`pipelines.sim.replay_enforced`): the resource's demand as
  estimated there.

A resource's added demand scales its rows on that broker and minute by one factor (new ÷ recorded requests): a
topic's ``TOPIC_PUT_NUMS`` and the ``GROUP_GET_NUMS`` of its subscriptions (consumers take what is put); a group's
``SNDBCK_PUT_NUMS`` rows, its retry topic's puts and their consumption. The broker's ``BROKER_PUT_NUMS`` grows by the
added requests × the resource's write units per request in that minute
(:func:`pipelines.sim.broker_model.offered_from_stats`), so a send-back keeps its recorded write amplification. A
topic refused everything on a broker in a minute (no row) gets a ``TOPIC_PUT_NUMS`` row of its refused messages.
Where both apply, the larger estimate of a resource's demand in that minute wins. Rows are minute rows, ``style``
``SUM``; ``sum`` messages per minute as floats (added demand need not be whole).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pandas as pd
import polars as pl

from pipelines import rocketmq as rmq
from pipelines.sim import broker_model as bm
from pipelines.sim.replay_refused import Refused
from pipelines.sim.traffic import TRAFFIC_COLUMNS

KEYS = ["m", "broker", "resource_type", "resource"]
RETRY = rmq.RETRY_TOPIC_PREFIX


@dataclass
class Demand:
    """The replay's demand: ``traffic`` (pandas, :data:`~pipelines.sim.traffic.TRAFFIC_COLUMNS`) and what was added
    to the recorded rows: ``added`` (refused messages), ``taken_off`` (expected deliveries taken off other brokers),
    ``left_out`` (refused sends of a retry topic without send-backs to attach to)."""

    traffic: pd.DataFrame
    added: float = 0.0
    taken_off: float = 0.0
    left_out: float = 0.0


def pair_rows(stats: pl.DataFrame, start: dt.datetime) -> pl.DataFrame:
    """``stats`` (minute stats) with ``m`` (minute index from ``start``) and the resource each row follows
    (``resource_type`` ``topic`` or ``group``, ``resource``; null for broker rows and system topics)."""
    key, stat = pl.col("stats_key"), pl.col("stat_name")
    topic_of = key.str.split("@").list.first()
    group_of = key.str.split("@").list.last()
    retry = topic_of.str.starts_with(RETRY)
    rtype = (pl.when((stat == rmq.TOPIC_PUT_NUMS) & key.str.starts_with(RETRY)).then(pl.lit("group"))
             .when((stat == rmq.TOPIC_PUT_NUMS) & ~key.str.starts_with("%")).then(pl.lit("topic"))
             .when(stat == rmq.SNDBCK_PUT_NUMS).then(pl.lit("group"))
             .when((stat == rmq.GROUP_GET_NUMS) & retry).then(pl.lit("group"))
             .when(stat == rmq.GROUP_GET_NUMS).then(pl.lit("topic")).otherwise(None))
    name = (pl.when((stat == rmq.TOPIC_PUT_NUMS) & key.str.starts_with(RETRY)).then(key.str.slice(len(RETRY)))
            .when(stat == rmq.TOPIC_PUT_NUMS).then(key)
            .when(stat == rmq.SNDBCK_PUT_NUMS).then(group_of)
            .when(retry).then(topic_of.str.slice(len(RETRY))).otherwise(topic_of))
    minute = ((pl.col("minute_start") - pl.lit(start).cast(pl.Datetime("us", "UTC"))).dt.total_seconds() // 60)
    return stats.with_columns(m=minute.cast(pl.Int64), resource_type=rtype,
                              resource=pl.when(rtype.is_null()).then(None).otherwise(name),
                              sum=pl.col("sum").cast(pl.Float64))


def recorded_offered(stats: pl.DataFrame, start: dt.datetime, cfg: bm.BrokerModelConfig) -> pl.DataFrame:
    """What the recorded rows offer (:func:`~pipelines.sim.broker_model.offered_from_stats`) per (``m``, broker,
    resource): ``requests`` (per minute) and ``work_per_request`` (write units)."""
    frame = stats.select("minute_start", "broker", "stat_name", "stats_key", "sum").to_pandas()
    offered = bm.offered_from_stats(frame, cfg)
    out = pl.from_pandas(offered[["minute_start", "broker", "resource_type", "resource", "requests_tps",
                                  "work_per_request"]])
    minute = (pl.col("minute_start") - pl.lit(start).cast(pl.Datetime("us", "UTC"))).dt.total_seconds() // 60
    return out.with_columns(m=minute.cast(pl.Int64), requests=pl.col("requests_tps") * 60.0).select(
        KEYS + ["requests", "work_per_request"])


def refused_demand(offered: pl.DataFrame, refused: Refused, topic_brokers: dict) -> tuple[pl.DataFrame, float]:
    """Demand per (``m``, broker, resource) with the refused messages added and the expected deliveries taken off
    (``demand`` column, requests per minute; only pairs it changes), and the messages left out (retry topics without
    send-backs). Pairs without recorded requests appear with ``requests`` 0."""
    add = refused.added.rename({"topic": "resource", "minute": "m"}).with_columns(
        resource_type=pl.when(pl.col("resource").str.starts_with(RETRY)).then(pl.lit("group")).otherwise(
            pl.lit("topic")),
        resource=pl.when(pl.col("resource").str.starts_with(RETRY)).then(pl.col("resource").str.slice(len(RETRY)))
        .otherwise(pl.col("resource"))).select(KEYS + ["messages"])
    taken = _taken_off(offered, refused.delivered, topic_brokers)
    delta = pl.concat([add, taken], how="vertical").group_by(KEYS).agg(pl.col("messages").sum())
    joined = delta.join(offered.select(KEYS + ["requests"]), on=KEYS, how="left").with_columns(
        pl.col("requests").fill_null(0.0))
    unplaced = joined.filter((pl.col("resource_type") == "group") & (pl.col("requests") <= 0))
    kept = joined.filter(~((pl.col("resource_type") == "group") & (pl.col("requests") <= 0)))
    return (kept.with_columns(demand=(pl.col("requests") + pl.col("messages")).clip(lower_bound=0.0))
            .select(KEYS + ["requests", "demand"]), float(unplaced["messages"].sum()))


def _taken_off(offered: pl.DataFrame, delivered: pl.DataFrame, topic_brokers: dict) -> pl.DataFrame:
    """Expected deliveries (per minute, topic and the broker that refused last) as negative messages on the topic's
    other brokers (its one broker when alone), in proportion to their recorded requests in that minute."""
    rows = []
    puts = offered.filter(pl.col("resource_type") == "topic")
    index = {(m, b, r): q for m, b, r, q in zip(puts["m"], puts["broker"], puts["resource"], puts["requests"])}
    for m, last, topic, expected in zip(delivered["minute"], delivered["last_broker"], delivered["topic"],
                                        delivered["messages"]):
        hosts = topic_brokers.get(topic, (last,))
        others = [b for b in hosts if b != last] or [last]
        weight = np.array([index.get((m, b, topic), 0.0) for b in others])
        if weight.sum() <= 0:
            continue
        rows += [(m, b, "topic", topic, -expected * w / weight.sum()) for b, w in zip(others, weight)]
    return pl.DataFrame(rows, schema={"m": pl.Int64, "broker": pl.Utf8, "resource_type": pl.Utf8,
                                      "resource": pl.Utf8, "messages": pl.Float64}, orient="row")


def apply_demand(rows: pl.DataFrame, offered: pl.DataFrame, demand: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (:func:`pair_rows`) with each changed pair's rows scaled to its ``demand`` (module docstring), the
    brokers' ``BROKER_PUT_NUMS`` grown by the added write units, and a ``TOPIC_PUT_NUMS`` row for a topic demanded on
    a broker where it printed none that minute."""
    changed = demand.join(offered.select(KEYS + ["work_per_request"]), on=KEYS, how="left").with_columns(
        factor=pl.when(pl.col("requests") > 0).then(pl.col("demand") / pl.col("requests")).otherwise(None),
        extra_work=(pl.col("demand") - pl.col("requests")) * pl.col("work_per_request").fill_null(1.0))
    scaled = rows.join(changed.select(KEYS + ["factor"]), on=KEYS, how="left").with_columns(
        sum=pl.col("sum") * pl.col("factor").fill_null(1.0)).drop("factor")
    work = changed.group_by(["m", "broker"]).agg(pl.col("extra_work").sum())
    broker = pl.col("stat_name") == rmq.BROKER_PUT_NUMS
    scaled = scaled.join(work, on=["m", "broker"], how="left").with_columns(
        sum=pl.when(broker).then(pl.col("sum") + pl.col("extra_work").fill_null(0.0)).otherwise(pl.col("sum"))
    ).drop("extra_work")
    new = changed.filter((pl.col("requests") <= 0) & (pl.col("resource_type") == "topic") & (pl.col("demand") > 0))
    created = new.select(
        pl.col("m"), pl.col("broker"), pl.lit(rmq.TOPIC_PUT_NUMS).alias("stat_name"),
        pl.col("resource").alias("stats_key"), pl.col("resource_type"), pl.col("resource"),
        pl.col("demand").alias("sum"))
    return pl.concat([scaled.select(created.columns), created], how="vertical")


def traffic_frame(rows: pl.DataFrame, start: dt.datetime) -> pd.DataFrame:
    """Demand rows → the cluster's ``traffic`` (pandas, :data:`~pipelines.sim.traffic.TRAFFIC_COLUMNS`; minute rows,
    style ``SUM``, TPS = SUM ÷ 60 s, AVGPT 1)."""
    out = rows.sort(["m", "broker", "stat_name", "stats_key"]).select(
        (pl.lit(start).cast(pl.Datetime("us", "UTC")) + pl.duration(minutes=pl.col("m"))).alias("minute_start"),
        "broker", "stat_name", "stats_key", pl.lit("minute").alias("period"), pl.lit("SUM").alias("style"),
        pl.col("sum"), (pl.col("sum") / 60.0).alias("tps"), pl.lit(1.0).alias("avgpt"), pl.lit(0).alias("times"))
    frame = out.to_pandas()
    frame["minute_start"] = pd.to_datetime(frame["minute_start"], utc=True)
    return frame[list(TRAFFIC_COLUMNS)]


def merge_estimates(*estimates: pl.DataFrame) -> pl.DataFrame:
    """Per (``m``, broker, resource) the largest ``demand`` of several estimates (each ``requests``, ``demand``)."""
    frames = [e.select(KEYS + ["requests", "demand"]) for e in estimates if e.height]
    if not frames:
        return pl.DataFrame(schema={**{k: pl.Int64 if k == "m" else pl.Utf8 for k in KEYS}, "requests": pl.Float64,
                                    "demand": pl.Float64})
    return pl.concat(frames, how="vertical").group_by(KEYS).agg(pl.col("requests").max(), pl.col("demand").max())
