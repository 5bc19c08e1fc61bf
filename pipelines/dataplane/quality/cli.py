"""Command line of the data-quality package: GX Data Docs of the validation results stored in a lake.

Usage:
    python -m pipelines.dataplane.quality docs --lake LAKE [--out DIR] [--last N]

No Spark and no validation: the pages render what ``quality/validation_runs`` holds
(:mod:`pipelines.dataplane.quality.data_docs`).
Exit status 0 when the docs were built, 2 with one line on stderr for a bad flag, a missing lake directory or a lake
without stored results.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pipelines.cli import OneLineParser, fail
from pipelines.dataplane.quality import data_docs


def main(argv: Iterable[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m pipelines.dataplane.quality", description="rate-governor data quality")
    sub = parser.add_subparsers(dest="command", required=True)
    docs = sub.add_parser(
        "docs", help="build GX Data Docs from the validation results stored in the lake (no Spark, no validation)"
    )
    docs.add_argument("--lake", required=True, help="lake directory")
    docs.add_argument("--out", help="output directory (default <lake>/quality/data_docs)")
    docs.add_argument(
        "--last", type=int, default=0, metavar="N", help="only the runs of the N newest validated micro-batches"
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.last < 0:
        parser.error("--last must be >= 0")
    if not Path(args.lake).is_dir():
        return fail(parser.prog, f"lake directory not found: {args.lake}")
    try:
        data_docs.build_docs(args.lake, args.out, last=args.last)
    except data_docs.DataDocsError as e:
        return fail(parser.prog, e)
    return 0
