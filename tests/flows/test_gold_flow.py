"""The gold query's handler (pipelines/flows/gold.py GoldFlow.handle) on a static micro-batch."""

from __future__ import annotations

import uuid

from pipelines import schemas
from pipelines.config import load_config
from pipelines.flows.assembly import build_governor


def test_the_handler_first_job_runs_in_the_micro_batch_partitions(spark, tmp_path):
    """The first job (the window bounds, which fills the cache) runs in the partitions Spark emits the micro-batch
    in: coalescing before caching ran the whole stateful aggregation in one task (a backlog's first gold
    micro-batch took longer, docs/performance.md). The decisions then read the cache in one partition
    (tests/transforms/test_gold.py)."""
    cfg = load_config("conf/local.toml").with_paths(str(tmp_path / "landing"), str(tmp_path / "lake"))
    governor = build_governor(spark, cfg)
    micro_batch = spark.createDataFrame([], schemas.WINDOW_METRIC).repartition(3)  # no finalized window yet
    context = spark.sparkContext
    group = f"gold-flow-{uuid.uuid4()}"
    context.setJobGroup(group, "gold handler")
    try:
        governor.gold.handle(micro_batch, 0)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    tracker = context.statusTracker()
    first = min(tracker.getJobIdsForGroup(group))
    tasks = [tracker.getStageInfo(s).numTasks for s in tracker.getJobInfo(first).stageIds]
    assert max(tasks) == 3, tasks
