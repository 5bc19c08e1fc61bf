"""Number and time text exactly as Spark writes it, so reasons and details read the same whoever decides.

Spark's ``format_string`` is Java's ``String.format``: ``%.Nf`` rounds half up on the value's shortest decimal
digits (``Double.toString``: ``0.15`` → ``0.2``, ``38.25`` → ``38.3``), ``NaN`` and ``Infinity`` spelled out.
Spark's ``format_number(x, N)`` is Java's ``DecimalFormat("#,##0.0…")``: half even on the exact binary value
(``0.15`` → ``0.1``, ``38.25`` → ``38.2``), thousands grouped, ``∞`` for infinity. Python's own formatting rounds
half even on the exact value (``f"{0.15:.1f}"`` is ``0.1`` but ``f"{0.25:.1f}"`` is ``0.2``), so neither is
Python's. Checked against Spark on random and tie values (``tests/decide/test_text.py``).
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal


def fixed(value: float | None, digits: int) -> str:
    """Java ``String.format("%.<digits>f", value)``; ``null`` for None (as ``%s`` of null)."""
    if value is None:
        return "null"
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    quantum = Decimal(1).scaleb(-digits)
    text = format(Decimal(repr(value)).quantize(quantum, rounding=ROUND_HALF_UP), "f")
    if text.startswith("-") and value == 0 and math.copysign(1.0, value) > 0:
        text = text[1:]
    return text


def number(value: float | None, digits: int) -> str | None:
    """Spark ``format_number(value, digits)`` (None stays None)."""
    if value is None:
        return None
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    quantum = Decimal(1).scaleb(-digits)
    exact = Decimal(value).quantize(quantum, rounding=ROUND_HALF_EVEN)
    return format(exact, f",.{digits}f")


def stamp(value: dt.datetime) -> str:
    """``yyyy-MM-dd'T'HH:mm:ss'Z'`` of a UTC time (Spark's ``date_format`` in a UTC session)."""
    value = value.astimezone(dt.timezone.utc) if value.tzinfo is not None else value
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")
