"""The control record: one signed rate limit for one resource, as written back to the brokers.

Source: docs/contracts.md §3 (the control record), article 001 (per-topic / per-consumer-group
``TokenBucketRateLimiter`` with circuit breaker; ``sendMsgBackLimitQps`` for retry traffic).

Shape (one JSON object per resource)::

    {"resource_type": "group", "resource": "get-pugc-to-ai-consumer", "limit_qps": 40.0,
     "burst": 40, "breaker_open_ms": 1000, "mode": "enforce",
     "expires_at": "2026-11-22T10:15:00Z", "version": 17, "reason": "...",
     "signature": "<hex HMAC-SHA256 of the other fields>"}

Fields and units:

- ``resource_type``: ``"topic"`` (put traffic of a topic) or ``"group"`` (retry traffic of a
  consumer group, i.e. ``CONSUMER_SEND_MSG_BACK``, article 001).
- ``resource``: the topic or consumer-group name (non-empty string).
- ``limit_qps``: the limit in messages (requests) per second; a finite number > 0.
- ``burst``: token-bucket capacity in messages (int >= 1), or ``null`` for the limiter's default
  (one second of tokens, ``max(1, limit_qps)``).
- ``breaker_open_ms``: how long the limiter's circuit breaker stays open after a rejection,
  in milliseconds (int >= 0; article 001's ``circuitBreakerOpenTime``, default 1000 ms).
- ``mode``: ``"enforce"`` (the broker rejects over-limit requests) or ``"advisory"`` (the broker
  only records what it would have rejected).
- ``expires_at``: UTC instant, exactly ``YYYY-MM-DDTHH:MM:SSZ``; at or after it the limit no
  longer applies and the broker falls back to its default (fail open).
- ``version``: int >= 0, increasing per decision.
- ``reason``: a sentence for people.
- ``signature``: lowercase hex HMAC-SHA256, keyed with the shared signing key, of
  :func:`canonical_json` of the record (every field except ``signature`` itself, so extra
  fields are covered by the signature too).

Optional, signed like every other field:

- ``brokers``: each broker's own share of the limit, ``{"<brokerName>": {"limit_qps": q,
  "burst": b}, ..., "*": {...}}``. A broker's token bucket is local (article 001; one limiter
  per broker), so ``limit_qps`` above stays the cluster-wide figure the decision's reason speaks
  of and each broker applies its own share (:func:`broker_limit`); the shares of the listed
  brokers add up to ``limit_qps``. ``"*"`` is the figure of any broker not listed (a broker that
  starts carrying the resource after the decision). A record without ``brokers`` (an older
  governor) applies ``limit_qps`` on every broker.

The file sink (docs/contracts.md §3) is ``<lake>/control/limits.json`` holding the whole current set,
replaced atomically: :mod:`control.limits_file` (its two functions are importable from here too). The written
form of ``expires_at`` is :mod:`control.timestamps` (its names are importable from here too).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from control.limits_file import read_limits_file, write_limits_file
from control.timestamps import EXPIRES_AT_FORMAT, format_expires_at, parse_expires_at


__all__ = [
    "FIELDS",
    "SIGNATURE_FIELD",
    "RESOURCE_TYPES",
    "MODES",
    "EXPIRES_AT_FORMAT",
    "SigningKeyError",
    "VerifyResult",
    "canonical_json",
    "sign",
    "validate",
    "verify",
    "record_key",
    "parse_key",
    "parse_expires_at",
    "format_expires_at",
    "load_signing_key",
    "broker_limit",
    "BROKERS_FIELD",
    "ANY_BROKER",
    "write_limits_file",
    "read_limits_file",
]

#: The signed fields of a control record, in the order of docs/contracts.md §3.
FIELDS: tuple[str, ...] = (
    "resource_type",
    "resource",
    "limit_qps",
    "burst",
    "breaker_open_ms",
    "mode",
    "expires_at",
    "version",
    "reason",
)
SIGNATURE_FIELD = "signature"
#: Optional field: per-broker shares of the limit (module docstring); ``ANY_BROKER`` keys the figure of an
#: unlisted broker.
BROKERS_FIELD = "brokers"
ANY_BROKER = "*"
RESOURCE_TYPES: frozenset[str] = frozenset({"topic", "group"})
MODES: frozenset[str] = frozenset({"enforce", "advisory"})
_HEX_SHA256_RE = re.compile(r"[0-9a-f]{64}")


class SigningKeyError(Exception):
    """The signing key cannot be loaded (named key file missing, unreadable or empty) or is empty."""


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify` / :func:`validate`: ``ok`` and, when refused, a specific ``reason``."""

    ok: bool
    reason: str = "ok"

    def __bool__(self) -> bool:
        return self.ok


_OK = VerifyResult(True, "ok")


def _refuse(reason: str) -> VerifyResult:
    return VerifyResult(False, reason)


# --------------------------------------------------------------------------------------------
# canonical form and signature
# --------------------------------------------------------------------------------------------

