#!/usr/bin/env bash
# Run the streaming governor with spark-submit.
#   ./spark-submit.sh [spark-submit options] -- [governor options]
# Example (local):   ./spark-submit.sh -- --conf conf/local.toml --landing landing --lake lake --once
# Example (cluster): ./spark-submit.sh --master spark://host:7077 -- --conf conf/local.toml
# Locally it uses the project's environment (.venv, created if missing). The code is shipped to executors as a
# zip of pipelines/, udfs/ and control/ (--py-files) and the config file(s) named by --conf with --files; every option before "--" goes to
# spark-submit unchanged (--master, --deploy-mode, --conf spark.*=..., --executor-memory, ...).
#
# Delta and Kafka jars on a cluster: with RG_ADD_PACKAGES=1 this script adds
#   --packages org.apache.spark:spark-sql-kafka-0-10_<scala>:<spark>[,io.delta:delta-spark_<scala>:<delta>]
# with the Spark version of this environment (RG_SCALA_VERSION default 2.13), or exactly RG_PACKAGES if set. The
# Delta jars are added only when the delta-spark extra is installed (pip install '.[delta-spark]'): <delta> is that
# package's version (or RG_DELTA_VERSION), a Delta release whose declared pyspark range holds this Spark line. No
# Delta release supports Spark 4.3 yet (delta-spark 4.4.1: pyspark<=4.2.0); without the Delta jars the governor
# writes its tables with delta-rs, which needs no jars (same tables). --packages needs a reachable Maven
# repository; where there is none, pre-install the jars on the cluster's classpath instead and leave both unset.
source "$(dirname "$0")/scripts/env.sh"

submit_opts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do submit_opts+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
governor_opts=("$@")

build_dir="$RG_ROOT/build"
mkdir -p "$build_dir"
zip_file="$build_dir/rate_governor.zip"
rm -f "$zip_file"
"$RG_PYTHON" - "$zip_file" "$RG_ROOT" <<'PY'
import sys, zipfile, pathlib
root = pathlib.Path(sys.argv[2])
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for pkg in ("pipelines", "udfs", "control"):
        for f in (root / pkg).rglob("*.py"):
            z.write(f, f.relative_to(root))
PY

conf_files=()
for ((i = 0; i < ${#governor_opts[@]}; i++)); do
  if [ "${governor_opts[$i]}" = "--conf" ]; then conf_files+=("${governor_opts[$((i + 1))]}"); fi
done

extra=()
if [ -z "${RG_PACKAGES:-}" ] && [ "${RG_ADD_PACKAGES:-0}" = "1" ]; then
  spark_version="$("$RG_PYTHON" -c 'import pyspark; print(pyspark.__version__)')"
  scala="${RG_SCALA_VERSION:-2.13}"
  RG_PACKAGES="org.apache.spark:spark-sql-kafka-0-10_${scala}:${spark_version}"
  delta_version="${RG_DELTA_VERSION:-$("$RG_PYTHON" -c 'from importlib.metadata import version; print(version("delta-spark"))' 2>/dev/null || true)}"
  if [ -n "$delta_version" ]; then
    RG_PACKAGES="$RG_PACKAGES,io.delta:delta-spark_${scala}:${delta_version}"
  else
    echo "spark-submit.sh: no delta-spark extra installed: the lake is written with delta-rs (no Delta jars added)" >&2
  fi
fi
[ -n "${RG_PACKAGES:-}" ] && extra+=(--packages "$RG_PACKAGES")
# executors run the project's interpreter unless the cluster says otherwise
extra+=(--conf "spark.pyspark.python=${RG_EXECUTOR_PYTHON:-$RG_PYTHON}")
[ ${#conf_files[@]} -gt 0 ] && extra+=(--files "$(IFS=,; echo "${conf_files[*]}")")

spark_submit="$(dirname "$RG_PYTHON")/spark-submit"
export PYSPARK_SUBMITTED=1
# The driver (client mode) also imports the control-record package (control/: signing; not shipped to executors).
export PYTHONPATH="$RG_ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$spark_submit" --py-files "$zip_file" "${extra[@]}" "${submit_opts[@]}" "$RG_ROOT/pipelines/governor.py" "${governor_opts[@]}"
