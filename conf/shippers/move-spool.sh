#!/usr/bin/env bash
# Move the shipper's closed spool files into rate-governor's landing directory, one rename each, so that Spark's
# file source never sees a file that is still being written (it reads a file once, when it first lists it).
#   move-spool.sh SPOOL LANDING [MIN_AGE_MINUTES]
# SPOOL/broker_stats/*.jsonl -> LANDING/broker_stats/, SPOOL/send_failures/*.jsonl -> LANDING/send_failures/.
# A file is moved once it has not changed for more than MIN_AGE_MINUTES (default 2: rsyslog's omfile closes an
# idle file after closeTimeout=1 minute; 0 = every file, for a shipper that has been stopped). SPOOL and LANDING must be on the same file system (rename is atomic there); each
# moved file gets a unique name, so a spool file re-created under an old name never replaces one already read.
# Run it every minute (cron: `* * * * * rg move-spool.sh /data/rg-spool /data/landing`, or a systemd timer).
set -euo pipefail
spool="${1:?usage: move-spool.sh SPOOL LANDING [MIN_AGE_MINUTES]}"
landing="${2:?usage: move-spool.sh SPOOL LANDING [MIN_AGE_MINUTES]}"
min_age="${3:-2}"
for input in broker_stats send_failures; do
  [ -d "$spool/$input" ] || continue
  mkdir -p "$landing/$input"
  find "$spool/$input" -maxdepth 1 -type f -name '*.jsonl' -mmin "+$min_age" -print0 |
    while IFS= read -r -d '' file; do
      name="$(basename "$file" .jsonl).$(date -u +%s%N).jsonl"
      mv -n "$file" "$landing/$input/$name"
    done
done
