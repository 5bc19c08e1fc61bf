"""The shipped rsyslog configuration (conf/shippers/rsyslog-rate-governor.conf), run by a real rsyslogd: it tails a
stats.log and a send-failure file, writes the contract's records to a spool that move-spool.sh moves into a landing
directory; the governor's parser reads what it wrote exactly as it reads the original lines. The Kafka output
(omkafka, same templates) is checked by rsyslog's own config validation only: librdkafka could not talk to the one
Kafka-protocol broker that runs here (Tansu 0.6: "Broker transport failure"), see docs/shippers.md."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from chispa import assert_df_equality

from pipelines import schemas
from pipelines.config import BrokersConfig, StatsConfig
from pipelines.dataplane.transforms import parse, parse_failures
from tests.helpers import INGESTED, raw_records, stats_line

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "conf" / "shippers" / "rsyslog-rate-governor.conf"
MOVER = ROOT / "conf" / "shippers" / "move-spool.sh"
RSYSLOGD = shutil.which("rsyslogd") or (Path("/usr/sbin/rsyslogd") if Path("/usr/sbin/rsyslogd").exists() else None)
OMKAFKA = any(Path(d, "omkafka.so").exists() for d in ("/usr/lib/x86_64-linux-gnu/rsyslog", "/usr/lib/rsyslog",
                                                       "/usr/lib/aarch64-linux-gnu/rsyslog"))
needs_rsyslog = pytest.mark.skipif(RSYSLOGD is None or not OMKAFKA,
                                   reason="rsyslogd with omkafka not installed (Debian: rsyslog rsyslog-kafka)")

STATS_LINES = [
    stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "orders", "SUM: 600 TPS: 10.00 AVGPT: 1.00"),
    stats_line("2022-02-08 15:40:00", "SNDBCK_PUT_NUMS", "%RETRY%g1@g1", "SUM: 120 TPS: 2.00 AVGPT: 0.50"),
    stats_line("2022-02-08 15:40:00", "GROUP_GET_LATENCY", "0@orders@g1", "TIMES: 12 AVGRT: 3.50"),
    stats_line("2022-02-08 15:40:00", "TOPIC_PUT_NUMS", "quiet", "SUM: 0 TPS: NaN AVGPT: 0.00"),
    stats_line("2022-02-09 00:00:00", "TOPIC_PUT_NUMS", "orders", "SUM: 36000 TPS: 10.00 AVGPT: 1.00", "In One Hour"),
    'not a stats line with "quotes" and a \\ backslash',  # quarantined either way, with the same reason
]
FAILURE_LINES = [
    json.dumps({"ts": 1644306000000, "topic": "orders", "broker": "broker-a", "producer_group": "pg", "code": 2,
                "message": "CODE: 2  DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while",
                "latency_ms": 3001}),
    json.dumps({"ts": "2022-02-08T07:40:01Z", "topic": "orders", "broker": None, "code": None,
                "message": 'sendDefaultImpl call timeout "RemotingTimeoutException"'}),
]


def start_rsyslogd(tmp: Path, **env: str) -> subprocess.Popen:
    (tmp / "state").mkdir(exist_ok=True)
    environment = {
        **os.environ, "RG_BROKER_NAME": "broker-a", "RG_CLUSTER": "DefaultCluster", "RG_STATE_DIR": str(tmp / "state"),
        "RG_STATS_LOG": str(tmp / "logs" / "stats.log"), "RG_FAILURES_LOG": str(tmp / "logs" / "failures.jsonl"),
        "RG_SPOOL": str(tmp / "spool"), "RG_KAFKA_BROKERS": "", **env,
    }
    return subprocess.Popen([str(RSYSLOGD), "-n", "-f", str(CONFIG), "-i", str(tmp / "rsyslogd.pid")], env=environment,
                            stdout=open(tmp / "rsyslogd.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def lines_under(folder: Path) -> list[str]:
    return [line for f in sorted(folder.rglob("*.jsonl")) for line in f.read_text().splitlines()]


def ship(tmp: Path, **env: str) -> Path:
    """Write the logs, let rsyslogd ship them, stop it, move the spool into ``tmp/landing``; returns the landing."""
    (tmp / "logs").mkdir()
    (tmp / "logs" / "stats.log").write_text("\n".join(STATS_LINES[:3]) + "\n")
    (tmp / "logs" / "failures.jsonl").write_text("\n".join(FAILURE_LINES) + "\n")
    proc = start_rsyslogd(tmp, **env)
    try:
        time.sleep(1)
        with open(tmp / "logs" / "stats.log", "a") as log:  # lines appended while it tails the file
            log.write("\n".join(STATS_LINES[3:]) + "\n")
        deadline = time.monotonic() + 60
        while len(lines_under(tmp / "spool")) < len(STATS_LINES) + len(FAILURE_LINES):
            assert proc.poll() is None, (tmp / "rsyslogd.log").read_text()
            assert time.monotonic() < deadline, f"spool: {lines_under(tmp / 'spool')}"
            time.sleep(0.2)
    finally:
        stop(proc)
    subprocess.run([str(MOVER), str(tmp / "spool"), str(tmp / "landing"), "0"], check=True)
    assert lines_under(tmp / "spool") == []
    return tmp / "landing"


def shipped_records(spark, landing: Path, source: str):
    rows = [(source, line, line.encode("utf-8"), f"file://{landing}/{source}/x.jsonl", None, INGESTED)
            for line in lines_under(landing / source)]
    return spark.createDataFrame(rows, schemas.RAW_RECORD)


@needs_rsyslog
def test_config_passes_rsyslog_validation(tmp_path):
    env = {**os.environ, "RG_STATE_DIR": str(tmp_path), "RG_STATS_LOG": str(tmp_path / "s.log"),
           "RG_FAILURES_LOG": str(tmp_path / "f.jsonl")}
    result = subprocess.run([str(RSYSLOGD), "-N1", "-f", str(CONFIG)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "End of config validation run" in result.stderr


@pytest.mark.slow
@needs_rsyslog
def test_rsyslog_envelopes_parse_like_the_original_lines(spark, tmp_path):
    landing = ship(tmp_path)
    envelopes = lines_under(landing / "broker_stats")
    assert [json.loads(e) for e in envelopes] == [
        {"broker": "broker-a", "cluster": "DefaultCluster", "line": line} for line in STATS_LINES
    ]
    stats_cfg = StatsConfig()
    via_shipper = shipped_records(spark, landing, "broker_stats").transform(parse.parse_broker_stats(stats_cfg))
    direct = raw_records(spark, "broker_stats", STATS_LINES, "broker-a").transform(parse.parse_broker_stats(stats_cfg))
    silver_cols = ["event_time", "broker", "stat_name", "period", "topic", "consumer_group", "sum", "tps", "avgpt", "value"]
    assert_df_equality(via_shipper.transform(parse.silver_broker_stats).select(*silver_cols),
                       direct.transform(parse.silver_broker_stats).select(*silver_cols), ignore_row_order=True)
    assert {r["cluster"] for r in via_shipper.transform(parse.silver_broker_stats).collect()} == {"DefaultCluster"}
    reasons = [r["reason"] for r in via_shipper.transform(parse.quarantine_rows("broker_stats")).collect()]
    assert reasons == [r["reason"] for r in direct.transform(parse.quarantine_rows("broker_stats")).collect()]
    assert len(reasons) == 1

    assert lines_under(landing / "send_failures") == FAILURE_LINES  # passed through unchanged
    failures = shipped_records(spark, landing, "send_failures").transform(
        parse_failures.parse_send_failures(stats_cfg, BrokersConfig()))
    got = failures.transform(parse_failures.silver_send_failures).select("topic", "code", "failure_class").collect()
    assert sorted(((r["topic"], r["code"], r["failure_class"]) for r in got), key=lambda t: t[2]) == [
        ("orders", None, "CLIENT_TIMEOUT"), ("orders", 2, "TIMEOUT_CLEAN_QUEUE")]
