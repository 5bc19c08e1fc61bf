"""Names shared by every transform module."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame

#: A ``DataFrame -> DataFrame`` step, composed with ``DataFrame.transform``.
Transform = Callable[[DataFrame], DataFrame]

#: The columns that identify an event-time window (UTC timestamps, ``window_end`` exclusive).
WINDOW_KEYS = ("window_start", "window_end")
