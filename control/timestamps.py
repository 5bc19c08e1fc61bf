"""The one written form of an instant in the control plane's files: ``YYYY-MM-DDTHH:MM:SSZ``, UTC to the second.

Used by a control record's ``expires_at`` (:mod:`control.record`) and by ``limits.json``'s ``generated_at``
(:mod:`control.limits_file`); docs/contracts.md §3.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

#: strftime/strptime format of ``expires_at`` (always UTC, always a literal ``Z``).
EXPIRES_AT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

_EXPIRES_AT_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


def parse_expires_at(value: str) -> datetime:
    """Parse ``YYYY-MM-DDTHH:MM:SSZ`` into an aware UTC datetime; ``ValueError`` otherwise."""
    if not isinstance(value, str) or not _EXPIRES_AT_RE.fullmatch(value):
        raise ValueError(f"expires_at must be 'YYYY-MM-DDTHH:MM:SSZ' (UTC), got {value!r}")
    return datetime.strptime(value, EXPIRES_AT_FORMAT).replace(tzinfo=timezone.utc)


def format_expires_at(when: datetime) -> str:
    """Render a datetime as ``YYYY-MM-DDTHH:MM:SSZ`` in UTC (naive datetimes are taken as UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime(EXPIRES_AT_FORMAT)
