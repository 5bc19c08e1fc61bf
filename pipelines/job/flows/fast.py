"""The fast flow: preliminary decisions on *open* windows, every micro-batch (:mod:`pipelines.decide.paths.fast`,
:mod:`pipelines.decide.rules.preliminary`).

The fast query reads what the ingest query already parsed (its metric events,
:func:`pipelines.dataplane.events.read_stream` of the fast path's own copy of each events file) and keeps running sums
per window × resource in Spark's state store (``update`` output mode, the same watermark as the gold query); each
micro-batch gets the windows its input touched, collected once as Arrow. The driver decides: what the partial evidence
already proves, outside the decision lock; the fold from the policy state and the limits in force, inside it. The
``set`` decisions that change a limit are appended to ``gold/limits`` with basis ``preliminary`` and published. It
writes no policy state: the final path stays the only owner of ``state/policy`` and reconciles what this flow decided.

Its trigger is ``windows.fast_trigger_seconds``: it finds an ingest micro-batch's events at its next trigger after
they are written, so a short one keeps containment within about one ingest trigger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pyspark.sql import DataFrame

from pipelines.config import GovernorConfig
from pipelines.decide.paths.fast import OpenRows, decide_fast, prepare_fast
from pipelines.decide.records.inputs import FastInputs, LockedInputs
from pipelines.decide.paths.reconcile import lift_reach_seconds, read_as_limited
from pipelines.job.flows.base import BatchReport, DecisionFlow, write_arrow
from pipelines import tables
from pipelines.dataplane.known_brokers import KnownBrokers
from pipelines.dataplane.transforms import fast

log = logging.getLogger("rate_governor")

#: Delta transaction app id of the fast query's writes (with the micro-batch id as version).
FAST_APP_ID = "rate-governor-fast"
QUERY = "fast"
#: The fast query's checkpoint directory under the checkpoint root. Its name changes when the query's source or
#: state schema does (Spark refuses a checkpoint whose state has another schema): the state holds open windows only,
#: so an upgraded governor starts the fast query on a new checkpoint, and the old directories (``fast``,
#: ``fast-v2``) can be deleted. ``fast-v3``: it reads the ingest query's metric events instead of the raw records,
#: and its open-window sums count the limiter's rejections.
CHECKPOINT = "fast-v3"


def open_window_stream(metric_events: DataFrame, cfg: GovernorConfig) -> DataFrame:
    """Streaming METRIC_EVENT rows (parsed once, by the ingest query) → running sums per window × resource
    (:func:`pipelines.dataplane.transforms.fast.open_window_sums`), with the gold query's watermark; run it in
    ``update`` output mode."""
    return (
        metric_events
        .withWatermark("event_time", f"{cfg.windows.watermark_seconds} seconds")
        .transform(fast.resource_events)
        .transform(fast.open_window_sums(cfg.windows))
    )


class FastFlow(DecisionFlow):
    """The ``foreachBatch`` handler of the fast query (preliminary decisions); see the module docstring.

    Constructor: :class:`pipelines.job.flows.base.DecisionFlow`.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.open_rows = OpenRows()
        #: The known brokers now (:meth:`pipelines.dataplane.known_brokers.KnownBrokerSource.current`; None: all
        #: trusted).
        self.known: Callable[[], KnownBrokers | None] = lambda: None
        #: The operators' overrides now (:meth:`pipelines.job.overrides.OverrideSource.current`; () without).
        self.overrides: Callable[[], tuple] = tuple

    def handle(self, open_windows: DataFrame, batch_id: int) -> None:
        """One micro-batch of updated open windows → preliminary decisions, published when there are any."""
        rows = open_windows.toArrow()  # the one Spark job: the micro-batch's stateful aggregation
        if rows.num_rows == 0:
            self.reports.append(BatchReport(QUERY, batch_id))
            return
        first = min(rows.column("window_start").to_pylist())
        topic_history, broker_history = self.history(first)
        known = self.known()
        inputs = FastInputs(open_rows=rows, topic_history=topic_history, broker_history=broker_history,
                            known=known.admits if known is not None else None, group_history=self.group_history(first),
                            limited=read_as_limited(self.store.limited_keys(), self.store.lifted_at(), self.clock(),
                                                    lift_reach_seconds(self.cfg.windows)))
        prepared = prepare_fast(inputs, self.open_rows, self.cfg)
        if not prepared.candidates:
            self.reports.append(BatchReport(QUERY, batch_id))
            return
        overrides = self.overrides()
        with self.decision_lock:
            locked = time.monotonic()
            now = self.clock()
            memory = LockedInputs(policy_state=self.store.state_before(), latest_limits=self.store.latest_limits(),
                                  overrides=overrides)
            accepted, refused = decide_fast(prepared, memory, self.cfg, now, origin=f"{FAST_APP_ID}:{batch_id}")
            self.store.add_limits(accepted)
            self.locked_seconds.append(time.monotonic() - locked)
        report = write_arrow(self.lake, QUERY, FAST_APP_ID, batch_id,
                             {tables.GOLD_LIMITS: accepted, tables.QUARANTINE: refused})
        self.reports.append(report)
        if accepted.num_rows:
            self.publish(now, batch_id, QUERY)
