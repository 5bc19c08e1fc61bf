"""The fast flow's state to fold from (pipelines/flows/fast.py preliminary_state): the final path's saved state with
the newer preliminary limits in force."""

from __future__ import annotations

import datetime as dt

from chispa import assert_df_equality

from pipelines import schemas
from pipelines.flows.fast import preliminary_state
from tests.helpers import ts

W1, W2, W3 = ts("2022-02-08 07:01"), ts("2022-02-08 07:02"), ts("2022-02-08 07:03")
NOW = dt.datetime(2026, 11, 22, 10, 0)
STATE = schemas.POLICY_STATE.__class__([f for f in schemas.POLICY_STATE.fields if f.name != "batch_id"])


def limit(resource, window_end, qps, basis, action="set", split=None):
    return (NOW, window_end, "group", resource, qps, int(qps) + 1, None, action, "enforce",
            NOW + dt.timedelta(minutes=10), f"[{basis}] r", 1, basis, split)


def saved(resource, qps, target=None, shares=None, since=None):
    return ("group", resource, qps, 3, W1, W1, W1, 400.0, "enforce", target, since, shares, None)


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
        ("group", "final-only", 50.0, 3, W1, W1, W1, 400.0, "enforce", 50.0, W1, None, None),
        ("group", "lifted", None, 3, W1, W2, W2, 400.0, "enforce", 40.0, W1, None, None),
        # new: only the fast path has limited it: its limit is its frozen target, its split its shares
        ("group", "new", 40.0, 0, None, W2, W2, None, "enforce", 40.0, W2, {"broker-a": 0.75, "broker-b": 0.25}, None),
        # tightened: the newer preliminary limit is in force; the final path's target and shares stay frozen
        ("group", "tightened", 20.0, 3, W1, W3, W3, 400.0, "enforce", 40.0, W1, {"broker-a": 1.0}, None),
    ], STATE)
    assert_df_equality(got, want, ignore_nullable=True)
