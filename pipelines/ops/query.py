"""Query the lake's Delta tables with SQL, without Spark (delta-rs ``QueryBuilder``, DataFusion SQL).

Every table is registered under its path with ``/`` replaced by ``_``: ``gold_limits``, ``gold_anomalies``,
``gold_topic_tps``, ``silver_broker_stats``, ``quarantine`` …

Usage:
    python -m pipelines.ops.query --lake DIR "SELECT resource, action, limit_qps, reason FROM gold_limits
        ORDER BY version"
"""

from __future__ import annotations

import sys

import pyarrow as pa

from pipelines.cli import OneLineParser, fail
from pipelines.dataplane.lake import TABLES
from pipelines.tables import sql_name


def run_sql(lake_root: str, sql: str) -> pa.Table:
    """Run ``sql`` over the lake's existing tables and return the result as an Arrow table.

    Raises:
        ValueError: the SQL is invalid or names a table that does not exist yet (message from DataFusion).
    """
    from deltalake import DeltaTable, QueryBuilder

    builder = QueryBuilder()
    for table in TABLES:
        path = f"{lake_root.rstrip('/')}/{table}"
        if DeltaTable.is_deltatable(path):
            builder = builder.register(sql_name(table), DeltaTable(path))
    try:
        return pa.table(builder.execute(sql))
    except Exception as exc:  # DataFusion raises its own exception types
        raise ValueError(str(exc).splitlines()[0]) from None


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m pipelines.ops.query", description=__doc__.splitlines()[0])
    parser.add_argument("--lake", required=True, help="lake directory")
    parser.add_argument("sql", help="SQL over gold_limits, gold_anomalies, gold_topic_tps, …")
    args = parser.parse_args(argv)
    try:
        result = run_sql(args.lake, args.sql)
    except ValueError as exc:
        return fail("rate-governor query", exc)
    import pandas as pd

    with pd.option_context("display.max_rows", 200, "display.max_columns", 20, "display.width", 200,
                           "display.max_colwidth", 120):
        print(result.to_pandas().to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
