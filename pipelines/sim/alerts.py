"""Where the governor's shipped alert ``RateGovernorLimitUnderNormal`` would fire in a closed loop: an enforced topic
limit held under what the topic's normal traffic needs (:func:`pipelines.decide.catalogue.normal_floor`:
``limits.surge_squeeze_headroom`` × the baseline frozen with it, what
``rate_governor_limit_normal_floor_messages_per_second`` exports), not under an operator's override, for the rule's
``for`` (read from ``conf/prometheus/rate-governor.rules.yml``, the file Prometheus loads).

A limit under its floor from one ``state/policy`` row until a later row is not (or the run's end) is a **spell**; the
alert fires ``for`` after a spell began, if the spell lasts that long. The sweep's lift check counts a fixed topic
held at such a limit as **named for a person** when the alert has fired by the lift's deadline: its carriers leave no
room for a probe, so no policy can tell the fix from the cause at the cap (docs/decisions.md §4 "Held under what its
normal traffic needs").
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
    """A topic's enforced limit under its normal floor from ``start`` to ``end`` (None: to the run's end; UTC)."""

    topic: str
    start: dt.datetime
    end: dt.datetime | None

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


def named_by(spells: list[Spell], topic: str, deadline: dt.datetime, wait_minutes: float) -> dt.datetime | None:
    """When the alert named ``topic``'s limit at or before ``deadline`` (the first firing of a spell of it), None
    when it did not."""
    fired = [at for sp in spells if sp.topic == topic and (at := sp.fires_at(wait_minutes)) is not None
             and at <= deadline]
    return min(fired) if fired else None
