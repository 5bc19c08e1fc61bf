"""A preliminary limit's per-broker split while its window is open (pipelines/decide/paths/open_split.py): held for the
brokers still to report, split again by the complete traffic once the census completes, and the state the fast path
folds from (pipelines/decide/paths/reconcile.py preliminary_state) freezing those shares."""

from __future__ import annotations

import datetime as dt

from pipelines.config import GovernorConfig
from pipelines.decide.paths import open_split
from pipelines.decide.paths import reconcile
from pipelines.decide.arrow import figures
from pipelines.decide.rules.candidates import Keyed
from pipelines.decide.rules.facts import ANY_BROKER, shares_of, split
from pipelines.decide.records.resource import Candidate
from pipelines.decide.records.limit_rows import decision_version

UTC = dt.timezone.utc
START = dt.datetime(2022, 2, 8, 7, 9)   # naive UTC, as the candidates' window ends
END = START + dt.timedelta(minutes=1)
W1, W2 = (dt.datetime(2022, 2, 8, 7, m, tzinfo=UTC) for m in (1, 2))
NOW = dt.datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
CFG = GovernorConfig()
EXPECTED = ["broker-a", "broker-b", "broker-c", "broker-d", "broker-e"]


def census(*brokers, start=START):
    return {"window_start": start.replace(tzinfo=UTC), "resource_type": "cluster", "resource": "*",
            "brokers": list(brokers)}


def keyed(tps, resource="g", end=END):
    return Keyed("group", resource, Candidate(end, target_qps=59.2, reason="r", broker_tps=tps, critical=True))


def listed(figures_):
    return {b: q for b, q in figures_.items() if b != ANY_BROKER}


def test_after_a_restart_the_brokers_still_to_report_hold_a_trickle_inside_the_limit():
    """Sweep case 9: right after the governor's restart the fast path remembers no earlier open window. Its first
    preliminary limit saw the storm's send-backs on broker-a alone (broker-b's stats of the minute land 5 s later),
    so broker-b applied the unlisted figure (``*``, the smallest listed share: the whole limit) and the brokers
    admitted 2.00x the limit for two minutes. The brokers the census still waits for are listed now, holding
    together TO_REPORT_SHARE of the limit: the figures of every broker that may carry it add up to the limit, the
    carrier heard from keeps the rest; one heard from without a line of the resource (broker-c) carries none."""
    to_report = open_split.still_to_report([census("broker-a", "broker-c", "broker-e"),
                                            {"window_start": START, "resource_type": "group", "resource": "g"}],
                                           EXPECTED, 60)
    assert to_report == {END: ["broker-b", "broker-d"]}
    got = open_split.held_for_brokers_to_report([keyed({"broker-a": 138.1})], to_report)
    assert got[0].candidate.critical
    tps = got[0].candidate.broker_tps
    assert sorted(tps) == ["broker-a", "broker-b", "broker-d"]
    each = split(59.2, shares_of(tps))
    assert abs(sum(listed(each).values()) - 59.2) < 1e-9                          # within the limit, not 2x it
    assert abs(each["broker-a"] - 59.2 * (1 - open_split.TO_REPORT_SHARE)) < 1e-9
    assert abs(each["broker-b"] - 59.2 * open_split.TO_REPORT_SHARE / 2) < 1e-9
    assert each[ANY_BROKER] == each["broker-b"]                                   # no unlisted broker gets more


def test_brokers_already_listed_a_complete_window_or_no_traffic_are_left_as_they_are():
    to_report = {END: ["broker-b"]}
    earlier = keyed({"broker-a": 100.0, "broker-b": 50.0})   # broker-b named by the window before, at its rate
    assert open_split.held_for_brokers_to_report([earlier], to_report) == [earlier]
    complete = keyed({"broker-a": 100.0})
    assert open_split.held_for_brokers_to_report([complete], {END: []}) == [complete]
    assert open_split.held_for_brokers_to_report([complete], {}) == [complete]
    nothing = keyed({})
    assert open_split.held_for_brokers_to_report([nothing], to_report) == [nothing]


