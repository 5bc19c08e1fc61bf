"""Preliminary → final reconciliation (pipelines/decide/paths/reconcile.py): the fast path's state to fold from (the final
path's saved state with the newer preliminary limits in force) and the final path's answer to preliminary decisions
(confirm, correct, reverse)."""

from __future__ import annotations

import datetime as dt

from pipelines.config import GovernorConfig
from pipelines.decide.paths import reconcile
from pipelines.decide.arrow import figures

UTC = dt.timezone.utc
W1, W2, W3 = (dt.datetime(2022, 2, 8, 7, m, tzinfo=UTC) for m in (1, 2, 3))
NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
CFG = GovernorConfig()


def limit(resource, window_end, qps, basis, action="set", split=None, version=1):
    return {"decided_at": NOW, "window_end": window_end, "resource_type": "group", "resource": resource,
            "limit_qps": qps, "burst": int(qps) + 1, "previous_qps": None, "action": action, "mode": "enforce",
            "expires_at": NOW + dt.timedelta(minutes=10), "reason": f"[{basis}] r", "version": version,
            "basis": basis, "broker_limits": split}


def saved(resource, qps, target=None, shares=None, since=None):
    return {"resource_type": "group", "resource": resource, "limit_qps": qps, "version": 3,
            "last_candidate_end": W1, "last_decision_end": W1, "last_change_end": W1, "lift_at_qps": 400.0,
            "mode": "enforce", "target_qps": target, "limited_since": since, "broker_shares": shares}


def by_key(rows):
    return {("group", r["resource"]): r for r in rows}


def test_preliminary_limits_in_force_override_the_saved_state_and_freeze_their_target_and_shares():
    latest = by_key([
        limit("new", W2, 40.0, "preliminary", split={"broker-a": 30.0, "broker-b": 10.0, "*": 10.0}),
        limit("tightened", W3, 20.0, "preliminary"),
        limit("lifted", W2, 40.0, "preliminary", action="lift"),
        limit("final-only", W1, 50.0, "final"),
    ])
    state = by_key([saved("tightened", 40.0, target=40.0, shares={"broker-a": 1.0}, since=W1),
                    saved("lifted", 40.0, target=40.0, since=W1), saved("final-only", 50.0, target=50.0, since=W1)])
    got = reconcile.preliminary_state(state, latest)
    pick = lambda r: (r["limit_qps"], r["version"], r.get("last_decision_end"), r.get("target_qps"),  # noqa: E731
                      r.get("limited_since"), figures(r.get("broker_shares")))
    assert pick(got["group", "final-only"]) == (50.0, 3, W1, 50.0, W1, {})        # untouched
    assert pick(got["group", "lifted"]) == (None, 3, W2, 40.0, W1, {})           # the lift in force, target kept
    # new: only the fast path limited it: its limit is its frozen target, its split its shares
    assert pick(got["group", "new"]) == (40.0, 0, W2, 40.0, W2, {"broker-a": 0.75, "broker-b": 0.25})
    # tightened: the newer preliminary limit is in force; the final path's target and shares stay frozen
    assert pick(got["group", "tightened"]) == (20.0, 3, W3, 40.0, W1, {"broker-a": 1.0})


def state_row(resource, qps, shares=None):
    return saved(resource, qps, target=qps, shares=shares, since=W1)


def test_unconfirmed_preliminary_limits_are_reversed_and_different_ones_corrected():
    latest = by_key([
        limit("unconfirmed", W1, 30.0, "preliminary"),
        limit("corrected", W1, 30.0, "preliminary"),
        limit("confirmed", W1, 30.0, "preliminary"),
        limit("decided-again", W1, 30.0, "preliminary"),
        limit("still-open", W2, 30.0, "preliminary"),   # its window is not final yet
        limit("final-already", W1, 30.0, "final"),
        limit("same-split", W1, 30.0, "preliminary", split={"a": 15.0, "b": 15.0, "*": 15.0}),
        limit("partial-split", W1, 30.0, "preliminary", split={"a": 30.0, "*": 30.0}),
    ])
    final_limits = [limit("decided-again", W1, 25.0, "final", version=5)]
    final_state = by_key([state_row("corrected", 40.0), state_row("confirmed", 30.0), state_row("decided-again", 25.0),
                          state_row("same-split", 30.0, {"a": 0.5, "b": 0.5}),
                          state_row("partial-split", 30.0, {"a": 0.5, "b": 0.5})])
    got = {r["resource"]: r for r in reconcile.reconcile_preliminary(latest, final_limits, final_state, W1, CFG, NOW)}
    assert set(got) == {"unconfirmed", "corrected", "partial-split"}
    split = got["partial-split"]   # the preliminary split saw broker a's lines only
    assert (split["action"], split["limit_qps"], split["broker_limits"]) == ("set", 30.0, {"a": 15.0, "b": 15.0, "*": 15.0})
    assert split["reason"] == ("[final] the final window ending 2022-02-08T07:01:00Z splits the 30.0 msg/s limit over "
                               "its brokers by their complete traffic (the preliminary split saw part of the window)")
    assert got["unconfirmed"]["action"] == "lift" and got["unconfirmed"]["basis"] == "final"
    assert got["unconfirmed"]["reason"] == ("[final] the final window ending 2022-02-08T07:01:00Z did not confirm the "
                                            "preliminary limit of 30.0 msg/s; reversed, brokers fall back to their "
                                            "defaults")
    corrected = got["corrected"]
    assert (corrected["action"], corrected["limit_qps"], corrected["previous_qps"]) == ("set", 40.0, 30.0)
    assert corrected["burst"] == 40 and corrected["expires_at"] == NOW + dt.timedelta(seconds=CFG.limits.ttl_seconds)
    epoch = int(W1.timestamp())
    assert got["unconfirmed"]["version"] == epoch * 10 + 6   # above the window's preliminary (1) and final (5)


def test_the_newest_row_per_resource_is_the_one_in_force():
    rows = [limit("g", W1, 30.0, "preliminary", version=11), limit("g", W1, 25.0, "final", version=15),
            limit("h", W2, 9.0, "final", version=25)]
    got = reconcile.latest_per_resource(rows)
    assert {k: r["version"] for k, r in got.items()} == {("group", "g"): 15, ("group", "h"): 25}


def test_a_group_lifted_within_a_watermark_and_a_window_is_read_as_limited():
    """tests/sim/test_overrides_loop.py::test_a_pinned_storm_is_held_at_the_pin_and_the_rules_take_over_after_it: an
    operator's pin at 40 msg/s lifted at 11:42 with the storm still on; the final window 11:41, finalized 91 s
    later, ran under the pin, its fallback sends counting the limiter's refusals: read through them (190.9 msg/s)
    the rules cut to 95.4 msg/s, 2.4x the pin. A resource lifted less than the watermark, a window and a trigger ago
    is read as limited (its brokers' acceptance alone); one lifted longer ago, or never, is not."""
    import datetime as dt

    from pipelines.config import WindowsConfig
    from pipelines.decide.paths.reconcile import lift_reach_seconds, read_as_limited

    now = dt.datetime(2026, 1, 5, 11, 43, 31, tzinfo=dt.timezone.utc)
    reach = lift_reach_seconds(WindowsConfig())
    assert reach == 120 + 60 + 10
    lifted = {("group", "g"): now - dt.timedelta(seconds=91), ("group", "old"): now - dt.timedelta(seconds=reach + 1)}
    assert read_as_limited(("topic\x1ft",), lifted, now, reach) == ("group\x1fg", "topic\x1ft")
    assert read_as_limited((), {}, now, reach) == ()
