"""Cluster mode, proven here: a Spark standalone master and one worker started from the project's own pyspark
(loopback only), the governor submitted with ./spark-submit.sh --master spark://127.0.0.1:PORT, the Delta tables
checked, and both daemons stopped by process id."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import functions as F

from pipelines.sim.render import render_landing
from pipelines.sim.spec import ScenarioSpec
from pipelines.dataplane.lake import open_lake
from tests.helpers import lean_config_file

pytestmark = pytest.mark.slow

SPEC = ScenarioSpec(
    seed=3, start=dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc), minutes=20, brokers=2, topics=4,
    groups=3, onset_minute=10,
)
LOOPBACK = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listening on {LOOPBACK}:{port} after {timeout_s} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


@pytest.fixture()
def standalone(tmp_path):
    spark_home = Path(pyspark.__file__).parent
    spark_class = str(spark_home / "bin" / "spark-class")
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": LOOPBACK, "SPARK_NO_DAEMONIZE": "1"}
    port = _free_port()
    logs = tmp_path / "daemon-logs"
    logs.mkdir()
    master = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(port),
         "--webui-port", str(_free_port())],
        env=env, stdout=open(logs / "master.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    worker = None
    try:
        _wait_for_port(port)
        worker = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://{LOOPBACK}:{port}", "--host", LOOPBACK,
             "--cores", "2", "--memory", "2g", "--webui-port", str(_free_port()), "--work-dir", str(tmp_path / "work")],
            env=env, stdout=open(logs / "worker.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while "Successfully registered with master" not in (logs / "worker.log").read_text():
            assert time.monotonic() < deadline, (logs / "worker.log").read_text()[-2000:]
            assert worker.poll() is None, (logs / "worker.log").read_text()[-2000:]
            time.sleep(0.5)
        yield f"spark://{LOOPBACK}:{port}"
    finally:
        for proc in (worker, master):
            if proc is not None:
                _stop(proc)
    assert master.poll() is not None and (worker is None or worker.poll() is not None)


def test_governor_on_a_standalone_cluster(spark, standalone, tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    written = render_landing(SPEC, landing)
    conf = lean_config_file(tmp_path / "lean.toml")
    done = subprocess.run(
        ["./spark-submit.sh", "--master", standalone, "--conf", f"spark.driver.host={LOOPBACK}",
         "--executor-memory", "1g", "--", "--conf", str(conf), "--landing", str(landing), "--lake", str(lake),
         "--once"],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    executors = list((tmp_path / "work").glob("app-*/*/stderr"))
    assert executors, "no executor ran on the standalone worker"
    tables = open_lake(spark, str(lake))
    assert tables.read("bronze/broker_stats").count() == written["stats_lines"]
    limited = tables.read("gold/limits").where(F.col("resource") == "get-pugc-to-ai-consumer").count()
    assert limited > 0
    assert (lake / "control" / "limits.json").is_file()
