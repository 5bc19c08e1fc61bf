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
  ``1 − consume_drop_when_rejected × lost share`` of the group's retry traffic while the group is broken (pull flow
  control, :mod:`pipelines.sim.cluster`);
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
#: How a stats row's count follows what the brokers admitted (:func:`admitted_rows`): as demanded, as its pair's
#: admitted puts, as its pair's admitted send-backs, as a subscription's consumption, as the broker's writes.
_AS_DEMANDED, _PUTS, _SENDBACKS, _GETS, _BROKER = range(5)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)


def _kahan(values) -> float:
    """A compensated sum, in order (as pandas' ``groupby().sum()`` adds floats, so the counts stay the same)."""
    total = comp = 0.0
    for v in values:
        y = v - comp
        t = total + y
        comp = t - total - y
        if comp != comp:
            comp = 0.0
        total = t
    return total


class _Plan:
    """What :func:`admitted_rows` needs of ``cluster.traffic`` and ``cluster.pairs`` once per cluster (not per
    minute): each row's minute, how its count follows what was admitted (``_AS_DEMANDED`` …) and the pair, group
    and broker it follows."""

    def __init__(self, cluster: ClosedLoopCluster) -> None:
        t, pairs = cluster.traffic, cluster.pairs
        self.minute = ((t["minute_start"] - cluster.start) // pd.Timedelta(minutes=1)).to_numpy(dtype=np.int64)
        key = {(b, rt, r): i for i, (b, rt, r) in enumerate(zip(pairs["broker"], pairs["resource_type"],
                                                                 pairs["resource"]))}
        groups = pairs["resource_type"].to_numpy() == "group"
        self.group_names = sorted(set(pairs.loc[groups, "resource"]))
        gindex = {g: i for i, g in enumerate(self.group_names)}
        self.group_pairs = [np.flatnonzero(groups & (pairs["resource"].to_numpy() == g)) for g in self.group_names]
        self.group_broken = [cluster.broken(g) for g in self.group_names]
        bindex = {b: i for i, b in enumerate(cluster.brokers)}
        n = len(t)
        self.how, self.pair = np.full(n, _AS_DEMANDED), np.full(n, -1)
        self.group, self.broker = np.full(n, -1), np.full(n, -1)
        for i, (b, stat, k) in enumerate(zip(t["broker"].astype(str), t["stat_name"].astype(str),
                                             t["stats_key"].astype(str))):
            if stat in (rmq.TOPIC_PUT_NUMS, rmq.TOPIC_PUT_SIZE):
                g = _retry_group(k)
                self.how[i], self.pair[i] = _PUTS, key.get((b, "group", g) if g else (b, "topic", k), -1)
            elif stat == rmq.SNDBCK_PUT_NUMS:
                self.how[i], self.pair[i] = _SENDBACKS, key.get((b, "group", k.split("@")[-1]), -1)
            elif stat in _SCALED_GET:
                parts = k.split("@")
                topic, group = parts[-2], parts[-1]
                g = _retry_group(topic)
                if g:
                    self.how[i], self.pair[i] = _PUTS, key.get((b, "group", g), -1)
                else:
                    self.how[i], self.pair[i] = _GETS, key.get((b, "topic", topic), -1)
                    self.group[i] = gindex.get(group, -1)
            elif stat == rmq.BROKER_PUT_NUMS:
                self.how[i], self.broker[i] = _BROKER, bindex.get(b, -1)
        self.value = t["style"].astype(str).to_numpy() == "VALUE"
        self.rows: dict[int, np.ndarray] = {}
        self.events: list | None = None

    def rows_of(self, m: int) -> np.ndarray:
        if m not in self.rows:
            self.rows[m] = np.flatnonzero(self.minute == m)
        return self.rows[m]


def _retry_group(topic: str) -> str | None:
    return topic[len(rmq.RETRY_TOPIC_PREFIX):] if topic.startswith(rmq.RETRY_TOPIC_PREFIX) else None


def _plan(cluster: ClosedLoopCluster) -> _Plan:
    plan = getattr(cluster, "_admitted_plan", None)
    if plan is None:
        plan = cluster._admitted_plan = _Plan(cluster)
    return plan


def admitted_factors(cluster: ClosedLoopCluster, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``cluster.traffic`` of minute ``m``'s rows, the factor of each row's counts: what the brokers
    admitted over what was demanded; 1 for rows printed as demanded). The minute must have been simulated."""
    if cluster.minutes_done() <= m:
        raise ValueError(f"minute {m} has not been simulated yet ({cluster.minutes_done()} done)")
    plan = _plan(cluster)
    at = plan.rows_of(m)
    demand = cluster.demand[:, m] * 60.0
    adm_all = cluster.admitted[m].sum(axis=1)
    put = _ratio(adm_all, demand)
    sndbck = _ratio(cluster.admitted[m][:, 0], demand)
    lost = cluster.lost[m]
    drop = np.zeros(len(plan.group_names) + 1)  # the last entry: a group without pairs (no drop)
    for i, rows in enumerate(plan.group_pairs):
        if not plan.group_broken[i][m]:  # a working consumer's rejected retries do not hold its pulls back
            continue
        dem = _kahan(demand[rows].tolist())
        share = _kahan(lost[rows].tolist()) / dem if dem > 0 else 0.0
        drop[i] = cluster.clients.consume_drop_when_rejected * min(max(share, 0.0), 1.0)
    work = cluster.work[:, m]
    broker = np.append(_ratio(np.bincount(cluster.pair_broker, adm_all * work, minlength=len(cluster.brokers)),
                              np.bincount(cluster.pair_broker, demand * work, minlength=len(cluster.brokers))), 1.0)
    how, pair = plan.how[at], plan.pair[at]
    put, sndbck = np.append(put, 1.0), np.append(sndbck, 1.0)  # index -1: a row without a pair (as demanded)
    factor = np.ones(len(at))
    factor = np.where(how == _PUTS, put[pair], factor)
    factor = np.where(how == _SENDBACKS, sndbck[pair], factor)
    factor = np.where(how == _GETS, put[pair] * (1.0 - drop[plan.group[at]]), factor)
    factor = np.where(how == _BROKER, broker[plan.broker[at]], factor)
    return at, factor


def admitted_sums(cluster: ClosedLoopCluster, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``cluster.traffic`` of minute ``m``'s rows, each row's admitted ``sum``): the SUM its line
    prints (:func:`admitted_rows` without building the frame)."""
    at, factor = admitted_factors(cluster, m)
    f = np.where(_plan(cluster).value[at], 1.0, factor)
    return at, np.rint(cluster.traffic["sum"].to_numpy(dtype=float)[at] * f).astype(np.int64)


def stats_events(cluster: ClosedLoopCluster, m: int) -> list[tuple]:
    """The metric events of minute ``m``'s stats lines as the brokers admitted it, windowed stats only
    (:data:`pipelines.rocketmq.WINDOWED_STATS` of the minute period): ``(event_time, broker, topic, group,
    metric, amount)`` as :mod:`pipelines.sim.windows` reads them, the event time the start of the minute (UTC)."""
    plan = _plan(cluster)
    if plan.events is None:  # each row's event without its amount (None: not a windowed stat)
        t = cluster.traffic
        plan.events = []
        for broker, stat, key, period in zip(t["broker"].astype(str), t["stat_name"].astype(str),
                                             t["stats_key"].astype(str), t["period"].astype(str)):
            if period != "minute" or stat not in rmq.WINDOWED_STATS:
                plan.events.append(None)
            elif stat == rmq.TOPIC_PUT_NUMS:
                plan.events.append((broker, key, None, stat))
            elif stat == rmq.BROKER_PUT_NUMS:
                plan.events.append((broker, None, None, stat))
            else:
                topic, _, group = key.rpartition("@")
                plan.events.append((broker, topic, group, stat))
    at, sums = admitted_sums(cluster, m)
    when = (cluster.start + pd.Timedelta(minutes=m)).to_pydatetime()
    out = []
    for i, amount in zip(at.tolist(), sums.tolist()):
        e = plan.events[i]
        if e is not None:
            out.append((when, e[0], e[1], e[2], e[3], amount))
    return out


def admitted_rows(cluster: ClosedLoopCluster, m: int) -> pd.DataFrame:
    """The stats rows of minute ``m`` (it must have been simulated) as the brokers admitted it, columns
    :data:`~pipelines.sim.traffic.TRAFFIC_COLUMNS` (plain string columns)."""
    at, factor = admitted_factors(cluster, m)
    rows = cluster.traffic.iloc[at].copy()
    for c in ("broker", "stat_name", "stats_key", "period", "style"):
        rows[c] = rows[c].astype(str)
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


class FailureText:
    """The send-failure line a client writes for a rejected attempt, classified as the data plane classifies it
    (:func:`pipelines.rocketmq.classify_failure_text`, the table of
    :func:`pipelines.dataplane.transforms.parse_failures.classify_failure`): the broker's remark
    (``[TIMEOUT_CLEAN_QUEUE]broker busy, …`` of its send queue, ``[RateLimit] for <resource> need wait:…`` of the
    limiter) in the Java client's text or the Go client's (:func:`pipelines.sim.failures.client_messages`), the code
    inside the message or in the record. One line rendered per (tick, pair, kind) of :meth:`rejection`'s callers:
    the lines of one tick, pair and kind differ only in their numbers."""

    def __init__(self, cluster: ClosedLoopCluster) -> None:
        self.cluster, self.rng = cluster, np.random.default_rng(cluster.spec.seed + 2)
        kind = cluster.pairs["kind"].to_numpy()
        self.topic = [rmq.RETRY_TOPIC_PREFIX + r if k == "group" else r
                      for k, r in zip(kind, cluster.pairs["resource"])]
        self.addr = [broker_address(cluster.spec, int(b)) for b in cluster.pair_broker]

    def text(self, pair: int, busy: bool) -> tuple[str, int | None]:
        """(the client's message, the record's code or None: only inside the message)."""
        spec, r = self.cluster.spec, self.rng
        remark = (fl.busy_remark(int(self.cluster.cfg.wait_time_ms_in_send_queue + r.integers(0, 100)),
                                 int(r.integers(1, 3000))) if busy else
                  fl.rate_limit_remark(self.topic[pair], int(r.integers(1, 1_000_000))))
        go = np.array([bool(r.random() < spec.go_client_share)])
        message = fl.client_messages(spec, fl.SYSTEM_BUSY, [remark], [self.addr[pair]], go)[0]
        return message, None if r.random() < spec.null_code_share else fl.SYSTEM_BUSY

    def rejection(self, pair: int, busy: bool) -> str:
        """The failure class of a rejected attempt's line, read from its text."""
        return rmq.classify_failure_text(*self.text(pair, busy))
