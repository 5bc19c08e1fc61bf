"""The control record of docs/contracts.md §3: canonical form, HMAC signature, verification, key loading,
atomic limits file."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pytest

from control import record as cr

KEY = b"test-signing-key"
NOW = datetime(2026, 11, 22, 10, 0, 0, tzinfo=timezone.utc)


def base_record(**overrides):
    rec = {
        "resource_type": "group",
        "resource": "get-pugc-to-ai-consumer",
        "limit_qps": 40.0,
        "burst": 40,
        "breaker_open_ms": 1000,
        "mode": "enforce",
        "expires_at": "2026-11-22T10:15:00Z",
        "version": 17,
        "reason": "RUNAWAY_RETRY: %RETRY%get-pugc-to-ai-consumer at 785.32 TPS vs baseline 12",
    }
    rec.update(overrides)
    return rec


def test_fields_match_contract():
    assert cr.FIELDS == ("resource_type", "resource", "limit_qps", "burst", "breaker_open_ms",
                         "mode", "expires_at", "version", "reason")


def test_canonical_json_is_sorted_compact_utf8_and_excludes_signature():
    rec = base_record(reason="重试风暴", signature="ab" * 32)
    raw = cr.canonical_json(rec)
    text = raw.decode("utf-8")
    assert "signature" not in text
    assert text.startswith('{"breaker_open_ms":1000,"burst":40,"expires_at":"2026-11-22T10:15:00Z",')
    assert '"limit_qps":40.0' in text          # floats rendered as Python's json does
    assert "重试风暴" in text                     # ensure_ascii=False
    assert ", " not in text and ": " not in text
    assert json.loads(text) == {k: v for k, v in rec.items() if k != "signature"}
    # key order of the input does not matter
    assert cr.canonical_json(dict(reversed(list(rec.items())))) == raw


def test_canonical_json_rejects_nan():
    with pytest.raises(ValueError):
        cr.canonical_json(base_record(limit_qps=float("nan")))


def test_sign_verify_round_trip():
    rec = base_record()
    signed = cr.sign(rec, KEY)
    assert "signature" not in rec              # a copy is returned
    assert len(signed["signature"]) == 64
    assert cr.verify(signed, KEY, NOW) == cr.VerifyResult(True, "ok")
    assert cr.verify(signed, KEY, NOW)         # truthy
    # survives a JSON round trip (what the file and Kafka sinks do)
    assert cr.verify(json.loads(json.dumps(signed)), KEY, NOW).ok
    # re-signing replaces the signature
    assert cr.sign(signed, KEY)["signature"] == signed["signature"]


def test_tampered_limit_refused():
    signed = cr.sign(base_record(), KEY)
    tampered = dict(signed, limit_qps=4000.0)
    res = cr.verify(tampered, KEY, NOW)
    assert not res.ok and res.reason == "bad signature"


def test_extra_field_is_signed_too():
    signed = cr.sign(base_record(), KEY)
    assert cr.verify(dict(signed, extra="x"), KEY, NOW).reason == "bad signature"


def test_wrong_key_refused():
    signed = cr.sign(base_record(), b"other-key")
    assert cr.verify(signed, KEY, NOW).reason == "bad signature"


def test_empty_key_refuses_and_cannot_sign():
    signed = cr.sign(base_record(), KEY)
    assert not cr.verify(signed, b"", NOW).ok
    with pytest.raises(cr.SigningKeyError):
        cr.sign(base_record(), b"")


def test_expired_refused():
    signed = cr.sign(base_record(expires_at="2026-11-22T10:00:00Z"), KEY)
    res = cr.verify(signed, KEY, NOW)                       # expires_at == now: expired
    assert not res.ok and res.reason.startswith("expired")
    assert cr.verify(signed, KEY, NOW - timedelta(seconds=1)).ok
    # naive datetimes are UTC
    assert not cr.verify(signed, KEY, NOW.replace(tzinfo=None)).ok


@pytest.mark.parametrize("field", cr.FIELDS + ("signature",))
def test_missing_field_refused(field):
    signed = cr.sign(base_record(), KEY)
    del signed[field]
    res = cr.verify(signed, KEY, NOW)
    assert not res.ok and res.reason == f"missing field: {field}"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_limit_refused(value):
    rec = dict(base_record(limit_qps=value), signature="0" * 64)
    res = cr.verify(rec, KEY, NOW)
    assert not res.ok and "not finite" in res.reason


@pytest.mark.parametrize("value", [0, 0.0, -5.0])
def test_non_positive_limit_refused(value):
    res = cr.verify(cr.sign(base_record(limit_qps=value), KEY), KEY, NOW)
    assert not res.ok and "limit_qps must be > 0" in res.reason


@pytest.mark.parametrize(
    "field, value",
    [
        ("limit_qps", "40"),
        ("limit_qps", True),
        ("burst", 40.0),
        ("breaker_open_ms", "1000"),
        ("version", 17.0),
        ("resource", None),
        ("reason", 3),
        ("expires_at", 1764000000),
    ],
)
def test_wrong_type_refused(field, value):
    rec = dict(base_record(**{field: value}), signature="0" * 64)
    res = cr.verify(rec, KEY, NOW)
    assert not res.ok and res.reason.startswith("wrong type") and field in res.reason


def test_unknown_resource_type_and_mode_refused():
    assert "unknown resource_type" in cr.verify(cr.sign(base_record(resource_type="broker"), KEY), KEY, NOW).reason
    assert "unknown mode" in cr.verify(cr.sign(base_record(mode="shadow"), KEY), KEY, NOW).reason


@pytest.mark.parametrize(
    "value",
    ["2026-11-22 10:15:00Z", "2026-11-22T10:15:00+00:00", "2026-11-22T10:15:00", "2026-13-22T10:15:00Z",
     "2026-11-22T10:15:00.5Z", ""],
)
def test_malformed_expires_at_refused(value):
    res = cr.verify(cr.sign(base_record(expires_at=value), KEY), KEY, NOW)
    assert not res.ok and "malformed expires_at" in res.reason


def test_not_a_mapping_refused():
    assert cr.verify([1, 2], KEY, NOW).reason.startswith("not a JSON object")
    assert not cr.verify(None, KEY, NOW).ok


def test_burst_null_allowed():
    assert cr.verify(cr.sign(base_record(burst=None), KEY), KEY, NOW).ok


def test_keys_and_expiry_helpers():
    assert cr.record_key(base_record()) == "group:get-pugc-to-ai-consumer"
    assert cr.parse_key(b"topic:a:b") == ("topic", "a:b")
    with pytest.raises(ValueError):
        cr.parse_key("broker:x")
    assert cr.format_expires_at(datetime(2026, 1, 2, 11, 4, 5, tzinfo=timezone(timedelta(hours=8)))) == \
        "2026-01-02T03:04:05Z"
    assert cr.parse_expires_at("2026-01-02T03:04:05Z") == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


# -- signing key ---------------------------------------------------------------------------------

def test_load_signing_key_env_wins(tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_bytes(b"  from-file\n")
    monkeypatch.setenv("RG_TEST_KEY", "from-env")
    assert cr.load_signing_key("RG_TEST_KEY", str(key_file)) == b"from-env"
    monkeypatch.delenv("RG_TEST_KEY")
    assert cr.load_signing_key("RG_TEST_KEY", str(key_file)) == b"from-file"   # stripped
    assert cr.load_signing_key("RG_TEST_KEY", None) is None
    assert cr.load_signing_key(None, None) is None


def test_load_signing_key_missing_file_raises(tmp_path, monkeypatch):
    monkeypatch.delenv("RG_TEST_KEY", raising=False)
    missing = tmp_path / "nope.key"
    with pytest.raises(cr.SigningKeyError, match="not found"):
        cr.load_signing_key("RG_TEST_KEY", str(missing))
    # the env var still wins over a missing file
    monkeypatch.setenv("RG_TEST_KEY", "k")
    assert cr.load_signing_key("RG_TEST_KEY", str(missing)) == b"k"


def test_load_signing_key_empty_file_raises(tmp_path):
    empty = tmp_path / "empty.key"
    empty.write_bytes(b"\n")
    with pytest.raises(cr.SigningKeyError, match="empty"):
        cr.load_signing_key(None, empty)


# -- limits file ------------------------------------------------------------------------------------

def test_write_and_read_limits_file_sorted(tmp_path):
    path = tmp_path / "control" / "limits.json"
    recs = [cr.sign(base_record(resource_type="topic", resource="orders"), KEY),
            cr.sign(base_record(resource_type="group", resource="g2"), KEY),
            cr.sign(base_record(resource_type="group", resource="g1"), KEY)]
    cr.write_limits_file(recs, path, generated_at=NOW)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["generated_at"] == "2026-11-22T10:00:00Z"
    assert [(r["resource_type"], r["resource"]) for r in doc["records"]] == \
        [("group", "g1"), ("group", "g2"), ("topic", "orders")]
    back = cr.read_limits_file(path)
    assert all(cr.verify(r, KEY, NOW).ok for r in back)
    assert os.listdir(path.parent) == ["limits.json"]


def test_write_limits_file_is_atomic_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "limits.json"
    old = [cr.sign(base_record(resource="old"), KEY)]
    cr.write_limits_file(old, path, generated_at=NOW)
    before = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(cr.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk on fire"):
        cr.write_limits_file([cr.sign(base_record(resource="new"), KEY)], path)
    assert path.read_bytes() == before                      # old content intact
    assert os.listdir(tmp_path) == ["limits.json"]          # no temp file left behind
    monkeypatch.undo()

    cr.write_limits_file([cr.sign(base_record(resource="new"), KEY)], path)
    assert [r["resource"] for r in cr.read_limits_file(path)] == ["new"]
    assert os.listdir(tmp_path) == ["limits.json"]


def test_write_limits_file_fails_before_touching_old_file_on_bad_record(tmp_path):
    path = tmp_path / "limits.json"
    cr.write_limits_file([cr.sign(base_record(), KEY)], path)
    before = path.read_bytes()
    with pytest.raises(ValueError):
        cr.write_limits_file([base_record(limit_qps=float("nan"))], path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["limits.json"]


def test_read_limits_file_malformed(tmp_path):
    bad = tmp_path / "limits.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError):
        cr.read_limits_file(bad)
    bad.write_text('{"records": {}}', encoding="utf-8")
    with pytest.raises(ValueError):
        cr.read_limits_file(bad)
    with pytest.raises(FileNotFoundError):
        cr.read_limits_file(tmp_path / "missing.json")


# --- per-broker shares (docs/contracts.md §3, "brokers") -------------------------------------------------------------
SHARES = {"broker-a": {"limit_qps": 30.0, "burst": 30}, "broker-b": {"limit_qps": 10.0, "burst": 10},
          "*": {"limit_qps": 5.0, "burst": 5}}


def test_brokers_field_is_signed_and_picked_per_broker():
    signed = cr.sign(base_record(brokers=SHARES), KEY)
    assert cr.verify(signed, KEY, NOW).ok
    tampered = dict(signed, brokers={**SHARES, "broker-a": {"limit_qps": 3000.0, "burst": 3000}})
    assert cr.verify(tampered, KEY, NOW).reason == "bad signature"
    assert cr.broker_limit(signed, "broker-a") == (30.0, 30)
    assert cr.broker_limit(signed, "broker-b") == (10.0, 10)
    assert cr.broker_limit(signed, "broker-z") == (5.0, 5)      # unlisted: the "*" figure
    assert cr.broker_limit(signed, None) == (40.0, 40)          # no broker name: cluster-wide
    assert cr.broker_limit(base_record(), "broker-a") == (40.0, 40)  # an older record: cluster-wide everywhere
    no_star = base_record(brokers={"broker-a": {"limit_qps": 30.0, "burst": None}})
    assert cr.broker_limit(no_star, "broker-b") == (40.0, 40)
    assert cr.broker_limit(no_star, "broker-a") == (30.0, None)


@pytest.mark.parametrize("brokers, reason", [
    ({}, "brokers must be a non-empty object"),
    ([1], "brokers must be a non-empty object"),
    ({"": {"limit_qps": 1.0}}, "empty broker name"),
    ({"b": 3.0}, "expected an object with limit_qps"),
    ({"b": {"limit_qps": 0}}, "limit_qps must be a finite number > 0"),
    ({"b": {"limit_qps": float("inf")}}, "limit_qps must be a finite number > 0"),
    ({"b": {"limit_qps": 1.0, "burst": 0}}, "burst must be an integer >= 1"),
])
def test_malformed_brokers_field_refused(brokers, reason):
    result = cr.validate(base_record(brokers=brokers))
    assert not result.ok and reason in result.reason
