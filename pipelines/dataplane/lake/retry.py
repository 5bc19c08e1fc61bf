"""Retries of a lake append: a storage error is retried with back-off, then fails the micro-batch.

Retrying is safe: an append is skipped when its ``(app_id, version)`` is already committed, and a failed one
committed nothing (files written before the failure are not in the Delta log; ``VACUUM`` removes them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pipelines.faults import APPEND_FAULT, fault_point

log = logging.getLogger("rate_governor")

#: Attempts of one append before its error fails the micro-batch, and the back-off between them (s): 0.5, 1, 2, 4.
APPEND_ATTEMPTS = 5
APPEND_BACKOFF = (0.5, 4.0)


def storage_error(exc: BaseException) -> bool:
    """True for an error of the storage under the lake, worth retrying: an ``OSError`` (a full disk, a storage
    hiccup), or delta-rs's ``DeltaError`` carrying an operating-system error (a real ENOSPC reaches Python as
    ``DeltaError: ... No space left on device (os error 28)``, not as an OSError)."""
    return isinstance(exc, OSError) or (type(exc).__name__ == "DeltaError" and "(os error " in str(exc))


def retried(write: Callable[[], int], fence: Callable[[], None], where: str) -> int:
    """``write()`` (one append to the table at ``where``; returns the rows written) behind ``fence`` and the append
    fault point (:data:`pipelines.faults.APPEND_FAULT`). The fence is asked before every attempt and its error is
    not retried; a :func:`storage_error` is retried up to :data:`APPEND_ATTEMPTS` times with exponential back-off
    (:data:`APPEND_BACKOFF`: about 7.5 s in all), then re-raised so the micro-batch fails and is replayed on restart.

    Raises:
        OSError: (or delta-rs's ``DeltaError``) the storage still failed on the last attempt; nothing was committed.
    """
    import tenacity

    def attempt() -> int:
        fence()
        fault_point(APPEND_FAULT, where)
        return write()

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(storage_error),
        stop=tenacity.stop_after_attempt(APPEND_ATTEMPTS),
        wait=tenacity.wait_exponential(multiplier=APPEND_BACKOFF[0], max=APPEND_BACKOFF[1]),
        before_sleep=lambda state: log.warning(
            "lake append failed (attempt %d of %d), retrying: %s",
            state.attempt_number, APPEND_ATTEMPTS, state.outcome.exception() if state.outcome else "?",
        ),
        reraise=True,
    )(attempt)
