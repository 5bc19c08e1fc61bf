"""The reference applier: article 001's TokenBucketRateLimiter and the LimitApplier (docs/contracts.md §3).

Every test drives a fake clock; nothing sleeps.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone

import pytest

from control import record as cr
from control.applier import Decision, LimitApplier
from control.token_bucket import TokenBucketRateLimiter, default_burst

KEY = b"test-signing-key"
T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=timezone.utc)
T0_MS = int(T0.timestamp() * 1000)


class FakeClock:
    """Seconds, moved by hand."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


# -- TokenBucketRateLimiter ----------------------------------------------------------------------

def test_article_001_example_qps1_ten_requests():
    clock = FakeClock(100.0)
    lim = TokenBucketRateLimiter(qps=1, clock=clock)          # burst 1, breaker 1000 ms
    results = [lim.try_acquire() for _ in range(10)]
    assert results.count(True) == 1 and results[0] is True    # exactly one passes, 9 rejected
    assert lim.state == "open"
    assert lim.breaker_open_until == pytest.approx(101.0)

    # during the next breaker_open_ms everything is rejected at once
    for step_ms in (1, 100, 500, 999):
        clock.t = 100.0 + step_ms / 1000.0
        assert lim.try_acquire() is False

    # right after it closes (t0 + 1 s) a token has refilled at qps 1: a request passes again
    clock.t = 101.0
    assert lim.state == "closed"
    assert lim.try_acquire() is True
    # With Guava's RateLimiter.acquire() the burst of 10 would have pushed nextFreeTicketMicros
    # 9 s ahead: every request until t0 + 10 s would have been rejected. Here a burst costs at most
    # breaker_open_ms, after which ordinary token-bucket limiting resumes.
    assert lim.try_acquire() is False                         # bucket empty again -> breaker
    clock.t = 102.0
    assert lim.try_acquire() is True                          # t0 + 2 s, long before Guava's t0 + 10 s


def test_starts_with_one_token_not_full():
    clock = FakeClock()
    lim = TokenBucketRateLimiter(qps=100, clock=clock)
    assert lim.burst == 100 == default_burst(100)
    assert lim.tokens_at() == pytest.approx(1.0)
    assert lim.try_acquire() is True
    assert lim.try_acquire() is False                         # 2nd at the same instant trips the breaker


def test_default_burst_is_one_second_of_tokens():
    assert default_burst(0.5) == 1.0
    assert default_burst(40) == 40.0
    lim = TokenBucketRateLimiter(qps=10, clock=FakeClock())
    assert lim.burst == 10
    assert lim.tokens_at(now=60.0) == pytest.approx(10.0)    # refill is capped at burst


def test_steady_rate_qps100_over_10s():
    clock = FakeClock()
    lim = TokenBucketRateLimiter(qps=100, clock=clock)
    passed = 0
    for ms in range(10_000):                                  # a request every 1 ms for 10 s
        clock.t = ms / 1000.0
        passed += lim.try_acquire()
    # about qps * 10 s (+ at most one burst); the breaker wastes nothing because it stays open
    # exactly as long as the bucket takes to refill (1 s of tokens)
    assert 950 <= passed <= 1000 + 100
    assert lim.passed == passed and lim.rejected == 10_000 - passed


def test_steady_rate_below_limit_never_rejects():
    clock = FakeClock()
    lim = TokenBucketRateLimiter(qps=100, clock=clock)
    for i in range(1000):                                     # 50 requests per second
        clock.t = i * 0.02
        assert lim.try_acquire()


def test_never_sleeps_and_uses_explicit_now():
    lim = TokenBucketRateLimiter(qps=1, clock=lambda: pytest.fail("clock must not be read"), now=0.0)
    assert lim.try_acquire(now=0.0) is True
    assert lim.try_acquire(now=0.5) is False
    assert lim.try_acquire(now=1.5) is True


def test_breaker_zero_is_a_plain_token_bucket():
    clock = FakeClock()
    lim = TokenBucketRateLimiter(qps=10, breaker_open_ms=0, clock=clock)
    assert lim.try_acquire() and not lim.try_acquire()
    clock.advance(0.1)
    assert lim.try_acquire()                                  # no breaker: the next token is enough


