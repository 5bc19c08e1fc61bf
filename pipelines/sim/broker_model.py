"""Broker model: what a RocketMQ broker does with the offered send traffic, with and without limits. The rules of one
tick live in :mod:`pipelines.sim.ticks`; this module reads offered traffic from stats rows, sizes the brokers and
runs a whole scenario with limits known in advance (open loop). The closed-loop backtest steps the same rules
minute by minute with the limits the governor publishes and the clients' answers to rejections
(:mod:`pipelines.sim.cluster`).

Good enough to show article 001 (``docs/background.md``) and nothing more:

* **Send queue with fast failure** (``docs/rocketmq-formats.md`` §5): each broker serves ``capacity_tps`` units of
  write work per second from one FIFO send queue. The head of the queue waits ``queue / capacity`` seconds; when that
  exceeds ``waitTimeMillsInSendQueue`` (200 ms default) ``BrokerFastFailure`` drops the expired requests with
  ``[TIMEOUT_CLEAN_QUEUE]broker busy``. Fast failure does not tell topics apart: in a tick where the queue overflows,
  every resource on the broker loses the same share of what it sent in that tick.
* **Per-resource token buckets with article 001's breaker** (:class:`control.applier.TokenBucketRateLimiter`
  semantics) sit in front of the queue, one per (broker, resource) with a limit in force: tokens refill at
  ``limit_qps`` up to ``burst``; when a request finds no token the breaker opens and rejects everything for
  ``breaker_open_ms``, then token-bucket limiting resumes. A ``group`` limit applies to the group's send-back
  (``CONSUMER_SEND_MSG_BACK``) requests, a ``topic`` limit to the topic's puts. Every broker applies the record
  locally (a topic on two brokers gets the limit on each).
* **Fluid, vectorised**: traffic is constant within a minute (stats.log resolution); the simulation steps a fixed
  tick (``tick_seconds``, default 0.1 s) with numpy vectors over brokers and over limited (broker, resource)
  pairs only. Unlimited resources are never expanded to ticks: their busy rejections are their minute's offered
  volume × the broker's mean reject share in that minute. A 10,000-topic, 50-broker hour is seconds of numpy.

Not modelled here: producer retries of rejected sends and the feedback of the limits on the traffic the governor
observes (:mod:`pipelines.sim.cluster` has both), queue capacity overflow (``[OVERLOAD]``).

Inputs and outputs are pandas frames:

* :func:`offered_from_stats` — stats rows (``minute_start`` UTC, ``broker``, ``stat_name``, ``stats_key``,
  ``sum`` msgs per minute; from :func:`pipelines.sim.traffic.build_traffic` or ``silver/broker_stats``) →
  :data:`OFFERED_COLUMNS`: one row per (minute, broker, resource) with ``requests_tps`` (msgs/s the limiter sees)
  and ``work_per_request`` (write units per request; 1 for a put, more for a send-back, whose schedule and retry
  re-puts also load the broker).
* :func:`limit_schedule` — ``gold/limits`` rows → :data:`SCHEDULE_COLUMNS` (when each enforced limit is in force at
  the brokers).
* :func:`simulate` — offered traffic + schedule + :class:`BrokerModelConfig` → :class:`ModelResult` (per resource
  per minute: offered, admitted, limiter-rejected, busy-rejected msgs; per broker per minute: work, capacity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from pipelines import rocketmq as rmq
from pipelines.config import ConfigSection
from pipelines.sim.ticks import SendQueues, TokenBuckets

#: Resource type of load no limiter can touch (``%DLQ%`` puts, unattributed writes without a send-back source).
BACKGROUND = "background"

OFFERED_COLUMNS = ("minute_start", "broker", "resource_type", "resource", "requests_tps", "work_per_request")
SCHEDULE_COLUMNS = ("resource_type", "resource", "start", "end", "limit_qps", "burst", "version", "window_end")


class BrokerModelConfig(ConfigSection):
    """Parameters of the broker model (units in the names), also the ``[broker]`` table of ``conf/backtest.toml``
    (commented defaults there). Unknown keys and out-of-range values are config errors."""

    tick_seconds: float = Field(default=0.1, gt=0)  # simulation step, s (the breaker's open time should be a multiple)
    wait_time_ms_in_send_queue: float = Field(default=200.0, ge=0)  # waitTimeMillsInSendQueue
    #                                                                 (docs/rocketmq-formats.md §5)
    capacity_factor: float = Field(default=3.0, gt=0)  # a broker serves this many times its normal write rate ...
    capacity_min_tps: float = Field(default=200.0, ge=0)  # ... and at least this many units/s
    capacity_baseline_minutes: int = Field(default=10, gt=0)  # normal rate = median over the first N full minutes
    breaker_open_ms: int = Field(default=1000, ge=0)  # circuitBreakerOpenTime (article 001), when a limit row has none
    unattributed_min_share: float = Field(default=0.01, ge=0)  # BROKER_PUT_NUMS − Σ topic puts below this: jitter
    capacity_tps: dict[str, float] = Field(default_factory=dict)  # explicit capacity per broker (overrides)

    @field_validator("tick_seconds")
    @classmethod
    def _divides_a_minute(cls, value: float) -> float:
        if abs(60 / value - round(60 / value)) > 1e-9:
            raise ValueError(f"must divide 60, got {value}")
        return value


@dataclass
class ModelResult:
    """Output of :func:`simulate`.

    ``resources``: one row per (minute_start, broker, resource_type, resource) with ``offered`` (msgs),
    ``limited_rejected`` (msgs rejected by our token bucket / breaker), ``busy_rejected`` (msgs dropped by fast
    failure, ``[TIMEOUT_CLEAN_QUEUE]``), ``admitted`` (msgs written), ``limit_qps`` (in force at the minute's end,
    NaN when none).
    ``brokers``: one row per (minute_start, broker) with ``offered_work``, ``admitted_work``, ``served_work``
    (units/s averaged over the minute), ``capacity_tps``, ``reject_share`` (busy-rejected share of what reached
    the queue), ``max_wait_ms`` (longest head-of-queue wait in the minute).
    """

    resources: pd.DataFrame
    brokers: pd.DataFrame


# ====================================================================================================================
# Offered traffic from stats rows
# ====================================================================================================================
def offered_from_stats(stats: pd.DataFrame, cfg: BrokerModelConfig | None = None) -> pd.DataFrame:
    """Stats rows → offered traffic per (minute, broker, resource), columns :data:`OFFERED_COLUMNS`.

    ``stats``: columns ``minute_start`` (UTC timestamp of the minute the line covers), ``broker``, ``stat_name``,
    ``stats_key``, ``sum`` (msgs in the minute); only ``TOPIC_PUT_NUMS``, ``SNDBCK_PUT_NUMS`` and
    ``BROKER_PUT_NUMS`` minute rows are used (filter ``period == "minute"`` before calling).

    * business topic puts → ``topic`` resources, 1 unit per request;
    * ``SNDBCK_PUT_NUMS [topic@group]`` → the ``group`` resource (its retry traffic), requests = send-backs/s;
      its work per request = (its ``%RETRY%group`` re-puts + its share of the broker's unattributed writes) per
      send-back, at least 1: a send-back costs a schedule write and a re-put (article 001: 8x broker writes);
    * unattributed writes (``BROKER_PUT_NUMS`` − Σ ``TOPIC_PUT_NUMS``, above ``unattributed_min_share``) go to the
      broker's send-back groups in proportion to their send-backs, else to a ``background`` resource, as do
      ``%RETRY%`` re-puts without a send-back in the minute and ``%DLQ%`` puts.
    """
    cfg = cfg or BrokerModelConfig()
    stats = stats[stats["stat_name"].isin([rmq.TOPIC_PUT_NUMS, rmq.SNDBCK_PUT_NUMS, rmq.BROKER_PUT_NUMS])]
    s = pd.DataFrame({
        "minute_start": pd.to_datetime(stats["minute_start"], utc=True),
        "broker": stats["broker"].astype(str).to_numpy(),
        "stat_name": stats["stat_name"].astype(str).to_numpy(),
        "stats_key": stats["stats_key"].astype(str).to_numpy(),
        "sum": pd.to_numeric(stats["sum"], errors="coerce").fillna(0.0).to_numpy(dtype=float),
    })
    keys = ["minute_start", "broker"]
    tp = s[s["stat_name"] == rmq.TOPIC_PUT_NUMS]
    is_retry = tp["stats_key"].str.startswith(rmq.RETRY_TOPIC_PREFIX)
    is_system = tp["stats_key"].str.startswith("%") & ~is_retry
    topics = tp[~tp["stats_key"].str.startswith("%")]
    topic_rows = pd.DataFrame({"minute_start": topics["minute_start"], "broker": topics["broker"],
                               "resource_type": "topic", "resource": topics["stats_key"],
                               "requests": topics["sum"], "work": topics["sum"]})

    sb = s[s["stat_name"] == rmq.SNDBCK_PUT_NUMS]
    sb = sb.assign(resource=sb["stats_key"].str.split("@", n=1).str[-1])
    groups = sb.groupby(keys + ["resource"], as_index=False)["sum"].sum().rename(columns={"sum": "requests"})
    retry = tp[is_retry].assign(resource=lambda d: d["stats_key"].str.slice(len(rmq.RETRY_TOPIC_PREFIX)))
    retry = retry.groupby(keys + ["resource"], as_index=False)["sum"].sum().rename(columns={"sum": "reput"})
    groups = groups.merge(retry, on=keys + ["resource"], how="outer").fillna({"requests": 0.0, "reput": 0.0})

    put_total = tp.groupby(keys, as_index=False)["sum"].sum().rename(columns={"sum": "topic_puts"})
    broker_put = s[s["stat_name"] == rmq.BROKER_PUT_NUMS].groupby(keys, as_index=False)["sum"].sum()
    un = broker_put.merge(put_total, on=keys, how="left").fillna({"topic_puts": 0.0})
    un["unattributed"] = (un["sum"] - un["topic_puts"]).clip(lower=0.0)
    un.loc[un["unattributed"] < cfg.unattributed_min_share * un["sum"], "unattributed"] = 0.0
    sb_total = groups.groupby(keys, as_index=False)["requests"].sum().rename(columns={"requests": "sb_total"})
    groups = groups.merge(sb_total, on=keys, how="left").merge(un[keys + ["unattributed"]], on=keys, how="left")
    groups = groups.fillna({"unattributed": 0.0, "sb_total": 0.0})
    share = np.where(groups["sb_total"] > 0, groups["requests"] / groups["sb_total"].where(groups["sb_total"] > 0, 1),
                     0)
    groups["work"] = groups["reput"] + share * groups["unattributed"]
    has_sb = groups["requests"] > 0
    group_rows = pd.DataFrame({"minute_start": groups["minute_start"][has_sb], "broker": groups["broker"][has_sb],
                               "resource_type": "group", "resource": groups["resource"][has_sb],
                               "requests": groups["requests"][has_sb],
                               "work": np.maximum(groups["work"][has_sb], groups["requests"][has_sb])})
    # background: re-puts without send-backs, system topics, unattributed writes of brokers without send-backs
    bg = pd.concat([
        groups.loc[~has_sb, keys + ["reput"]].rename(columns={"reput": "work"}),
        tp[is_system].rename(columns={"sum": "work"})[keys + ["work"]],
        un.merge(sb_total, on=keys, how="left").fillna({"sb_total": 0.0})
          .query("sb_total <= 0")[keys + ["unattributed"]].rename(columns={"unattributed": "work"}),
    ], ignore_index=True)
    bg = bg.groupby(keys, as_index=False)["work"].sum()
    bg = bg[bg["work"] > 0]
    bg_rows = pd.DataFrame({"minute_start": bg["minute_start"], "broker": bg["broker"], "resource_type": BACKGROUND,
                            "resource": "(background)", "requests": bg["work"], "work": bg["work"]})
    out = pd.concat([topic_rows, group_rows, bg_rows], ignore_index=True)
    out = out.groupby(["minute_start", "broker", "resource_type", "resource"],
                      as_index=False)[["requests", "work"]].sum()
    out["requests_tps"] = out["requests"] / 60.0
    out["work_per_request"] = np.where(out["requests"] > 0, out["work"] / out["requests"].where(out["requests"] > 0, 1),
                                       1.0)
    return out[list(OFFERED_COLUMNS)].sort_values(["minute_start", "broker", "resource_type", "resource"],
                                                  kind="mergesort").reset_index(drop=True)


# ====================================================================================================================
# Limit schedule from gold/limits
# ====================================================================================================================
def limit_schedule(limits: pd.DataFrame, *, delay_seconds: float | pd.Series,
                   ttl_seconds: float | None = None) -> pd.DataFrame:
    """``gold/limits`` rows → when each enforced limit is in force at the brokers, columns :data:`SCHEDULE_COLUMNS`.

    A decision reaches the brokers at ``window_end + delay_seconds`` (one number, or one per row of ``limits``;
    the caller sums: the minute line's print lag,
    the watermark, the trigger and the propagation delay; ``decided_at`` is a wall-clock time of the replay and is
    not used). A ``set`` is in force from then until the next decision of the same resource reaches the brokers or
    until it expires ``ttl`` after it arrived (``expires_at − decided_at`` of the row, else ``ttl_seconds``),
    whichever is first; a ``lift`` ends it. ``advisory`` rows are never enforced.
    """
    cols = list(SCHEDULE_COLUMNS)
    if limits is None or len(limits) == 0:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    d = limits.copy()
    d["window_end"] = pd.to_datetime(d["window_end"], utc=True)
    d["arrive"] = d["window_end"] + pd.to_timedelta(delay_seconds, unit="s")
    ttl = None
    if "expires_at" in d and "decided_at" in d:
        ttl = (pd.to_datetime(d["expires_at"], utc=True) - pd.to_datetime(d["decided_at"], utc=True))
    if ttl is None or ttl.isna().all():
        ttl = pd.Series(pd.to_timedelta(ttl_seconds or 600, unit="s"), index=d.index)
    d["expire"] = d["arrive"] + ttl.fillna(pd.to_timedelta(ttl_seconds or 600, unit="s"))
    d = d.sort_values(["resource_type", "resource", "version"], kind="mergesort")
    d["next_arrive"] = d.groupby(["resource_type", "resource"])["arrive"].shift(-1)
    d["end"] = d[["expire", "next_arrive"]].min(axis=1)
    mode = d["mode"] if "mode" in d else pd.Series("enforce", index=d.index)
    keep = (d["action"] != "lift") & (mode == "enforce") & (d["end"] > d["arrive"])
    d = d[keep]
    burst = d["burst"] if "burst" in d else np.ceil(d["limit_qps"])
    return pd.DataFrame({"resource_type": d["resource_type"].astype(str), "resource": d["resource"].astype(str),
                         "start": d["arrive"], "end": d["end"], "limit_qps": d["limit_qps"].astype(float),
                         "burst": np.maximum(pd.to_numeric(burst).astype(float), 1.0), "version": d["version"],
                         "window_end": d["window_end"]}).reset_index(drop=True)


# ====================================================================================================================
# Simulation
# ====================================================================================================================
def broker_capacity(offered: pd.DataFrame, cfg: BrokerModelConfig) -> pd.Series:
    """Capacity per broker, units/s: ``capacity_factor`` × median work/s over its first ``capacity_baseline_minutes``
    minutes with traffic (at least ``capacity_min_tps``), unless ``cfg.capacity_tps`` names it."""
    work = (offered["requests_tps"] * offered["work_per_request"]).groupby(
        [offered["broker"], offered["minute_start"]]).sum()
    work = work[work > 0].sort_index()
    normal = work.groupby(level=0).apply(lambda x: x.iloc[:cfg.capacity_baseline_minutes].median())
    cap = np.maximum(normal * cfg.capacity_factor, cfg.capacity_min_tps)
    for b, c in cfg.capacity_tps.items():
        cap.loc[b] = float(c)
    return cap.rename("capacity_tps")


@dataclass
class _Axis:
    """The time axis and the rows of one run of :func:`simulate`: the tick (``dt_s`` seconds, ``ticks_per_min`` a
    minute), the ``minutes`` (UTC minute starts, ``T`` of them, the first ``t0``), the ``brokers`` (``B``, sorted) with
    their capacity ``cap`` (units/s), and per row of ``off`` (the offered frame): its minute ``m_of``, its broker
    ``b_of``, its requests/s ``req`` and work per request ``wpr``."""

    off: pd.DataFrame
    dt_s: float
    ticks_per_min: int
    minutes: pd.DatetimeIndex
    t0: pd.Timestamp
    T: int
    brokers: list
    B: int
    bidx: dict
    m_of: np.ndarray
    b_of: np.ndarray
    req: np.ndarray
    wpr: np.ndarray
    cap: np.ndarray

    @property
    def n_ticks(self) -> int:
        return self.T * self.ticks_per_min


@dataclass
class _Pairs:
    """The limited (broker, resource) pairs of a run (those with a schedule entry, ``L`` of them, ``pairs``), and per
    row of the offered frame whether it is limited (``limited_row``) and its pair (``pair_id``, -1: none); per pair
    and minute its requests/s ``pr`` and work per request ``pw``; per pair and tick the limit in force (``limit``,
    NaN: none) and its ``burst``; ``base_work``: the unlimited work per broker and minute (units/s)."""

    limited_row: np.ndarray
    pair_id: np.ndarray
    pairs: pd.DataFrame
    L: int
    pr: np.ndarray
    pw: np.ndarray
    pair_broker: np.ndarray
    limit: np.ndarray
    burst: np.ndarray
    base_work: np.ndarray


@dataclass
class _Ticks:
    """What the tick loop measured: per broker and tick the queue's reject share, the work that arrived and was
    served; per broker and minute the longest wait (s); per limited pair and minute the requests admitted, rejected
    by the limiter and rejected busy."""

    reject_share: np.ndarray
    arrived: np.ndarray
    served: np.ndarray
    max_wait: np.ndarray
    p_adm: np.ndarray
    p_lim: np.ndarray
    p_busy: np.ndarray


def simulate(offered: pd.DataFrame, schedule: pd.DataFrame | None, cfg: BrokerModelConfig | None = None,
             capacity: pd.Series | None = None, minutes: pd.DatetimeIndex | None = None) -> ModelResult:
    """Run the broker model over ``offered`` (:func:`offered_from_stats`) with the limits of ``schedule``
    (:func:`limit_schedule`; None or empty = no governor). ``capacity`` (units/s per broker) defaults to
    :func:`broker_capacity` of ``offered`` — pass the same one to the runs you compare. ``minutes`` (UTC minute
    starts) is the time axis, by default the first to the last minute of ``offered``; pass the whole run's axis
    when ``offered`` holds only some brokers (:mod:`udfs.broker_model`), so that every broker's ticks line up.

    Brokers are independent: a broker's queue sees only its own resources, a limited (broker, resource) pair
    keeps its own token bucket and breaker, and a pair's state depends only on its own limit. Shared by all
    brokers are only the inputs ``schedule`` (a limit applies on every broker hosting the resource), ``cfg`` and
    the time axis. So running each broker alone (same ``capacity``, same ``minutes``) gives the same result.
    """
    cfg = cfg or BrokerModelConfig()
    axis = _axis(offered, cfg, capacity, minutes)
    sched = schedule if schedule is not None and len(schedule) else None
    pairs = _limited_pairs(axis, sched)
    ticks = _run_ticks(axis, pairs, cfg)
    return ModelResult(resources=_resource_minutes(axis, pairs, ticks), brokers=_broker_minutes(axis, pairs, ticks))


def _axis(offered: pd.DataFrame, cfg: BrokerModelConfig, capacity: pd.Series | None,
          minutes: pd.DatetimeIndex | None) -> _Axis:
    """The time axis and rows of a run (:class:`_Axis`). Raises ``ValueError`` for a tick that does not divide 60 s."""
    dt_s = float(cfg.tick_seconds)
    ticks_per_min = int(round(60.0 / dt_s))
    if abs(ticks_per_min * dt_s - 60.0) > 1e-9:
        raise ValueError(f"tick_seconds must divide 60, got {dt_s}")
    off = offered.reset_index(drop=True)
    axis = pd.DatetimeIndex(sorted(off["minute_start"].unique()) if minutes is None else minutes)
    t0 = axis[0]
    minutes = pd.date_range(t0, axis[-1], freq="min")
    brokers = sorted(off["broker"].unique())
    bidx = {b: i for i, b in enumerate(brokers)}
    capacity = broker_capacity(off, cfg) if capacity is None else capacity
    return _Axis(off=off, dt_s=dt_s, ticks_per_min=ticks_per_min, minutes=minutes, t0=t0, T=len(minutes),
                 brokers=brokers, B=len(brokers), bidx=bidx,
                 m_of=((off["minute_start"] - t0) // pd.Timedelta(minutes=1)).to_numpy(dtype=np.int64),
                 b_of=off["broker"].map(bidx).to_numpy(dtype=np.int64),
                 req=off["requests_tps"].to_numpy(dtype=float), wpr=off["work_per_request"].to_numpy(dtype=float),
                 cap=capacity.reindex(brokers).fillna(cfg.capacity_min_tps).to_numpy(dtype=float))


def _limited_pairs(ax: _Axis, sched: pd.DataFrame | None) -> _Pairs:
    """Which rows are limited: the (broker, resource) pairs with a schedule entry, their traffic per minute and their
    limits per tick (:class:`_Pairs`)."""
    off, T = ax.off, ax.T
    limited_row = np.zeros(len(off), dtype=bool)
    pair_id = np.full(len(off), -1, dtype=np.int64)
    pairs = pd.DataFrame(columns=["broker", "resource_type", "resource"])
    if sched is not None:
        keyset = set(zip(sched["resource_type"], sched["resource"]))
        rk = list(zip(off["resource_type"], off["resource"]))
        limited_row = np.fromiter((k in keyset for k in rk), dtype=bool, count=len(rk))
        pairs = off.loc[limited_row, ["broker", "resource_type", "resource"]].drop_duplicates().reset_index(drop=True)
        pid = {tuple(r): i for i, r in enumerate(pairs.itertuples(index=False))}
        pair_id[limited_row] = [pid[(b, t, r)] for b, t, r in zip(off["broker"][limited_row],
                                                                   off["resource_type"][limited_row],
                                                                   off["resource"][limited_row])]
    L = len(pairs)
    # unlimited work per broker per minute (units/s)
    base_work = np.zeros((ax.B, T))
    np.add.at(base_work, (ax.b_of[~limited_row], ax.m_of[~limited_row]), (ax.req * ax.wpr)[~limited_row])
    # limited pairs: requests/s and work per request per minute
    pr = np.zeros((L, T))
    pw = np.ones((L, T))
    if L:
        lr = limited_row
        pr[pair_id[lr], ax.m_of[lr]] = ax.req[lr]
        pw[pair_id[lr], ax.m_of[lr]] = ax.wpr[lr]
    pair_broker = pairs["broker"].map(ax.bidx).to_numpy(dtype=np.int64) if L else np.zeros(0, dtype=np.int64)
    limit, burst = _limits_per_tick(ax, pairs, sched)
    return _Pairs(limited_row=limited_row, pair_id=pair_id, pairs=pairs, L=L, pr=pr, pw=pw, pair_broker=pair_broker,
                  limit=limit, burst=burst, base_work=base_work)


def _limits_per_tick(ax: _Axis, pairs: pd.DataFrame, sched: pd.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """The limit in force per pair per tick (NaN = none) and its burst (1 where none), from the schedule's
    ``[start, end)`` spans (a tick is in a span from the first tick starting at or after its start)."""
    L, n_ticks = len(pairs), ax.n_ticks
    limit = np.full((L, n_ticks), np.nan)
    burst = np.ones((L, n_ticks))
    if L:
        tick_ns = int(round(ax.dt_s * 1e9))
        for i, (b, rt, r) in enumerate(pairs.itertuples(index=False)):
            rows = sched[(sched["resource_type"] == rt) & (sched["resource"] == r)].sort_values("start")
            for s_, e_, q, bu in zip(rows["start"], rows["end"], rows["limit_qps"], rows["burst"]):
                lo = max(0, int(math.ceil((pd.Timestamp(s_) - ax.t0).value / tick_ns)))
                hi = min(n_ticks, int(math.ceil((pd.Timestamp(e_) - ax.t0).value / tick_ns)))
                if hi > lo:
                    limit[i, lo:hi] = q
                    burst[i, lo:hi] = bu
    return limit, burst


def _run_ticks(ax: _Axis, p: _Pairs, cfg: BrokerModelConfig) -> _Ticks:
    """The tick loop: vectors over brokers (B) and limited pairs (L), the rules of :mod:`pipelines.sim.ticks` (the
    limiter in front of the send queue)."""
    B, T, L, dt_s, n_ticks = ax.B, ax.T, p.L, ax.dt_s, ax.n_ticks
    open_ticks = max(1, int(round(cfg.breaker_open_ms / 1000.0 / dt_s))) if cfg.breaker_open_ms > 0 else 0
    tick_minute = np.arange(n_ticks) // ax.ticks_per_min
    buckets = TokenBuckets.empty(L)
    queues = SendQueues.empty(ax.cap, cfg.wait_time_ms_in_send_queue)
    out = _Ticks(reject_share=np.zeros((B, n_ticks)), arrived=np.zeros((B, n_ticks)), served=np.zeros((B, n_ticks)),
                 max_wait=np.zeros((B, T)), p_adm=np.zeros((L, T)), p_lim=np.zeros((L, T)), p_busy=np.zeros((L, T)))
    for k in range(n_ticks):
        m = tick_minute[k]
        arrivals = p.base_work[:, m] * dt_s
        if L:
            a = p.pr[:, m] * dt_s
            adm = buckets.admit(a, p.limit[:, k], p.burst[:, k], open_ticks, dt_s)
            out.p_adm[:, m] += adm
            out.p_lim[:, m] += a - adm
            np.add.at(arrivals, p.pair_broker, adm * p.pw[:, m])
        share, served, wait = queues.serve(arrivals, dt_s)
        out.reject_share[:, k] = share
        out.arrived[:, k] = arrivals
        out.served[:, k] = served
        out.max_wait[:, m] = np.maximum(out.max_wait[:, m], wait)
        if L:
            out.p_busy[:, m] += adm * share[p.pair_broker]  # this tick's admitted × the broker's reject share
    return out


def _resource_minutes(ax: _Axis, p: _Pairs, ticks: _Ticks) -> pd.DataFrame:
    """Per row of the offered frame (resource, broker, minute): offered, limiter-rejected, busy-rejected and admitted
    msgs, and the limit in force at the minute's last tick. An unlimited row's busy rejections are its minute's
    offered volume × its broker's mean reject share in that minute (constant-rate traffic within the minute)."""
    off, B, T, tpm = ax.off, ax.B, ax.T, ax.ticks_per_min
    mean_share = ticks.reject_share.reshape(B, T, tpm).mean(axis=2)
    offered_msgs = ax.req * 60.0
    busy = np.where(p.limited_row, 0.0, offered_msgs * mean_share[ax.b_of, ax.m_of])
    lim_rej = np.zeros(len(off))
    admitted_pre = offered_msgs.copy()
    limit_end = np.full(len(off), np.nan)
    if p.L:
        lr = np.flatnonzero(p.limited_row)
        lim_rej[lr] = ticks.p_lim[p.pair_id[lr], ax.m_of[lr]]
        busy[lr] = ticks.p_busy[p.pair_id[lr], ax.m_of[lr]]
        admitted_pre[lr] = ticks.p_adm[p.pair_id[lr], ax.m_of[lr]]
        last_tick = (ax.m_of[lr] + 1) * tpm - 1
        limit_end[lr] = p.limit[p.pair_id[lr], last_tick]
    return pd.DataFrame({
        "minute_start": off["minute_start"], "broker": off["broker"], "resource_type": off["resource_type"],
        "resource": off["resource"], "offered": offered_msgs, "limited_rejected": lim_rej,
        "busy_rejected": busy, "admitted": admitted_pre - busy, "limit_qps": limit_end,
    })


def _broker_minutes(ax: _Axis, p: _Pairs, ticks: _Ticks) -> pd.DataFrame:
    """Per broker and minute: offered, admitted and served work (units/s), capacity, reject share of the work that
    arrived, longest wait (ms)."""
    B, T, tpm = ax.B, ax.T, ax.ticks_per_min
    arr_m = ticks.arrived.reshape(B, T, tpm)
    rej_work_m = (arr_m * ticks.reject_share.reshape(B, T, tpm)).sum(axis=2)
    arrived_work_m = arr_m.sum(axis=2)
    bm = pd.DataFrame({
        "minute_start": np.tile(ax.minutes, B) if B else [],
        "broker": np.repeat(ax.brokers, T),
        "offered_work": (p.base_work + _pair_work(p.pr * p.pw, p.pair_broker, B, T)).ravel(),
        "admitted_work": (arrived_work_m / 60.0).ravel(),
        "served_work": (ticks.served.reshape(B, T, tpm).sum(axis=2) / 60.0).ravel(),
        "capacity_tps": np.repeat(ax.cap, T),
        "reject_share": np.where(arrived_work_m > 0, rej_work_m / np.where(arrived_work_m > 0, arrived_work_m, 1), 0.0)
        .ravel(),
        "max_wait_ms": (ticks.max_wait * 1000.0).ravel(),
    })
    bm["minute_start"] = pd.to_datetime(bm["minute_start"], utc=True)
    return bm


def _pair_work(work: np.ndarray, pair_broker: np.ndarray, B: int, T: int) -> np.ndarray:
    out = np.zeros((B, T))
    if work.size:
        np.add.at(out, pair_broker, work)
    return out
