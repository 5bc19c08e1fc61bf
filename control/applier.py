"""Reference applier: what a broker runs to apply rate-governor's control records.

Sources: article 001 (``TokenBucketRateLimiter``: Guava's token bucket without the sleep and with a
circuit breaker; one limiter per topic, or per consumer group for ``CONSUMER_SEND_MSG_BACK`` retry
traffic; fail open), article 000 (``setRate`` on a live limiter), docs/contracts.md §3 (a record is applied
only if its signature verifies and it has not expired; otherwise the default stays; an expired limit
falls back to the default).

Units: qps = messages (requests) per second; ``breaker_open_ms`` milliseconds; limiter clocks are in
seconds; ``now_ms`` is epoch milliseconds (UTC); ``expires_at`` is a UTC instant.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from control import record as cr
from control.limits_file import read_limits_file
from control.token_bucket import TokenBucketRateLimiter, check_open_ms, check_qps, default_burst

__all__ = ["TokenBucketRateLimiter", "LimitApplier", "Decision", "LoadResult", "default_burst"]

log = logging.getLogger("rate_governor.applier")

@dataclass(frozen=True)
class Decision:
    """What the applier decided for one request.

    ``allowed``: what the broker does (False = reply ``SYSTEM_BUSY`` / ``rateLimit``).
    ``would_allow``: what the record's limit would have done; differs from ``allowed`` only for
    ``advisory`` records, which are never enforced. ``source``: ``"record"`` when a live record
    governs the resource, ``"default"`` otherwise. ``limit_qps``: the governing limit (None =
    unlimited).
    """

    allowed: bool
    would_allow: bool
    mode: str
    source: str
    limit_qps: float | None


@dataclass(frozen=True)
class LoadResult:
    """Summary of :meth:`LimitApplier.load_file`."""

    applied: int = 0
    refused: int = 0
    lifted: int = 0
    error: str | None = None


@dataclass
class _Entry:
    record: dict[str, Any] | None = None   # last good, live record (None: default applies)
    expires: datetime | None = None
    max_version: int | None = None         # highest version ever applied (kept across lifts)
    limiter: TokenBucketRateLimiter | None = None  # the enforcing limiter (record or default)
    limiter_cfg: tuple | None = None
    shadow: TokenBucketRateLimiter | None = None   # advisory records: what would have happened
    shadow_cfg: tuple | None = None


Key = str  # "<resource_type>:<resource>"


class LimitApplier:
    """Holds one limiter per ``(resource_type, resource)`` and applies signed control records.

    - ``key``: the HMAC signing key (bytes); records that do not verify with it are refused.
    - ``default_qps``: the limit of a resource without a live record; ``None`` = unlimited.
      ``default_qps_by_type`` overrides it per resource type (e.g. ``{"group": 50.0}``, the
      article's separate ``sendMsgBackLimitQps`` for retry traffic).
    - ``default_burst`` / ``breaker_open_ms``: used for default limits.
    - ``clock``: wall clock, epoch seconds (``time.time``); it serves both expiry (``expires_at``
      is wall time) and the buckets. ``now``/``now_ms`` arguments override it.
    - ``broker``: the name of the broker this applier runs on (RocketMQ ``brokerName``). A record
      with per-broker figures (``brokers``, docs/contracts.md §3) is applied at this broker's own
      share (:func:`control.record.broker_limit`); None applies the cluster-wide ``limit_qps``.

    :meth:`apply` refuses (logs a warning on ``rate_governor.applier``, appends ``(key, reason)``
    to :attr:`refused`, returns False) anything that is forged, tampered, expired, malformed or
    older than the version already applied for that resource; the resource keeps its last good
    limit, or the default. A tombstone lifts the limit back to the default. ``advisory`` records
    are kept and evaluated but never enforced: the default limit (if any) keeps governing.
    """

    def __init__(
        self,
        key: bytes | None,
        default_qps: float | None = None,
        *,
        default_qps_by_type: Mapping[str, float | None] | None = None,
        default_burst: int | None = None,
        breaker_open_ms: int = 1000,
        clock: Callable[[], float] = time.time,
        broker: str | None = None,
    ) -> None:
        self._key = key or b""
        self.broker = broker
        if default_qps is not None:
            check_qps(default_qps)
        self._default_qps = default_qps
        self._default_by_type = dict(default_qps_by_type or {})
        for v in self._default_by_type.values():
            if v is not None:
                check_qps(v)
        self._default_burst = default_burst
        self._breaker_open_ms = check_open_ms(breaker_open_ms)
        self._clock = clock
        self._lock = threading.RLock()
        self._entries: dict[Key, _Entry] = {}
        self.refused: list[tuple[Key, str]] = []

    # -- helpers ---------------------------------------------------------------------------------
    def _now_dt(self, now: datetime | None) -> datetime:
        if now is None:
            return datetime.fromtimestamp(self._clock(), tz=timezone.utc)
        return now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now.astimezone(timezone.utc)

    def _refuse(self, key: Key, reason: str) -> bool:
        log.warning("refused control record for %s: %s", key, reason)
        self.refused.append((key, reason))
        return False

    def default_for(self, resource_type: str) -> float | None:
        """The default limit (qps) of a resource type; None = unlimited."""
        if resource_type in self._default_by_type:
            return self._default_by_type[resource_type]
        return self._default_qps

    @staticmethod
    def _guess_key(value: Any) -> Key:
        if isinstance(value, Mapping):
            rt, res = value.get("resource_type"), value.get("resource")
            if isinstance(rt, str) and isinstance(res, str):
                return f"{rt}:{res}"
        return "?"

    # -- applying records ------------------------------------------------------------------------
    def apply(self, record_or_tombstone: Any, now: datetime | None = None) -> bool:
        """Verify and apply one control record; True when applied (or a limit lifted).

        Accepts a record mapping, or a ``(key, value)`` pair as read from the compacted topic:
        ``key`` is ``"<resource_type>:<resource>"`` (str or bytes), ``value`` is the record
        (mapping, or JSON str/bytes) or ``None`` for a tombstone, which lifts the limit back to
        the default. With a pair, the key must match the record's own resource.
        ``now`` (naive = UTC) is the instant used for the expiry check; default: the clock.
        """
        t = self._now_dt(now)
        record = record_or_tombstone
        if isinstance(record_or_tombstone, tuple):
            if len(record_or_tombstone) != 2:
                return self._refuse("?", "malformed (key, value) pair")
            raw_key, value = record_or_tombstone
            try:
                rtype, resource = cr.parse_key(raw_key)
            except (ValueError, UnicodeDecodeError, AttributeError, TypeError) as exc:
                return self._refuse(str(raw_key), str(exc))
            key = f"{rtype}:{resource}"
            if value is None:
                self.lift(rtype, resource)
                return True
            if isinstance(value, (bytes, bytearray, str)):
                try:
                    value = json.loads(value)
                except (ValueError, UnicodeDecodeError) as exc:
                    return self._refuse(key, f"malformed JSON: {exc}")
            if self._guess_key(value) not in (key, "?"):
                return self._refuse(key, f"key mismatch: record is for {self._guess_key(value)}")
            record = value

        key = self._guess_key(record)
        result = cr.verify(record, self._key, t)
        if not result.ok:
            return self._refuse(key, result.reason)

        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
            version = record["version"]
            if entry.max_version is not None and version < entry.max_version:
                return self._refuse(key, f"stale version {version} < {entry.max_version} already applied")
            entry.record = dict(record)
            entry.expires = cr.parse_expires_at(record["expires_at"])
            entry.max_version = version
            self._sync(key, entry, t.timestamp())  # the new rate counts from now (set_rate)
        qps, burst = cr.broker_limit(record, self.broker)
        log.info("applied control record %s: %s qps here (burst %s, cluster-wide %s qps, %s) until %s, version %s",
                 key, qps, burst, record["limit_qps"], record["mode"], record["expires_at"], version)
        return True

    def lift(self, resource_type: str, resource: str) -> None:
        """Drop the record of a resource (tombstone): its limit falls back to the default."""
        key = f"{resource_type}:{resource}"
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.record is not None:
                entry.record = None
                entry.expires = None
                log.info("lifted limit for %s: back to default", key)

    def load_file(self, path: Any, now: datetime | None = None) -> LoadResult:
        """Apply every record of a ``limits.json`` file (the whole current set, docs/contracts.md §3).

        Resources holding a record that are absent from the file are lifted (the file is the
        whole set). Refused records keep their resource's last good limit. An unreadable or
        malformed file changes nothing and is logged as a refusal with key ``file:<path>``.
        """
        try:
            records = read_limits_file(path)
        except (OSError, ValueError) as exc:
            self._refuse(f"file:{path}", f"cannot read limits file: {exc}")
            return LoadResult(error=str(exc))
        applied = refused = 0
        present: set[Key] = set()
        for rec in records:
            present.add(self._guess_key(rec))
            if self.apply(rec, now):
                applied += 1
            else:
                refused += 1
        lifted = 0
        with self._lock:
            for key, entry in self._entries.items():
                if entry.record is not None and key not in present:
                    rtype, _, resource = key.partition(":")
                    self.lift(rtype, resource)
                    lifted += 1
        return LoadResult(applied=applied, refused=refused, lifted=lifted)

    # -- limiting ------------------------------------------------------------------------------
    def current_record(self, resource_type: str, resource: str, now_ms: int | None = None) -> dict | None:
        """The live record governing a resource (None: default applies); expired ones are dropped."""
        t_s = self._clock() if now_ms is None else now_ms / 1000.0
        with self._lock:
            entry = self._entries.get(f"{resource_type}:{resource}")
            if entry is None:
                return None
            self._expire(f"{resource_type}:{resource}", entry, t_s)
            return None if entry.record is None else dict(entry.record)

    def _expire(self, key: Key, entry: _Entry, t_s: float) -> None:
        if entry.record is not None and entry.expires is not None and entry.expires.timestamp() <= t_s:
            log.info("limit for %s expired at %s: back to default (fail open)", key, entry.record["expires_at"])
            entry.record = None
            entry.expires = None

    @staticmethod
    def _sync_limiter(current: TokenBucketRateLimiter | None, current_cfg: tuple | None,
                      cfg: tuple | None, t_s: float) -> tuple[TokenBucketRateLimiter | None, tuple | None]:
        if cfg is None:
            return None, None
        if current is None:
            qps, burst, open_ms = cfg
            return TokenBucketRateLimiter(qps, burst, open_ms, now=t_s), cfg
        if cfg != current_cfg:
            qps, burst, open_ms = cfg
            current.set_rate(qps, burst, open_ms, now=t_s)
        return current, cfg

    def _sync(self, key: Key, entry: _Entry, t_s: float) -> tuple[tuple | None, tuple | None]:
        """Drop an expired record, then bring the entry's limiters in line with what governs it.

        Returns ``(enforce_cfg, shadow_cfg)``, each ``(qps, burst, breaker_open_ms)`` or None
        (None enforce = unlimited; shadow only for advisory records). Lock held.
        """
        self._expire(key, entry, t_s)
        rec = entry.record
        default = self.default_for(key.partition(":")[0])
        default_cfg = None if default is None else (float(default), self._default_burst, self._breaker_open_ms)
        if rec is not None:
            qps, burst = cr.broker_limit(rec, self.broker)
            rec_cfg = (qps, burst, rec["breaker_open_ms"])
            advisory = rec["mode"] == "advisory"
        else:
            rec_cfg, advisory = None, False
        enforce_cfg = default_cfg if (rec is None or advisory) else rec_cfg
        shadow_cfg = rec_cfg if advisory else None
        entry.limiter, entry.limiter_cfg = self._sync_limiter(entry.limiter, entry.limiter_cfg, enforce_cfg, t_s)
        entry.shadow, entry.shadow_cfg = self._sync_limiter(entry.shadow, entry.shadow_cfg, shadow_cfg, t_s)
        return enforce_cfg, shadow_cfg

    def decide(self, resource_type: str, resource: str, now_ms: int | None = None, permits: int = 1) -> Decision:
        """Evaluate one request of ``permits`` messages for a resource at ``now_ms`` (epoch ms)."""
        t_s = self._clock() if now_ms is None else now_ms / 1000.0
        key = f"{resource_type}:{resource}"
        default = self.default_for(resource_type)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                if default is None:
                    return Decision(True, True, "enforce", "default", None)
                entry = self._entries.setdefault(key, _Entry())
            enforce_cfg, shadow_cfg = self._sync(key, entry, t_s)
            rec = entry.record
            advisory = shadow_cfg is not None

            allowed = True if entry.limiter is None else entry.limiter.try_acquire(permits, now=t_s)
            if advisory:
                would = entry.shadow.try_acquire(permits, now=t_s)
                return Decision(allowed, would, "advisory", "record", shadow_cfg[0])
            source = "record" if rec is not None else "default"
            limit = enforce_cfg[0] if enforce_cfg is not None else None
            return Decision(allowed, allowed, "enforce", source, limit)

    def try_acquire(self, resource_type: str, resource: str, now_ms: int | None = None, permits: int = 1) -> bool:
        """True when the request may pass (never sleeps); False = reject with ``rateLimit``."""
        return self.decide(resource_type, resource, now_ms, permits).allowed

    def limiter(self, resource_type: str, resource: str) -> TokenBucketRateLimiter | None:
        """The enforcing limiter of a resource, if one exists yet (for inspection)."""
        with self._lock:
            entry = self._entries.get(f"{resource_type}:{resource}")
            return None if entry is None else entry.limiter
