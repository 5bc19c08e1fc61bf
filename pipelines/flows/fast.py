"""The fast flow: preliminary decisions on *open* windows, every micro-batch (see :mod:`pipelines.transforms.fast`).

The query keeps running sums per window × resource in Spark's state store (``update`` output mode, the same
watermark as the gold query); each micro-batch gets the windows its input touched. Under the decision lock it reads
the newest finalized windows (baselines and the broker census), the policy state and the limits in force, folds the
candidates of the evidence already proven (no recovery: absence is only known on final windows), and appends the
``set`` decisions that change a limit to ``gold/limits`` with basis ``preliminary``, then publishes. It writes no
policy state: the final path stays the only owner of ``state/policy`` and reconciles what this flow decided.

Spark emits only the rows a micro-batch's input touched (``update`` mode). The flow remembers the rows it was given
for windows not final yet (:class:`OpenRows`, on the driver: a window × resource row per open window, replaced by
Spark's newer row), so that a window completed by the last expected broker's lines is judged on all its resources
(:func:`pipelines.transforms.fast.with_rows_of_completed_windows`), whichever micro-batches its files fell into.
The memory is the flow's, not the checkpoint's: after a restart a window whose brokers' lines straddle it waits
for the final path, as before.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipelines.io import tables
from pipelines.io.lake.registry import utc
from pipelines.schemas import RESOURCE_KEYS
from pipelines.config import GovernorConfig
from pipelines.flows.base import BatchReport, DecisionFlow, release, write_outputs
from pipelines.io.known_brokers import KnownBrokers, expected_brokers
from pipelines.quality.gate import QualityGate
from pipelines.transforms import demand, fast, gold, policy, policy_fold, silver
from pipelines import rocketmq as rmq
from pipelines.transforms.fold import Observation
from pipelines.transforms.reconcile import preliminary_state

log = logging.getLogger("rate_governor")

#: Delta transaction app id of the fast query's writes (with the micro-batch id as version).
FAST_APP_ID = "rate-governor-fast"
QUERY = "fast"
#: The fast query's checkpoint directory under the checkpoint root. Its name changes when the query's state schema
#: does (Spark refuses a checkpoint whose state has another schema): the state holds open windows only, so an
#: upgraded governor starts the fast query on a new checkpoint, and the old directory (``fast``) can be deleted.
#: ``fast-v2``: the open-window sums gained ``rate_limited``.
CHECKPOINT = "fast-v2"


def open_window_stream(raw: DataFrame, cfg: GovernorConfig, gate: QualityGate,
                       known: KnownBrokers | None = None) -> DataFrame:
    """Streaming RAW_RECORD rows → running sums per window × resource (:func:`pipelines.transforms.fast.open_window_sums`),
    with the gold query's watermark; run it in ``update`` output mode. Records of brokers not in ``known`` are left
    out (None: every broker trusted); Spark fixes a streaming plan when its query starts, so the fast query judges
    with the known set of its start (README "Whom the governor trusts")."""
    stats = raw.transform(silver.parsed_stats(cfg, gate.enforce_stats, known))
    failures = raw.transform(silver.parsed_failures(cfg, gate.enforce_failures, known))
    return (
        silver.metric_events(stats, failures)
        .withWatermark("event_time", f"{cfg.windows.watermark_seconds} seconds")
        .transform(fast.resource_events)
        .transform(fast.open_window_sums(cfg.windows))
    )


def after_window(rows: pa.Table, newest_final: dt.datetime | None) -> pa.Table:
    """Arrow open-window rows → those of windows starting after ``newest_final`` (UTC; None: all of them)."""
    if newest_final is None:
        return rows
    bound = pa.scalar(utc(newest_final), type=rows.schema.field("window_start").type)
    return rows.filter(pc.greater(rows["window_start"], bound))


class OpenRows:
    """The open-window rows Spark has emitted to the fast flow (one per window × resource, the newest), kept as an
    Arrow table on the driver for the windows the final path has not decided yet (see the module docstring).

    Example:
        >>> memory = OpenRows()
        >>> memory.remember(batch_rows, newest_final)    # pyarrow rows of open_window_sums, UTC datetime or None
        >>> memory.frame(spark, schema)                   # the remembered rows as a DataFrame (None: nothing yet)
    """

    KEYS = ("window_start", *RESOURCE_KEYS)

    def __init__(self) -> None:
        self.rows: pa.Table | None = None

    def remember(self, fresh: pa.Table, newest_final: dt.datetime | None) -> None:
        """Keep ``fresh`` and the remembered rows ``fresh`` does not replace, of windows after ``newest_final``."""
        kept = fresh if self.rows is None else pa.concat_tables([
            self.rows.filter(pc.invert(pc.is_in(self._keys(self.rows), value_set=self._keys(fresh)))),
            fresh.cast(self.rows.schema),
        ])
        self.rows = after_window(kept, newest_final)

    def frame(self, spark: SparkSession, schema: StructType) -> DataFrame | None:
        """The remembered rows as a DataFrame of ``schema`` (None when there are none)."""
        if self.rows is None or self.rows.num_rows == 0:
            return None
        return spark.createDataFrame(self.rows, schema=schema)

    def evidence(self, after: dt.datetime, window_seconds: int) -> dict[tuple[str, str], list[Observation]]:
        """What the remembered open windows starting at or after ``after`` (UTC) show of every topic and group so
        far: per resource one :class:`~pipelines.transforms.fold.Observation`
        per open window with its limited traffic (cluster-wide msg/s: a topic's puts; a group's retry traffic, per
        broker the larger of its send-backs and the puts to ``%RETRY%<group>``) and its limiter's rejections (the
        ``RATE_LIMITED`` failures of the topic, or of ``%RETRY%<group>``). Partial sums: they only grow. The final
        path's lift veto (:func:`pipelines.transforms.fold.fold_resource`)."""
        if self.rows is None or self.rows.num_rows == 0:
            return {}
        rows = self.rows.filter(pc.greater_equal(self.rows["window_start"],
                                                 pa.scalar(utc(after), type=self.rows.schema.field("window_start").type)))
        per: dict[tuple, dict] = {}
        for row in rows.select(["window_end", "resource_type", "resource", "puts", "rate_limited",
                                "broker_amounts"]).to_pylist():
            key = (row["resource_type"], row["resource"])
            if key[0] not in ("topic", "group"):
                continue
            amounts = dict(row["broker_amounts"] or [])
            if key[0] == "topic" and key[1].startswith(rmq.RETRY_TOPIC_PREFIX):  # a group's plain sends
                owner = ("group", key[1][len(rmq.RETRY_TOPIC_PREFIX):])
                slot = per.setdefault((owner, row["window_end"]), {"sent": {}, "puts": {}, "rejected": 0})
                slot["puts"] = amounts
                slot["rejected"] += row["rate_limited"] or 0
            else:
                slot = per.setdefault((key, row["window_end"]), {"sent": {}, "puts": {}, "rejected": 0})
                if key[0] == "group":
                    slot["sent"] = amounts
                else:
                    slot["puts"] = amounts
                    slot["rejected"] += row["rate_limited"] or 0
        out: dict[tuple[str, str], list[Observation]] = {}
        for (key, end), slot in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            brokers = set(slot["sent"]) | set(slot["puts"])
            total = sum(max(slot["sent"].get(b, 0), slot["puts"].get(b, 0)) for b in brokers) if key[0] == "group" \
                else sum(slot["puts"].values())
            naive = utc(end).replace(tzinfo=None)  # the fold's times are naive UTC (as Spark collects them)
            out.setdefault(key, []).append(Observation(naive, total / window_seconds, int(slot["rejected"])))
        return out

    @classmethod
    def _keys(cls, rows: pa.Table) -> pa.Array:
        parts = [pc.cast(rows[k], pa.string()) for k in cls.KEYS]
        return pc.binary_join_element_wise(*parts, "\x1f").combine_chunks()


