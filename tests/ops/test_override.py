"""The override command (pipelines/ops/override.py) on a small lake in the governor's schemas (no Spark): what it
writes to control/overrides, what list says, every bad input refused with one line and nothing written; the status
page's overrides and the overrides' gauges (pipelines/ops/override_metrics.py)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.config import GovernorConfig
from pipelines.ops import metrics, override, override_metrics, status
from pipelines.ops.metrics import GovernorMetrics
from pipelines.ops.query import run_sql
from tests.ops.lake_fixture import NOW, build_lake

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def lake(tmp_path) -> Path:
    return build_lake(tmp_path / "lake")


def run(lake: Path, *argv: str, at: dt.datetime = NOW, capsys=None) -> tuple[int, str, str]:
    code = override.main([*argv, "--lake", str(lake)], now=at)
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return code, out, err


def rows(lake: Path) -> list[dict]:
    if not (lake / "control" / "overrides").is_dir():
        return []
    return run_sql(str(lake), "SELECT * FROM control_overrides ORDER BY recorded_at, event").to_pylist()


def test_pin_exempt_list_and_release_as_an_on_call_engineer_would(lake, capsys):
    code, out, _ = run(lake, "pin", "group", "cg-billing", "--qps", "800", "--for", "2h", "--reason", "sale",
                       "--author", "alice", capsys=capsys)
    assert code == 0
    pin_id = out.split(":")[0]
    assert out.startswith(f"{pin_id}: group cg-billing pinned at 800.0 msg/s until 2026-11-22T12:50:00Z (by alice); "
                          "the governor applies it within 2 s")
    later = NOW + dt.timedelta(minutes=5)
    code, out, _ = run(lake, "exempt", "group", "cg-billing", "--for", "30m", "--reason", "billing run", at=later,
                       capsys=capsys)
    exempt_id = out.split(":")[0]
    assert code == 0 and f"newer than {pin_id}, which it replaces" in out
    written = rows(lake)
    assert [(r["event"], r["kind"], r["limit_qps"], r["author"]) for r in written] == [
        ("create", "pin", 800.0, "alice"), ("create", "exempt", None, os.environ.get("USER") or written[1]["author"])]
    assert written[0]["ends_at"] - written[0]["starts_at"] == dt.timedelta(hours=2)
    code, out, _ = run(lake, "list", at=later, capsys=capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["ID", "KIND", "RESOURCE"]
    assert exempt_id in lines[1] and "in force" in lines[1]  # the newest wins, and list says so
    assert pin_id in lines[2] and f"not applied: {exempt_id} is newer and wins" in lines[2]
    code, out, _ = run(lake, "release", exempt_id, "--reason", "done", "--author", "bob",
                       at=later + dt.timedelta(minutes=1), capsys=capsys)
    assert code == 0 and out.startswith(f"released {exempt_id} (exempt group cg-billing)")
    assert rows(lake)[-1]["event"] == "release" and rows(lake)[-1]["author"] == "bob"
    _, out, _ = run(lake, "list", at=later + dt.timedelta(minutes=2), capsys=capsys)
    assert "released by bob at 2026-11-22T10:56:00Z" in out and f"{pin_id}" in out
    assert [line for line in out.splitlines() if pin_id in line][0].count("in force") == 1  # the pin is back
    _, out, _ = run(lake, "list", at=NOW + dt.timedelta(days=2), capsys=capsys)
    assert out.startswith("no override in force or ended in the last 24 hours")
    _, out, _ = run(lake, "list", "--all", at=NOW + dt.timedelta(days=2), capsys=capsys)
    assert pin_id in out and "ended at 2026-11-22T12:50:00Z" in out


@pytest.mark.parametrize("argv, message", [
    (["pin", "topic", "promo", "--qps", "0", "--for", "1h", "--reason", "x"], "--qps 0 must be a finite number"),
    (["pin", "topic", "promo", "--qps", "-5", "--for", "1h", "--reason", "x"], "--qps -5 must be a finite number"),
    (["pin", "topic", "promo", "--qps", "inf", "--for", "1h", "--reason", "x"], "--qps inf must be a finite number"),
    (["pin", "topic", "promo", "--qps", "nan", "--for", "1h", "--reason", "x"], "--qps nan must be a finite number"),
    (["pin", "topic", "promo", "--qps", "2000000", "--for", "1h", "--reason", "x"],
     "pin topic promo refused: 2e+06 msg/s is above limits.max_limit_qps = 1e+06"),
    (["pin", "topic", "promo", "--qps", "0.5", "--for", "1h", "--reason", "x"],
     "pin topic promo refused: 0.5 msg/s is below limits.min_limit_qps = 1"),
    (["pin", "topic", "SCHEDULE_TOPIC_XXXX", "--qps", "50", "--for", "1h", "--reason", "x"],
     "refused: SCHEDULE_TOPIC_XXXX is on limits.protected"),
    (["exempt", "topic", "promo", "--for", "25h", "--reason", "x"], "over overrides.max_duration_seconds = 86400"),
    (["exempt", "topic", "promo", "--for", "0s", "--reason", "x"], "must be more than 0 seconds"),
    (["exempt", "topic", "promo", "--for", "soon", "--reason", "x"], "--for 'soon' is not a duration"),
    (["exempt", "topic", "promo", "--for", "1h", "--reason", "  "], "an override needs an author and a reason"),
    (["release", "ovr-0123abcd"], "no override ovr-0123abcd in"),
])
def test_bad_input_is_one_line_a_non_zero_exit_and_nothing_written(lake, capsys, argv, message):
    code, out, err = run(lake, *argv, capsys=capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("rate-governor override: ") and message in err, err
    assert rows(lake) == []


@pytest.mark.parametrize("argv, message", [
    (["freeze", "topic", "promo"], "invalid choice: 'freeze'"),
    (["pin", "broker", "broker-a", "--qps", "5", "--for", "1h", "--reason", "x"], "invalid choice: 'broker'"),
    (["pin", "topic", "promo", "--for", "1h", "--reason", "x"], "the following arguments are required: --qps"),
    (["pin", "topic", "promo", "--qps", "lots", "--for", "1h", "--reason", "x"], "invalid float value: 'lots'"),
])
def test_an_unknown_verb_kind_or_flag_is_one_usage_line(lake, capsys, argv, message):
    with pytest.raises(SystemExit) as stopped:
        override.main([*argv, "--lake", str(lake)], now=NOW)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and message in err and err.endswith("(see --help)\n"), err


def test_a_lake_without_a_governors_tables_and_a_release_of_an_ended_override_are_refused(lake, tmp_path, capsys):
    code, _, err = run(tmp_path / "elsewhere", "list", capsys=capsys)
    assert code == 2 and "not a governor's lake (none of bronze/broker_stats" in err
    _, out, _ = run(lake, "pin", "topic", "promo", "--qps", "50", "--for", "10m", "--reason", "x", capsys=capsys)
    code, _, err = run(lake, "release", out.split(":")[0], at=NOW + dt.timedelta(minutes=11), capsys=capsys)
    assert code == 2 and "is no longer in force: ended at 2026-11-22T11:00:00Z" in err


def test_the_command_as_a_process_prints_one_line_and_exits_non_zero(lake):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pipelines.ops.override", "pin", "group", "g", "--qps", "-1",
                           "--for", "1h", "--reason", "x", "--lake", str(lake)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "rate-governor override: --qps -1 must be a finite number of msg/s above 0\n"


def test_the_status_page_lists_overrides_in_force_and_recent(lake, tmp_path, capsys):
    run(lake, "pin", "group", "cg-billing", "--qps", "80", "--for", "2h", "--reason", "sale <b>", "--author", "alice",
        at=NOW - dt.timedelta(minutes=30), capsys=capsys)
    run(lake, "exempt", "topic", "promo", "--for", "10m", "--reason", "old", at=NOW - dt.timedelta(hours=30),
        capsys=capsys)
    page = status.write_page(str(lake), tmp_path / "out", now=NOW).read_text()
    section = page.split("<h2>Operators' overrides</h2>")[1].split("<h2>")[0]
    assert "cg-billing" in section and "80.0" in section and "in force" in section and "alice" in section
    assert "sale &lt;b&gt;" in section and "promo" not in section  # escaped; ended 30 h ago: not recent


def test_the_gauges_count_overrides_in_force_and_tell_when_each_ends():
    fresh = GovernorMetrics()
    previous = metrics.install(fresh)
    try:
        cfg = GovernorConfig()
        made = lambda oid, kind, res, start, end: {  # noqa: E731
            "recorded_at": start, "event": "create", "override_id": oid, "kind": kind, "resource_type": "group",
            "resource": res, "limit_qps": 10.0 if kind == "pin" else None, "starts_at": start, "ends_at": end,
            "author": "a", "reason": "r"}
        rows_ = [made("ovr-0000000a", "pin", "g", NOW, NOW + dt.timedelta(hours=1)),
                 made("ovr-0000000b", "exempt", "h", NOW, NOW + dt.timedelta(hours=2)),
                 made("ovr-0000000c", "exempt", "old", NOW - dt.timedelta(hours=3), NOW - dt.timedelta(hours=2))]
        overrides, _ = override.parse(rows_, cfg)
        override_metrics.observe(overrides, NOW + dt.timedelta(minutes=1))
        sample = fresh.registry.get_sample_value
        assert sample("rate_governor_overrides_active", {"kind": "pin"}) == 1.0
        assert sample("rate_governor_overrides_active", {"kind": "exempt"}) == 1.0
        assert sample("rate_governor_override_ends_timestamp_seconds", {
            "resource_type": "group", "resource": "g", "kind": "pin", "override_id": "ovr-0000000a"}) == \
            (NOW + dt.timedelta(hours=1)).timestamp()
        override_metrics.observe(overrides, NOW + dt.timedelta(hours=1, minutes=30))  # the pin has ended
        assert sample("rate_governor_overrides_active", {"kind": "pin"}) == 0.0
        assert sample("rate_governor_override_ends_timestamp_seconds", {
            "resource_type": "group", "resource": "g", "kind": "pin", "override_id": "ovr-0000000a"}) is None
    finally:
        metrics.install(previous)