def test_oversized_request_does_not_open_breaker():
    clock = FakeClock()
    lim = TokenBucketRateLimiter(qps=1, burst=1, clock=clock)
    assert lim.try_acquire(permits=5) is False
    assert lim.state == "closed"
    assert lim.try_acquire() is True


def test_set_rate_changes_live_limiter():
    clock = FakeClock()
    lim = TokenBucketRateLimiter(qps=1, clock=clock)
    passed_slow = 0
    for ms in range(0, 5000, 10):
        clock.t = ms / 1000.0
        passed_slow += lim.try_acquire()
    assert passed_slow <= 6

    clock.t = 5.0
    lim.set_rate(100)                                         # article 000: updateTopicRateLimiter -> setRate
    assert lim.qps == 100 and lim.burst == 100
    passed_fast = 0
    for ms in range(5000, 10_000):
        clock.t = ms / 1000.0
        passed_fast += lim.try_acquire()
    assert 400 <= passed_fast <= 600                          # ~100 qps over 5 s

    lim.set_rate(2, burst=5, breaker_open_ms=0)
    assert lim.burst == 5 and lim.breaker_open_ms == 0
    assert lim.tokens_at() <= 5                               # tokens above the new capacity dropped


def test_set_rate_counts_earned_tokens_at_old_rate():
    clock = FakeClock()
    lim = TokenBucketRateLimiter(qps=1, burst=10, clock=clock)
    assert lim.try_acquire()
    clock.t = 2.0                                             # 2 tokens earned at qps 1
    lim.set_rate(1000, burst=10)
    assert lim.tokens_at() == pytest.approx(2.0)


def test_clock_going_backwards_keeps_remaining_open_time():
    clock = FakeClock(10.0)
    lim = TokenBucketRateLimiter(qps=1, clock=clock)
    assert lim.try_acquire() and not lim.try_acquire()       # breaker open until 11.0
    clock.t = 5.2                                             # clock stepped back 4.8 s
    assert lim.try_acquire() is False
    assert lim.breaker_open_until == pytest.approx(6.2)
    clock.t = 6.0
    assert lim.try_acquire() is False                         # still open; 0.8 s earned since the step
    clock.t = 6.2
    assert lim.try_acquire() is True                          # closed, and 1 s has refilled one token


@pytest.mark.parametrize("kwargs", [{"qps": 0}, {"qps": float("nan")}, {"qps": 1, "burst": 0},
                                    {"qps": 1, "breaker_open_ms": -1}])
def test_limiter_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        TokenBucketRateLimiter(clock=FakeClock(), **kwargs)


# -- LimitApplier ---------------------------------------------------------------------------------------

def record(**overrides):
    rec = {
        "resource_type": "group",
        "resource": "get-pugc-to-ai-consumer",
        "limit_qps": 1.0,
        "burst": 1,
        "breaker_open_ms": 1000,
        "mode": "enforce",
        "expires_at": "2026-11-22T10:15:00Z",
        "version": 17,
        "reason": "RUNAWAY_RETRY",
    }
    rec.update(overrides)
    return rec


def signed(**overrides):
    return cr.sign(record(**overrides), KEY)


def applier(**kw):
    clock = FakeClock(T0.timestamp())
    kw.setdefault("clock", clock)
    return LimitApplier(KEY, **kw), clock


def burst_pass_count(app, n=10, at_ms=None, rtype="group", res="get-pugc-to-ai-consumer"):
    return sum(app.try_acquire(rtype, res, now_ms=at_ms) for _ in range(n))


def test_unlimited_by_default():
    app, _ = applier()
    assert burst_pass_count(app, 1000, T0_MS) == 1000
    assert app.decide("topic", "orders", T0_MS) == Decision(True, True, "enforce", "default", None)


def test_apply_good_record_enforces_it():
    app, _ = applier()
    assert app.apply(signed(), T0) is True
    assert burst_pass_count(app, 10, T0_MS) == 1                # article example through the applier
    assert app.try_acquire("group", "get-pugc-to-ai-consumer", T0_MS + 500) is False
    assert app.try_acquire("group", "get-pugc-to-ai-consumer", T0_MS + 1000) is True
    # other resources are not affected
    assert burst_pass_count(app, 10, T0_MS, "topic", "orders") == 10
    assert app.refused == []


