"""Tests of the scenario generator (pure Python, no Spark): determinism, line formats, article-001 numbers,
send failures and the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

from pipelines.sim import cli as sim_cli
from pipelines.sim.scenarios import build_send_failures
from pipelines.sim.render import render_landing
from pipelines.sim.spec import ScenarioSpec
from pipelines.sim.traffic import TRAFFIC_COLUMNS, build_traffic

#: Onset = 07:39 UTC, so the first storm minute is printed at 15:40:00 GMT+8 like the article's line.
STORM_START = datetime(2022, 2, 8, 6, 39, tzinfo=timezone.utc)
ARTICLE_SUM = 47119
CULPRIT = "get-pugc-to-ai-consumer"
RETRY_TOPIC = f"%RETRY%{CULPRIT}"

LINE = re.compile(r"^(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) INFO - \[(?P<stat>[A-Z_]+)\] \[(?P<key>[^\]]+)\] "
                  r"(?P<rest>.+)$")
NUM = r"(\d+)"
DEC = r"(\d+\.\d{2})"
KINDS: dict[str, re.Pattern[str]] = {
    "minute": re.compile(rf"^Stats In One Minute, SUM: {NUM} TPS: {DEC} AVGPT: {DEC}$"),
    "minute_nan": re.compile(r"^Stats In One Minute, SUM: 0 TPS: NaN AVGPT: 0\.00$"),
    "minute_times": re.compile(rf"^Stats In One Minute, TIMES: {NUM} AVGRT: {DEC}$"),
    "hour": re.compile(rf"^Stats In One Hour, SUM: {NUM} TPS: {DEC} AVGPT: {DEC}$"),
    "hour_nan": re.compile(r"^Stats In One Hour, SUM: 0 TPS: NaN AVGPT: 0\.00$"),
    "day": re.compile(rf"^Stats In One Day, SUM: {NUM} TPS: {DEC} AVGPT: {DEC}$"),
    "day_nan": re.compile(r"^Stats In One Day, SUM: 0 TPS: NaN AVGPT: 0\.00$"),
    "five_min": re.compile(rf"^Stats Every 5 Minutes, Value: {NUM}$"),
}
KEY_SHAPES: dict[str, re.Pattern[str]] = {
    "TOPIC_PUT_NUMS": re.compile(r"^[^@]+$"), "TOPIC_PUT_SIZE": re.compile(r"^[^@]+$"),
    "GROUP_GET_NUMS": re.compile(r"^[^@]+@[^@]+$"), "GROUP_GET_SIZE": re.compile(r"^[^@]+@[^@]+$"),
    "SNDBCK_PUT_NUMS": re.compile(r"^[^@]+@[^@]+$"),
    "GROUP_GET_LATENCY": re.compile(r"^\d+@[^@]+@[^@]+$"), "GROUP_GET_FALL_SIZE": re.compile(r"^\d+@[^@]+@[^@]+$"),
    "BROKER_PUT_NUMS": re.compile(r"^DefaultCluster$"), "BROKER_GET_NUMS": re.compile(r"^DefaultCluster$"),
}


def read_stats(root: Path) -> dict[str, list[str]]:
    """broker → raw lines, from raw stats.log folders and shipper envelopes alike."""
    out: dict[str, list[str]] = defaultdict(list)
    for path in sorted((root / "broker_stats").rglob("*")):
        if not path.is_file():
            continue
        if path.parent.name == "shipper":
            for raw in path.read_text(encoding="utf-8").splitlines():
                env = json.loads(raw)
                assert set(env) == {"broker", "cluster", "line"} and env["cluster"] == "DefaultCluster"
                out[env["broker"]].append(env["line"])
        else:
            out[path.parent.name].extend(path.read_text(encoding="utf-8").splitlines())
    return dict(out)


def read_failures(root: Path) -> list[dict]:
    rows = []
    for path in sorted((root / "send_failures").glob("failures-*.jsonl")):
        rows += [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    return rows


def minute_sums(lines: list[str], stat: str, key: str) -> dict[str, int]:
    """stamp → SUM of the minute lines of one item."""
    out = {}
    for line in lines:
        m = LINE.match(line)
        if m and m["stat"] == stat and m["key"] == key and m["rest"].startswith("Stats In One Minute, SUM:"):
            out[m["ts"]] = int(m["rest"].split("SUM: ")[1].split()[0])
    return out


def failure_time(ts: int | str) -> datetime:
    if isinstance(ts, int):
        return datetime.fromtimestamp(ts / 1000, tz=timezone.utc)
    assert ts.endswith("Z")
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def storm(tmp_path_factory: pytest.TempPathFactory) -> tuple[ScenarioSpec, Path, dict]:
    spec = ScenarioSpec(start=STORM_START)  # defaults: retry_storm, 90 min, 3 brokers, 30 topics, 20 groups
    root = tmp_path_factory.mktemp("storm")
    return spec, root, render_landing(spec, root)


# ---------------------------------------------------------------------------------------------------------------------
def test_layout_and_summary(storm: tuple[ScenarioSpec, Path, dict]) -> None:
    spec, root, result = storm
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == [
        "broker_stats/broker-a/stats.log", "broker_stats/broker-b/stats.log", "broker_stats/shipper/broker-c.jsonl",
        "send_failures/failures-broker-a.jsonl", "send_failures/failures-broker-b.jsonl",
        "send_failures/failures-broker-c.jsonl",
    ]
    assert result["files"] == 6
    assert result["onset"] == datetime(2022, 2, 8, 7, 39, tzinfo=timezone.utc)
    assert result["culprit_group"] == CULPRIT
    assert result["stats_lines"] == sum(len(v) for v in read_stats(root).values())
    assert result["failure_lines"] == len(read_failures(root))


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    spec = ScenarioSpec(start=STORM_START, minutes=20, topics=10, groups=5)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    render_landing(spec, a)
    render_landing(spec, b)
    render_landing(ScenarioSpec(start=STORM_START, minutes=20, topics=10, groups=5, seed=8), c)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert (a / "broker_stats/broker-a/stats.log").read_bytes() != (c / "broker_stats/broker-a/stats.log").read_bytes()


def test_every_line_kind_parses(tmp_path: Path) -> None:
    # 14:50 UTC + 80 min crosses 16:00 UTC = midnight GMT+8; broker-b prints TIMES/AVGRT (>= 4.9.3)
    spec = ScenarioSpec(start=datetime(2022, 2, 8, 14, 50, tzinfo=timezone.utc), minutes=80, brokers=2,
                        topics=10, groups=6, envelope_share=0.5)
    render_landing(spec, tmp_path)
    assert (tmp_path / "broker_stats/shipper/broker-b.jsonl").is_file()
    seen: dict[str, set[str]] = defaultdict(set)
    for broker, lines in read_stats(tmp_path).items():
        stamps = []
        for line in lines:
            m = LINE.match(line)
            assert m, line
            assert KEY_SHAPES[m["stat"]].match(m["key"]), line
            kinds = [k for k, rx in KINDS.items() if rx.match(m["rest"])]
            assert kinds, line
            for kind in kinds:
                seen[kind].add(m["stat"])
            stamps.append(m["ts"])
            if kinds == ["minute"]:
                detail = KINDS["minute"].match(m["rest"])
                assert detail[2] == "%.2f" % (int(detail[1]) / 60), line  # TPS = SUM / 60 s
            if "Hour" in line or "Day" in line:
                assert m["stat"] == "TOPIC_PUT_NUMS" and m["ts"].endswith(":00:00"), line
            if "Every 5 Minutes" in line:
                assert int(m["ts"][14:16]) % 5 == 0, line
        assert stamps == sorted(stamps), broker
        # GMT+8: the first minute [14:50, 14:51) UTC is stamped 22:51:00 and is the broker start (TPS NaN)
        assert stamps[0] == "2022-02-08 22:51:00" and stamps[-1] == "2022-02-09 00:10:00"
        assert all("TPS: NaN" in x or "TIMES: 0 AVGRT: 0.00" in x or "Every 5" in x
                   for x in lines if x.startswith("2022-02-08 22:51:00"))
        assert any(x.startswith("2022-02-09 00:00:00") and "Stats In One Day" in x for x in lines)
    assert {"minute", "minute_nan", "minute_times", "hour", "day", "five_min"} <= set(seen)
    assert seen["minute_times"] == {"GROUP_GET_LATENCY"} and seen["five_min"] == {"GROUP_GET_FALL_SIZE"}


def test_hour_line_sums_the_last_hour(tmp_path: Path) -> None:
    spec = ScenarioSpec(name="steady", start=datetime(2022, 2, 8, 6, 30, tzinfo=timezone.utc), minutes=95,
                        topics=8, groups=4, envelope_share=0.0)
    render_landing(spec, tmp_path)
    lines = (tmp_path / "broker_stats/broker-a/stats.log").read_text().splitlines()
    sums = minute_sums(lines, "TOPIC_PUT_NUMS", "pugc-content")
    hour = [x for x in lines if x.startswith("2022-02-08 16:00:00") and "[pugc-content] Stats In One Hour" in x]
    assert len(hour) == 1
    window = [f"2022-02-08 15:{mm:02d}:00" for mm in range(1, 60)] + ["2022-02-08 16:00:00"]
    assert f"SUM: {sum(sums[t] for t in window)} " in hour[0]


def test_retry_storm_reproduces_article_001(storm: tuple[ScenarioSpec, Path, dict]) -> None:
    spec, root, _ = storm
    lines = read_stats(root)["broker-a"]
    article = [x for x in lines if x.startswith("2022-02-08 15:40:00") and f"[TOPIC_PUT_NUMS] [{RETRY_TOPIC}]" in x]
    assert len(article) == 1 and "AVGPT: 1.00" in article[0]
    first_storm_stamp = "2022-02-08 15:40:00"  # onset 07:39 UTC + 1 min, GMT+8
    retry = minute_sums(lines, "TOPIC_PUT_NUMS", RETRY_TOPIC)
    after = [v for t, v in retry.items() if t >= first_storm_stamp]
    before = [v for t, v in retry.items() if t < first_storm_stamp]
    assert len(after) == spec.minutes - spec.onset_index
    assert all(abs(v - ARTICLE_SUM) <= 0.10 * ARTICLE_SUM for v in after), after
    assert max(before) < 0.01 * ARTICLE_SUM  # a small steady retry rate exists before
    sndbck = minute_sums(lines, "SNDBCK_PUT_NUMS", f"pugc-content@{CULPRIT}")
    assert all(abs(v - ARTICLE_SUM) <= 0.10 * ARTICLE_SUM for t, v in sndbck.items() if t >= first_storm_stamp)
    reconsume = minute_sums(lines, "GROUP_GET_NUMS", f"{RETRY_TOPIC}@{CULPRIT}")
    assert min(v for t, v in reconsume.items() if t >= first_storm_stamp) > 10 * max(
        v for t, v in reconsume.items() if t < first_storm_stamp)
    broker = minute_sums(lines, "BROKER_PUT_NUMS", "DefaultCluster")
    normal = [v for t, v in broker.items() if "2022-02-08 14:40:00" < t < first_storm_stamp]
    stormy = [v for t, v in broker.items() if t >= first_storm_stamp]
    assert 27_000 < sum(normal) / len(normal) < 34_000  # article: ~30,000/min before
    assert 6 <= (sum(stormy) / len(stormy)) / (sum(normal) / len(normal)) <= 10  # article: 225,400/min, ~8x
    # the other brokers see no storm
    for other in ("broker-b", "broker-c"):
        b = list(minute_sums(read_stats(root)[other], "BROKER_PUT_NUMS", "DefaultCluster").values())[1:]
        assert max(b) / min(b) < 1.5


def test_send_failures(storm: tuple[ScenarioSpec, Path, dict]) -> None:
    spec, root, _ = storm
    rows = read_failures(root)
    fields = ["ts", "topic", "broker", "producer_group", "client", "code", "message", "latency_ms"]
    assert all(list(r) == fields for r in rows)
    assert {type(r["ts"]) for r in rows} == {int, str}
    busy = [r for r in rows if "[TIMEOUT_CLEAN_QUEUE]" in r["message"]]
    first = spec.onset + timedelta(minutes=1)
    assert busy and all(failure_time(r["ts"]) >= first for r in busy)
    assert {r["broker"] for r in busy} == {"broker-a"} and "pugc-content" not in {r["topic"] for r in busy}
    assert {r["code"] for r in busy} == {2, None}
    assert 0.15 < sum(r["code"] is None for r in busy) / len(busy) < 0.45
    java = [r for r in busy if r["message"].startswith("CODE: 2  DESC: [TIMEOUT_CLEAN_QUEUE]broker busy")]
    go = [r for r in busy if r["message"].startswith("CODE: 2, DESC: [TIMEOUT_CLEAN_QUEUE]broker busy")]
    assert java and go and len(java) + len(go) == len(busy)
    assert all(" BROKER: 10.0.0.1:10911\nFor more information, please visit the url, "
               "http://rocketmq.apache.org/docs/faq/" in r["message"] for r in java)
    assert all(re.search(r"period in queue: 2\d\dms, size of queue: \d+", r["message"]) for r in busy)
    per_minute = pd.Series([failure_time(r["ts"]).replace(second=0, microsecond=0) for r in busy]).value_counts()
    assert len(per_minute) == spec.minutes - spec.onset_index - 1 and per_minute.between(10, 1000).all()
    # before the onset: a low trickle of ordinary failures on every broker
    early = [r for r in rows if failure_time(r["ts"]) < spec.onset]
    assert early and len(early) / spec.onset_index < 5
    assert {r["broker"] for r in early} == {"broker-a", "broker-b", "broker-c"}
    assert any(r["code"] is None and r["message"].startswith("RemotingTimeoutException: wait response on the channel")
               for r in early)
    assert all("[TIMEOUT_CLEAN_QUEUE]" not in r["message"] for r in early)


def test_steady_is_the_storm_without_incident(tmp_path: Path) -> None:
    storm_spec = ScenarioSpec(start=STORM_START)
    steady_spec = ScenarioSpec(name="steady", start=STORM_START)
    storm, steady = build_traffic(storm_spec), build_traffic(steady_spec)
    assert list(storm.columns) == list(TRAFFIC_COLUMNS) and steady.attrs["incident"] is None
    pre = storm_spec.onset
    a = storm[storm["minute_start"] < pre].reset_index(drop=True)
    b = steady[steady["minute_start"] < pre].reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)  # same catalog and noise: a backtest can diff the two
    retry = steady[(steady["stat_name"] == "TOPIC_PUT_NUMS") & (steady["stats_key"] == RETRY_TOPIC)]
    assert retry["sum"].max() < 0.01 * ARTICLE_SUM
    failures = build_send_failures(steady_spec, steady)
    assert len(failures) and not failures["message"].str.contains("TIMEOUT_CLEAN_QUEUE").any()
    assert list(failures.columns[:8]) == ["ts", "topic", "broker", "producer_group", "client", "code", "message",
                                          "latency_ms"]


def test_steady_topics_never_jump(tmp_path: Path) -> None:
    spec = ScenarioSpec(name="steady", start=STORM_START, topics=60, groups=10)
    t = build_traffic(spec)
    tp = t[(t["stat_name"] == "TOPIC_PUT_NUMS") & (t["minute_start"] > spec.start_utc)
           & ~t["stats_key"].astype(str).str.startswith("%")]
    wide = tp.pivot_table(index="minute_start", columns=["broker", "stats_key"], values="sum", observed=True)
    ratio = (wide / wide.shift(1)).iloc[1:]
    assert ratio.max().max() < 1.5 and (1 / ratio).max().max() < 1.5
    topics = t[(t["stat_name"] == "TOPIC_PUT_NUMS")]
    broker_put = t[t["stat_name"] == "BROKER_PUT_NUMS"].groupby(["minute_start", "broker"], observed=True)["sum"].sum()
    topic_put = topics.groupby(["minute_start", "broker"], observed=True)["sum"].sum()
    rel = (broker_put / topic_put).dropna()
    assert ((rel - 1).abs() < 0.01).all()  # BROKER_PUT_NUMS ≈ the sum of the broker's topic puts


def test_cli_bad_flag_exits_non_zero(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pipelines.sim", "--out", str(tmp_path), "--bogus"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and "--bogus" in proc.stderr


def test_cli_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_cli.main(["--out", str(tmp_path / "ok"), "--minutes", "6", "--topics", "5", "--groups", "3",
                     "--start", "2022-02-08T07:35:00Z"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "2022-02-08T07:39:00Z" in out[0] and CULPRIT in out[0]
    assert sim_cli.main(["--out", str(tmp_path / "x"), "--minutes", "1"]) != 0
    (tmp_path / "file").write_text("")
    assert sim_cli.main(["--out", str(tmp_path / "file" / "sub"), "--minutes", "3"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("error" in e for e in err)
    with pytest.raises(SystemExit) as exc:
        sim_cli.main(["--out", str(tmp_path), "--start", "not-a-time"])
    assert exc.value.code != 0
