#!/usr/bin/env bash
# Run the test suite (chispa + pytest), slow end-to-end tests included. Extra arguments go to pytest.
source "$(dirname "$0")/scripts/env.sh"
cd "$RG_ROOT"
exec "$RG_PYTHON" -m pytest "$@"
