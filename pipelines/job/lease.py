"""One governor per lake: a lease file ``<lake>/_governor.lease`` that a running governor renews and a second one
respects.

Two governors on one lake (a double ``spark-submit``, a driver restarted while the old one still runs) would both
append to the same Delta tables and checkpoints; Spark notices only later (``CONCURRENT_STREAM_LOG_UPDATE``), after
the second may have written. The lease makes the second refuse before it starts Spark, with one line naming the
holder.

The file is JSON ``{"owner": "HOST:PID:STARTED:NONCE", "host", "pid", "started_at", "renewed_at", "expires_at"}`` (times
ISO 8601 UTC). A holder renews it every ``ttl/3`` seconds from a daemon thread; a lease past ``expires_at`` is stale
(the holder crashed or hangs) and is taken over, and so is a lease of a process on this host that no longer runs.
A holder whose own lease expired before it renewed it (it hung longer than the ttl: a stopped process, a long GC
or VM pause) has lost it, whether or not another governor took it over and even released it since: it must not
write again (:meth:`GovernorLease.check`, the fence the lake's writes call). Whether this process holds the lease
is a metric (:func:`pipelines.ops.metrics.observe_lease`).
Read-check-write is serialised with ``flock`` on ``<lake>/_governor.lease.lock`` and the lease is replaced
atomically (temporary file + ``os.replace``), so two starting governors cannot both win. The lease needs a lake on a
POSIX file system (local disk, a mount); on an object store (``s3://``, ``abfss://``) it is skipped with a warning.

Example:
    >>> lease = GovernorLease("/data/lake", ttl_seconds=60)
    >>> lease.acquire()            # raises LakeHeldError: rate-governor: lake /data/lake is held by ...
    >>> lease.start_renewing(on_lost=stop_queries)
    >>> lease.release()
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipelines.ops import metrics

log = logging.getLogger("rate_governor")

LEASE_FILE = "_governor.lease"
Clock = Callable[[], dt.datetime]


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _text(ts: dt.datetime) -> str:
    return ts.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class LakeHeldError(Exception):
    """Another governor holds the lake's lease (its message is the one line the CLI prints)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user: it exists
        return True
    return True


