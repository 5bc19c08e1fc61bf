"""The ingest outputs' row counts from the micro-batch's counts per source."""

from __future__ import annotations

from pipelines import tables
from pipelines.dataplane.transforms.silver import ingest_rows


def test_row_count_of_every_ingest_table_from_the_counts_per_source():
    measured = {
        "broker_stats": {"records": 10, "silver": 6, "late": 1, "quarantine": 3},
        "send_failures": {"records": 4, "silver": 2, "late": 0, "quarantine": 2},
    }
    assert ingest_rows(measured) == {
        tables.BRONZE_BROKER_STATS: 10, tables.BRONZE_SEND_FAILURES: 4,
        tables.SILVER_BROKER_STATS: 7,           # late rows stay in silver
        tables.SILVER_SEND_FAILURES: 2,
        tables.QUARANTINE: 5,
    }
    assert ingest_rows({})[tables.QUARANTINE] == 0   # an empty micro-batch
