"""Crash points for the exactly-once tests: a process started with ``RATE_GOVERNOR_CRASH_AT=<point>`` kills itself
with SIGKILL when it reaches that point for the ``RATE_GOVERNOR_CRASH_AFTER``-th time (default 1st). Without the
variable, :func:`crash_point` does nothing. Points are named where they are called:

* ``<query>:after:<table>``: a micro-batch of ``ingest`` or ``gold`` has just committed that Delta table (the
  first table of a batch = mid micro-batch; the last = between the Delta writes and the checkpoint commit);
* ``publish:before-replace``: limits.json's temporary file is written, not yet moved into place.
"""

from __future__ import annotations

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