class FastFlow(DecisionFlow):
    """The ``foreachBatch`` handler of the fast query (preliminary decisions); see the module docstring.

    Constructor: :class:`pipelines.flows.base.DecisionFlow`.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.open_rows = OpenRows()
        #: The known brokers now (:meth:`pipelines.io.known_brokers.KnownBrokerSource.current`; None: all trusted).
        self.known: Callable[[], KnownBrokers | None] = lambda: None

    def decide(self, open_windows: DataFrame, batch_id: int, now: dt.datetime,
               rows: pa.Table) -> dict[str, DataFrame]:
        """Open windows (``rows``: the same collected, not empty) → ``{tables.GOLD_LIMITS: preliminary decisions,
        tables.QUARANTINE: refused decisions}``; empty when the partial evidence proves no anomaly."""
        cfg = self.cfg
        since = gold.baseline_since(utc(pc.min(rows["window_start"]).as_py()), cfg)
        topic_history = self.lake.read(tables.GOLD_TOPIC_TPS, since=since).transform(self._single)
        broker_history = self.lake.read(tables.GOLD_BROKER_TPS, since=since).transform(self._single)
        newest_final, expected = fast.newest_final_window(broker_history)
        expected = expected_brokers(expected, self.known())  # a broker that left the cluster is not waited for
        # the earlier micro-batches' rows (those of this one replace them in with_rows_of_completed_windows)
        remembered = self.open_rows.frame(open_windows.sparkSession, open_windows.schema)
        self.open_rows.remember(rows, newest_final)
        if newest_final is not None:  # windows the final path has decided are its business
            open_windows = open_windows.where(F.col("window_start") > F.lit(newest_final))
            topic_history = topic_history.where(F.col("window_start") <= F.lit(newest_final))
            broker_history = broker_history.where(F.col("window_start") <= F.lit(newest_final))
            rows = after_window(rows, newest_final)
            if rows.num_rows == 0:
                return {}
        if remembered is not None:
            open_windows = fast.with_rows_of_completed_windows(open_windows, remembered.transform(self._single),
                                                               expected)
        anomalies = fast.preliminary_anomalies(
            open_windows, topic_history, broker_history, expected, cfg.windows, cfg.detection,
            first_open=utc(pc.min(rows["window_start"]).as_py()),
        ).transform(self._single).transform(gold.collected_leaf)  # one Spark job; a leaf of its rows from here on
        if anomalies.isEmpty():  # the usual case (no Spark job on a leaf): no policy state to read, nothing to fold
            return {}
        candidates = demand.with_broker_tps(
            policy.candidate_limits(anomalies, fast.topic_carriers(open_windows), cfg.limits)
            .transform(lambda c: fast.cut_bounded_by_final_rates(c, open_windows, expected, cfg.windows)),
            fast.open_broker_tps(open_windows, cfg.windows),
        )
        state = preliminary_state(self.saved_state(), self.latest_limits())
        horizon = utc(pc.max(rows["window_end"]).as_py())
        folded = policy_fold.decide(candidates, state, horizon, cfg.limits, cfg.windows.length_seconds, recover=False)
        decided = policy.finish_decisions(
            folded.where((F.col("row_kind") == "decision") & (F.col("action") == policy.ACTION_SET)),
            cfg.limits, now, policy.BASIS_PRELIMINARY,
        )
        accepted, refused = self.gate.check_limits(decided, origin=f"{FAST_APP_ID}:{batch_id}", at=now)
        return {tables.GOLD_LIMITS: accepted, tables.QUARANTINE: refused}

    def handle(self, open_windows: DataFrame, batch_id: int) -> None:
        """One micro-batch of updated open windows → preliminary decisions, published when there are any."""
        open_windows = open_windows.transform(self._single).persist()
        try:
            rows = open_windows.toArrow()  # one job: the micro-batch's stateful aggregation; fills the cache
            if rows.num_rows == 0:
                self.reports.append(BatchReport(QUERY, batch_id))
                return
            with self.decision_lock:
                now = self.clock()
                outputs = self.decide(open_windows, batch_id, now, rows)
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
