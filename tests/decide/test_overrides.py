"""Operators' overrides in the decision plane (pipelines/decide/paths/overrides.py): the rows of ``control/overrides`` read
(bad ones refused with their reason), which override is in force, and pin, exempt and their ends through the whole
final path and the fast path on inline rows: a consumer group ``g`` sending back all it consumes (400 msg/s) on two
brokers, a storm the rules limit to 40 msg/s at once."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from pipelines import columns
from pipelines.config import GovernorConfig
from pipelines.decide.paths import overrides as ov
from typing import NamedTuple

from pipelines.decide.paths import fast as fast_path
from pipelines.decide.paths.fast import FastPrepared as Prepared
from pipelines.decide.rules.candidates import Keyed
from pipelines.decide.records.resource import Candidate
from pipelines.decide.paths.final import run_final
from pipelines.decide.records.inputs import FinalInputs, LockedInputs
from tests.decide.rows import T0, table, win

CFG = GovernorConfig()
NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)
PIN_ID, EXEMPT_ID, OTHER_ID = "ovr-0000000a", "ovr-0000000b", "ovr-0000000c"


def create(oid=PIN_ID, kind="pin", resource="g", qps=25.0, start=NOW - HOUR, end=NOW + HOUR, rtype="group",
           author="alice", reason="sale") -> dict:
    return {"recorded_at": start, "event": "create", "override_id": oid, "kind": kind, "resource_type": rtype,
            "resource": resource, "limit_qps": qps if kind == "pin" else None, "starts_at": start, "ends_at": end,
            "author": author, "reason": reason}


def release(oid=PIN_ID, at=NOW - dt.timedelta(minutes=1), author="bob") -> dict:
    return {"recorded_at": at, "event": "release", "override_id": oid, "kind": None, "resource_type": None,
            "resource": None, "limit_qps": None, "starts_at": None, "ends_at": None, "author": author,
            "reason": "done"}


def parsed(*rows) -> tuple:
    overrides, refused = ov.parse(rows, CFG)
    assert refused == [], refused
    return tuple(overrides)


# --- reading control/overrides ------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, why", [
    ({"kind": "freeze"}, "unknown kind 'freeze'"),
    ({"resource_type": "broker"}, "unknown resource type 'broker'"),
    ({"override_id": "x1"}, "is not ovr- and 8-32 hex digits"),
    ({"limit_qps": math.nan}, "a pin needs a finite limit_qps > 0"),
    ({"limit_qps": math.inf}, "a pin needs a finite limit_qps > 0"),
    ({"limit_qps": 0.0}, "a pin needs a finite limit_qps > 0"),
    ({"limit_qps": 2e6}, "above limits.max_limit_qps = 1e+06"),
    ({"limit_qps": 0.5}, "below limits.min_limit_qps = 1"),
    ({"resource": "TBW102", "resource_type": "topic"}, "TBW102 is on limits.protected"),
    ({"ends_at": NOW + dt.timedelta(days=2)}, "over overrides.max_duration_seconds = 86400"),
    ({"ends_at": NOW - HOUR}, "its end is not after its start"),
    ({"reason": " "}, "needs an author and a reason"),
    ({"event": "extend"}, "unknown event 'extend'"),
])
def test_a_bad_row_is_refused_with_its_reason_and_the_others_are_read(change, why):
    good = create(oid=OTHER_ID, kind="exempt", resource="h")
    overrides, refused = ov.parse([{**create(), **change}, good], CFG)
    assert [o.override_id for o in overrides] == [OTHER_ID]
    (row, reason), = refused
    assert why in reason, reason


def test_an_exemption_with_a_limit_a_second_create_and_an_unknown_release_are_refused():
    rows = [{**create(oid=EXEMPT_ID, kind="exempt"), "limit_qps": 10.0}, create(), create(qps=30.0),
            release(oid="ovr-000000ff")]
    overrides, refused = ov.parse(rows, CFG)
    assert [(o.override_id, o.limit_qps) for o in overrides] == [(PIN_ID, 25.0)]
    assert sorted(why for _, why in refused) == ["a second create of ovr-0000000a", "an exemption has no limit_qps",
                                                 "release of an unknown override 'ovr-000000ff'"]


def test_a_release_ends_an_override_early_and_the_newest_of_two_wins():
    pin, = parsed(create(), release(at=NOW + dt.timedelta(minutes=5)))
    assert pin.until == NOW + dt.timedelta(minutes=5) and pin.released_by == "bob"
    assert pin.in_force(NOW) and not pin.in_force(NOW + dt.timedelta(minutes=5))
    older = create(oid=EXEMPT_ID, kind="exempt", start=NOW - 2 * HOUR)
    both = parsed(older, create())
    assert ov.in_force(both, NOW)[("group", "g")].override_id == PIN_ID
    assert ov.in_force(both, NOW + HOUR + dt.timedelta(seconds=1)) == {}


# --- the final path ------------------------------------------------------------------------------------------------

class Batch(NamedTuple):
    """A final micro-batch: what the path reads outside the decision lock and under it (the overrides with it)."""

    topics: object
    groups: object
    brokers: object
    traffic: object
    topic_history: object
    broker_history: object
    policy_state: object
    latest_limits: object
    limiter_rejections: object = None
    open_evidence: object = None
    overrides: tuple = ()


def storm_inputs(state=(), latest=(), overrides=(), windows=(0,)) -> Batch:
    """Group g consumes 400 msg/s and sends all of it back (300 on broker-a, 100 on broker-b) in each window."""
    ws = [win(i) for i in windows]
    groups = table(columns.GOLD_GROUP_TPS, [(s, e, "g", "orders", 400.0, 400.0, 1.0) for s, e in ws])
    traffic = table(columns.WINDOW_TRAFFIC,
                    [(s, e, "group", "g", b, tps, 0, True) for s, e in ws for b, tps in (("broker-a", 300.0),
                                                                                        ("broker-b", 100.0))]
                    + [(s, e, "*", m, None, None, None, None) for s, e in ws for m in ("metrics", "traffic")])
    empty = lambda spec: table(spec, [])  # noqa: E731
    return Batch(empty(columns.GOLD_TOPIC_TPS), groups, empty(columns.GOLD_BROKER_TPS), traffic,
                       empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS),
                       table(columns.POLICY_STATE, []) if not state else state, table(columns.GOLD_LIMITS, list(latest))
                       if latest and isinstance(latest[0], tuple) else _limits(latest), None, None, tuple(overrides))


def _limits(rows) -> object:
    from pipelines.decide.arrow import from_rows

    return from_rows(list(rows), columns.GOLD_LIMITS)


def final(b: Batch, now=NOW, batch=1):
    inputs = FinalInputs(topics=b.topics, groups=b.groups, brokers=b.brokers, traffic=b.traffic,
                         topic_history=b.topic_history, broker_history=b.broker_history,
                         limiter_rejections=b.limiter_rejections)
    locked = LockedInputs(policy_state=b.policy_state, latest_limits=b.latest_limits, open_evidence=b.open_evidence,
                          overrides=tuple(b.overrides))
    return run_final(inputs, locked, CFG, now, batch_id=batch, origin=f"rate-governor-gold:{batch}")


def decide_fast(prepared, state, limits, cfg, now, *, origin, overrides=()):
    locked = LockedInputs(policy_state=state, latest_limits=limits, overrides=tuple(overrides))
    return fast_path.decide_fast(prepared, locked, cfg, now, origin=origin)


def rows_of(out, resource="g") -> list[dict]:
    return sorted((r for r in out.limits.to_pylist() if r["resource"] == resource), key=lambda r: r["version"])


def test_without_an_override_the_storm_is_limited_to_its_target():
    rule, = rows_of(final(storm_inputs()))
    assert (rule["action"], rule["mode"], rule["basis"], rule["limit_qps"]) == ("set", "enforce", "final", 40.0)
    assert "override" not in rule["reason"]


def test_a_pin_holds_the_resource_at_its_figure_split_by_its_traffic_and_pauses_the_rules():
    out = final(storm_inputs(overrides=parsed(create())))
    pin, = rows_of(out)
    assert (pin["action"], pin["mode"], pin["basis"], pin["limit_qps"]) == ("set", "enforce", "override", 25.0)
    assert pin["reason"].startswith(f"[override] override {PIN_ID} (pin at 25.0 msg/s by alice until ")
    assert ov.tag(pin["reason"]) == PIN_ID
    assert pin["broker_limits"] == [("*", 6.25), ("broker-a", 18.75), ("broker-b", 6.25)]  # by its 3:1 traffic
    assert pin["expires_at"] == NOW + dt.timedelta(seconds=CFG.limits.ttl_seconds)
    state, = out.state.to_pylist()
    assert (state["limit_qps"], state["override_id"]) == (25.0, PIN_ID)
    assert [a["anomaly"] for a in out.anomalies.to_pylist()] == ["RUNAWAY_RETRY"]  # the rules still see it


def test_a_pin_is_refreshed_only_when_due_survives_a_restart_and_expires_at_its_end_at_the_latest():
    first = final(storm_inputs(overrides=parsed(create(end=NOW + dt.timedelta(minutes=7)))))
    pin, = rows_of(first)
    assert pin["expires_at"] == NOW + dt.timedelta(minutes=7)  # not NOW + ttl: it ends before
    # a restarted governor reads the same lake: state and newest row from the lake, nothing decided again
    again = storm_inputs(first.state, [pin], parsed(create(end=NOW + dt.timedelta(minutes=7))), windows=(1,))
    assert rows_of(final(again, NOW + dt.timedelta(seconds=299), batch=2)) == []
    refresh, = rows_of(final(again, NOW + dt.timedelta(seconds=300), batch=2))
    assert refresh["reason"].endswith(": refresh at 25.0 msg/s cluster-wide; the rules are paused until it ends")
    assert refresh["version"] > pin["version"] and refresh["broker_limits"] == pin["broker_limits"]


def test_a_pin_replaces_a_limit_in_force_with_its_shares_and_outranks_it():
    rule, = rows_of(final(storm_inputs()))
    rule_state = final(storm_inputs()).state
    out = final(storm_inputs(rule_state, [rule], parsed(create(qps=80.0)), windows=(1,)), batch=2)
    pin, = rows_of(out)
    assert pin["version"] > rule["version"] and pin["previous_qps"] == 40.0 and pin["limit_qps"] == 80.0
    assert dict(pin["broker_limits"]) == {"*": 20.0, "broker-a": 60.0, "broker-b": 20.0}


def test_an_exemption_lifts_the_enforced_limit_and_the_rules_go_on_in_advisory_records():
    base = final(storm_inputs())
    rule, = rows_of(base)
    out = final(storm_inputs(base.state, [rule], parsed(create(oid=EXEMPT_ID, kind="exempt")), windows=(1,)), batch=2)
    lift, advisory = rows_of(out)
    assert (lift["action"], lift["basis"], lift["mode"]) == ("lift", "override", "enforce")
    assert lift["reason"].startswith(f"[override] override {EXEMPT_ID} (exempt by alice until ")
    assert "the enforce limit of 40.0 msg/s is lifted" in lift["reason"]
    assert (advisory["action"], advisory["mode"], advisory["basis"]) == ("set", "advisory", "final")
    assert advisory["reason"].startswith(f"[final] override {EXEMPT_ID} (exempt by alice") and \
        "advisory only; the rules' decision: RUNAWAY_RETRY" in advisory["reason"]
    assert rule["version"] < lift["version"] < advisory["version"]
    state, = out.state.to_pylist()
    assert (state["mode"], state["override_id"]) == ("advisory", EXEMPT_ID)
    assert not any(r["mode"] == "enforce" and r["action"] != "lift" for r in out.limits.to_pylist())


def test_when_an_exemption_ends_a_storm_still_raging_is_limited_at_once_from_a_fresh_state():
    exempt = parsed(create(oid=EXEMPT_ID, kind="exempt", end=NOW + dt.timedelta(minutes=2)))
    under = final(storm_inputs(overrides=exempt))
    advisory, = rows_of(under)
    later = NOW + dt.timedelta(minutes=3)
    out = final(storm_inputs(under.state, [advisory], exempt, windows=(1,)), later, batch=2)
    lift, limit = rows_of(out)
    assert (lift["action"], lift["basis"]) == ("lift", "override") and "ended at" in lift["reason"]
    assert (limit["action"], limit["mode"], limit["limit_qps"]) == ("set", "enforce", 40.0)  # the target at once
    assert limit["reason"].startswith(f"[final] after override {EXEMPT_ID} ended at ")
    assert "from the current evidence: RUNAWAY_RETRY" in limit["reason"]
    assert limit["version"] > lift["version"] > advisory["version"]
    state, = out.state.to_pylist()
    assert (state["override_id"], state["mode"], state["limit_qps"]) == (None, "enforce", 40.0)


def test_when_a_pin_ends_without_its_cause_it_is_lifted_once_and_the_state_is_fresh():
    pin_rows = parsed(create(end=NOW + dt.timedelta(minutes=2)))
    under = final(storm_inputs(overrides=pin_rows))
    pin, = rows_of(under)
    quiet = storm_inputs(under.state, [pin], pin_rows, windows=(1,))
    quiet = Batch(quiet.topics, table(columns.GOLD_GROUP_TPS, [(*win(1), "g", "orders", 400.0, 4.0, 0.01)]),
                        quiet.brokers, table(columns.WINDOW_TRAFFIC, [(*win(1), "*", m, None, None, None, None)
                                                                      for m in ("metrics", "traffic")]),
                        quiet.topic_history, quiet.broker_history, quiet.policy_state, quiet.latest_limits, None, None,
                        quiet.overrides)
    later = NOW + dt.timedelta(minutes=3)
    out = final(quiet, later, batch=2)
    lift, = rows_of(out)
    assert (lift["action"], lift["limit_qps"], lift["basis"]) == ("lift", 25.0, "override")
    assert lift["reason"] == (f"[override] override {PIN_ID} (pin by alice) ended at 2026-11-22T10:02:00Z: its limit "
                              "of 25.0 msg/s is lifted; the rules take over from the current evidence")
    state, = out.state.to_pylist()
    assert (state["limit_qps"], state["override_id"], state["target_qps"]) == (None, None, None)
    after = Batch(quiet.topics, quiet.groups, quiet.brokers, quiet.traffic, quiet.topic_history,
                        quiet.broker_history, out.state, _limits([lift]), None, None, pin_rows)
    assert rows_of(final(after, later + dt.timedelta(minutes=1), batch=3)) == []  # lifted once


def test_a_released_pin_ends_at_its_release_and_names_who_released_it():
    rows = parsed(create(), release(at=NOW + dt.timedelta(minutes=1)))
    under = final(storm_inputs(overrides=parsed(create())))
    pin, = rows_of(under)
    out = final(storm_inputs(under.state, [pin], rows, windows=(1,)), NOW + dt.timedelta(minutes=2), batch=2)
    lift, limit = rows_of(out)
    assert "released by bob at 2026-11-22T10:01:00Z" in lift["reason"]
    assert (limit["mode"], limit["limit_qps"]) == ("enforce", 40.0)


# --- the fast path -------------------------------------------------------------------------------------------------

def test_the_fast_path_decides_nothing_for_a_pinned_resource_and_only_advisory_records_for_an_exempted_one():
    end = win(0)[1].replace(tzinfo=None)
    cand = Keyed("group", "g", Candidate(end, 40.0, "RUNAWAY_RETRY: g sends back all it consumes", floor_qps=1.0,
                                         critical=True, broker_tps={"broker-a": 300.0}))
    prepared = Prepared([cand], win(0)[1])
    state, limits = table(columns.POLICY_STATE, []), table(columns.GOLD_LIMITS, [])
    plain, _ = decide_fast(prepared, state, limits, CFG, NOW, origin="fast:1")
    assert [(r["action"], r["mode"], r["basis"]) for r in plain.to_pylist()] == [("set", "enforce", "preliminary")]
    pinned, _ = decide_fast(prepared, state, limits, CFG, NOW, origin="fast:1", overrides=parsed(create()))
    assert [(r["basis"], r["limit_qps"]) for r in pinned.to_pylist()] == [("override", 25.0)]
    exempt, _ = decide_fast(prepared, state, limits, CFG, NOW, origin="fast:1",
                            overrides=parsed(create(oid=EXEMPT_ID, kind="exempt")))
    row, = exempt.to_pylist()
    assert (row["action"], row["mode"], row["basis"]) == ("set", "advisory", "preliminary")
    assert ov.tag(row["reason"]) == EXEMPT_ID


def test_the_rules_judge_a_pinned_resource_in_shadow_but_never_lift_it():
    """Pinned at 25 msg/s: in window 1 the group's retry traffic is at the pin and its limiter rejects 12,000 sends
    (a storm held by it: a limit-bound anomaly, as under a rule's limit), then it falls to 1 msg/s for four
    windows: the rules would lift a limit of theirs after three clear windows; the pin stays, nothing is decided."""
    pin_rows = parsed(create())
    under = final(storm_inputs(overrides=pin_rows))
    pin, = rows_of(under)
    ws = [win(i) for i in range(1, 6)]
    groups = table(columns.GOLD_GROUP_TPS, [(s, e, "g", "orders", 400.0, 25.0 if i == 0 else 1.0, 0.0)
                                            for i, (s, e) in enumerate(ws)])
    traffic = table(columns.WINDOW_TRAFFIC, [(s, e, "group", "g", "broker-a", 25.0 if i == 0 else 1.0,
                                              12_000 if i == 0 else 0, True)
                                             for i, (s, e) in enumerate(ws)]
                    + [(s, e, "*", m, None, None, None, None) for s, e in ws for m in ("metrics", "traffic")])
    empty = lambda spec: table(spec, [])  # noqa: E731
    out = final(Batch(empty(columns.GOLD_TOPIC_TPS), groups, empty(columns.GOLD_BROKER_TPS), traffic,
                            empty(columns.GOLD_TOPIC_TPS), empty(columns.GOLD_BROKER_TPS), under.state,
                            _limits([pin]), None, None, pin_rows), NOW + dt.timedelta(minutes=1), batch=2)
    assert rows_of(out) == []
    bound, = out.anomalies.to_pylist()
    assert bound["window_end"] == ws[0][1] and bound["detail"].startswith("g: limit-bound: 25.0 of 25.0 msg/s")
    state, = out.state.to_pylist()
    assert (state["limit_qps"], state["override_id"]) == (25.0, PIN_ID)