@pytest.mark.parametrize(
    "bad, reason_part",
    [
        (dict(signed(), limit_qps=1000.0), "bad signature"),                         # tampered
        (cr.sign(record(limit_qps=1000.0), b"attacker-key"), "bad signature"),      # forged
        (signed(limit_qps=1000.0, expires_at="2026-11-22T09:59:59Z"), "expired"),    # expired
        ({k: v for k, v in signed(limit_qps=1000.0).items() if k != "burst"}, "missing field: burst"),
        (dict(record(limit_qps=float("inf")), signature="0" * 64), "not finite"),
        (signed(limit_qps=1000.0, mode="yolo"), "unknown mode"),
        ("not a record", "not a JSON object"),
    ],
)
def test_refused_records_are_not_applied_and_last_good_limit_stays(bad, reason_part, caplog):
    app, _ = applier()
    assert app.apply(signed(), T0)                              # last good: 1 qps
    with caplog.at_level(logging.WARNING, logger="rate_governor.applier"):
        assert app.apply(bad, T0) is False
    assert len(app.refused) == 1 and reason_part in app.refused[0][1]
    assert any(reason_part in r.getMessage() for r in caplog.records)
    assert app.current_record("group", "get-pugc-to-ai-consumer", T0_MS)["limit_qps"] == 1.0
    assert burst_pass_count(app, 10, T0_MS) == 1                # still 1 qps, not 1000


def test_refused_record_without_previous_limit_keeps_default():
    app, _ = applier(default_qps=5.0)
    assert app.apply(dict(signed(), limit_qps=1000.0), T0) is False
    d = app.decide("group", "get-pugc-to-ai-consumer", T0_MS)
    assert d.source == "default" and d.limit_qps == 5.0


def test_expired_limit_falls_back_to_default():
    app, _ = applier(default_qps=None)
    assert app.apply(signed(expires_at="2026-11-22T10:00:10Z"), T0)
    assert burst_pass_count(app, 10, T0_MS) == 1
    later = T0_MS + 10_000                                      # == expires_at: expired, fail open
    assert burst_pass_count(app, 10, later) == 10
    assert app.current_record("group", "get-pugc-to-ai-consumer", later) is None


def test_expired_limit_falls_back_to_limited_default():
    app, _ = applier(default_qps=1000.0)
    assert app.apply(signed(expires_at="2026-11-22T10:00:10Z"), T0)
    d = app.decide("group", "get-pugc-to-ai-consumer", T0_MS + 20_000)
    assert d.allowed and d.source == "default" and d.limit_qps == 1000.0


def test_default_by_type():
    app, _ = applier(default_qps=None, default_qps_by_type={"group": 1.0})
    assert burst_pass_count(app, 10, T0_MS, "topic", "orders") == 10
    assert burst_pass_count(app, 10, T0_MS, "group", "g") == 1


def test_tombstone_lifts_limit():
    app, _ = applier()
    assert app.apply(("group:get-pugc-to-ai-consumer", json.dumps(signed())), T0)
    assert burst_pass_count(app, 10, T0_MS) == 1
    assert app.apply((b"group:get-pugc-to-ai-consumer", None), T0) is True
    assert burst_pass_count(app, 10, T0_MS + 5000) == 10
    assert app.current_record("group", "get-pugc-to-ai-consumer") is None


def test_kafka_pair_key_mismatch_and_bad_key_refused():
    app, _ = applier()
    assert app.apply(("topic:orders", signed()), T0) is False
    assert "key mismatch" in app.refused[-1][1]
    assert app.apply(("broker:x", None), T0) is False
    assert app.apply(("group:g", b"{not json"), T0) is False
    assert "malformed JSON" in app.refused[-1][1]


def test_stale_version_refused():
    app, _ = applier()
    assert app.apply(signed(version=5, limit_qps=1.0), T0)
    assert app.apply(signed(version=4, limit_qps=1000.0), T0) is False
    assert "stale version" in app.refused[-1][1]
    assert app.apply(signed(version=5, limit_qps=1.0), T0)      # same version again: idempotent
    assert app.apply(signed(version=6, limit_qps=2.0), T0)
    assert app.current_record("group", "get-pugc-to-ai-consumer", T0_MS)["limit_qps"] == 2.0


