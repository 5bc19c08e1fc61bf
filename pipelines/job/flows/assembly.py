"""The flows of one governor, wired to one lake: one quality gate, one publisher, one decision lock and one
decisions' memory shared by the final and fast paths (one policy state, one version order), and the operators'
overrides read once for both and applied between micro-batches by the override tick."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.config import GovernorConfig
from pipelines.job.flows.base import BatchReport
from pipelines.job.flows.fast import FastFlow
from pipelines.job.flows.base import Clock, utc_now
from pipelines.job.flows.gold import GoldFlow
from pipelines.job.flows.ingest import IngestFlow
from pipelines.job.flows.store import DecisionStore
from pipelines.job.overrides import OverrideSource, OverrideTick
from pipelines.dataplane.known_brokers import KnownBrokerSource
from pipelines.dataplane.lake import Lake, open_lake
from pipelines.writeback.publish import Publisher
from pipelines.dataplane.quality.gate import QualityGate


@dataclass
class Governor:
    """A running (or finished) governor: its flows and streaming queries."""

    cfg: GovernorConfig
    lake: Lake
    ingest: IngestFlow
    gold: GoldFlow
    fast: FastFlow
    known: KnownBrokerSource
    overrides: OverrideTick
    queries: list[StreamingQuery] = field(default_factory=list)

    @property
    def reports(self) -> list[BatchReport]:
        """Every micro-batch's report: ingest, gold, then fast."""
        return [*self.ingest.reports, *self.gold.reports, *self.fast.reports]


def build_governor(spark: SparkSession, cfg: GovernorConfig, clock: Clock = utc_now) -> Governor:
    """The flows of a governor on ``cfg``'s lake and its known brokers (nothing started yet)."""
    lake = open_lake(spark, cfg.lake.path, cfg.lake.writer, cfg.lake.executor_write_rows)
    gate = QualityGate(cfg, lake)
    publisher = Publisher(cfg, lake)
    decisions = threading.Lock()  # the final and fast paths decide one at a time (one state, one version order)
    known = KnownBrokerSource(cfg)  # read on first use; refreshed once started (pipelines.governor.run)
    store = DecisionStore(lake)
    fast = FastFlow(cfg, lake, publisher, clock, decisions, store)
    fast.known = known.current
    gold = GoldFlow(cfg, lake, publisher, clock, decisions, store, open_rows=fast.open_rows)
    source = OverrideSource(lake, cfg)  # operators' overrides: read by both deciding flows and the tick
    fast.overrides = gold.overrides = source.current
    tick = OverrideTick(cfg, lake, source, store, publisher, decisions, clock)
    tick.also.append(gold.probe_tick)  # a probe's undo at its deadline, input or not
    return Governor(
        cfg, lake, IngestFlow(cfg, lake, gate, known, fast_events=cfg.windows.fast_path != "never"), gold, fast, known,
        tick,
    )