def limit(resource, window_end, qps, basis, split_=None, rank=1):
    return {"decided_at": NOW, "window_end": window_end, "resource_type": "group", "resource": resource,
            "limit_qps": qps, "burst": int(qps) + 1, "previous_qps": None, "action": "set", "mode": "enforce",
            "expires_at": NOW + dt.timedelta(minutes=10), "reason": f"[{basis}] r",
            "version": decision_version(window_end, rank), "basis": basis, "broker_limits": split_}


def test_once_the_window_is_complete_by_census_the_fast_path_splits_its_limit_by_the_complete_traffic():
    """The split held for the brokers still to report lasts until their stats land, not until the final path 3
    minutes later: once the window is complete by census, the fast path splits the same limit by the complete
    traffic (rank 2: above the decision it answers, below the final path's), once. The state it folds from freezes
    the complete shares, as the final path will."""
    held = {"a": 57.0, "b": 1.0, "d": 1.0, "*": 1.0}
    latest = {("group", r["resource"]): r for r in [
        limit("partial", W2, 59.0, "preliminary", held),
        limit("whole", W2, 60.0, "preliminary", {"a": 30.0, "b": 30.0, "*": 30.0}),
        limit("answered", W2, 59.0, "preliminary", held, rank=2),
        limit("older-window", W1, 59.0, "preliminary", held),
        limit("decided-now", W2, 59.0, "preliminary", held),
        limit("final", W2, 59.0, "final", held, rank=5),
    ]}
    naive_end = W2.replace(tzinfo=None)
    complete = open_split.complete_traffic(
        [keyed({"a": 120.0, "b": 120.0}, name, naive_end) for name in
         ("partial", "whole", "answered", "older-window", "decided-now", "final")]
        + [keyed({"a": 120.0}, "open", naive_end + dt.timedelta(minutes=1))], {naive_end})
    assert sorted(k[1] for k in complete) == ["answered", "decided-now", "final", "older-window", "partial", "whole"]
    got = open_split.complete_split(latest, complete, {("group", "decided-now")}, CFG, NOW)
    assert [r["resource"] for r in got] == ["partial"]
    row = got[0]
    assert (row["action"], row["limit_qps"], row["basis"], row["broker_limits"], row["version"]) == (
        "set", 59.0, "preliminary", {"a": 29.5, "b": 29.5, "*": 29.5}, decision_version(W2, 2))
    assert row["reason"] == ("[preliminary] the open window ending 2022-02-08T07:02:00Z is complete by census: the "
                             "59.0 msg/s limit split over its brokers by their complete traffic (the first split "
                             "held a share for each broker still to report)")
    state = reconcile.preliminary_state({}, latest, complete)
    assert figures(state["group", "partial"]["broker_shares"]) == {"a": 0.5, "b": 0.5}
    shares = figures(reconcile.preliminary_state({}, latest)["group", "partial"]["broker_shares"])
    assert shares == {"a": 57.0 / 59.0, "b": 1.0 / 59.0, "d": 1.0 / 59.0}


