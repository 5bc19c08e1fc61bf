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


def test_a_limited_group_whose_limiter_rejected_in_the_window_is_still_bound(spark):
    """The final path's wiring of the limiters' own evidence: a group limited to 40 msg/s shows only 10 msg/s of
    retry traffic in the window (below the 90 % bound), but the RocketMQ admin sink saw its %RETRY% limiter reject
    sends in that window: the anomaly persists (a limit-bound row), the limit is not lifted."""
    from pipelines.transforms.fold import ResourceState  # noqa: F401 (the state row's meaning)

    t0, t1 = ts("2022-02-08 07:00"), ts("2022-02-08 07:01")
    windows = [(t0 + dt.timedelta(minutes=i), t0 + dt.timedelta(minutes=i + 1)) for i in range(4)]
    metrics = spark.createDataFrame(
        [(s, e, "broker-a", "%RETRY%g", "g", "SNDBCK_PUT_NUMS", 600) for s, e in windows]
        + [(s, e, "broker-a", "orders", "g", "GROUP_GET_NUMS", 24_000) for s, e in windows], schemas.WINDOW_METRIC)
    state = spark.createDataFrame([("group", "g", 40.0, 3, t0, t0, t0, 400.0, "enforce", 40.0, t0,
                                    {"broker-a": 1.0}, None)],
                                  schemas.POLICY_STATE.__class__([f for f in schemas.POLICY_STATE.fields
                                                                  if f.name != "batch_id"]))
    rejections = spark.createDataFrame(
        [(windows[-1][1], "rocketmq", "broker-a", "%RETRY%g", s + dt.timedelta(seconds=30), 7) for s, _ in windows],
        schemas.LIMITER_REJECTIONS)
    empty = lambda schema: spark.createDataFrame([], schema)  # noqa: E731
    def outputs(limiter_rejections):
        inputs = gold.GoldInputs(metrics, empty(schemas.GOLD_TOPIC_TPS), empty(schemas.GOLD_BROKER_TPS), state,
                                 empty(schemas.GOLD_LIMITS), limiter_rejections)
        return gold.gold_outputs(inputs, CFG, NOW, check=lambda d: (d, d.limit(0)), batch_id=1,
                                 first_window=windows[0][0], horizon_end=windows[-1][1])
    with_views = outputs(rejections)
    bound = with_views.anomalies.where("resource = 'g'").collect()
    assert len(bound) == 4 and all("limit-bound: 10.0 of 40.0 msg/s, rejecting" in r["detail"] for r in bound)
    assert with_views.limits.where("action = 'lift'").count() == 0
    without = outputs(None)   # the same traffic with no view of the limiter: 10 of 40 msg/s is clear: lifted
    assert [r["action"] for r in without.limits.collect()] == ["lift"]
