"""A real Prometheus for the tests: Debian's ``prometheus`` package (``.ci/run`` installs it), started on a free
loopback port with a throw-away TSDB, scraping given targets every second and evaluating the shipped alert rules
(``conf/prometheus/rate-governor.rules.yml``) every second. Asked only through its HTTP API (``/api/v1/query``,
``/api/v1/alerts``), as an operator's Grafana or Alertmanager would.

Example:
    >>> prom = PrometheusServer(tmp_path, targets=["127.0.0.1:9872"]).start()
    >>> prom.wait(lambda: prom.value('rate_governor_lease_held') == 1, 30, "the first scrape")
    >>> prom.stop()
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.kafka_broker import free_port

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "conf" / "prometheus" / "rate-governor.rules.yml"
#: The scrape job name the shipped rules expect (``up{job="rate-governor"}``).
JOB = "rate-governor"
MISSING = ("prometheus is not installed (Debian package 'prometheus'; .ci/run installs it), so the checks through a "
           "real Prometheus did not run")


def prometheus_binary() -> str | None:
    """Path of the ``prometheus`` executable, None when it is not installed."""
    return shutil.which("prometheus")


class PrometheusServer:
    """One Prometheus process scraping ``targets`` (``host:port``) as job :data:`JOB` every ``interval``."""

    def __init__(self, workdir: Path, targets: list[str], interval: str = "1s") -> None:
        self.dir = Path(workdir)
        self.targets = targets
        self.interval = interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "PrometheusServer":
        """Write its configuration, start it, and wait until it is ready (``/-/ready``)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": self.targets}]}],
        }))
        log = open(self.dir / "prometheus.log", "ab")
        self.process = subprocess.Popen(
            [prometheus_binary() or "prometheus", f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.wait(self._ready, timeout, "Prometheus to be ready")
        return self

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"prometheus exited {self.process.returncode}: see {self.dir / 'prometheus.log'}")
        try:
            return urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> dict | list:
        """``GET /api/v1/<path>?<params>``; its ``data`` (raises on an error answer)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> dict[tuple, float]:
        """An instant query's vector: the labels of each series (``__name__``, ``job`` and ``instance`` left out,
        sorted into a tuple of pairs) → its value."""
        data = self.api("query", query=promql)
        drop = {"__name__", "job", "instance"}
        return {tuple(sorted((k, v) for k, v in r["metric"].items() if k not in drop)): float(r["value"][1])
                for r in data["result"]}

    def value(self, promql: str) -> float | None:
        """The value of a query that gives at most one series (None: no series)."""
        found = self.query(promql)
        assert len(found) <= 1, found
        return next(iter(found.values()), None)

    def alerts(self) -> list[dict]:
        """Alerts pending or firing now (``/api/v1/alerts``): ``labels``, ``annotations``, ``state``."""
        return self.api("alerts")["alerts"]

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
