"""What the closed-loop cluster prints and what its clients log: the stats rows of a minute as the brokers admitted
it (rendered by :mod:`pipelines.sim.render`, so the governor parses exactly what a broker prints) and the
send-failure records of its rejected attempts.

**Stats of minute m** (:func:`admitted_rows`): the demand's rows of that minute (:mod:`pipelines.sim.traffic`)
with the counts the brokers admitted (:class:`pipelines.sim.cluster.ClosedLoopCluster`):

* ``TOPIC_PUT_NUMS [topic]`` on a broker: the puts it admitted, retried attempts from other brokers included;
  ``[%RETRY%<group>]``: the group's admitted send-backs and fallback plain sends (one bucket, one topic);
  ``TOPIC_PUT_SIZE`` in the same proportion;
* ``SNDBCK_PUT_NUMS [topic@group]``: the admitted send-backs (``CONSUMER_SEND_MSG_BACK`` only: a fallback plain
  send is a put of the retry topic, not a send-back);
* ``GROUP_GET_*`` of a subscription: consumers take what was admitted; of a business topic, times
  ``1 − consume_drop_when_rejected × lost share`` of the group's retry traffic (pull flow control,
  :mod:`pipelines.sim.cluster`);
* ``BROKER_PUT_NUMS``: in proportion to the write units the broker admitted;
* ``GROUP_GET_FALL_SIZE`` and ``BROKER_GET_NUMS`` as demanded (the governor's rules do not read them).

**Send failures** (:func:`failure_rows`): one record per rejected attempt (docs/contracts.md §1.2) naming the
broker it went to, code 2 with the broker's remark — ``[TIMEOUT_CLEAN_QUEUE]broker busy, …`` (the send queue's
fast failure) or ``[RateLimit] for <resource> need wait:<n>microsecs`` (Sohu's limiter) — in the Java client's
text, or the Go client's for the first attempts of ``go_client_share`` of them; plus the demand's trickle of client
timeouts and ``TOPIC_NOT_EXIST`` (:func:`pipelines.sim.failures.trickle_failures`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines import rocketmq as rmq
from pipelines.sim import failures as fl
from pipelines.sim.cluster import ClosedLoopCluster
from pipelines.sim.traffic import TRAFFIC_COLUMNS
from pipelines.sim.world import broker_address

_SCALED_GET = (rmq.GROUP_GET_NUMS, rmq.GROUP_GET_SIZE, rmq.GROUP_GET_LATENCY)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)


def admitted_rows(cluster: ClosedLoopCluster, m: int) -> pd.DataFrame:
    """The stats rows of minute ``m`` (it must have been simulated) as the brokers admitted it, columns
    :data:`~pipelines.sim.traffic.TRAFFIC_COLUMNS` (plain string columns)."""
    if cluster.minutes_done() <= m:
        raise ValueError(f"minute {m} has not been simulated yet ({cluster.minutes_done()} done)")
    t = cluster.traffic
    at = cluster.start + pd.Timedelta(minutes=m)
    rows = t[t["minute_start"] == at].copy()
    for c in ("broker", "stat_name", "stats_key", "period", "style"):
        rows[c] = rows[c].astype(str)
    pairs = cluster.pairs
    demand = cluster.demand[:, m] * 60.0
    adm_all = cluster.admitted[m].sum(axis=1)
    adm_first = cluster.admitted[m][:, 0]
    work = cluster.work[:, m]
    key = {(b, rt, r): i for i, (b, rt, r) in enumerate(zip(pairs["broker"], pairs["resource_type"], pairs["resource"]))}
    put_factor = dict(zip(key, _ratio(adm_all, demand)))
    sndbck_factor = dict(zip(key, _ratio(adm_first, demand)))
    groups = pairs["resource_type"] == "group"
    lost = pd.Series(cluster.lost[m][groups.to_numpy()]).groupby(pairs.loc[groups, "resource"].to_numpy()).sum()
    dem = pd.Series(demand[groups.to_numpy()]).groupby(pairs.loc[groups, "resource"].to_numpy()).sum()
    drop = cluster.clients.consume_drop_when_rejected * (lost / dem.where(dem > 0)).fillna(0.0).clip(0.0, 1.0)
    broker_factor = pd.Series(_ratio(
        np.bincount(cluster.pair_broker, adm_all * work, minlength=len(cluster.brokers)),
        np.bincount(cluster.pair_broker, demand * work, minlength=len(cluster.brokers))), index=cluster.brokers)

    def retry_group(topic: str) -> str | None:
        return topic[len(rmq.RETRY_TOPIC_PREFIX):] if topic.startswith(rmq.RETRY_TOPIC_PREFIX) else None

    factor = np.ones(len(rows))
    for n, (b, stat, k) in enumerate(zip(rows["broker"], rows["stat_name"], rows["stats_key"])):
        if stat in (rmq.TOPIC_PUT_NUMS, rmq.TOPIC_PUT_SIZE):
            g = retry_group(k)
            factor[n] = put_factor.get((b, "group", g) if g else (b, "topic", k), 1.0)
        elif stat == rmq.SNDBCK_PUT_NUMS:
            factor[n] = sndbck_factor.get((b, "group", k.split("@")[-1]), 1.0)
        elif stat in _SCALED_GET:
            parts = k.split("@")
            topic, group = parts[-2], parts[-1]
            g = retry_group(topic)
            if g:
                factor[n] = put_factor.get((b, "group", g), 1.0)
            else:
                factor[n] = put_factor.get((b, "topic", topic), 1.0) * (1.0 - float(drop.get(group, 0.0)))
        elif stat == rmq.BROKER_PUT_NUMS:
            factor[n] = float(broker_factor.get(b, 1.0))
    return _scale(rows, factor)[list(TRAFFIC_COLUMNS)].reset_index(drop=True)


def _scale(rows: pd.DataFrame, factor: np.ndarray) -> pd.DataFrame:
    """Counts × ``factor`` (whole numbers), TPS = SUM / 60 s where the line prints one, AVGPT = SUM / times."""
    out = rows.copy()
    value = out["style"].to_numpy() == "VALUE"
    f = np.where(value, 1.0, factor)
    sums = np.rint(out["sum"].to_numpy(dtype=float) * f).astype(np.int64)
    times = np.rint(out["times"].to_numpy(dtype=float) * f).astype(np.int64)
    out["sum"], out["times"] = sums, times
    tps = out["tps"].to_numpy(dtype=float)
    out["tps"] = np.where(np.isnan(tps), np.nan, sums / 60.0)
    avg = out["avgpt"].to_numpy(dtype=float)
    out["avgpt"] = np.where(value | (avg == 0), avg, np.where(times > 0, sums / np.maximum(times, 1), 0.0))
    return out


def failure_rows(cluster: ClosedLoopCluster, first: int, last: int, rng: np.random.Generator) -> pd.DataFrame:
    """Send-failure records of the rejections logged in entries ``first:last`` of ``cluster.rejections``, columns
    :data:`pipelines.sim.failures.FAILURE_COLUMNS` + ``event_time`` (UTC) and ``expected_class``; each line's
    time is uniform within its tick."""
    rj = cluster.rejections
    if last <= first:
        return fl.empty_failures()
    sl = slice(first, last)
    count = np.asarray(rj.count[sl], dtype=np.int64)
    rep = lambda values: np.repeat(np.asarray(values[sl]), count)  # noqa: E731
    tick, pair, stream, busy = rep(rj.tick), rep(rj.pair), rep(rj.stream), rep(rj.busy).astype(bool)
    limit, queue = rep(rj.limit), rep(rj.queue)
    n = tick.size
    spec, pairs = cluster.spec, cluster.pairs
    kind = pairs["kind"].to_numpy()[pair]
    resource = pairs["resource"].to_numpy(dtype=object)[pair]
    topics = np.where(kind == "group", np.char.add(rmq.RETRY_TOPIC_PREFIX, resource.astype(str)), resource)
    broker_index = cluster.pair_broker[pair]
    start_ms = int(cluster.start.value // 1_000_000)
    epoch_ms = start_ms + np.floor((tick + rng.random(n)) * cluster.dt * 1000.0).astype(np.int64)
    period = np.rint(cluster.cfg.wait_time_ms_in_send_queue + rng.uniform(0, 100, n)).astype(np.int64)
    size = np.maximum(np.rint(queue), 1).astype(np.int64) + rng.integers(0, 50, n)
    wait_us = np.maximum(1, np.floor(rng.random(n) * 1e6 / np.where(np.isnan(limit), 1.0, limit))).astype(np.int64)
    remarks = [fl.busy_remark(p, q) if b else fl.rate_limit_remark(t, w)
               for b, p, q, t, w in zip(busy.tolist(), period.tolist(), size.tolist(), topics.tolist(),
                                        wait_us.tolist())]
    go = (stream == 0) & (kind == "topic") & (rng.random(n) < spec.go_client_share)
    addrs = [broker_address(spec, int(b)) for b in broker_index.tolist()]
    names = np.unique(pairs["resource"].to_numpy(dtype=str))
    out = pd.DataFrame({
        "ts": epoch_ms,
        "topic": topics,
        "broker": np.asarray(cluster.brokers, dtype=object)[broker_index],
        "producer_group": np.where(kind == "group", fl.CLIENT_INNER_PRODUCER,
                                   np.char.add(topics.astype(str), "-producer")),
        "client": fl.client_address(np.searchsorted(names, resource.astype(str)), rng.integers(0, 2, n)),
        "code": pd.array(np.where(rng.random(n) < spec.null_code_share, pd.NA, fl.SYSTEM_BUSY).tolist(),
                         dtype="Int64"),
        "message": fl.client_messages(spec, fl.SYSTEM_BUSY, remarks, addrs, go),
        "latency_ms": np.where(busy, period + rng.integers(1, 30, n), rng.integers(1, 6, n)).astype(np.int64),
        "event_time": pd.to_datetime(epoch_ms, unit="ms", utc=True),
        "expected_class": np.where(busy, "TIMEOUT_CLEAN_QUEUE", rmq.RATE_LIMITED),
    })
    return fl.finish_failures(spec, out, rng)


def trickle(cluster: ClosedLoopCluster, rng: np.random.Generator) -> pd.DataFrame:
    """The demand's background failures for the whole run (client timeouts, ``TOPIC_NOT_EXIST``): no limit or
    queue causes them."""
    out = fl.trickle_failures(cluster.spec, fl.business_topic_rates(cluster.traffic), rng)
    return fl.finish_failures(cluster.spec, out, rng) if len(out) else fl.empty_failures()