def canonical_json(record: Mapping[str, Any]) -> bytes:
    """The bytes that are signed: every field of ``record`` except ``signature``, as compact JSON.

    Sorted keys, separators ``(",", ":")``, ``ensure_ascii=False``, UTF-8; numbers rendered by
    Python's ``json`` (``40.0`` stays ``40.0``, ``40`` stays ``40``). NaN/Infinity are not JSON
    and raise ``ValueError``.
    """
    body = {k: v for k, v in record.items() if k != SIGNATURE_FIELD}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _check_key(key: bytes) -> bytes:
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise SigningKeyError("signing key must be non-empty bytes")
    return bytes(key)


def _signature(record: Mapping[str, Any], key: bytes) -> str:
    return hmac.new(key, canonical_json(record), hashlib.sha256).hexdigest()


def sign(record: Mapping[str, Any], key: bytes) -> dict[str, Any]:
    """Return a copy of ``record`` with ``signature`` = hex HMAC-SHA256(key, canonical_json(record)).

    An existing ``signature`` is replaced. Raises :class:`SigningKeyError` for an empty key and
    ``ValueError`` for non-finite numbers (they have no JSON form). The record is not otherwise
    validated; use :func:`validate` first when in doubt.
    """
    key = _check_key(key)
    out = {k: v for k, v in record.items() if k != SIGNATURE_FIELD}
    out[SIGNATURE_FIELD] = _signature(out, key)
    return out


# --------------------------------------------------------------------------------------------
# validation and verification
# --------------------------------------------------------------------------------------------

def _as_utc(now: datetime) -> datetime:
    if now.tzinfo is None:
        return now.replace(tzinfo=timezone.utc)
    return now.astimezone(timezone.utc)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def validate(record: Any) -> VerifyResult:
    """Check shape, types and values of a control record; no signature or expiry check.

    Refusal reasons (in the order checked): ``not a JSON object``, ``missing field: <f>``,
    ``wrong type: <f> ...``, ``limit_qps is not finite``, ``limit_qps must be > 0``,
    ``burst must be >= 1``, ``breaker_open_ms must be >= 0``, ``version must be >= 0``,
    ``empty resource``, ``unknown resource_type``, ``unknown mode``, ``malformed expires_at``,
    ``malformed signature`` (only when a ``signature`` is present).
    """
    if not isinstance(record, Mapping):
        return _refuse(f"not a JSON object: {type(record).__name__}")
    for name in FIELDS:
        if name not in record:
            return _refuse(f"missing field: {name}")

    r = record
    if not isinstance(r["resource_type"], str):
        return _refuse("wrong type: resource_type must be a string")
    if not isinstance(r["resource"], str):
        return _refuse("wrong type: resource must be a string")
    if not _is_number(r["limit_qps"]):
        return _refuse("wrong type: limit_qps must be a number")
    if r["burst"] is not None and not _is_int(r["burst"]):
        return _refuse("wrong type: burst must be an integer or null")
    if not _is_int(r["breaker_open_ms"]):
        return _refuse("wrong type: breaker_open_ms must be an integer")
    if not isinstance(r["mode"], str):
        return _refuse("wrong type: mode must be a string")
    if not isinstance(r["expires_at"], str):
        return _refuse("wrong type: expires_at must be a string")
    if not _is_int(r["version"]):
        return _refuse("wrong type: version must be an integer")
    if not isinstance(r["reason"], str):
        return _refuse("wrong type: reason must be a string")
    if SIGNATURE_FIELD in r and not isinstance(r[SIGNATURE_FIELD], str):
        return _refuse("wrong type: signature must be a string")

    qps = r["limit_qps"]
    if isinstance(qps, float) and not math.isfinite(qps):
        return _refuse(f"limit_qps is not finite: {qps!r}")
    if qps <= 0:
        return _refuse(f"limit_qps must be > 0, got {qps!r}")
    if r["burst"] is not None and r["burst"] < 1:
        return _refuse(f"burst must be >= 1, got {r['burst']!r}")
    if r["breaker_open_ms"] < 0:
        return _refuse(f"breaker_open_ms must be >= 0, got {r['breaker_open_ms']!r}")
    if r["version"] < 0:
        return _refuse(f"version must be >= 0, got {r['version']!r}")
    if not r["resource"]:
        return _refuse("empty resource")
    if r["resource_type"] not in RESOURCE_TYPES:
        return _refuse(f"unknown resource_type: {r['resource_type']!r} (expected topic|group)")
    if r["mode"] not in MODES:
        return _refuse(f"unknown mode: {r['mode']!r} (expected enforce|advisory)")
    try:
        parse_expires_at(r["expires_at"])
    except ValueError:
        return _refuse(f"malformed expires_at: {r['expires_at']!r} (expected YYYY-MM-DDTHH:MM:SSZ)")
    if SIGNATURE_FIELD in r and not _HEX_SHA256_RE.fullmatch(r[SIGNATURE_FIELD].lower()):
        return _refuse("malformed signature: expected 64 hex characters")
    if BROKERS_FIELD in r:
        return _validate_brokers(r[BROKERS_FIELD])
    return _OK


