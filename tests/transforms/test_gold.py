"""The final path's reconciliation of preliminary decisions (pipelines/transforms/gold.py)."""

from __future__ import annotations

import datetime as dt

from pipelines import schemas
from pipelines.config import GovernorConfig
from pipelines.transforms import gold
from tests.helpers import ts

CFG = GovernorConfig()
NOW = dt.datetime(2026, 11, 22, 10, 0)
W1, W2 = ts("2022-02-08 07:01"), ts("2022-02-08 07:02")


def limit_row(resource, window_end, qps, basis, action="set", version=1, split=None):
    return (NOW, window_end, "group", resource, qps, int(qps) + 1, None, action, "enforce", NOW + dt.timedelta(minutes=10),
            f"[{basis}] r", version, basis, split)


def state_row(resource, qps, shares=None):
    return ("group", resource, qps, 1, W1, W1, W1, 790.0, "enforce", qps, W1, shares, None)


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
    state_schema = schemas.POLICY_STATE.fieldNames()[:-1]
    final_state = spark.createDataFrame(
        [state_row("corrected", 40.0), state_row("confirmed", 30.0), state_row("decided-again", 25.0),
         state_row("same-split", 30.0, {"a": 0.5, "b": 0.5}), state_row("partial-split", 30.0, {"a": 0.5, "b": 0.5})],
        schemas.POLICY_STATE.__class__([f for f in schemas.POLICY_STATE.fields if f.name in state_schema]),
    )
    got = {r["resource"]: r for r in gold.reconcile_preliminary(latest, final_limits, final_state, W1, CFG, NOW).collect()}
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
