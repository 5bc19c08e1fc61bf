#!/usr/bin/env bash
# Run the streaming governor with spark-submit.
#   ./spark-submit.sh [spark-submit options] -- [governor options]
# Example (local):   ./spark-submit.sh -- --conf conf/local.toml --landing landing --lake lake --once
# Example (cluster): ./spark-submit.sh --master spark://host:7077 -- --conf conf/local.toml
# Locally it uses the project's environment (.venv, created if missing). The code is shipped to executors as a
# zip (--py-files) and the config file with --files. On a cluster whose classpath lacks the Delta/Kafka jars,
# add them with RG_PACKAGES (needs a reachable Maven repository, or pre-install the jars instead):
#   RG_PACKAGES="io.delta:delta-spark_2.13:4.0.0,org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0" ./spark-submit.sh ...
source "$(dirname "$0")/scripts/env.sh"

submit_opts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do submit_opts+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
governor_opts=("$@")

build_dir="$RG_ROOT/build"
mkdir -p "$build_dir"
zip_file="$build_dir/rate_governor.zip"
rm -f "$zip_file"
"$RG_PYTHON" - "$zip_file" <<'PY'
import sys, zipfile, pathlib
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for pkg in ("pipelines", "udfs"):
        for f in pathlib.Path(pkg).rglob("*.py"):
            z.write(f)
PY

conf_files=()
for ((i = 0; i < ${#governor_opts[@]}; i++)); do
  if [ "${governor_opts[$i]}" = "--conf" ]; then conf_files+=("${governor_opts[$((i + 1))]}"); fi
done

extra=()
[ -n "${RG_PACKAGES:-}" ] && extra+=(--packages "$RG_PACKAGES")
[ ${#conf_files[@]} -gt 0 ] && extra+=(--files "$(IFS=,; echo "${conf_files[*]}")")

spark_submit="$(dirname "$RG_PYTHON")/spark-submit"
export PYSPARK_SUBMITTED=1
exec "$spark_submit" --py-files "$zip_file" "${extra[@]}" "${submit_opts[@]}" "$RG_ROOT/pipelines/governor.py" "${governor_opts[@]}"
