"""Article 001's in-broker limiter: a token bucket that never sleeps, guarded by a short circuit breaker.

Sources: article 001 (``TokenBucketRateLimiter``: Guava's token bucket without the sleep and with a circuit
breaker), article 000 (``setRate`` on a live limiter). Units: qps = requests per second; ``breaker_open_ms``
milliseconds; limiter clocks are in seconds (monotonic unless a ``now`` is given).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["TokenBucketRateLimiter", "default_burst", "check_qps", "check_open_ms"]

#: Tolerance when comparing refilled (floating point) tokens with the permits asked for.
_EPS = 1e-9


def default_burst(qps: float) -> float:
    """Default bucket capacity: one second of tokens, ``max(1, qps)`` (at least one whole request)."""
    return max(1.0, float(qps))


def check_qps(qps: float) -> float:
    if isinstance(qps, bool) or not isinstance(qps, (int, float)) or not math.isfinite(qps) or qps <= 0:
        raise ValueError(f"qps must be a finite number > 0, got {qps!r}")
    return float(qps)


def _check_burst(burst: int | float | None, qps: float) -> float:
    if burst is None:
        return default_burst(qps)
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not math.isfinite(burst) or burst < 1:
        raise ValueError(f"burst must be >= 1, got {burst!r}")
    return float(burst)


def check_open_ms(breaker_open_ms: int) -> int:
    if isinstance(breaker_open_ms, bool) or not isinstance(breaker_open_ms, int) or breaker_open_ms < 0:
        raise ValueError(f"breaker_open_ms must be an int >= 0, got {breaker_open_ms!r}")
    return breaker_open_ms


class TokenBucketRateLimiter:
    """Article 001's limiter: a token bucket that never sleeps, guarded by a circuit breaker.

    - Tokens refill continuously at ``qps`` per second up to the capacity ``burst``
      (default :func:`default_burst`: one second of tokens, ``max(1, qps)``).
    - The bucket starts with ``min(burst, 1)`` token, i.e. one request can pass at once, like a
      fresh Guava ``RateLimiter`` whose first acquisition is always immediate; it is *not* full.
    - :meth:`try_acquire` takes ``permits`` tokens if they are there and returns True; it never
      waits. When the tokens are not there the circuit breaker OPENS: that request and every
      request during the next ``breaker_open_ms`` are rejected at once, without touching the
      bucket. When the breaker closes, ordinary token-bucket limiting resumes with whatever tokens
      refilled meanwhile.
    - A rejection never borrows from the future. Guava's ``RateLimiter.acquire()`` pays for a
      burst by pushing ``nextFreeTicketMicros`` ahead (qps 1 and 10 requests: the next 9 s are all
      rejected); here the cost of a burst is bounded by ``breaker_open_ms``.

    Differences from the article's Java code, on purpose: the breaker stays open for
    ``breaker_open_ms`` measured from the rejection that opened it (the Java code measures from
    ``nextFreeTicketMicros``); a request for more permits than ``burst`` can never be served and is
    rejected without opening the breaker (so one oversized request cannot block a resource).

    ``clock`` returns seconds (``time.monotonic`` by default); every method also accepts an explicit
    ``now`` in the clock's seconds. A clock that goes backwards refills nothing and shifts an open
    breaker's deadline back by the same amount (its remaining open time is kept). Thread-safe.
    """

    def __init__(
        self,
        qps: float,
        burst: int | None = None,
        breaker_open_ms: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        *,
        now: float | None = None,
    ) -> None:
        self._qps = check_qps(qps)
        self._capacity = _check_burst(burst, self._qps)
        self._open_s = check_open_ms(breaker_open_ms) / 1000.0
        self._breaker_open_ms = breaker_open_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._last = clock() if now is None else float(now)
        self._tokens = min(self._capacity, 1.0)
        self._open_until: float | None = None
        self.passed = 0
        self.rejected = 0
        self.breaker_trips = 0

    # -- internals (lock held) ---------------------------------------------------------------
    def _advance(self, now: float) -> None:
        elapsed = now - self._last
        if elapsed > 0:
            self._tokens = min(self._capacity, self._tokens + elapsed * self._qps)
        elif elapsed < 0 and self._open_until is not None:
            self._open_until += elapsed  # clock went backwards: keep the remaining open time
        self._last = now

    def _breaker_open(self, now: float) -> bool:
        if self._open_until is not None and now >= self._open_until:
            self._open_until = None  # breaker closes; normal token-bucket limiting resumes
        return self._open_until is not None

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else float(now)

    # -- public API ----------------------------------------------------------------------------
    def try_acquire(self, permits: int = 1, now: float | None = None) -> bool:
        """Take ``permits`` tokens now if possible; never sleeps.

        Returns False while the breaker is open; opens it (for ``breaker_open_ms``) when the
        tokens are not there. ``now`` overrides the clock (seconds).
        """
        if isinstance(permits, bool) or not isinstance(permits, int) or permits < 1:
            raise ValueError(f"permits must be an int >= 1, got {permits!r}")
        with self._lock:
            t = self._now(now)
            self._advance(t)
            if self._breaker_open(t):
                self.rejected += 1
                return False
            if self._tokens + _EPS >= permits:
                self._tokens = max(0.0, self._tokens - permits)
                self.passed += 1
                return True
            self.rejected += 1
            if permits > self._capacity:
                return False  # can never be served; do not punish the other requests
            if self._open_s > 0:
                self._open_until = t + self._open_s
                self.breaker_trips += 1
            return False

    def set_rate(
        self,
        qps: float,
        burst: int | None = None,
        breaker_open_ms: int | None = None,
        *,
        now: float | None = None,
    ) -> None:
        """Change a live limiter (article 000 ``setRate``).

        Tokens earned so far are counted at the old rate, then the new rate and capacity apply
        (``burst=None``: the default, one second of tokens at the new rate); tokens above the new
        capacity are dropped. An open breaker stays open until its deadline;
        ``breaker_open_ms=None`` keeps the current open time for future trips. ``now`` overrides
        the clock (seconds).
        """
        new_qps = check_qps(qps)
        new_capacity = _check_burst(burst, new_qps)
        new_open_ms = self._breaker_open_ms if breaker_open_ms is None else check_open_ms(breaker_open_ms)
        with self._lock:
            self._advance(self._now(now))
            self._qps = new_qps
            self._capacity = new_capacity
            self._tokens = min(self._tokens, new_capacity)
            self._breaker_open_ms = new_open_ms
            self._open_s = new_open_ms / 1000.0

    @property
    def qps(self) -> float:
        """Refill rate, messages per second."""
        return self._qps

    @property
    def burst(self) -> float:
        """Bucket capacity, messages."""
        return self._capacity

    @property
    def breaker_open_ms(self) -> int:
        """How long the breaker stays open after a trip, milliseconds."""
        return self._breaker_open_ms

    @property
    def breaker_open_until(self) -> float | None:
        """Clock time (seconds) at which the open breaker closes; None when it is closed."""
        return self._open_until

    def state_at(self, now: float | None = None) -> str:
        """``"open"`` or ``"closed"`` at ``now`` (default: the clock), without side effects."""
        t = self._now(now)
        until = self._open_until
        return "open" if until is not None and t < until else "closed"

    @property
    def state(self) -> str:
        """``"open"`` or ``"closed"`` at the clock's current time."""
        return self.state_at()

    def tokens_at(self, now: float | None = None) -> float:
        """Tokens that would be in the bucket at ``now`` (default: the clock), without side effects."""
        t = self._now(now)
        elapsed = max(0.0, t - self._last)
        return min(self._capacity, self._tokens + elapsed * self._qps)

    def __repr__(self) -> str:
        return (f"TokenBucketRateLimiter(qps={self._qps}, burst={self._capacity}, "
                f"breaker_open_ms={self._breaker_open_ms}, state={self.state})")