def test_sweep_case_9_a_restarted_fast_path_keeps_a_storm_s_figures_within_its_limit_then_splits_it_whole():
    """Sweep case 9, the fast path end to end (the simulator's open windows, an empty memory: the governor has just
    restarted). A storm sends back 300 msg/s on each of broker-a and broker-b, and broker-a is busy. broker-a's
    stats of the minute land first: the storm is limited at once (critical), and broker-b, a carrier still to
    report, applied the unlisted figure, the whole limit (the brokers admitted 2.00x the limit until the final
    path's split, 3 minutes later). Now every figure a carrier may apply keeps the sum within the limit; when
    broker-b's stats land, the same limit is split by the complete traffic."""
    from pipelines import columns
    from pipelines.decide.arrow import from_rows
    from pipelines.decide.paths.fast import OpenRows, decide_fast, prepare_fast
    from pipelines.decide.records.inputs import FastInputs, LockedInputs
    from pipelines.sim.windows import FAILURE, OpenWindows

    t0 = dt.datetime(2026, 1, 5, 6, 9, tzinfo=UTC)
    final = t0 - dt.timedelta(minutes=2)   # the newest finalized window: every broker reported
    broker_history = from_rows([{"window_start": final, "window_end": final + dt.timedelta(minutes=1), "broker": b,
                                 "put_tps": 100.0, "broker_put_tps": None, "topics": 1, "failures": 0,
                                 "busy_failures": 0, "failures_by_class": None} for b in ("broker-a", "broker-b",
                                                                                         "broker-c")],
                               columns.GOLD_BROKER_TPS)
    group_history = from_rows([{"window_start": final, "window_end": final + dt.timedelta(minutes=1),
                                "consumer_group": "g", "topic": "orders", "consume_tps": 600.0, "retry_tps": 0.0,
                                "retry_ratio": 0.0}], columns.GOLD_GROUP_TPS)
    at = t0 + dt.timedelta(seconds=59)

    def minute(broker):
        return [(at, broker, "orders", None, "TOPIC_PUT_NUMS", 60 * 300),
                (at, broker, "orders", "g", "GROUP_GET_NUMS", 60 * 300),
                (at, broker, "orders", "g", "SNDBCK_PUT_NUMS", 60 * 300)]

    busy = [(t0 + dt.timedelta(seconds=30), "broker-a", "orders", None, FAILURE + "TIMEOUT_CLEAN_QUEUE", 50)]
    opened, memory = OpenWindows(60, 120), OpenRows()
    limits: list[dict] = []

    def fast(events, now):
        rows, dicts = opened.batch_rows(events)
        inputs = FastInputs(open_rows=rows, topic_history=from_rows([], columns.GOLD_TOPIC_TPS),
                            broker_history=broker_history, open_dicts=dicts, group_history=group_history)
        locked = LockedInputs(policy_state=from_rows([], columns.POLICY_STATE),
                              latest_limits=from_rows(limits, columns.GOLD_LIMITS))
        accepted, refused = decide_fast(prepare_fast(inputs, memory, CFG), locked, CFG, now, origin="fast:1")
        assert refused.num_rows == 0
        limits.extend(accepted.to_pylist())
        return accepted.to_pylist()

    first, = fast(minute("broker-a") + minute("broker-c")[:1] + busy, t0 + dt.timedelta(seconds=66))
    assert (first["basis"], first["action"]) == ("preliminary", "set")
    qps, each = first["limit_qps"], figures(first["broker_limits"])
    applied = {b: each.get(b, each[ANY_BROKER]) for b in ("broker-a", "broker-b")}   # what each carrier applies
    assert sum(applied.values()) <= qps * (1 + 1e-9)                                  # was 2x the limit
    assert abs(sum(listed(each).values()) - qps) < 1e-9 * qps
    again, = fast(minute("broker-b"), t0 + dt.timedelta(seconds=72))
    assert (again["basis"], again["limit_qps"], again["version"] % 10) == ("preliminary", qps, 2)
    assert figures(again["broker_limits"]) == {"broker-a": qps / 2, "broker-b": qps / 2, ANY_BROKER: qps / 2}


