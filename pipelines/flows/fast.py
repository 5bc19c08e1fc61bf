"""The fast flow: preliminary decisions on *open* windows, every micro-batch (see :mod:`pipelines.transforms.fast`).

The query keeps running sums per window × resource in Spark's state store (``update`` output mode, the same
watermark as the gold query); each micro-batch gets the windows its input touched. Under the decision lock it reads
the newest finalized windows (baselines and the broker census), the policy state and the limits in force, folds the
candidates of the evidence already proven (no recovery: absence is only known on final windows), and appends the
``set`` decisions that change a limit to ``gold/limits`` with basis ``preliminary``, then publishes. It writes no
policy state: the final path stays the only owner of ``state/policy`` and reconciles what this flow decided.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.io import tables
from pipelines.config import GovernorConfig
from pipelines.flows.base import BatchReport, DecisionFlow, release, write_outputs
from pipelines.quality.gate import QualityGate
from pipelines.transforms import demand, fast, gold, policy, policy_fold, silver
from pipelines.transforms.reconcile import preliminary_state

log = logging.getLogger("rate_governor")

#: Delta transaction app id of the fast query's writes (with the micro-batch id as version).
FAST_APP_ID = "rate-governor-fast"
QUERY = "fast"


def open_window_stream(raw: DataFrame, cfg: GovernorConfig, gate: QualityGate) -> DataFrame:
    """Streaming RAW_RECORD rows → running sums per window × resource (:func:`pipelines.transforms.fast.open_window_sums`),
    with the gold query's watermark; run it in ``update`` output mode."""
    stats = raw.transform(silver.parsed_stats(cfg, gate.enforce_stats))
    failures = raw.transform(silver.parsed_failures(cfg, gate.enforce_failures))
    return (
        silver.metric_events(stats, failures)
        .withWatermark("event_time", f"{cfg.windows.watermark_seconds} seconds")
        .transform(fast.resource_events)
        .transform(fast.open_window_sums(cfg.windows))
    )


class FastFlow(DecisionFlow):
    """The ``foreachBatch`` handler of the fast query (preliminary decisions); see the module docstring.

    Constructor: :class:`pipelines.flows.base.DecisionFlow`.
    """

    def decide(self, open_windows: DataFrame, batch_id: int, now: dt.datetime) -> dict[str, DataFrame]:
        """Open windows → ``{tables.GOLD_LIMITS: preliminary decisions, tables.QUARANTINE: refused decisions}``; empty when
        the partial evidence proves no anomaly."""
        cfg = self.cfg
        first_open = open_windows.agg(F.min("window_start")).first()[0]
        since = gold.baseline_since(first_open, cfg)
        topic_history = self.lake.read(tables.GOLD_TOPIC_TPS, since=since).transform(self._single)
        broker_history = self.lake.read(tables.GOLD_BROKER_TPS, since=since).transform(self._single)
        newest_final, expected = fast.newest_final_window(broker_history)
        if newest_final is not None:  # windows the final path has decided are its business
            open_windows = open_windows.where(F.col("window_start") > F.lit(newest_final))
            topic_history = topic_history.where(F.col("window_start") <= F.lit(newest_final))
            broker_history = broker_history.where(F.col("window_start") <= F.lit(newest_final))
        anomalies = fast.preliminary_anomalies(
            open_windows, topic_history, broker_history, expected, cfg.windows, cfg.detection
        ).transform(self._single).persist()
        if anomalies.isEmpty():  # the usual case: no policy state to read, nothing to fold or write
            anomalies.unpersist()
            return {}
        candidates = demand.with_broker_tps(
            policy.candidate_limits(anomalies, fast.topic_carriers(open_windows), cfg.limits)
            .transform(lambda c: fast.cut_bounded_by_final_rates(c, open_windows, expected, cfg.windows)),
            fast.open_broker_tps(open_windows, cfg.windows),
        )
        state = preliminary_state(self.saved_state(), self.latest_limits())
        horizon = open_windows.agg(F.max("window_end")).first()[0]
        folded = policy_fold.decide(candidates, state, horizon, cfg.limits, cfg.windows.length_seconds, recover=False)
        decided = policy.finish_decisions(
            folded.where((F.col("row_kind") == "decision") & (F.col("action") == policy.ACTION_SET)),
            cfg.limits, now, policy.BASIS_PRELIMINARY,
        )
        accepted, refused = self.gate.check_limits(decided, origin=f"{FAST_APP_ID}:{batch_id}", at=now)
        anomalies.unpersist()
        return {tables.GOLD_LIMITS: accepted, tables.QUARANTINE: refused}

    def handle(self, open_windows: DataFrame, batch_id: int) -> None:
        """One micro-batch of updated open windows → preliminary decisions, published when there are any."""
        open_windows = open_windows.transform(self._single).persist()
        try:
            if open_windows.isEmpty():
                self.reports.append(BatchReport(QUERY, batch_id))
                return
            with self.decision_lock:
                now = self.clock()
                outputs = self.decide(open_windows, batch_id, now)
                report = write_outputs(self.lake, QUERY, FAST_APP_ID, batch_id, outputs) if outputs \
                    else BatchReport(QUERY, batch_id)
                self.reports.append(report)
                if report.rows.get(tables.GOLD_LIMITS):
                    started = time.monotonic()
                    self.publisher.publish(now, batch_id, QUERY)
                    log.info("fast batch %d: %d preliminary decisions published in %.2f s", batch_id,
                             report.rows[tables.GOLD_LIMITS], time.monotonic() - started)
        finally:
            release(QUERY, batch_id, open_windows)
