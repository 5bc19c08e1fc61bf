"""The unknown-broker check of both parses: a record naming a broker the cluster does not have is quarantined.

Built-in Spark functions over the known set (:class:`pipelines.dataplane.known_brokers.KnownBrokers`) as literals: the
set is bounded by the cluster's size. A name of the set matches exactly (``isin``, case-sensitive); a pattern of
``[brokers] known`` matches as fnmatch does for ``*`` and ``?`` (translated to SQL ``LIKE``, which matches the whole
string across line breaks, like ``fnmatch.fnmatchcase``); a ``host:port`` that ``[brokers] addresses`` left
unmapped never matches (:data:`pipelines.dataplane.known_brokers.ADDRESS`). The Python twin of the predicate is
:meth:`KnownBrokers.admits`; ``tests/transforms/test_known.py`` holds the two equal.

The check runs after the parse's own checks and before the data-quality expectations
(:func:`pipelines.dataplane.transforms.silver.parsed_stats`), so a record has one reason and an unknown broker's records
never reach silver, the metric events, a window, the census or a decision (docs/contracts.md §1).

Example:
    >>> parsed.transform(judged(KnownBrokers.of(["broker-*"])))   # reject_reason set for other brokers
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines.dataplane.known_brokers import ADDRESS, ADDRESSES, KnownBrokers
from pipelines.dataplane.transforms.types import Transform

#: The quarantine reason of a record from an unknown broker (docs/contracts.md §1); ``source`` names the set:
#: ``the name server's cluster <cluster>``, ``[brokers] known`` or ``[brokers] addresses``.
UNKNOWN_BROKER = "unknown broker {broker} (not in {source})"
#: SQL ``LIKE``'s escape character (Spark's default): it may only precede ``_``, ``%`` or itself.
LIKE_ESCAPE = "\\"


def unknown_broker_reason(broker: Column | str, source: str) -> Column | str:
    """:data:`UNKNOWN_BROKER` for ``broker`` (a Column, or a str for tests and docs) and ``source``."""
    head, tail = UNKNOWN_BROKER.split("{broker}")
    tail = tail.format(source=source)
    if isinstance(broker, str):
        return head + broker + tail
    return F.concat(F.lit(head), broker, F.lit(tail))


def like_pattern(glob: str) -> str:
    """An fnmatch-style pattern (``*``, ``?``; no character classes) as a SQL ``LIKE`` pattern."""
    out = []
    for ch in glob:
        if ch in (LIKE_ESCAPE, "%", "_"):
            out.append(LIKE_ESCAPE + ch)
        else:
            out.append({"*": "%", "?": "_"}.get(ch, ch))
    return "".join(out)


def unknown_broker(broker: Column, known: KnownBrokers | None) -> Column:
    """The quarantine reason of a record naming ``broker`` (a string Column), null when it is evidence: a null
    broker (not judged), or every broker when ``known`` is None (every name trusted)."""
    if known is None:
        return F.lit(None).cast("string")
    admitted = broker.isin(*known.names) if known.names else F.lit(False)
    for pattern in known.patterns:
        admitted = admitted | broker.like(like_pattern(pattern))
    return (
        F.when(broker.isNull(), F.lit(None).cast("string"))
        .when(broker.rlike(f"^(?:{ADDRESS})\\z"), unknown_broker_reason(broker, ADDRESSES))
        .when(~admitted, unknown_broker_reason(broker, known.source))
    )


def judged(known: KnownBrokers | None) -> Transform:
    """Parsed rows (``broker``, ``reject_reason``) → the same rows, with :func:`unknown_broker`'s reason where the
    parse accepted the row; unchanged when ``known`` is None."""

    def transform(parsed: DataFrame) -> DataFrame:
        if known is None:
            return parsed
        return parsed.withColumn("reject_reason",
                                 F.coalesce(F.col("reject_reason"), unknown_broker(F.col("broker"), known)))

    return transform
