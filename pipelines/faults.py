"""Fault injection for the exactly-once and fault tests.

Crash points: a process started with ``RATE_GOVERNOR_CRASH_AT=<point>`` kills itself with SIGKILL when it reaches
that point for the ``RATE_GOVERNOR_CRASH_AFTER``-th time (default 1st); failure points (:func:`fault_point`) raise
a transient ``OSError`` instead. Without the variables, both do nothing. Crash points are named where they are
called:

* ``<query>:after:<table>``: a micro-batch of ``ingest`` or ``gold`` has just committed that Delta table (the
  first table of a batch = mid micro-batch; the last = between the Delta writes and the checkpoint commit);
* ``ingest:after:events``: an ingest micro-batch's metric-events file for the gold query is in place
  (:mod:`pipelines.dataplane.events`), its checkpoint not committed;
* ``publish:before-replace``: limits.json's temporary file is written, not yet moved into place.
"""

from __future__ import annotations

import errno
import os
import signal

CRASH_AT_ENV = "RATE_GOVERNOR_CRASH_AT"
CRASH_AFTER_ENV = "RATE_GOVERNOR_CRASH_AFTER"
_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Kill this process with SIGKILL if ``name`` is the configured crash point and its hit count is reached."""
    if os.environ.get(CRASH_AT_ENV) != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(os.environ.get(CRASH_AFTER_ENV, "1")):
        os.kill(os.getpid(), signal.SIGKILL)


# --- transient failures -----------------------------------------------------------------------------------------
#: ``RATE_GOVERNOR_FAIL_AT=<point>`` with ``RATE_GOVERNOR_FAIL_COUNT=N`` (default 1): the next N hits of that point
#: fail as a full disk would, after ``RATE_GOVERNOR_FAIL_SKIP=K`` hits (default 0) have passed. How they fail,
#: ``RATE_GOVERNOR_FAIL_MODE``:
#:
#: * ``raise`` (default): raise ``OSError(ENOSPC)`` ("No space left on device") before anything is written;
#: * ``fill``: really fill the file system of ``RATE_GOVERNOR_FILL_DIR`` (a small one, e.g. a tmpfs holding the lake)
#:   at hit K+1 with a ballast file ``<dir>/.ballast`` that leaves :data:`FILL_LEAVE_BYTES` free, and let the write go
#:   on: it writes part of its file and meets the real ENOSPC (a torn write); the ballast is removed at hit K+N+1
#:   (the disk freed), so the write after N failures succeeds;
#: * ``torn``: the same shape without a small file system: write part of a Parquet file (``PAR1`` and a few KiB)
#:   into the table's directory, as a writer cut off mid-file leaves it, then raise ``OSError(ENOSPC)``.
#:
#: Without ``RATE_GOVERNOR_FAIL_AT``, :func:`fault_point` does nothing.
FAIL_AT_ENV = "RATE_GOVERNOR_FAIL_AT"
FAIL_COUNT_ENV = "RATE_GOVERNOR_FAIL_COUNT"
FAIL_SKIP_ENV = "RATE_GOVERNOR_FAIL_SKIP"
FAIL_MODE_ENV = "RATE_GOVERNOR_FAIL_MODE"
FILL_DIR_ENV = "RATE_GOVERNOR_FILL_DIR"
FILL_LEAVE_BYTES = 4096
BALLAST = ".ballast"
#: Every Delta append of the lake (:meth:`pipelines.dataplane.lake.Lake.append`), before anything is written.
APPEND_FAULT = "lake:append"
_fail_hits: dict[str, int] = {}


def fault_point(name: str, where: str | None = None) -> None:
    """At the configured failure point ``name``, fail this hit if it is one of the failing ones (hits ``K+1 ..
    K+N``) in the configured mode; otherwise do nothing. ``where`` is the directory the caller is about to write
    (the ``torn`` mode leaves its partial file there)."""
    if os.environ.get(FAIL_AT_ENV) != name:
        return
    _fail_hits[name] = hit = _fail_hits.get(name, 0) + 1
    skip, count = int(os.environ.get(FAIL_SKIP_ENV, "0")), int(os.environ.get(FAIL_COUNT_ENV, "1"))
    mode = os.environ.get(FAIL_MODE_ENV, "raise")
    if mode == "fill":
        ballast = os.path.join(os.environ[FILL_DIR_ENV], BALLAST)
        if hit == skip + 1:
            _fill(ballast)
        elif hit == skip + count + 1 and os.path.exists(ballast):
            os.unlink(ballast)
        return
    if not skip < hit <= skip + count:
        return
    if mode == "torn" and where is not None and "://" not in where:
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, f"part-00000-torn-{os.getpid()}-{hit}.c000.snappy.parquet"), "wb") as f:
            f.write(b"PAR1" + os.urandom(4096))
    raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected at {name}, hit {hit})")


def _fill(ballast: str) -> None:
    """Write ``ballast`` until its file system is full, then give back :data:`FILL_LEAVE_BYTES`."""
    chunk = b"\0" * (1 << 20)
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    for step in (1 << 16, 1 << 12, 1 << 9):  # the last partial chunk: fill it with ever smaller writes
        try:
            with open(ballast, "ab") as f:
                while True:
                    f.write(b"\0" * step)
                    f.flush()
        except OSError:
            pass
    os.truncate(ballast, max(0, os.path.getsize(ballast) - FILL_LEAVE_BYTES))
