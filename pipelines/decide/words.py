"""The decision plane's words: each closed set of values a decision, a limit or a judged window takes, as a ``str``
enum whose value is the word the tables, records and reasons hold (``gold/limits.action`` ``set``,
``gold/anomalies.severity`` ``critical``, …; docs/contracts.md §2-3). A member is a ``str``: it equals, hashes and
formats as its value (``f"{Action.SET}"`` is ``set``), so a row written with one is the row written with the word.

* :class:`Anomaly`: an anomaly kind (``gold/anomalies.anomaly``; its rule: :mod:`pipelines.decide.catalogue`);
* :class:`Action`: what a decision does to a limit (``gold/limits.action``);
* :class:`Mode`: whether brokers apply it (``gold/limits.mode``, ``state/policy.mode``, the control record's);
* :class:`Basis`: which path decided it (``gold/limits.basis``);
* :class:`Severity`: how far an anomaly is past its rule (``gold/anomalies.severity``);
* :class:`Status`: how a window under an enforced limit is judged (docs/decisions.md §4; the evidence rows, logs).
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A ``str`` enum whose ``str()`` and ``format()`` are its value on every Python the project runs on (a plain
    ``(str, Enum)`` member formats as ``Class.MEMBER`` from Python 3.12)."""

    __str__ = str.__str__
    __format__ = str.__format__


class Anomaly(Word):
    """An anomaly kind; ``.value`` is what ``gold/anomalies.anomaly`` holds (docs/contracts.md §2)."""

    RUNAWAY_RETRY = "RUNAWAY_RETRY"
    TRAFFIC_SURGE = "TRAFFIC_SURGE"
    BROKER_BUSY = "BROKER_BUSY"
    FAILURE_SPIKE = "FAILURE_SPIKE"


class Action(Word):
    """What a decision does to the limit of a resource (``gold/limits.action``)."""

    SET = "set"        # a new value (or the same one re-issued: a refresh, a new ``expires_at``)
    RELAX = "relax"    # a probe: the limit raised to see the demand
    LIFT = "lift"      # no limit: brokers fall back to their defaults


class Mode(Word):
    """Whether the brokers apply a limit: ``enforce``, or ``advisory`` (recorded and published, never applied)."""

    ENFORCE = "enforce"
    ADVISORY = "advisory"


class Basis(Word):
    """Which path decided: on an open window's partial evidence (the fast path) or on a finalized window."""

    PRELIMINARY = "preliminary"
    FINAL = "final"


class Severity(Word):
    """An anomaly's severity: ``critical`` when its observed value is at least ``detection.critical_factor`` × its
    rule's floor (a critical limit cuts at once), else ``warning``."""

    CRITICAL = "critical"
    WARNING = "warning"


class Status(Word):
    """How a window under an enforced limit is judged on its visible demand (docs/decisions.md §4); ``veto``: a
    window after a lift's point shows the cause back or hidden, so the lift is not decided (logged, never a window's
    status)."""

    BOUND = "bound"      # the rule fires and the limit binds: the cause persists behind it
    HOLD = "hold"        # the rule fires below the cap, nothing refused: the cause persists in plain sight
    CAPPED = "capped"    # the rule silent on what shows, but at the cap: the demand hidden (never clear)
    CLEAR = "clear"      # below the cap and the rule silent: counts towards the lift
    VETO = "veto"
