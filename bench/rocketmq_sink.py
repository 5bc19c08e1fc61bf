"""Cost of the RocketMQ admin sink's publishes on loopback brokers (tests/rocketmq_loopback.py, real sockets on
127.0.0.1, current Sohu fork line), with the shipped ``[sink.rocketmq]`` settings of conf/local.toml, against a
baseline measured in the same run: the same publishes master by master (``max_parallel_brokers = 1``, no deadline),
as the sink ran before publishes became parallel.

    .venv/bin/python bench/rocketmq_sink.py [--limits 50] [--masters 3] [--stalled 20] [--repeat 3]

1. ``--limits`` group limits on ``--masters`` healthy masters: the first push (every rate changed), a publish with
   everything in line (nothing sent), and a lift of all (every rate back to the broker's default); best of
   ``--repeat`` rounds each.
2. One publish to a cluster of one healthy master and ``--stalled`` masters that accept connections and never
   answer.

Checks (exit 1 when one fails): every rate reaches its target and comes back to the broker default; the in-line
publish sends nothing; the stalled-cluster publish ends within ``publish_deadline_ms`` + 1 s and still sets the
healthy master.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines.config import RocketMQSinkConfig, load_config  # noqa: E402
from pipelines.writeback.rocketmq_sink import RocketMQAdminSink  # noqa: E402
from tests.rocketmq_loopback import LoopbackBroker, LoopbackNameServer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LATER = "2099-01-01T00:00:00Z"


def record(group: str, qps: float) -> dict:
    return {"resource_type": "group", "resource": group, "limit_qps": qps, "burst": int(qps), "mode": "enforce",
            "breaker_open_ms": 1000, "expires_at": LATER, "version": 1, "reason": "bench"}


def timed(action) -> tuple[float, object]:
    started = time.monotonic()
    out = action()
    return time.monotonic() - started, out


def healthy_round(cfg: RocketMQSinkConfig, limits: int, masters: int, repeat: int) -> tuple[dict, list[str]]:
    """Best times (s) of first push / in line / lift all, and the problems seen."""
    groups = [f"group-{i:03d}" for i in range(limits)]
    records = [record(g, 10.0 + i) for i, g in enumerate(groups)]
    best: dict[str, float] = {}
    problems: list[str] = []
    for _ in range(repeat):
        brokers = [LoopbackBroker(f"broker-{i}") for i in range(masters)]
        for b in brokers:
            for g in groups:
                b.traffic("%RETRY%" + g, retry=True)
        ns = LoopbackNameServer("c1", brokers)
        with tempfile.TemporaryDirectory() as tmp:
            sink = RocketMQAdminSink(cfg.model_copy(update={"namesrv_addr": (ns.addr,), "cluster": "c1"}), tmp)
            try:
                for step, (prev, cur) in {"first push": ([], records), "in line": (records, records),
                                          "lift all": (records, [])}.items():
                    took, sent = timed(lambda: sink.publish(prev, cur))
                    best[step] = min(best.get(step, took), took)
                    want = {"first push": limits * masters, "in line": 0, "lift all": limits * masters}[step]
                    if sent != want or sink.status:
                        problems.append(f"{step}: {sent} updates (wanted {want}), status {sink.status}")
                if any(q != 1000.0 for b in brokers for q in b.rates.values()):
                    problems.append("lift all: not every rate back at the broker default 1000")
            finally:
                sink.close()
                ns.stop()
                for b in brokers:
                    b.stop()
    return best, problems


def stalled_round(cfg: RocketMQSinkConfig, stalled: int) -> tuple[float, list[str]]:
    healthy = LoopbackBroker("broker-00")
    healthy.traffic("%RETRY%g1", retry=True)
    dead = [LoopbackBroker(f"broker-{i:02d}") for i in range(1, stalled + 1)]
    for b in dead:
        b.stall = True
    ns = LoopbackNameServer("c1", [healthy, *dead])
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        sink = RocketMQAdminSink(cfg.model_copy(update={"namesrv_addr": (ns.addr,), "cluster": "c1"}), tmp)
        try:
            took, _ = timed(lambda: sink.publish([], [record("g1", 40.0)]))
            if healthy.rates["%RETRY%g1"] != 40.0:
                problems.append("the healthy master was not set")
        finally:
            sink.close()
            ns.stop()
            for b in [healthy, *dead]:
                b.stop()
    return took, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", type=int, default=50)
    ap.add_argument("--masters", type=int, default=3)
    ap.add_argument("--stalled", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    logging.getLogger("rate_governor").setLevel(logging.ERROR)  # the stalled masters' per-broker warnings
    shipped = load_config(str(REPO / "conf" / "local.toml")).sink.rocketmq.model_copy(update={"enabled": True})
    baseline = shipped.model_copy(update={"max_parallel_brokers": 1, "publish_deadline_ms": 10**9})
    print(f"config: conf/local.toml [sink.rocketmq] timeout_ms={shipped.timeout_ms} "
          f"publish_deadline_ms={shipped.publish_deadline_ms} max_parallel_brokers={shipped.max_parallel_brokers}; "
          f"baseline: max_parallel_brokers=1, no deadline; {args.limits} limits x {args.masters} masters, "
          f"best of {args.repeat}; {args.stalled} stalled masters + 1 healthy")
    problems = []
    timings = {}
    for name, cfg in (("shipped", shipped), ("baseline", baseline)):
        timings[name], found = healthy_round(cfg, args.limits, args.masters, args.repeat)
        problems += [f"{name} {p}" for p in found]
    for step in ("first push", "in line", "lift all"):
        s, b = timings["shipped"][step] * 1000, timings["baseline"][step] * 1000
        print(f"{step:>10}: shipped {s:7.1f} ms   baseline {b:7.1f} ms   baseline/shipped {b / s:5.2f}x")
    stalled = {}
    for name, cfg in (("shipped", shipped), ("baseline", baseline)):
        stalled[name], found = stalled_round(cfg, args.stalled)
        problems += [f"{name} stalled: {p}" for p in found]
    print(f"   stalled: shipped {stalled['shipped']:7.2f} s    baseline {stalled['baseline']:7.2f} s    "
          f"baseline/shipped {stalled['baseline'] / stalled['shipped']:5.1f}x")
    if stalled["shipped"] > shipped.publish_deadline_ms / 1000 + 1.0:
        problems.append(f"stalled publish took {stalled['shipped']:.2f} s > deadline + 1 s")
    for p in problems:
        print(f"CHECK FAILED: {p}")
    print("checks: " + ("FAILED" if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