def _validate_brokers(brokers: Any) -> VerifyResult:
    """Shape of the optional ``brokers`` field: a non-empty object of broker name → ``{limit_qps, burst}``."""
    if not isinstance(brokers, Mapping) or not brokers:
        return _refuse("wrong type: brokers must be a non-empty object")
    for name, share in brokers.items():
        if not isinstance(name, str) or not name:
            return _refuse("brokers: empty broker name")
        if not isinstance(share, Mapping) or "limit_qps" not in share:
            return _refuse(f"brokers[{name}]: expected an object with limit_qps")
        qps, burst = share["limit_qps"], share.get("burst")
        if not _is_number(qps) or (isinstance(qps, float) and not math.isfinite(qps)) or qps <= 0:
            return _refuse(f"brokers[{name}]: limit_qps must be a finite number > 0, got {qps!r}")
        if burst is not None and (not _is_int(burst) or burst < 1):
            return _refuse(f"brokers[{name}]: burst must be an integer >= 1 or null, got {burst!r}")
    return _OK


def broker_limit(record: Mapping[str, Any], broker: str | None) -> tuple[float, int | None]:
    """``(limit_qps, burst)`` that ``broker`` applies for a valid record: its own entry of ``brokers``, else the
    ``"*"`` entry, else the record's ``limit_qps`` / ``burst`` (a record without per-broker figures, or an applier
    that does not know its broker name: ``broker`` None).

    Example:
        >>> broker_limit({"limit_qps": 40.0, "burst": 40,
        ...               "brokers": {"broker-a": {"limit_qps": 30.0, "burst": 30},
        ...                           "broker-b": {"limit_qps": 10.0, "burst": 10},
        ...                           "*": {"limit_qps": 10.0, "burst": 10}}}, "broker-a")
        (30.0, 30)
    """
    brokers = record.get(BROKERS_FIELD) or {}
    share = brokers.get(broker) if broker is not None else None
    if share is None and broker is not None:
        share = brokers.get(ANY_BROKER)
    if share is None:
        return float(record["limit_qps"]), record.get("burst")
    return float(share["limit_qps"]), share.get("burst")


def verify(record: Any, key: bytes, now: datetime) -> VerifyResult:
    """Decide whether a broker may apply ``record`` at instant ``now`` (naive = UTC).

    Order of checks: :func:`validate` (shape, types, values), then ``missing field: signature``,
    then the signature (``bad signature``, constant-time ``hmac.compare_digest``), then expiry
    (``expired``: ``expires_at <= now``). An empty key refuses everything (``no signing key``).
    """
    result = validate(record)
    if not result.ok:
        return result
    if SIGNATURE_FIELD not in record:
        return _refuse(f"missing field: {SIGNATURE_FIELD}")
    try:
        key = _check_key(key)
    except SigningKeyError:
        return _refuse("no signing key configured")
    try:
        expected = _signature(record, key)
    except (TypeError, ValueError) as exc:  # unserialisable extra field
        return _refuse(f"cannot canonicalise record: {exc}")
    if not hmac.compare_digest(expected, record[SIGNATURE_FIELD].lower()):
        return _refuse("bad signature")
    expires = parse_expires_at(record["expires_at"])
    if expires <= _as_utc(now):
        return _refuse(f"expired at {record['expires_at']}")
    return _OK


def record_key(record: Mapping[str, Any]) -> str:
    """The resource key ``<resource_type>:<resource>`` (the Kafka key of the compacted topic)."""
    return f"{record['resource_type']}:{record['resource']}"


def parse_key(key: str | bytes) -> tuple[str, str]:
    """Split ``<resource_type>:<resource>`` at the first ``:``; ``ValueError`` if malformed."""
    if isinstance(key, (bytes, bytearray)):
        key = bytes(key).decode("utf-8")
    rtype, sep, resource = key.partition(":")
    if not sep or rtype not in RESOURCE_TYPES or not resource:
        raise ValueError(f"malformed control key {key!r} (expected topic:<name> or group:<name>)")
    return rtype, resource


# --------------------------------------------------------------------------------------------
# signing key
# --------------------------------------------------------------------------------------------

def load_signing_key(env_var: str | None, key_file: str | os.PathLike[str] | None) -> bytes | None:
    """Load the HMAC key: the environment variable ``env_var`` wins, else ``key_file``.

    - ``env_var`` set and non-empty in the environment: its value, stripped, UTF-8 encoded.
    - else ``key_file`` given: the file's bytes, stripped of surrounding whitespace; a missing,
      unreadable or empty key file raises :class:`SigningKeyError`.
    - else ``None`` (no key configured; callers decide whether that is allowed).
    """
    if env_var:
        value = os.environ.get(env_var, "").strip()
        if value:
            return value.encode("utf-8")
    if key_file is not None and str(key_file) != "":
        path = Path(key_file)
        try:
            data = path.read_bytes().strip()
        except FileNotFoundError:
            raise SigningKeyError(f"signing key file not found: {path}") from None
        except OSError as exc:
            raise SigningKeyError(f"cannot read signing key file {path}: {exc}") from exc
        if not data:
            raise SigningKeyError(f"signing key file is empty: {path}")
        return data
    return None
