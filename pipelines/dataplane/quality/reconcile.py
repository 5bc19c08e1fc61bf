"""Per micro-batch reconciliation of the ingest query, and the gold query's watermark that decides late rows.

Every ingest micro-batch is reconciled per source: ``records_read = silver_rows + late_rows + quarantine_rows``
(one ``quality/reconciliation`` row per source, :data:`pipelines.schemas.QUALITY_RECONCILIATION`, and a log line;
ERROR when it does not balance). ``late_rows`` are accepted rows whose event time is behind the gold query's
watermark (they stay in the silver table, the gold windows ignore them); ``silver_rows`` are the others.
"""

from __future__ import annotations

import datetime as dt
import logging

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines import schemas
from pipelines import tables
from pipelines.dataplane.lake import Lake
from pipelines.dataplane.quality.rules import REASON_PREFIX

log = logging.getLogger("rate_governor.quality")


class Reconciler:
    """Reconciles ingest micro-batches of one lake, keeping the largest accepted event time per source (restored
    from ``quality/reconciliation`` on first use, so a restarted job computes the same watermark).

    ``watermark_seconds`` is ``[windows] watermark_seconds``; ``lake`` the lake written to;
    ``app_id`` tags the Delta commits (one per micro-batch, idempotent on replay).
    """

    def __init__(self, watermark_seconds: int, lake: Lake, app_id: str) -> None:
        self.watermark_seconds = watermark_seconds
        self.lake = lake
        self.app_id = app_id
        self._max_event_time: dict[str, dt.datetime] | None = None

    def _seen(self, batch_id: int) -> dict[str, dt.datetime]:
        if self._max_event_time is None:
            saved = self.lake.read(tables.QUALITY_RECONCILIATION).where(F.col("batch_id") < batch_id)
            rows = saved.groupBy("source").agg(F.max("max_event_time").alias("m")).collect()
            self._max_event_time = {r["source"]: r["m"] for r in rows if r["m"] is not None}
        return self._max_event_time

    def watermark(self, batch_id: int) -> dt.datetime | None:
        """The gold query's watermark at the start of ``batch_id`` as Spark computes it (naive UTC): per input,
        the largest event time of earlier batches minus ``watermark_seconds``; the minimum over inputs that saw
        data; None before any input saw data."""
        seen = self._seen(batch_id)
        if not seen:
            return None
        return min(seen.values()) - dt.timedelta(seconds=self.watermark_seconds)

    def measure(self, batch_id: int, raw: DataFrame, parsed: dict[str, DataFrame]) -> dict[str, dict]:
        """The counts of ``batch_id`` per source, in one Spark job: ``records`` (raw records read), ``rows``,
        ``silver``, ``late``, ``quarantine``, ``expectations`` (quarantined by an expectation), ``candidates`` (rows
        the parse accepted, what GX validates) and ``max_event_time`` (of accepted rows, naive UTC). ``raw`` and
        ``parsed`` are as in :meth:`reconcile`."""
        wm = self.watermark(batch_id)
        accepted = F.col("reject_reason").isNull()
        late = accepted & F.lit(wm is not None) & (F.col("event_time") < F.lit(wm))
        parts = [raw.groupBy("source").agg(F.count(F.lit(1)).alias("records"))]
        for source, df in parsed.items():
            parts.append(df.agg(
                F.lit(source).alias("source"),
                F.count(F.lit(1)).alias("rows"),
                F.count_if(accepted & ~late).alias("silver"),
                F.count_if(late).alias("late"),
                F.count_if(~accepted).alias("quarantine"),
                F.count_if(F.col("reject_reason").startswith(REASON_PREFIX)).alias("expectations"),
                F.count_if(F.col("parse_reason").isNull()).alias("candidates"),
                F.max(F.when(accepted, F.col("event_time"))).alias("max_event_time"),
            ))
        union = parts[0]
        for part in parts[1:]:
            union = union.unionByName(part, allowMissingColumns=True)
        measured: dict[str, dict] = {}
        for row in union.collect():
            counts = row.asDict()
            entry = measured.setdefault(counts.pop("source"), {"records": 0})
            records = counts.pop("records")
            if records is not None:  # a row of the raw records' count
                entry["records"] = records
            else:
                entry.update(counts)
        return measured

    def reconcile(
        self, batch_id: int, raw: DataFrame, parsed: dict[str, DataFrame], at: dt.datetime,
        measured: dict[str, dict] | None = None,
    ) -> list[dict]:
        """Reconcile ``batch_id``: ``raw`` is the micro-batch's RAW_RECORD rows, ``parsed`` maps each source
        (``broker_stats``, ``send_failures``) to its rows after enforcement (``reject_reason``, ``parse_reason``,
        ``event_time``); ``measured`` is :meth:`measure`'s result when the caller already has it.
        Appends one ``quality/reconciliation`` row per source (recorded ``at``, naive UTC) and returns them as
        dicts keyed by the table's column names."""
        wm = self.watermark(batch_id)
        measured = measured if measured is not None else self.measure(batch_id, raw, parsed)
        out = []
        for source in parsed:
            agg = measured[source]
            records = int(agg["records"])
            row = {
                "batch_id": batch_id,
                "source": source,
                "records_read": records,
                "silver_rows": agg["silver"],
                "late_rows": agg["late"],
                "quarantine_rows": agg["quarantine"],
                "expectation_rows": agg["expectations"],
                "watermark": wm,
                "max_event_time": agg["max_event_time"],
                "balanced": records == agg["silver"] + agg["late"] + agg["quarantine"],
                "recorded_at": at,
            }
            if agg["max_event_time"] is not None:
                prev = self._max_event_time.get(source)
                self._max_event_time[source] = max(prev, agg["max_event_time"]) if prev else agg["max_event_time"]
            level = logging.INFO if row["balanced"] else logging.ERROR
            log.log(
                level,
                "reconciliation batch %d %s: read %d = silver %d + late %d + quarantine %d (%d by expectations)%s",
                batch_id, source, records, row["silver_rows"], row["late_rows"], row["quarantine_rows"],
                row["expectation_rows"], "" if row["balanced"] else "  NOT BALANCED",
            )
            out.append(row)
        fields = [f.name for f in schemas.QUALITY_RECONCILIATION.fields]
        self.lake.append_rows(
            [tuple(r[f] for f in fields) for r in out], tables.QUALITY_RECONCILIATION,
            app_id=self.app_id, version=batch_id,
        )
        return out
