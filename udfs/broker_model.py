"""Grouped pandas UDF: the backtest's broker model (:func:`pipelines.sim.broker_model.simulate`) per group of
brokers, so that a 50-broker backtest runs on the executors instead of the driver.

Why grouping by broker is exact: each broker has its own send queue and capacity, and each limited
(broker, resource) pair its own token bucket and breaker whose state depends only on its own limit; nothing in the
tick loop adds one broker's traffic or state to another's. What the brokers share are inputs, and the UDF closes
over them: the limit schedule (a limit applies on every broker hosting the resource), the model config, the
capacities (computed once over the whole run by :func:`~pipelines.sim.broker_model.broker_capacity`) and the run's
time axis (so that every broker's ticks line up with the driver's run).

A group may hold several whole brokers: the model vectorises over the brokers of a group, and its tick loop costs
about the same for one broker as for fifty, so the backtest groups brokers into as many buckets as the cluster
has cores (:func:`model_on_executors`) rather than one group per broker.

The closed-loop backtest (:mod:`pipelines.backtest`) steps the model minute by minute on the driver
(:mod:`pipelines.sim.cluster`); this whole-run, open-loop form is measured by ``bench/broker_model_udf.py``.

Cost: the driver's vectorised run is many times faster than the UDF at the sizes measured (one bucket per core
beats one group per broker; all three give the same rejected sends; the figures are in docs/performance.md). The
UDF pays for itself only where the driver cannot hold or loop over the cluster.

Usage::

    fn = simulate_per_broker(schedule, cfg, capacity, minutes)
    rows = offered_df.groupBy("broker").applyInPandas(fn, schema=schemas.BROKER_MODEL_RESULT)  # or a broker bucket

``offered_df``: :data:`pipelines.schemas.BROKER_MODEL_OFFERED`; ``rows``: :data:`pipelines.schemas.BROKER_MODEL_RESULT`
(``row_kind`` ``resource`` | ``broker``). Timestamps are UTC (the session time zone is UTC,
:func:`pipelines.dataplane.session.build_session`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines.sim import broker_model as bm

RESULT_COLUMNS: list[str] = [f.name for f in schemas.BROKER_MODEL_RESULT.fields]
_ORDER = ["minute_start", "broker", "resource_type", "resource"]  # the row order of offered_from_stats


def simulate_per_broker(schedule: pd.DataFrame | None, cfg: bm.BrokerModelConfig, capacity: pd.Series,
                        minutes: pd.DatetimeIndex) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """The ``applyInPandas`` function for ``groupBy("broker")`` (or any grouping that keeps each broker's rows in one
    group): runs :func:`~pipelines.sim.broker_model.simulate` on the group's offered rows with ``schedule`` (None or
    empty: no governor), ``capacity`` (units/s per broker) and ``minutes`` (the run's UTC minute starts, tz-aware), and
    returns its :class:`ModelResult` as rows of :data:`pipelines.schemas.BROKER_MODEL_RESULT`."""
    sched = schedule if schedule is not None and len(schedule) else None
    axis = pd.DatetimeIndex(minutes)

    def one_group(offered: pd.DataFrame) -> pd.DataFrame:
        off = offered.assign(minute_start=pd.to_datetime(offered["minute_start"], utc=True))
        off = off.sort_values(_ORDER, kind="mergesort").reset_index(drop=True)
        result = bm.simulate(off, sched, cfg, capacity, minutes=axis)
        res = result.resources.assign(row_kind="resource")
        brk = result.brokers.assign(row_kind="broker")
        out = pd.concat([res, brk], ignore_index=True)
        for c in RESULT_COLUMNS:
            if c not in out:
                out[c] = np.nan
        return out[RESULT_COLUMNS]

    return one_group


def model_on_executors(spark: SparkSession, offered: pd.DataFrame, schedule: pd.DataFrame | None,
                       cfg: bm.BrokerModelConfig, capacity: pd.Series) -> bm.ModelResult:
    """:func:`pipelines.sim.broker_model.simulate` of ``offered`` (:data:`~pipelines.sim.broker_model.OFFERED_COLUMNS`)
    with ``schedule`` on the executors: the brokers hashed into one bucket per core (``defaultParallelism``, at most
    one broker per bucket), each bucket one group of ``applyInPandas`` with the UDF of :mod:`udfs.broker_model`
    (whole brokers per group, so the result is the driver's), collected into a
    :class:`~pipelines.sim.broker_model.ModelResult` in the driver run's row order. ``capacity``: units/s per
    broker, computed once for both runs."""
    minutes = pd.date_range(offered["minute_start"].min(), offered["minute_start"].max(), freq="min")
    buckets = max(1, min(offered["broker"].nunique(), spark.sparkContext.defaultParallelism))
    df = spark.createDataFrame(offered[list(bm.OFFERED_COLUMNS)], schema=schemas.BROKER_MODEL_OFFERED)
    rows = (df.withColumn("broker_bucket", F.pmod(F.hash("broker"), F.lit(buckets)))
            .groupBy("broker_bucket")
            .applyInPandas(simulate_per_broker(schedule, cfg, capacity, minutes), schema=schemas.BROKER_MODEL_RESULT)
            .toPandas())
    stamps = pd.to_datetime(rows["minute_start"])
    rows["minute_start"] = stamps.dt.tz_localize("UTC") if stamps.dt.tz is None else stamps.dt.tz_convert("UTC")
    res = rows[rows["row_kind"] == "resource"].sort_values(["minute_start", "broker", "resource_type", "resource"],
                                                          kind="mergesort")
    brk = rows[rows["row_kind"] == "broker"].sort_values(["broker", "minute_start"], kind="mergesort")
    resource_cols = ["minute_start", "broker", "resource_type", "resource", "offered", "limited_rejected",
                     "busy_rejected", "admitted", "limit_qps"]
    broker_cols = ["minute_start", "broker", "offered_work", "admitted_work", "served_work", "capacity_tps",
                   "reject_share", "max_wait_ms"]
    return bm.ModelResult(resources=res[resource_cols].reset_index(drop=True),
                          brokers=brk[broker_cols].reset_index(drop=True))
