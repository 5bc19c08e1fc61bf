"""Fault injection for the exactly-once and fault tests.

Crash points: a process started with ``RATE_GOVERNOR_CRASH_AT=<point>`` kills itself with SIGKILL when it reaches
that point for the ``RATE_GOVERNOR_CRASH_AFTER``-th time (default 1st); failure points (:func:`fault_point`) raise
a transient ``OSError`` instead. Without the variables, both do nothing. Crash points are named where they are
called:

* ``<query>:after:<table>``: a micro-batch of ``ingest`` or ``gold`` has just committed that Delta table (the
  first table of a batch = mid micro-batch; the last = between the Delta writes and the checkpoint commit);
* ``ingest:after:events``: an ingest micro-batch's metric-events file for the gold query is in place
  (:mod:`pipelines.io.events`), its checkpoint not committed;
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
#: raise ``OSError(ENOSPC)`` ("No space left on device"), as a full disk would, after ``RATE_GOVERNOR_FAIL_SKIP=K``
#: hits (default 0) have passed. Without the variable, :func:`fault_point` does nothing.
FAIL_AT_ENV = "RATE_GOVERNOR_FAIL_AT"
FAIL_COUNT_ENV = "RATE_GOVERNOR_FAIL_COUNT"
FAIL_SKIP_ENV = "RATE_GOVERNOR_FAIL_SKIP"
#: Every Delta append of the lake (:meth:`pipelines.io.lake.Lake.append`), before anything is written.
APPEND_FAULT = "lake:append"
_fail_hits: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Raise ``OSError(ENOSPC)`` if ``name`` is the configured failure point and this hit is one of the failing
    ones (hits ``K+1 .. K+N``); otherwise do nothing."""
    if os.environ.get(FAIL_AT_ENV) != name:
        return
    _fail_hits[name] = hit = _fail_hits.get(name, 0) + 1
    skip, count = int(os.environ.get(FAIL_SKIP_ENV, "0")), int(os.environ.get(FAIL_COUNT_ENV, "1"))
    if skip < hit <= skip + count:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected at {name}, hit {hit})")
