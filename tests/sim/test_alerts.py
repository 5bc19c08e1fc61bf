"""Where the alerts that name a limit for a person fire in a closed loop (pipelines/sim/alerts.py), from saved
``state/policy`` rows."""

from __future__ import annotations

import datetime as dt

from pipelines.sim.alerts import AT_CAP, alert_for_minutes, at_cap_spells, named_by

T0 = dt.datetime(2026, 1, 5, 6, 0, tzinfo=dt.timezone.utc)


def at(minute: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minute)


def row(since, limit=10.0, override=None, resource="cg-orders") -> dict:
    return {"resource_type": "group", "resource": resource, "limit_qps": limit, "at_cap_since": since,
            "override_id": override}


def test_a_limit_at_its_cap_for_30_minutes_is_named_one_for_after_that():
    """At its cap since minute 2 and held so to minute 40: the condition from minute 32, the alert (``for`` 1m in
    the shipped rules) at 33; a deadline at 32.5 is too early. A group whose last judged window fell under the cap
    at minute 20 restarts its clock; one under an override never fires."""
    wait = alert_for_minutes(AT_CAP)
    assert wait == 1.0
    states = [(at(m), row(at(2))) for m in range(3, 41)]
    spells = at_cap_spells(states, 1800)
    assert [(sp.topic, sp.start, sp.end, sp.resource_type) for sp in spells] == [("cg-orders", at(32), None, "group")]
    assert named_by(spells, "cg-orders", at(40), wait, "group") == at(33)
    assert named_by(spells, "cg-orders", at(32.5), wait, "group") is None
    assert named_by(spells, "cg-orders", at(40), wait, "topic") is None

    broken = [(at(m), row(at(2) if m < 20 else (None if m == 20 else at(21)))) for m in range(3, 41)]
    assert named_by(at_cap_spells(broken, 1800), "cg-orders", at(40), wait, "group") is None
    overridden = [(at(m), row(at(2), override="ovr-0a1b2c3d")) for m in range(3, 41)]
    assert at_cap_spells(overridden, 1800) == []


def test_a_lift_ends_the_spell():
    """Lifted at minute 35, after the condition began at 32: a spell of 32-35 (fires at 33)."""
    states = [(at(m), row(at(2))) for m in range(3, 35)] + [(at(35), row(None, limit=None))]
    spells = at_cap_spells(states, 1800)
    assert [(sp.start, sp.end) for sp in spells] == [(at(32), at(35))]
    assert named_by(spells, "cg-orders", at(40), 1.0, "group") == at(33)
    short = [(at(m), row(at(2))) for m in range(3, 32)] + [(at(32.5), row(None, limit=None))]
    assert named_by(at_cap_spells(short, 1800), "cg-orders", at(40), 1.0, "group") is None
