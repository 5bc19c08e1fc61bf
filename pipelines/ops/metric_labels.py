"""Label values of the governor's metrics that come from data, kept to a bounded set (docs/metrics.md §2).

A quarantine reason often carries the data it rejects (``unknown stat name: FOO``, ``unknown broker b-7 (not in
[brokers] known)``); as a label each such value would be a series of its own. :func:`reason_kind` keeps the kind of
reason and drops the data; the quarantine table keeps every whole reason. :func:`label_counts` counts a table's
rows per label tuple.
"""

from __future__ import annotations

import re

import pyarrow as pa

from pipelines.dataplane.quality.rules import REASON_PREFIX
from pipelines.dataplane.transforms.known import UNKNOWN_BROKER

_QUOTED = re.compile(r"'[^']*'")
_UNKNOWN_HEAD, _tail = UNKNOWN_BROKER.split("{broker}")  # "unknown broker ", " (not in {source})"
_UNKNOWN_SOURCE = _tail.split("{source}")[0]  # " (not in "


def reason_kind(reason: str | None) -> str:
    """The kind of a quarantine reason, for a label (at most 120 characters):

    * ``expectation failed: <expectation>(<column>)`` as it is (a finite set: the GX suites);
    * ``unknown broker <name> (not in <source>)`` → ``unknown broker (not in <source>)`` (the sources are few);
    * any other reason up to its first ``": "`` (``unknown stat name: X`` → ``unknown stat name``), quoted text
      replaced by ``'…'``; None or empty → ``unknown``.
    """
    if not reason:
        return "unknown"
    if reason.startswith(_UNKNOWN_HEAD) and _UNKNOWN_SOURCE in reason:
        return _UNKNOWN_HEAD.rstrip() + reason[reason.rindex(_UNKNOWN_SOURCE):][:100]
    if not reason.startswith(REASON_PREFIX):
        reason = reason.split(": ", 1)[0]
    return _QUOTED.sub("'…'", reason)[:120]


def label_counts(data: pa.Table, columns: tuple[str, ...]) -> dict[tuple[str, ...], int]:
    """Rows of ``data`` per value of ``columns``, as label tuples (null as ``"null"``)."""
    if data.num_rows == 0:
        return {}
    grouped = data.select(list(columns)).group_by(list(columns)).aggregate([([], "count_all")]).to_pylist()
    return {tuple("null" if row[c] is None else str(row[c]) for c in columns): row["count_all"] for row in grouped}