class GovernorLease:
    """The lease of one governor process on the lake at ``lake_root``.

    Args:
        lake_root: the lake directory (``lake.path``); ``file://`` URIs are accepted.
        ttl_seconds: how long a lease lasts without renewal (``lake.lease_ttl_seconds``); renewed every ttl/3 s.
        clock: UTC now (tests move it).
    """

    def __init__(self, lake_root: str, ttl_seconds: int = 60, clock: Clock = _utc_now) -> None:
        root = str(lake_root)
        self.supported = "://" not in root or root.startswith("file://")
        self.root = Path(root.removeprefix("file://"))
        self.ttl = dt.timedelta(seconds=ttl_seconds)
        self.clock = clock
        self.started_at = clock()
        self.host = socket.gethostname()
        self.pid = os.getpid()
        # the nonce tells apart two leases of one process (in-process runs of the tests)
        self.owner = f"{self.host}:{self.pid}:{_text(self.started_at)}:{uuid.uuid4().hex[:8]}"
        self.held = False
        self.lost = False
        #: expires_at of the lease this holder last wrote (None before acquire)
        self.expires_at: dt.datetime | None = None
        self._renewed_text = "never"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> Path:
        return self.root / LEASE_FILE

    # --- file operations (under the flock) ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{LEASE_FILE}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read(self) -> dict[str, Any] | None:
        """The lease as written, None when there is none or it cannot be parsed (treated as stale)."""
        try:
            lease = json.loads(self.path.read_text())
            dt.datetime.fromisoformat(lease["expires_at"].replace("Z", "+00:00"))
            return lease
        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _write(self) -> None:
        now = self.clock()
        lease = {
            "owner": self.owner,
            "host": self.host,
            "pid": self.pid,
            "started_at": _text(self.started_at),
            "renewed_at": _text(now),
            "expires_at": _text(now + self.ttl),
        }
        tmp = self.path.with_name(f".{LEASE_FILE}.{self.pid}.tmp")
        tmp.write_text(json.dumps(lease, indent=2) + "\n")
        os.replace(tmp, self.path)
        self.expires_at = now + self.ttl
        self._renewed_text = _text(now)

    def _stale(self, lease: dict[str, Any]) -> bool:
        expires = dt.datetime.fromisoformat(lease["expires_at"].replace("Z", "+00:00"))
        if expires <= self.clock():
            return True
        return lease.get("host") == self.host and isinstance(lease.get("pid"), int) and not _alive(lease["pid"])

    # --- public API ------------------------------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take the lease (or keep it: re-entrant for its owner).

        Raises:
            LakeHeldError: another live governor holds an unexpired lease; the message names it, when it started
                and when its lease expires.
        """
        if not self.supported:
            log.warning("lake %s is not on a POSIX file system: no single-governor lease", self.root)
            return
        with self._locked():
            lease = self.read()
            if lease and lease.get("owner") != self.owner and not self._stale(lease):
                raise LakeHeldError(
                    f"lake {self.root} is held by {lease.get('host')}:{lease.get('pid')} since "
                    f"{lease.get('started_at')} (lease expires {lease['expires_at']}); stop it or wait"
                )
            if lease and lease.get("owner") != self.owner:
                log.warning("taking over the stale lease of %s (expires %s; expired, or its process is gone)",
                            lease.get("owner"), lease["expires_at"])
            self._write()
            self.held = True
            metrics.observe_lease(True)

    def _expired(self) -> bool:
        """True when the lease this holder last wrote has expired: it hung past the ttl, and another governor was
        entitled to take the lake over (and may have released it again since)."""
        return self.held and self.expires_at is not None and self.clock() >= self.expires_at

    def renew(self) -> bool:
        """Extend the lease by ``ttl``; False (and nothing written) when another governor took it over or this
        holder's own lease expired before this renewal (it hung longer than the ttl)."""
        if not self.supported:
            return True
        with self._locked():
            lease = self.read()
            if self._expired() or (lease is not None and lease.get("owner") != self.owner):
                self.held, self.lost = False, True
                metrics.observe_lease(False)
                return False
            self._write()
            return True

    def check(self) -> None:
        """The fence before a write to the lake: returns when this holder's lease is still valid.

        Raises:
            LakeHeldError: the lease was lost (taken over, or expired while this process hung); ``lost`` is set.
        """
        if not self.supported:
            return
        if not self.lost and self._expired():
            self.held, self.lost = False, True
            metrics.observe_lease(False)
        if self.lost:
            raise LakeHeldError(f"lake {self.root}: the lease was taken over by another governor; stopped")

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not (self.supported and self.held):
            return
        with self._locked():
            lease = self.read()
            if lease is not None and lease.get("owner") == self.owner:
                self.path.unlink(missing_ok=True)
        self.held = False
        metrics.observe_lease(False)

    def start_renewing(self, on_lost: Callable[[], None] | None = None) -> None:
        """Renew every ttl/3 s in a daemon thread; when the lease was lost (taken over, or this process hung longer
        than the ttl), log an ERROR and call ``on_lost`` (the governor stops its queries)."""
        if not self.supported or self._thread is not None:
            return
        interval = max(self.ttl.total_seconds() / 3, 0.1)

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    ok = self.renew()
                except OSError as exc:  # the lake's disk for a moment: the lease lasts ttl, retry next time
                    log.warning("lease renewal failed: %s", exc)
                    continue
                if not ok:
                    log.error("lake %s: the lease was taken over by another governor, or expired before this process "
                              "renewed it (last renewed %s, now %s); stopping", self.root, self._renewed_text,
                              _text(self.clock()))
                    if on_lost is not None:
                        on_lost()
                    return

        self._thread = threading.Thread(target=loop, name="governor-lease", daemon=True)
        self._thread.start()
