"""Preliminary → final reconciliation (pipelines/transforms/reconcile.py): the fast path's state to fold from (the
final path's saved state with the newer preliminary limits in force) and the final path's answer to preliminary
decisions (confirm, correct, reverse)."""

from __future__ import annotations

import datetime as dt

from chispa import assert_df_equality

from pipelines import schemas
from pipelines.config import GovernorConfig
from pipelines.transforms import reconcile
from pipelines.transforms.reconcile import preliminary_state
from tests.helpers import ts

W1, W2, W3 = ts("2022-02-08 07:01"), ts("2022-02-08 07:02"), ts("2022-02-08 07:03")
NOW = dt.datetime(2026, 11, 22, 10, 0)
STATE = schemas.POLICY_STATE.__class__([f for f in schemas.POLICY_STATE.fields if f.name != "batch_id"])


def pad(row: tuple) -> tuple:
    """A state row whose newer trailing columns (the recurrence memory) are null."""
    return row + (None,) * (len(STATE.fields) - len(row))


def limit(resource, window_end, qps, basis, action="set", split=None):
    return (NOW, window_end, "group", resource, qps, int(qps) + 1, None, action, "enforce",
            NOW + dt.timedelta(minutes=10), f"[{basis}] r", 1, basis, split)


def saved(resource, qps, target=None, shares=None, since=None):
    return pad(("group", resource, qps, 3, W1, W1, W1, 400.0, "enforce", target, since, shares, None))


def test_preliminary_limits_in_force_override_the_saved_state_and_freeze_their_target_and_shares(spark):
    latest = spark.createDataFrame([
        limit("new", W2, 40.0, "preliminary", split={"broker-a": 30.0, "broker-b": 10.0, "*": 10.0}),
        limit("tightened", W3, 20.0, "preliminary"),
        limit("lifted", W2, 40.0, "preliminary", action="lift"),
        limit("final-only", W1, 50.0, "final"),
    ], schemas.GOLD_LIMITS)
    state = spark.createDataFrame([
        saved("tightened", 40.0, target=40.0, shares={"broker-a": 1.0}, since=W1),
        saved("lifted", 40.0, target=40.0, since=W1),
        saved("final-only", 50.0, target=50.0, since=W1),
    ], STATE)
    got = preliminary_state(state, latest).orderBy("resource")
    want = spark.createDataFrame([
        # final-only: untouched; lifted: the preliminary lift is in force (no limit), the saved target stays
        pad(("group", "final-only", 50.0, 3, W1, W1, W1, 400.0, "enforce", 50.0, W1, None, None)),
        pad(("group", "lifted", None, 3, W1, W2, W2, 400.0, "enforce", 40.0, W1, None, None)),
        # new: only the fast path has limited it: its limit is its frozen target, its split its shares
        pad(("group", "new", 40.0, 0, None, W2, W2, None, "enforce", 40.0, W2, {"broker-a": 0.75, "broker-b": 0.25}, None)),
        # tightened: the newer preliminary limit is in force; the final path's target and shares stay frozen
        pad(("group", "tightened", 20.0, 3, W1, W3, W3, 400.0, "enforce", 40.0, W1, {"broker-a": 1.0}, None)),
    ], STATE)
    assert_df_equality(got, want, ignore_nullable=True)


CFG = GovernorConfig()


def limit_row(resource, window_end, qps, basis, action="set", version=1, split=None):
    return (NOW, window_end, "group", resource, qps, int(qps) + 1, None, action, "enforce", NOW + dt.timedelta(minutes=10),
            f"[{basis}] r", version, basis, split)


def state_row(resource, qps, shares=None):
    return pad(("group", resource, qps, 1, W1, W1, W1, 790.0, "enforce", qps, W1, shares, None))


def test_unconfirmed_preliminary_limits_are_reversed_and_different_ones_corrected(spark):
    latest = spark.createDataFrame([
        limit_row("unconfirmed", W1, 30.0, "preliminary"),
        limit_row("corrected", W1, 30.0, "preliminary"),
        limit_row("confirmed", W1, 30.0, "preliminary"),
        limit_row("decided-again", W1, 30.0, "preliminary"),
        limit_row("still-open", W2, 30.0, "preliminary"),   # its window is not final yet
        limit_row("final-already", W1, 30.0, "final"),
        limit_row("same-split", W1, 30.0, "preliminary", split={"a": 15.0, "b": 15.0, "*": 15.0}),
        limit_row("partial-split", W1, 30.0, "preliminary", split={"a": 30.0, "*": 30.0}),
    ], schemas.GOLD_LIMITS)
    final_limits = spark.createDataFrame([limit_row("decided-again", W1, 25.0, "final", version=5)], schemas.GOLD_LIMITS)
    state_schema = [n for n in schemas.POLICY_STATE.fieldNames() if n != "batch_id"]
    final_state = spark.createDataFrame(
        [state_row("corrected", 40.0), state_row("confirmed", 30.0), state_row("decided-again", 25.0),
         state_row("same-split", 30.0, {"a": 0.5, "b": 0.5}), state_row("partial-split", 30.0, {"a": 0.5, "b": 0.5})],
        schemas.POLICY_STATE.__class__([f for f in schemas.POLICY_STATE.fields if f.name in state_schema]),
    )
    got = {r["resource"]: r for r in reconcile.reconcile_preliminary(latest, final_limits, final_state, W1, CFG, NOW).collect()}
    assert set(got) == {"unconfirmed", "corrected", "partial-split"}
    # the preliminary split saw only broker a's lines; the final window splits the same limit over both brokers
    split = got["partial-split"]
    assert (split["action"], split["limit_qps"], split["broker_limits"]) == ("set", 30.0, {"a": 15.0, "b": 15.0, "*": 15.0})
    assert "splits the 30.0 msg/s limit over its brokers" in split["reason"]
    assert got["unconfirmed"]["action"] == "lift" and got["unconfirmed"]["basis"] == "final"
    assert "did not confirm the preliminary limit of 30.0 msg/s" in got["unconfirmed"]["reason"]
    assert (got["corrected"]["action"], got["corrected"]["limit_qps"], got["corrected"]["previous_qps"]) == ("set", 40.0, 30.0)
    epoch = int(W1.replace(tzinfo=dt.timezone.utc).timestamp())
    assert got["unconfirmed"]["version"] == epoch * 10 + 6   # above the window's preliminary (1) and final (5)
