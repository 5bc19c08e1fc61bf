#!/usr/bin/env bash
# Run the governor on the embedded default: generate the article-001 scenario into a scratch landing directory
# (unless --landing DIR is given), run the governor once (--once) with one progress line per micro-batch, print a
# summary and write the status page (<lake>/status/index.html). Spark's own log lines only with --verbose.
# Usage: ./run.sh [--landing DIR] [--lake DIR] [--conf conf/local.toml] [--seed N] [--verbose]
source "$(dirname "$0")/scripts/env.sh"
exec "$RG_PYTHON" -m pipelines.ops.demo "$@"
