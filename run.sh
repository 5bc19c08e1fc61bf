#!/usr/bin/env bash
# Run the governor on the embedded default: generate the article-001 scenario into a scratch landing directory
# (unless --landing DIR is given), run the governor once (--once), print a summary.
# Usage: ./run.sh [--landing DIR] [--lake DIR] [--conf conf/local.toml] [--seed N]
source "$(dirname "$0")/scripts/env.sh"
exec "$RG_PYTHON" -m pipelines.demo "$@"
