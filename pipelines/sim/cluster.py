"""The closed-loop cluster: what the brokers admit of the clients' demand under the limits in force, tick by tick,
and how the clients answer a rejection. It is the broker model of :mod:`pipelines.sim.broker_model` (the rules of
:mod:`pipelines.sim.ticks`) with the feedback the open-loop model leaves out.

Demand: the scenario's World (:mod:`pipelines.sim.scenarios`) realised as stats rows (:func:`build_traffic`), read by
:func:`~pipelines.sim.broker_model.offered_from_stats` into requests/s and write units per request for every
(broker, resource) pair and minute: what producers and consumers *want* to send. Every pair has a token bucket (a
limit comes into force when :meth:`ClosedLoopCluster.set_limits` says so: each broker its own figure) in front of
its broker's send queue.

What the clients do with a rejection (``SYSTEM_BUSY``, code 2, from the queue's fast failure or from the limiter):

* **Producers retry on another broker** (apache/rocketmq ``DefaultMQProducerImpl.sendDefaultImpl``: up to
  1 + ``retryTimesWhenSendFailed`` = 3 attempts, ``selectOneMessageQueue`` avoiding the last broker; code 2 is in
  ``retryResponseCodes`` from 5.3.0, PR #5845): a rejected attempt is offered again in the next tick to the
  topic's other brokers (the same broker when it is alone), for the ``retrying_share`` of sends whose clients do
  so (rocketmq-client-go's ``needRetryCode`` and Java clients before 5.3.0 do not). Every rejected attempt leaves
  one send-failure line naming the broker it went to, as far as the producers log and ship them: a limiter's
  rejection (``RATE_LIMITED``) leaves a line for ``rejection_log_share`` of the attempts (1: every one; a sampled
  log less; 0: none shipped), and no producer ships more than ``log_lines_per_minute`` lines per topic, broker and
  minute (a log throttle; 0: no throttle). The governor never sees more of a rejected demand than that.
* **A consumer whose send-back is rejected falls back to a plain send** (``fallback_send``; a C++ client,
  ``fallback_send`` False, does not: it only re-consumes the message locally) to ``%RETRY%<group>``
  (``DefaultMQPushConsumerImpl.sendMessageBack`` → ``sendMessageBackAsNormalMessage``, through the client's own
  producer, group ``CLIENT_INNER_PRODUCER``): it is offered in the next tick to any broker of the group's retry
  topic, into the **same bucket** (Sohu's ``RateLimitHandler`` keys ``CONSUMER_SEND_MSG_BACK`` by
  ``%RETRY%<group>`` and a plain send by its topic, sohutv/rocketmq 5.3.1-sohu-01), with the producer's retries.
  Neither failure reaches a send-failure log: a rejected send-back is answered to the consumer, and a rejected
  fallback send fails inside the consumer client's own producer, whose exception the consumer catches
  (``ConsumeMessageConcurrentlyService.processConsumeResult``); the application that ships its send failures never
  sees either. What the brokers print of them is what they admitted: the group's send-backs
  (``SNDBCK_PUT_NUMS``) and the plain sends to its retry topic (``TOPIC_PUT_NUMS``). A message that still fails is
  re-consumed locally (``ConsumeMessageConcurrentlyService.submitConsumeRequestLater``) and sent back again: the demand
  of a broken consumer does not fall, whatever the limit (the World's send-back rate stays). Such messages stay in the
  process queue, whose flow control (``pullThresholdForQueue``, ``consumeConcurrentlyMaxSpan``) slows the pulls:
  while the group is broken (:meth:`ClosedLoopCluster.broken`) its consumption of its other topics falls by
  ``consume_drop_when_rejected`` × the share of its retry traffic lost (:mod:`pipelines.sim.admitted`). A working
  consumer's retries are transient failures: a message whose send-back is rejected is re-consumed locally five
  seconds later and succeeds, so it leaves the process queue and does not hold the pulls back (its consumption
  does not fall; it sends back the World's share of what it consumes, :mod:`pipelines.sim.consumers`).

**Pulsed producers** (``pulse_period_seconds`` > 0): a surging topic's demand in pulses
(:mod:`pipelines.sim.pulses`).

Not modelled: the retry topic's delay levels (a re-put lands in the same minute, as in :mod:`pipelines.sim.traffic`),
producers giving up under ``sendMsgTimeout``, queue capacity overflow (``[OVERLOAD]``), Sohu's default per-resource
limits (``sendMsgRateLimitQps``; a resource without a record is unlimited here).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pydantic import Field

from pipelines.config import ConfigSection
from pipelines.sim import broker_model as bm
from pipelines.sim.consumers import Consumers
from pipelines.sim.pulses import Pulses
from pipelines.sim.spec import Incident, ScenarioSpec
from pipelines.sim.ticks import SendQueues, TokenBuckets
from pipelines.sim.traffic import build_traffic


class ClientConfig(ConfigSection):
    """How the clients answer a rejection; the ``[clients]`` table of ``conf/backtest.toml``."""

    producer_attempts: int = Field(default=3, ge=1)  # 1 + DefaultMQProducer.retryTimesWhenSendFailed (2)
    retrying_share: float = Field(default=0.6, ge=0, le=1)  # sends whose client retries code 2 on another broker
    consume_drop_when_rejected: float = Field(default=0.5, ge=0, le=1)  # share of a broken group's consumption
    #                                                                     lost when all of its retry traffic is lost
    rejection_log_share: float = Field(default=1.0, ge=0, le=1)  # a producer's limiter rejections that leave a line
    log_lines_per_minute: int = Field(default=0, ge=0)  # at most this many lines per topic, broker and minute (0: all)
    pulse_period_seconds: int = Field(default=0, ge=0)  # a surging topic's producers send in pulses this often (0: no)
    pulse_on_seconds: int = Field(default=0, ge=0)  # each pulse lasts this long (whole seconds, <= the period)
    fallback_send: bool = True  # a consumer client sends a refused send-back again as a plain send (the Java
    #   client); False: it re-consumes it locally only (apache/rocketmq-client-cpp master,
    #   DefaultMQPushConsumerImpl::sendMessageBack logs the MQException and returns false, and
    #   ConsumeMessageConcurrentlyService keeps the message for a local retry; the Python client wraps it)


@dataclass
class Rejections:
    """Send-failure lines emitted so far, one entry per (tick, pair, stream, kind) with ``count`` lines."""

    tick: list[int]
    pair: list[int]
    stream: list[int]
    busy: list[bool]
    count: list[int]
    limit: list[float]  # the pair's limit in force (requests/s at this broker), NaN for busy rejections
    queue: list[float]  # the broker's send queue (write units) at the tick


#: Minutes of traffic before an incident that show a broker's normal load (a cold start has fewer).
NORMAL_MINUTES = 3


def normal_capacity(offered: pd.DataFrame, incident: Incident | None, cfg: bm.BrokerModelConfig) -> pd.Series:
    """Each broker's capacity (write units/s): :func:`~pipelines.sim.broker_model.broker_capacity` of its normal
    load, the minutes before the incident's onset; where fewer than :data:`NORMAL_MINUTES` of them have traffic (a
    storm under way when the governor starts, a cold start), of every minute without the incident's own
    traffic (the pairs of its causes: a group's retry traffic, a surging topic's puts), so that a broker is sized for
    its normal load, not for the capacity floor."""
    if incident is None:
        return bm.broker_capacity(offered, cfg)
    before = offered[offered["minute_start"] < pd.Timestamp(incident.onset)]
    minutes = before.loc[before["requests_tps"] > 0, "minute_start"].nunique()
    if minutes >= min(NORMAL_MINUTES, cfg.capacity_baseline_minutes) or not getattr(incident, "causes", ()):
        return bm.broker_capacity(before if len(before) else offered, cfg)
    causes = {(c.resource_type, c.resource) for c in incident.causes}
    own = pd.Series(list(zip(offered["resource_type"], offered["resource"])), index=offered.index).isin(causes)
    return bm.broker_capacity(offered[~own.to_numpy()], cfg)


class ClosedLoopCluster:
    """One scenario's cluster in closed loop. Time runs in ticks of ``broker_cfg.tick_seconds`` from the scenario's
    start; :meth:`advance_to` runs them with the limit vectors last given to :meth:`set_limits`.

    Attributes after construction: ``pairs`` (frame: broker, resource_type, resource, kind), ``incident``, ``traffic``
    (the demand's stats rows, :data:`pipelines.sim.traffic.TRAFFIC_COLUMNS`: ``spec``'s, or a replay's given),
    ``capacity`` (units/s per broker: :func:`~pipelines.sim.broker_model.broker_capacity` of the minutes before the
    onset); while it runs, ``limiter_count`` and ``limiter_last_tick`` per pair: the sends its limiter rejected and the
    tick of the last (what the RocketMQ admin sink's view reads, :mod:`pipelines.sim.limiter_view`; never a busy
    broker's refusals).
    """

    def __init__(self, spec: ScenarioSpec, broker_cfg: bm.BrokerModelConfig | None = None,
                 clients: ClientConfig | None = None, capacity: pd.Series | None = None,
                 traffic: pd.DataFrame | None = None) -> None:
        self.spec, self.cfg, self.clients = spec, broker_cfg or bm.BrokerModelConfig(), clients or ClientConfig()
        self.traffic = build_traffic(spec) if traffic is None else traffic
        self.incident: Incident | None = self.traffic.attrs.get("incident")
        minute = self.traffic[self.traffic["period"] == "minute"]
        stats = pd.DataFrame({c: minute[c].astype(str) for c in ("broker", "stat_name", "stats_key")})
        stats["minute_start"], stats["sum"] = minute["minute_start"], minute["sum"]
        offered = bm.offered_from_stats(stats, self.cfg)
        self.start = pd.Timestamp(spec.start_utc)
        self.T = spec.minutes
        self.dt = float(self.cfg.tick_seconds)
        self.ticks_per_minute = int(round(60.0 / self.dt))
        self.brokers = list(spec.broker_names)
        self._demand_of(offered)
        if capacity is None:
            capacity = normal_capacity(offered, self.incident, self.cfg)
        self.capacity = capacity.reindex(self.brokers).fillna(self.cfg.capacity_min_tps)
        self._routes()
        self._limiter_state()
        self._ledgers()
        self.apply_pulses()
        self.consumers = Consumers.of(self)

    def _demand_of(self, offered: pd.DataFrame) -> None:
        """The (broker, resource) pairs of ``offered`` (:func:`pipelines.sim.broker_model.offered_from_stats`) and
        per pair and minute their demand (requests/s) and work per request (write units; carried over minutes
        without demand)."""
        pairs = offered[["broker", "resource_type", "resource"]].drop_duplicates().sort_values(
            ["broker", "resource_type", "resource"], kind="mergesort").reset_index(drop=True)
        self.pairs = pairs.assign(kind=pairs["resource_type"])
        L, T = len(pairs), self.T
        index = {tuple(r): i for i, r in enumerate(pairs.itertuples(index=False))}
        rows = np.array([index[(b, t, r)] for b, t, r in zip(offered["broker"], offered["resource_type"],
                                                              offered["resource"])], dtype=np.int64)
        m = ((offered["minute_start"] - self.start) // pd.Timedelta(minutes=1)).to_numpy(dtype=np.int64)
        self.demand = np.zeros((L, T))
        self.demand[rows, m] = offered["requests_tps"].to_numpy(dtype=float)
        self._demand_dt = self.demand * float(self.cfg.tick_seconds)  # requests per tick
        work = np.full((L, T), np.nan)
        work[rows, m] = offered["work_per_request"].to_numpy(dtype=float)
        self.work = pd.DataFrame(work).T.ffill().bfill().fillna(1.0).T.to_numpy()
        self.pair_broker = pairs["broker"].map({b: i for i, b in enumerate(self.brokers)}).to_numpy(dtype=np.int64)

    def _limiter_state(self) -> None:
        """Every pair's token bucket and breaker, every broker's send queue, the retries pending per pair and
        stream, no limit yet."""
        L, S = len(self.pairs), self.streams
        self.buckets = TokenBuckets.empty(L)
        self.queues = SendQueues.empty(self.capacity.to_numpy(dtype=float), self.cfg.wait_time_ms_in_send_queue)
        self.pending = np.zeros((L, S))
        self._clean: tuple | None = None  # :meth:`_clean_tick`'s amounts of one minute
        self.k = 0
        self.limit = np.full(L, np.nan)
        self._has, self._limited = np.zeros(L, dtype=bool), False
        self._prepared, self._limited_dt = (None, None, None), np.zeros(L)
        self.burst = np.ones(L)
        self.open_ticks = np.full(L, self._ticks(self.cfg.breaker_open_ms), dtype=np.int64)

    def _ledgers(self) -> None:
        """What the run records: per minute × pair × stream (msgs); per second × pair (msgs); per broker × minute;
        the failure lines logged and the limiters' own counts."""
        L, S, T = len(self.pairs), self.streams, self.T
        # per minute × pair × stream (msgs); per second × pair (msgs); per broker × minute
        self.offered = np.zeros((T, L, S))
        self.admitted = np.zeros((T, L, S))
        self.limiter_rejected = np.zeros((T, L, S))
        self.busy_rejected = np.zeros((T, L, S))
        self.lost = np.zeros((T, L))
        self.limited_seconds = np.zeros((T, L))
        self.limit_min = np.full((T, L), np.nan)
        self.second_admitted = np.zeros((T * 60, L))
        self.second_rejected = np.zeros((T * 60, L))
        self.arrived_work = np.zeros((len(self.brokers), T))
        self.max_wait_ms = np.zeros((len(self.brokers), T))
        self._debt = np.zeros((2, L, S))
        self._log_minute, self._log_used = -1, np.zeros(L)  # lines logged per pair in the current minute (throttle)
        self.rejections = Rejections([], [], [], [], [], [], [])
        # per pair: the sends its limiter rejected (RATE_LIMITED, whole sends) and the tick of the last (-1: none)
        self.limiter_count, self.limiter_last_tick = np.zeros(L, dtype=np.int64), np.full(L, -1, dtype=np.int64)
        self._limiter_sum = np.zeros(L)

    def apply_pulses(self) -> None:
        """The pulsed producers of the clients' ``pulse_*`` settings (:class:`pipelines.sim.pulses.Pulses`)."""
        self.pulses = Pulses.of(self)

    # --- set-up ------------------------------------------------------------------------------------------------------
    def broken(self, group: str) -> np.ndarray:
        """Per minute: whether ``group`` is a broken consumer (its messages fail on every consumption): a storm
        cause of the incident (:attr:`Incident.causes`) while it is active, or else the incident's culprit group
        while its cause is active (:attr:`Incident.active`; none: from the onset on)."""
        on = np.zeros(self.T, dtype=bool)
        inc = self.incident
        if inc is not None and inc.causes:
            spans = [s for c in inc.causes if c.resource_type == "group" and c.resource == group for s in c.active]
        elif inc is None or inc.culprit_group != group:
            return on
        else:
            spans = inc.active or ((inc.onset, self.end),)
        for a, b in spans:
            lo = int((pd.Timestamp(a) - self.start) // pd.Timedelta(minutes=1))
            hi = int(-(-(pd.Timestamp(b) - self.start) // pd.Timedelta(minutes=1)))
            on[max(lo, 0):max(hi, 0)] = True
        return on

    @property
    def streams(self) -> int:
        """Request streams per pair: a topic's attempts 1..A (A = ``producer_attempts``); a group's send-backs
        (0) and its fallback plain sends' attempts 1..A."""
        return self.clients.producer_attempts + 1

    def _ticks(self, open_ms: float) -> int:
        return max(1, int(round(open_ms / 1000.0 / self.dt))) if open_ms > 0 else 0

    def reroute(self) -> None:
        """Recompute the rejections' routes after ``clients`` changed (a cluster not run yet)."""
        if self.k:
            raise ValueError("the cluster has run already")
        self._routes()

    def _routes(self) -> None:
        """Where the rejections of stream k go as stream k + 1 (``self.route[k]``, pairs × pairs) and which
        (pair, stream) rejections leave a send-failure line (``self.logged``: a producer's attempts only; a
        consumer's send-backs and its client's fallback sends fail inside the consumer client, unlogged)."""
        L, S, A = len(self.pairs), self.streams, self.clients.producer_attempts
        kind = self.pairs["kind"].to_numpy()
        key = list(zip(self.pairs["resource_type"], self.pairs["resource"]))
        same = np.array([[a == b for b in key] for a in key], dtype=float) if L else np.zeros((0, 0))
        n = same.sum(axis=1, keepdims=True)
        any_broker = same / np.maximum(n, 1)
        other = np.where(n > 1, same * (1 - np.eye(L)) / np.maximum(n - 1, 1), same)
        topic, group = (kind == "topic")[:, None], (kind == "group")[:, None]
        r = self.clients.retrying_share
        self.route = np.zeros((S - 1, L, L))
        for k in range(S - 1):
            if k <= A - 2:
                self.route[k] += np.where(topic, r * other, 0.0)
            if k == 0:  # a refused send-back: sent again as a plain send to any broker of the retry topic, or not
                self.route[k] += np.where(group, any_broker, 0.0) if self.clients.fallback_send else 0.0
            elif k <= A - 1:
                self.route[k] += np.where(group, r * other, 0.0)
        streams = np.arange(S)[None, :]
        self.logged = topic & (streams < A)

    # --- time --------------------------------------------------------------------------------------------------------
    def time_of(self, tick: int | float) -> pd.Timestamp:
        """UTC time of a tick's start."""
        return self.start + pd.Timedelta(seconds=float(tick) * self.dt)

    @property
    def now(self) -> pd.Timestamp:
        """UTC time up to which the cluster has run."""
        return self.time_of(self.k)

    @property
    def end(self) -> pd.Timestamp:
        return self.start + pd.Timedelta(minutes=self.T)

    def minutes_done(self) -> int:
        """Number of whole minutes simulated so far."""
        return self.k // self.ticks_per_minute

    def set_limits(self, limit: np.ndarray, burst: np.ndarray, breaker_open_ms: np.ndarray) -> None:
        """The limits in force from :attr:`now` on, per pair: ``limit`` requests/s at that broker (NaN = none),
        ``burst`` requests, ``breaker_open_ms``."""
        self.limit = np.asarray(limit, dtype=float)
        self._has = ~np.isnan(self.limit)
        self._limited = bool(self._has.any())
        self.burst = np.where(np.isnan(self.limit), 1.0, np.maximum(np.asarray(burst, dtype=float), 1.0))
        self.open_ticks = np.array([self._ticks(ms) for ms in np.asarray(breaker_open_ms, dtype=float)],
                                   dtype=np.int64)
        self._prepared = TokenBuckets.prepare(self.limit, self.open_ticks, self.dt)
        self._limited_dt = np.where(self._has, self.dt, 0.0)

    # --- the tick loop -----------------------------------------------------------------------------------------------
    def advance_to(self, when: pd.Timestamp | dt.datetime) -> None:
        """Run the ticks that start before ``when`` (at most to the end of the scenario)."""
        last = min(int(np.ceil((pd.Timestamp(when) - self.start).total_seconds() / self.dt - 1e-9)),
                   self.T * self.ticks_per_minute)
        while self.k < last:
            if not self._clean_tick():
                self._tick()

    def _clean_tick(self) -> bool:
        """The usual tick, cheaply: no limit in force, nothing pending from the tick before, an empty send queue that
        this minute's arrivals do not fill. Then :meth:`_tick` would admit every request and leave the queue empty;
        this adds the same amounts to the same totals (the same float additions in the same order) and returns True.
        Otherwise returns False and changes nothing."""
        k, tpm = self.k, self.ticks_per_minute
        m = k // tpm
        if self._limited or self.pending.any() or not self.buckets.at_rest or self.queues.queue.any() or \
                self.pulses.minute[m]:
            return False
        self.consumers.reset()  # every request admitted: the consumers receive their whole demand
        if self._clean is None or self._clean[0] != m:
            demand = self._demand_dt[:, m] + 0.0  # x[:, 0] of a tick with nothing pending
            x = np.zeros_like(self.pending)
            x[:, 0] += demand
            total = x.sum(axis=1)
            arrivals = np.bincount(self.pair_broker, total * self.work[:, m], minlength=len(self.brokers))
            fits = bool(np.all(arrivals <= self.queues.capacity * self.dt))  # SendQueues.serve leaves it empty
            self._clean = (m, x, total, arrivals, fits)
        _, x, total, arrivals, fits = self._clean
        if not fits:
            return False
        self.offered[m] += x
        self.arrived_work[:, m] += arrivals
        self.admitted[m] += x
        self.second_admitted[int(k * self.dt + 1e-9)] += total
        self.k = k + 1
        return True

    def _tick(self) -> None:
        k, dt_s, tpm = self.k, self.dt, self.ticks_per_minute
        m, sec = k // tpm, int(k * dt_s + 1e-9)
        x = self.pending
        x[:, 0] += self.pulses.demand(k, self.consumers.demand(self, k, self._demand_dt[:, m]))
        total = x.sum(axis=1)
        passed = self.buckets.admit(total, self.limit, self.burst, self.open_ticks, dt_s, self._prepared)
        arrivals = np.bincount(self.pair_broker, passed * self.work[:, m], minlength=len(self.brokers))
        share, _served, wait = self.queues.serve(arrivals, dt_s)
        self.offered[m] += x
        self.arrived_work[:, m] += arrivals
        if np.count_nonzero(wait):
            self.max_wait_ms[:, m] = np.maximum(self.max_wait_ms[:, m], wait * 1000.0)
        if self._limited:
            self.limited_seconds[m] += self._limited_dt
            self.limit_min[m] = np.fmin(self.limit_min[m], self.limit)
        busy = passed * share[self.pair_broker] if np.count_nonzero(share) else None
        if busy is None and not self._limited:  # every request admitted: total - passed is 0
            refused = None
        else:
            refused = total - passed + busy if busy is not None else total - passed
        if refused is None or not np.count_nonzero(refused):  # nothing rejected (the usual case): nothing to retry
            self.admitted[m] += x
            self.second_admitted[sec] += total
            self.pending = np.zeros_like(x)
            self.k += 1
            return
        safe = np.where(total > 0, total, 1.0)
        r_lim = x * ((total - passed) / safe)[:, None]
        rejected = r_lim
        if busy is not None:
            r_busy = x * (busy / safe)[:, None]
            rejected = r_lim + r_busy
            self.busy_rejected[m] += r_busy
        else:
            r_busy = None
        self.admitted[m] += x - rejected
        self.limiter_rejected[m] += r_lim
        if self._limited:  # the limiter's own count (a whole send once its fractions add up to one)
            self._limiter_sum += r_lim.sum(axis=1)
            whole = np.floor(self._limiter_sum + 1e-9).astype(np.int64)
            self.limiter_last_tick[whole > self.limiter_count] = k
            self.limiter_count = whole
        out = rejected.sum(axis=1)
        self.second_admitted[sec] += total - out
        self.second_rejected[sec] += out
        nxt = np.zeros_like(x)
        for s in range(self.streams - 1):
            nxt[:, s + 1] = self.route[s].T @ rejected[:, s]
        self.lost[m] += out - nxt.sum(axis=1)
        self.pending = nxt
        self._log(k, r_lim, r_busy)
        self.k += 1

    def _log(self, k: int, r_lim: np.ndarray, r_busy: np.ndarray | None) -> None:
        """Whole send-failure lines of this tick's logged rejections (fractions carry over to the next tick):
        ``rejection_log_share`` of the limiter's rejections, every busy one, at most ``log_lines_per_minute`` per
        pair and minute (the excess is dropped, as a log throttle drops it). ``r_busy`` None: no busy rejection."""
        self._debt[0] += np.where(self.logged, r_lim * self.clients.rejection_log_share, 0.0)
        if r_busy is not None:
            self._debt[1] += np.where(self.logged, r_busy, 0.0)
        lines = np.floor(self._debt + 1e-9)
        if not np.count_nonzero(lines):
            return
        self._debt -= lines
        cap = self.clients.log_lines_per_minute
        if cap:
            minute = k // self.ticks_per_minute
            if minute != self._log_minute:
                self._log_minute, self._log_used = minute, np.zeros_like(self._log_used)
            total = lines.sum(axis=(0, 2))
            room = np.maximum(cap - self._log_used, 0.0)
            if np.any(total > room):
                scale = np.where(total > room, room / np.maximum(total, 1.0), 1.0)
                lines = np.floor(lines * scale[None, :, None] + 1e-9)
            self._log_used += lines.sum(axis=(0, 2))
            if not np.count_nonzero(lines):
                return
        rj = self.rejections
        busy, i, s = np.nonzero(lines)
        rj.tick.extend([k] * len(i))
        rj.pair.extend(i.tolist())
        rj.stream.extend(s.tolist())
        rj.busy.extend((busy != 0).tolist())
        rj.count.extend(lines[busy, i, s].astype(np.int64).tolist())
        rj.limit.extend(self.limit[i].tolist())
        rj.queue.extend(self.queues.queue[self.pair_broker[i]].tolist())