def test_new_limit_is_applied_live():
    app, _ = applier()
    assert app.apply(signed(version=1, limit_qps=1.0, burst=1), T0)
    assert burst_pass_count(app, 10, T0_MS) == 1
    lim = app.limiter("group", "get-pugc-to-ai-consumer")
    assert app.apply(signed(version=2, limit_qps=100.0, burst=None, breaker_open_ms=0), T0)
    # after one second at the new rate the bucket holds one second of tokens
    assert burst_pass_count(app, 200, T0_MS + 1000) == 100
    assert app.limiter("group", "get-pugc-to-ai-consumer") is lim  # same limiter, set_rate


def test_advisory_never_rejects_but_reports():
    app, _ = applier()
    assert app.apply(signed(mode="advisory"), T0)
    decisions = [app.decide("group", "get-pugc-to-ai-consumer", T0_MS) for _ in range(10)]
    assert all(d.allowed for d in decisions)
    assert [d.would_allow for d in decisions].count(True) == 1
    assert all(d.mode == "advisory" and d.source == "record" and d.limit_qps == 1.0 for d in decisions)
    assert burst_pass_count(app, 10, T0_MS) == 10


def test_advisory_keeps_default_enforced():
    app, _ = applier(default_qps=1.0)
    assert app.apply(signed(mode="advisory", limit_qps=1000.0, burst=1000), T0)
    # one second later the advisory bucket holds 1000 tokens, the default (1 qps) bucket one
    decisions = [app.decide("group", "get-pugc-to-ai-consumer", T0_MS + 1000) for _ in range(10)]
    assert [d.allowed for d in decisions].count(True) == 1     # the default still governs
    assert all(d.would_allow for d in decisions)


def test_load_file_applies_and_lifts(tmp_path):
    path = tmp_path / "control" / "limits.json"
    app, _ = applier()
    cr.write_limits_file([signed(), signed(resource_type="topic", resource="orders")], path)
    res = app.load_file(path, T0)
    assert (res.applied, res.refused, res.lifted) == (2, 0, 0)
    assert burst_pass_count(app, 10, T0_MS, "topic", "orders") == 1

    # next generation: orders lifted (absent), the group record tampered -> keeps last good
    cr.write_limits_file([dict(signed(), limit_qps=1000.0)], path)
    res = app.load_file(path, T0)
    assert (res.applied, res.refused, res.lifted) == (0, 1, 1)
    assert burst_pass_count(app, 10, T0_MS + 5000, "topic", "orders") == 10
    assert app.current_record("group", "get-pugc-to-ai-consumer", T0_MS)["limit_qps"] == 1.0


def test_load_file_missing_or_malformed_changes_nothing(tmp_path):
    app, _ = applier()
    assert app.apply(signed(), T0)
    res = app.load_file(tmp_path / "missing.json", T0)
    assert res.error and app.refused[-1][0].startswith("file:")
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    assert app.load_file(tmp_path / "bad.json", T0).error
    assert app.current_record("group", "get-pugc-to-ai-consumer", T0_MS) is not None


def test_apply_uses_clock_when_now_not_given():
    app, clock = applier()
    assert app.apply(signed(expires_at="2026-11-22T10:00:10Z"))
    clock.t = (T0 + timedelta(seconds=10)).timestamp()
    assert app.apply(signed(expires_at="2026-11-22T10:00:10Z")) is False
    assert app.refused[-1][1].startswith("expired")


def test_each_broker_applies_its_own_share_of_a_per_broker_record():
    """A record with per-broker figures: each broker's applier enforces its own share (the shares add up to the
    cluster-wide limit), an unlisted broker the "*" figure, an applier without a broker name the cluster-wide one."""
    shares = {"broker-a": {"limit_qps": 3.0, "burst": 3}, "broker-b": {"limit_qps": 1.0, "burst": 1},
              "*": {"limit_qps": 1.0, "burst": 1}}
    rec = signed(limit_qps=4.0, burst=4, brokers=shares)
    admitted = {}
    for broker in ("broker-a", "broker-b", "broker-new", None):
        app, _ = applier(broker=broker)
        assert app.apply(rec, T0) is True
        # 10 s at 20 requests per second (one every 50 ms): the bucket admits about its rate
        admitted[broker] = sum(app.try_acquire("group", "get-pugc-to-ai-consumer", now_ms=T0_MS + 50 * i)
                               for i in range(200))
    assert 20 <= admitted["broker-a"] <= 40
    assert 8 <= admitted["broker-b"] <= 14
    assert admitted["broker-new"] == admitted["broker-b"]
    assert admitted[None] > admitted["broker-a"]
