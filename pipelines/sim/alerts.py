"""Where the governor's shipped alerts that name a limit for a person would fire in a closed loop.

``RateGovernorLimitUnderNormal``: an enforced topic limit held under what the topic's normal traffic needs
(:func:`pipelines.decide.catalogue.normal_floor`: ``limits.surge_squeeze_headroom`` × the baseline frozen with it, what
``rate_governor_limit_normal_floor_messages_per_second`` exports), not under an operator's override, for the rule's
``for`` (read from ``conf/prometheus/rate-governor.rules.yml``, the file Prometheus loads).

A limit under its floor from one ``state/policy`` row until a later row is not (or the run's end) is a **spell**; the
alert fires ``for`` after a spell began, if the spell lasts that long. The sweep's lift check counts a fixed topic
held at such a limit as **named for a person** when the alert has fired by the lift's deadline: its carriers leave no
room for a probe, so no policy can tell the fix from the cause at the cap (docs/decisions.md §4 "Held under what its
normal traffic needs").

``RateGovernorLimitAtCap`` (:func:`at_cap_spells`): a limit held at its cap (``state/policy``
``at_cap_since``) for ``limits.max_at_cap_seconds``, not under an operator's override: a fixed consumer group that
keeps retrying more than its cap lets through looks the same as its storm there, and takes every probe's raise, so
no policy can lift it; the sweep counts such a fix as named for a person when the alert has fired by the deadline.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.decide.catalogue import normal_floor

#: The shipped alert rules (the file Prometheus loads: docs/metrics.md §4).
RULES = Path(__file__).resolve().parents[2] / "conf" / "prometheus" / "rate-governor.rules.yml"
UNDER_NORMAL = "RateGovernorLimitUnderNormal"
AT_CAP = "RateGovernorLimitAtCap"


def alert_for_minutes(alert: str = UNDER_NORMAL, rules: Path = RULES) -> float:
    """The ``for`` of ``alert`` in the rule file ``rules`` (minutes).

    Raises:
        ValueError: the rule, or its ``for``, is not in the file.
    """
    text = rules.read_text(encoding="utf-8")
    block = re.search(rf"- alert: {alert}\n(.*?)(?:\n\s+- alert: |\Z)", text, re.S)
    wait = re.search(r"\n\s+for: (\d+)([sm])\n", block.group(1)) if block else None
    if wait is None:
        raise ValueError(f"{alert} with a `for` is not in {rules}")
    return int(wait.group(1)) / (60.0 if wait.group(2) == "s" else 1.0)


@dataclass(frozen=True)
class Spell:
    """A resource's limit in the alert's condition from ``start`` to ``end`` (None: to the run's end; UTC): a topic
    (``topic``: its name) under its normal floor, or a resource of ``resource_type`` at its cap since long enough."""

    topic: str
    start: dt.datetime
    end: dt.datetime | None
    resource_type: str = "topic"

    def minutes(self, until: dt.datetime) -> float:
        """Its length up to ``until`` (or its end), minutes."""
        return ((self.end or until) - self.start).total_seconds() / 60.0

    def fires_at(self, wait_minutes: float) -> dt.datetime | None:
        """When the alert fires on it (``wait_minutes`` after its start), None when it ends before that."""
        at = self.start + dt.timedelta(minutes=wait_minutes)
        return at if self.end is None or self.end >= at else None


def under_normal_spells(states: list[tuple[dt.datetime, dict]], headroom: float) -> list[Spell]:
    """The spells under the normal floor of ``states``: (when saved, ``state/policy`` row) of a run, in any order;
    ``headroom``: ``limits.surge_squeeze_headroom``."""
    since: dict[str, dt.datetime] = {}
    out: list[Spell] = []
    for now, r in sorted(states, key=lambda x: x[0]):
        if r["resource_type"] != "topic":
            continue
        floor = normal_floor("topic", r["baseline_tps"], headroom)
        under = (r["limit_qps"] is not None and floor is not None and r["mode"] == "enforce"
                 and r.get("override_id") is None and r["limit_qps"] < floor)
        if under and r["resource"] not in since:
            since[r["resource"]] = now
        elif not under and r["resource"] in since:
            out.append(Spell(r["resource"], since.pop(r["resource"]), now))
    return out + [Spell(topic, start, None) for topic, start in since.items()]


def at_cap_spells(states: list[tuple[dt.datetime, dict]], max_at_cap_seconds: float) -> list[Spell]:
    """The spells of ``RateGovernorLimitAtCap``'s condition in ``states`` ((when saved, ``state/policy`` row) of a
    run, in any order): from ``at_cap_since`` + ``max_at_cap_seconds`` (``limits.max_at_cap_seconds``, event time;
    the rows' own clock, so a final path that runs late names it later by as much) while the saved rows keep that
    ``at_cap_since``, the limit in force and no override, to the first row that does not (or the run's end). A
    row saved before the spell's start that still holds the limit keeps it open."""
    held: dict[tuple[str, str], dt.datetime] = {}
    out: list[Spell] = []
    for now, r in sorted(states, key=lambda x: x[0]):
        key = (r["resource_type"], r["resource"])
        since = r.get("at_cap_since")
        on = since is not None and r["limit_qps"] is not None and r.get("override_id") is None
        start = since + dt.timedelta(seconds=max_at_cap_seconds) if on else None
        if key in held and held[key] != start:
            if now > held[key]:
                out.append(Spell(key[1], held.pop(key), now, key[0]))
            else:
                held.pop(key)
        if start is not None and key not in held:
            held[key] = start
    return out + [Spell(r, start, None, rt) for (rt, r), start in held.items()]


def named_by(spells: list[Spell], topic: str, deadline: dt.datetime, wait_minutes: float,
             resource_type: str = "topic") -> dt.datetime | None:
    """When the alert named the limit of ``resource_type`` ``topic`` at or before ``deadline`` (the first firing of
    a spell of it), None when it did not."""
    fired = [at for sp in spells if sp.topic == topic and sp.resource_type == resource_type
             and (at := sp.fires_at(wait_minutes)) is not None and at <= deadline]
    return min(fired) if fired else None