def test_sweep_case_186_a_surge_whose_carriers_all_reported_is_limited_before_the_census_completes():
    """Sweep case 186: cart-audit surges on broker-b alone (2.7x its baseline of 272.5 msg/s, 199 of its sends
    refused as busy). broker-b's stats land first; broker-a and broker-c, which carry none of it, land 10 s later.
    A distressed surge is not critical: its first cut is bounded by ``max_cut_pct`` of the observed rate, so it
    waited for the census (limited 119 s after onset, the pipeline's fastest 108.9 s). Every broker that carried it
    in the earlier open window has reported (``open_split.topics_heard``): it is limited on broker-b's stats, the
    whole limit on broker-b (the brokers still to report hold none of it: they carry none), bounded by the
    breaker's burst (0.7 x broker-b's busy writes less the other topics' at their normal: its 300 msg/s normal
    less the topic's baseline); a topic whose earlier carrier has not reported still waits."""
    from pipelines import columns
    from pipelines.decide.arrow import from_rows
    from pipelines.decide.paths.fast import OpenRows, decide_fast, prepare_fast
    from pipelines.decide.records.inputs import FastInputs, LockedInputs
    from pipelines.sim.windows import FAILURE, OpenWindows

    t0 = dt.datetime(2026, 1, 5, 6, 11, tzinfo=UTC)    # the window before the surge's first whole one
    brokers = ("broker-a", "broker-b", "broker-c")
    minute = dt.timedelta(minutes=1)
    finals = [t0 - minute * i for i in range(10, 0, -1)]
    topic_history = from_rows([{"window_start": s, "window_end": s + minute, "topic": "cart-audit", "put_tps": 272.5,
                                "brokers_reporting": 1, "failures": 0, "busy_failures": 0, "failures_by_class": None,
                                "failure_rate": 0.0, "rate_limited": 0, "limit_qps": None} for s in finals],
                              columns.GOLD_TOPIC_TPS)
    broker_history = from_rows([{"window_start": s, "window_end": s + minute, "broker": b, "put_tps": 300.0,
                                 "broker_put_tps": 300.0, "topics": 2, "failures": 0, "busy_failures": 0,
                                 "failures_by_class": None} for s in finals for b in brokers], columns.GOLD_BROKER_TPS)

    def stats(start, broker, cart):
        at = start + dt.timedelta(seconds=59)
        out = [(at, broker, "other", None, "TOPIC_PUT_NUMS", 60 * 25)]
        if cart:
            out.append((at, broker, "cart-audit", None, "TOPIC_PUT_NUMS", int(60 * cart)))
        return out + [(at, broker, None, None, "BROKER_PUT_NUMS", int(60 * (cart + 25)))]

    def run(earlier_carriers):
        opened, memory = OpenWindows(60, 120), OpenRows()

        def fast(events, now):
            rows, dicts = opened.batch_rows(events)
            inputs = FastInputs(open_rows=rows, topic_history=topic_history, broker_history=broker_history,
                                open_dicts=dicts)
            locked = LockedInputs(policy_state=from_rows([], columns.POLICY_STATE),
                                  latest_limits=from_rows([], columns.GOLD_LIMITS))
            accepted, refused = decide_fast(prepare_fast(inputs, memory, CFG), locked, CFG, now, origin="fast:1")
            assert refused.num_rows == 0
            return accepted.to_pylist()

        # the window before: every broker reported, the topic on its carriers at its normal rate
        assert fast([e for b in brokers for e in stats(t0, b, 272.5 if b in earlier_carriers else 0)],
                    t0 + minute + dt.timedelta(seconds=20)) == []
        t1 = t0 + minute
        busy = [(t1 + dt.timedelta(seconds=5), "broker-b", "cart-audit", None, FAILURE + "TIMEOUT_CLEAN_QUEUE", 199),
                (t1 + dt.timedelta(seconds=5), "broker-b", "other", None, FAILURE + "TIMEOUT_CLEAN_QUEUE", 461)]
        return fast(busy + stats(t1, "broker-b", 732.4), t1 + minute + dt.timedelta(seconds=12))

    got, = run({"broker-b"})
    assert (got["resource"], got["basis"], got["action"]) == ("cart-audit", "preliminary", "set")
    # 0.7 x broker-b's 757.5 msg/s busy less the other topics' 27.5 (its 300 normal less the topic's 272.5)
    assert round(got["limit_qps"], 1) == 502.7 and "bounded to 502.7 msg/s by the breaker's burst" in got["reason"]
    assert listed(figures(got["broker_limits"])) == {"broker-b": got["limit_qps"]}
    assert run({"broker-b", "broker-c"}) == []   # broker-c carried it and has not reported: the census decides
