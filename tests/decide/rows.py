"""Inline rows for the decision plane's tests: tuples in a :mod:`pipelines.columns` spec's column order → Arrow
tables and polars frames of exactly that schema (times UTC)."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pyarrow as pa

from pipelines import columns
from pipelines.decide.arrow import from_rows, to_polars

T0 = dt.datetime(2022, 2, 8, 7, 0, tzinfo=dt.timezone.utc)


def win(i: int) -> tuple[dt.datetime, dt.datetime]:
    """(start, end) of window ``i`` minutes after ``T0``."""
    start = T0 + dt.timedelta(minutes=i)
    return start, start + dt.timedelta(minutes=1)


def end(i: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=i)


def table(spec: columns.Spec, rows: list[tuple]) -> pa.Table:
    names = [n for n, _ in spec]
    return from_rows([dict(zip(names, r)) for r in rows], spec)


def frame(spec: columns.Spec, rows: list[tuple]) -> pl.DataFrame:
    return to_polars(table(spec, rows), spec)


def empty(spec: columns.Spec) -> pl.DataFrame:
    return to_polars(None, spec)
