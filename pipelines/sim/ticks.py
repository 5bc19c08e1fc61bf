"""The broker model's rules for one tick, vectorised with numpy: the in-broker limiter and the send queue.

One owner of these rules: :func:`pipelines.sim.broker_model.simulate` (a whole run, limits known in advance) and
:class:`pipelines.sim.cluster.ClosedLoopCluster` (minute by minute, limits as the governor publishes them) both
step these two classes. Units: requests and write units per tick; ``dt`` in seconds.

* :class:`TokenBuckets` — one token bucket per (broker, resource) pair with article 001's circuit breaker, the
  semantics of Sohu's ``TokenBucketRateLimiter`` (sohutv/rocketmq 5.3.1-sohu-01,
  ``broker/util/TokenBucketRateLimiter.java``): tokens refill at ``limit_qps`` up to ``burst``; a request that
  finds no token opens the breaker, which rejects everything for ``breaker_open_ms`` (1 s), then token-bucket
  limiting resumes. Fluid: within a tick the pair admits what its tokens allow and the rest is rejected; the breaker
  opens when the tokens run out, inside that tick, so the tick counts towards its open time (otherwise a persisting
  overload would be admitted at ``1 / (1 + tick)`` of the limit: 0.91 at 0.1 s ticks, 0.67 at 0.5 s).
* :class:`SendQueues` — one FIFO send queue per broker served at its capacity; when the head of the queue has
  waited ``waitTimeMillsInSendQueue`` (200 ms) ``BrokerFastFailure`` drops the expired requests with
  ``[TIMEOUT_CLEAN_QUEUE]broker busy`` (docs/rocketmq-formats.md §5). Fast failure does not tell resources apart:
  in a tick where the queue overflows every request that arrived loses the same share.

The limiter stands in front of the queue (Sohu's ``RateLimitHandler`` is a Netty handler ahead of the send
processor), so a rejected request costs the queue nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Tolerance when comparing refilled tokens with the requests of a tick.
_EPS = 1e-9


@dataclass
class TokenBuckets:
    """Token buckets with breakers for ``n`` pairs. ``tokens`` (requests) and ``open_left`` (ticks the breaker
    stays open) are the state; a pair without a limit in force has no breaker and keeps one token."""

    tokens: np.ndarray
    open_left: np.ndarray
    _reset: bool = False  # tokens and breakers as without a limit (nothing to reset again)

    @classmethod
    def empty(cls, n: int) -> "TokenBuckets":
        return cls(tokens=np.ones(n), open_left=np.zeros(n, dtype=np.int64))

    @property
    def at_rest(self) -> bool:
        """Whether the buckets are as a tick without any limit leaves them (one token per pair, no breaker open):
        then :meth:`admit` without limits admits every request and changes nothing."""
        return self._reset

    def admit(self, offered: np.ndarray, limit: np.ndarray, burst: np.ndarray, open_ticks: np.ndarray | int,
              dt: float, prepared: tuple | None = None) -> np.ndarray:
        """One tick: ``offered`` requests per pair, ``limit`` (requests/s, NaN = no limit in force), ``burst``
        (requests), ``open_ticks`` (the breaker's open time in ticks, per pair or one for all) → admitted
        requests per pair (the rest is rejected by the limiter). ``prepared``: :meth:`prepare` of the same limits
        (what does not change from tick to tick while they are in force)."""
        has, refill, open_max = prepared if prepared is not None else self.prepare(limit, open_ticks, dt)
        if has is None:
            if not self._reset:
                self.tokens = np.ones_like(self.tokens)
                self.open_left[:] = 0
                self._reset = True
            return offered.copy()
        self._reset = False
        is_open = has & (self.open_left > 0)
        closed = has & ~is_open
        self.tokens = np.where(has, np.minimum(burst, self.tokens + refill), 1.0)
        short = closed & (offered > self.tokens + _EPS)
        admitted = np.where(is_open, 0.0, np.where(short, self.tokens, offered))
        admitted = np.where(has, admitted, offered)
        self.tokens = np.where(closed, self.tokens - admitted, self.tokens)
        left = np.where(is_open, self.open_left - 1, self.open_left)
        left = np.where(short, open_max, left)  # this tick is the first open one
        self.open_left = np.where(has, left, 0)
        return admitted

    @staticmethod
    def prepare(limit: np.ndarray, open_ticks: np.ndarray | int, dt: float) -> tuple:
        """(pairs with a limit in force, or None when none is; tokens refilled per tick; the breaker's open ticks
        after its first) of limits in force: :meth:`admit` computes them once per change of the limits."""
        has = ~np.isnan(limit)
        if not has.any():
            return None, None, None
        return has, np.nan_to_num(limit) * dt, np.maximum(np.asarray(open_ticks) - 1, 0)


@dataclass
class SendQueues:
    """One send queue per broker: ``queue`` (write units waiting), ``capacity`` (units/s served), ``wait_s``
    (``waitTimeMillsInSendQueue`` in seconds)."""

    queue: np.ndarray
    capacity: np.ndarray
    wait_s: float

    @classmethod
    def empty(cls, capacity: np.ndarray, wait_ms: float) -> "SendQueues":
        return cls(queue=np.zeros(len(capacity)), capacity=np.asarray(capacity, dtype=float), wait_s=wait_ms / 1000.0)

    def serve(self, arrivals: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One tick: ``arrivals`` (write units per broker that passed the limiters) → (busy-rejected share of
        what arrived, per broker; units served; the head's wait in seconds after the tick)."""
        q = self.queue + arrivals
        served = np.minimum(q, self.capacity * dt)
        q = q - served
        over = np.maximum(q - self.capacity * self.wait_s, 0.0)
        if np.count_nonzero(over):
            q = q - over
            share = np.where(arrivals > 0, np.minimum(over / np.where(arrivals > 0, arrivals, 1.0), 1.0), 0.0)
        else:  # nothing expired (the usual case)
            share = np.zeros_like(q)
        self.queue = q
        return share, served, q / self.capacity
