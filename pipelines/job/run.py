"""One governor run: the lake's lease, the checkpoint checks, the governor's flows built, its queries started and
awaited, its metrics endpoint served (:func:`run`). The command line is :mod:`pipelines.governor`.
"""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from pipelines.config import GovernorConfig
from pipelines.job.checkpoint import check_checkpoint, clear_unplanned_first_batch
from pipelines.job.flows.assembly import Governor, build_governor
from pipelines.job.flows.base import Clock, utc_now
from pipelines.job.lease import GovernorLease, LakeHeldError
from pipelines.job.queries import _stop_all, start_queries
from pipelines.ops import metrics, progress

log = logging.getLogger("rate_governor")


def run(
    spark: SparkSession, cfg: GovernorConfig, *, once: bool, clock: Clock = utc_now, lease: GovernorLease | None = None
) -> Governor:
    """Run the governor on ``cfg`` (landing and lake already set). With ``once``, returns when all that has landed
    is processed; otherwise runs until a query stops or fails, serving its metrics (``[metrics] port``,
    :mod:`pipelines.ops.metrics`) meanwhile. Holds the lake's lease (``lease``, or a new one) while running and
    releases it at the end.

    Raises:
        LakeHeldError: another governor holds the lake (nothing was started or written), or this one's lease was
            lost (taken over, or expired while it hung longer than ``lake.lease_ttl_seconds``): its queries were
            stopped and it wrote nothing after its lease expired (every write asks the lease first).
        RuntimeError: a query failed (its name and error).
    """
    lease = lease or GovernorLease(cfg.lake.path, cfg.lake.lease_ttl_seconds)
    metrics.configure(cfg)
    lease.acquire()
    endpoint = None if once else metrics.serve(cfg.metrics)  # never stops the run: a busy port is one log line
    try:
        check_checkpoint(cfg)
        clear_unplanned_first_batch(cfg)  # under the lease: no other governor writes these checkpoints
        governor = build_governor(spark, cfg, clock)
        governor.lake.fence = lease.check  # no write once the lease is lost (taken over, or expired in a hang)
        listener = progress.attach(spark, governor, once=once)  # one console line per micro-batch
        # renewed from before the first query starts: a --once backlog can take longer than the ttl
        lease.start_renewing(on_lost=lambda: _stop_all(governor.queries))
        try:
            governor.known.start()  # the known brokers, read now (the trust line logged once) and kept fresh
            if not once:
                governor.overrides.start()  # operators' overrides applied within a fast trigger, input or not
            start_queries(spark, governor, once)
            if not once:
                spark.streams.awaitAnyTermination()
        except Exception:
            if not lease.lost:  # a query failed on the fence: the lease, not the query, is the error
                raise
        finally:
            progress.detach(spark, listener)
            governor.known.stop()
            governor.overrides.stop()
        if lease.lost:
            _stop_all(governor.queries)
            raise LakeHeldError(f"lake {cfg.lake.path}: the lease was taken over by another governor; stopped")
        for query in governor.queries:
            if query.exception() is not None:
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")
        return governor
    finally:
        lease.release()
        if endpoint is not None:
            endpoint.close()


