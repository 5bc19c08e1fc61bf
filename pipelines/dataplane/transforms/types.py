"""Names shared by every transform module: the ``DataFrame -> DataFrame`` type and the window key columns."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame

#: A pure transform, composed with ``DataFrame.transform``.
Transform = Callable[[DataFrame], DataFrame]

#: Key columns of every windowed table (gold/*_tps, gold/anomalies): UTC timestamps, window = [start, end).
WINDOW_KEYS: tuple[str, str] = ("window_start", "window_end")
