"""pipelines.flows.fast.FastFlow: a micro-batch whose open windows prove no anomaly is judged without the decision
lock (it never waits for the final path's decisions); pipelines.flows.base.DecisionLock counts its releases."""

from __future__ import annotations

import threading

from pipelines.config import load_config
from pipelines.flows.assembly import build_governor
from pipelines.flows.base import DecisionLock
from tests.transforms.test_fast import T0, sums


def test_decision_lock_generation_counts_releases():
    lock = DecisionLock()
    seen = lock.generation
    with lock:
        assert lock.generation == seen  # nobody released it since
    assert lock.generation == seen + 1
    with lock:
        pass
    assert lock.generation == seen + 2


def test_a_quiet_micro_batch_is_handled_while_the_final_path_holds_the_lock(spark, tmp_path):
    cfg = load_config("conf/local.toml").with_paths(str(tmp_path / "landing"), str(tmp_path / "lake"))
    gov = build_governor(spark, cfg)
    quiet = sums(spark, [(T0, "broker-a", "orders", None, "TOPIC_PUT_NUMS", 600),
                         (T0, "broker-a", "orders", "g", "GROUP_GET_NUMS", 600)])
    done = threading.Event()
    with gov.fast.decision_lock:  # the final path deciding, as long as this block runs
        seen = gov.fast.decision_lock.generation
        worker = threading.Thread(target=lambda: (gov.fast.handle(quiet, 0), done.set()), daemon=True)
        worker.start()
        assert done.wait(120), "the quiet micro-batch waited for the decision lock"
        assert gov.fast.decision_lock.generation == seen  # it never took the lock
    assert gov.fast.reports[-1].rows == {}
    assert gov.fast.open_rows.rows.num_rows == quiet.count()  # remembered for later micro-batches
