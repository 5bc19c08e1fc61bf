#!/usr/bin/env bash
# Shared set-up for ./run.sh and ./test.sh: check Java, create the project's environment (.venv) if missing.
# Sourced, not executed. Sets RG_PYTHON to the environment's interpreter.
set -euo pipefail
RG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RG_VENV="${RG_VENV:-$RG_ROOT/.venv}"

# PySpark 4 needs Java 17 or newer.
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "rate-governor: Java 17 or newer is required (PySpark 4), but no java was found; install a JDK 17+ and retry." >&2
  exit 3
fi
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
java_version="$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')"
java_major="${java_version%%.*}"
if [ "$java_major" = "1" ]; then java_major="$(echo "$java_version" | cut -d. -f2)"; fi
if ! [ "$java_major" -ge 17 ] 2>/dev/null; then
  echo "rate-governor: Java 17 or newer is required (PySpark 4), found Java ${java_version:-unknown}; install a JDK 17+ and retry." >&2
  exit 3
fi

# The project's own environment, created on first use and refreshed when pyproject.toml changes.
stamp="$RG_VENV/.installed-$(sha256sum "$RG_ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -x "$RG_VENV/bin/python" ] || [ ! -f "$stamp" ]; then
  # One line on the console; pip's own output goes to a log file (named if the install fails).
  pip_log="$RG_ROOT/scratch/pip-install.log"
  mkdir -p "$(dirname "$pip_log")"
  echo "rate-governor: setting up the Python environment in $RG_VENV (first run takes a few minutes; pip log: $pip_log) ..." >&2
  python_bin="${PYTHON:-python3}"
  [ -x "$RG_VENV/bin/python" ] || "$python_bin" -m venv "$RG_VENV" >"$pip_log" 2>&1
  if ! { "$RG_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip \
         && "$RG_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$RG_ROOT[test]"; } >>"$pip_log" 2>&1; then
    echo "rate-governor: installing the Python environment failed; see $pip_log" >&2
    exit 4
  fi
  rm -f "$RG_VENV"/.installed-*
  touch "$stamp"
fi
RG_PYTHON="$RG_VENV/bin/python"
export PYSPARK_PYTHON="$RG_PYTHON"
export PYSPARK_DRIVER_PYTHON="$RG_PYTHON"
