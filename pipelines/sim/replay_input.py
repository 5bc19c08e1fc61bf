"""What a recording says, read from the tables of the governor's own ``--once`` run on it (the I/O edge of the
replay, :mod:`pipelines.sim.replay`): no second parser, every record parsed, quarantined or windowed by the job.

* ``silver/broker_stats``: the minute lines of the windowed stats (:data:`pipelines.rocketmq.WINDOWED_STATS`), one
  row per (minute, broker, stat, key) with the lines' SUM added up once per distinct line (a line shipped twice
  counts once, as in the job's windows, docs/contracts.md §2). A minute line stamped ``T`` covers the minute before
  ``T``: its minute is ``T − 60 s`` truncated to the minute, as the job windows it.
* ``silver/send_failures``: the refused sends, the failure classes a broker answers when it refuses
  (:data:`pipelines.rocketmq.BUSY_FAILURE_CLASSES`, :data:`pipelines.rocketmq.RATE_LIMITED`) of known brokers;
  :mod:`pipelines.sim.replay_refused` counts each refused message once. The other failures (client timeouts,
  ``TOPIC_NOT_EXIST`` …) are the replay's background: no limit or queue of the replay causes them.
* ``gold/anomalies``: what the rules found in the recording (open loop), and ``gold/broker_tps``'s last window end:
  a ``--once`` run finalizes windows up to its watermark only, so the last ``windows.watermark_seconds`` of the
  recording are never judged.
* ``quarantine``: records the job refused, counted by reason (an unknown broker's records among them:
  docs/contracts.md §1.3).
* ``gold/limits`` of *another* lake (:func:`read_enforced`): the governor that ran while the recording was made.

Times are UTC (``datetime[μs, UTC]``). Errors: :class:`RecordingError`, one line each.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipelines import rocketmq as rmq
from pipelines import tables

#: Failure classes that mean a broker refused the send (its fast failure and flow control, or its limiter).
REFUSED_CLASSES: tuple[str, ...] = rmq.BUSY_FAILURE_CLASSES + (rmq.RATE_LIMITED,)
UTC = "UTC"
_STATS = {"minute_start": pl.Datetime("us", UTC), "broker": pl.Utf8, "stat_name": pl.Utf8, "stats_key": pl.Utf8,
          "sum": pl.Int64}
_FAILURES = {"event_time": pl.Datetime("us", UTC), "broker": pl.Utf8, "topic": pl.Utf8, "producer_group": pl.Utf8,
             "client": pl.Utf8, "failure_class": pl.Utf8, "message": pl.Utf8, "code": pl.Int32}
_ANOMALIES = {"window_start": pl.Datetime("us", UTC), "window_end": pl.Datetime("us", UTC), "resource_type": pl.Utf8,
              "resource": pl.Utf8, "anomaly": pl.Utf8, "observed_tps": pl.Float64}
_LIMITS = {"decided_at": pl.Datetime("us", UTC), "window_end": pl.Datetime("us", UTC), "resource_type": pl.Utf8,
           "resource": pl.Utf8, "limit_qps": pl.Float64, "action": pl.Utf8, "mode": pl.Utf8,
           "expires_at": pl.Datetime("us", UTC), "version": pl.Int64}


#: The longest recording a replay runs on, minutes: the closed loop keeps per-second arrays of every (broker,
#: resource) pair (:class:`pipelines.sim.cluster.ClosedLoopCluster`), about 0.35 GB per 1,000 pairs and 6 hours.
MAX_MINUTES = 360


class RecordingError(Exception):
    """A recording the replay cannot run on (no stats, too short, an unreadable table); the message is one line."""


@dataclass(frozen=True)
class Recording:
    """A recording as the job's tables hold it.

    ``stats``: :data:`_STATS` columns, windowed minute stats, ``sum`` messages per minute. ``refused``:
    :data:`_FAILURES` columns, the refused sends' failure lines inside the recording's minutes. ``anomalies``:
    ``gold/anomalies`` rows (:data:`_ANOMALIES`). ``quarantine``: ``source``, ``reason``, ``records``. ``start``:
    the first minute (UTC); ``minutes``: minutes from it to the last minute with stats, inclusive; ``brokers``: the
    brokers with stats, sorted. ``failures_outside``: refused lines outside those minutes or naming no broker of
    them (left out). ``background``: the other failure lines of those brokers and minutes (:data:`_FAILURES`).
    ``judged_until``: the end of the last window the job finalized (None: none)."""

    stats: pl.DataFrame
    refused: pl.DataFrame
    anomalies: pl.DataFrame
    quarantine: pl.DataFrame
    start: dt.datetime
    minutes: int
    brokers: tuple[str, ...]
    failures_outside: int = 0
    background: pl.DataFrame | None = None
    judged_until: dt.datetime | None = None


def _table(path: Path, columns) -> pl.LazyFrame | None:
    """The Delta table at ``path``, only ``columns`` (names; None: no table there, as the job leaves a table it
    never wrote to)."""
    if not (path / "_delta_log").is_dir():
        return None
    try:
        return pl.scan_delta(str(path)).select(list(columns))
    except Exception as exc:  # noqa: BLE001 - delta-rs and polars raise several kinds; the message is what matters
        raise RecordingError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None


def _empty(columns: dict) -> pl.DataFrame:
    return pl.DataFrame(schema=columns)


def stats_minutes(lake: Path) -> pl.DataFrame:
    """``silver/broker_stats`` → windowed minute stats (:data:`_STATS`), each distinct line once, summed per
    minute."""
    frame = _table(lake / tables.SILVER_BROKER_STATS,
                   ["event_time", "broker", "stat_name", "period", "stats_key", "sum"])
    if frame is None:
        return _empty(_STATS)
    out = (frame.filter((pl.col("period") == "minute") & pl.col("stat_name").is_in(list(rmq.WINDOWED_STATS))
                        & pl.col("broker").is_not_null() & pl.col("sum").is_not_null())
           .unique(subset=["event_time", "broker", "stat_name", "stats_key", "sum"])
           .with_columns(minute_start=(pl.col("event_time") - pl.duration(seconds=60)).dt.truncate("1m"))
           .group_by(["minute_start", "broker", "stat_name", "stats_key"]).agg(pl.col("sum").sum())
           .collect())
    return out.select([pl.col(c).cast(t) for c, t in _STATS.items()]).sort(["minute_start", "broker", "stat_name",
                                                                            "stats_key"])


def failure_lines(lake: Path) -> pl.DataFrame:
    """``silver/send_failures`` rows, :data:`_FAILURES` columns, by time."""
    frame = _table(lake / tables.SILVER_SEND_FAILURES, list(_FAILURES))
    if frame is None:
        return _empty(_FAILURES)
    return frame.collect().select([pl.col(c).cast(t) for c, t in _FAILURES.items()]).sort("event_time")


def quarantine_reasons(lake: Path) -> pl.DataFrame:
    """``quarantine`` rows counted by ``source`` and ``reason`` (``records``), most first."""
    frame = _table(lake / tables.QUARANTINE, ["source", "reason"])
    if frame is None:
        return pl.DataFrame(schema={"source": pl.Utf8, "reason": pl.Utf8, "records": pl.UInt32})
    return (frame.group_by(["source", "reason"]).agg(records=pl.len()).collect()
            .sort(["records", "reason"], descending=[True, False]))


def read_recording(lake: Path, min_minutes: int) -> Recording:
    """The recording the job's ``--once`` run wrote to ``lake``.

    Raises:
        RecordingError: no windowed minute line passed the job's checks ("no stats"), fewer than ``min_minutes``
            minutes with stats ("too short"), or more than :data:`MAX_MINUTES` from the first to the last ("too
            long").
    """
    stats = stats_minutes(lake)
    quarantine = quarantine_reasons(lake)
    if stats.height == 0:
        why = (f"; the job quarantined {int(quarantine['records'].sum())} records, most for "
               f"'{quarantine['reason'][0]}'" if quarantine.height else "")
        raise RecordingError("no stats: the recording holds no minute line of "
                             f"{', '.join(rmq.WINDOWED_STATS)} that the job accepted{why}")
    start = stats["minute_start"].min()
    minutes = int((stats["minute_start"].max() - start) // dt.timedelta(minutes=1)) + 1
    with_stats = stats["minute_start"].n_unique()
    if with_stats < min_minutes:
        raise RecordingError(f"too short: {with_stats} minute(s) of stats between {start:%Y-%m-%d %H:%M} and "
                             f"{stats['minute_start'].max():%Y-%m-%d %H:%M} UTC; a replay needs at least {min_minutes}")
    if minutes > MAX_MINUTES:
        raise RecordingError(f"too long: {minutes} minutes from {start:%Y-%m-%d %H:%M} UTC; a replay runs on at most "
                             f"{MAX_MINUTES} (copy the minutes of the incident to a landing directory of their own)")
    brokers = tuple(sorted(stats["broker"].unique().to_list()))
    lines = failure_lines(lake)
    end = start + dt.timedelta(minutes=minutes)
    inside = lines.filter((pl.col("event_time") >= start) & (pl.col("event_time") < end)
                          & pl.col("broker").is_in(list(brokers)))
    refused = pl.col("failure_class").is_in(list(REFUSED_CLASSES))
    outside = lines.filter(refused).height - inside.filter(refused).height
    anomalies = _table(lake / tables.GOLD_ANOMALIES, list(_ANOMALIES))
    judged = _table(lake / tables.GOLD_BROKER_TPS, ["window_end"])
    until = judged.select(pl.col("window_end").max()).collect().item() if judged is not None else None
    return Recording(stats, inside.filter(refused), anomalies.collect() if anomalies is not None else
                     _empty(_ANOMALIES), quarantine, start, minutes, brokers, outside, inside.filter(~refused), until)


def recorded_counts(stats: pl.DataFrame) -> dict[str, int]:
    """How many business topics (``TOPIC_PUT_NUMS`` keys not starting with ``%``) and consumer groups
    (``GROUP_GET_NUMS`` and ``SNDBCK_PUT_NUMS`` keys' groups) the recording's stats name."""
    key = pl.col("stats_key")
    topics = stats.filter((pl.col("stat_name") == rmq.TOPIC_PUT_NUMS) & ~key.str.starts_with("%"))["stats_key"]
    groups = stats.filter(pl.col("stat_name").is_in([rmq.GROUP_GET_NUMS, rmq.SNDBCK_PUT_NUMS])).select(
        key.str.split("@").list.last())["stats_key"]
    return {"topic": topics.n_unique(), "group": groups.n_unique()}


def read_enforced(lake: Path) -> pl.DataFrame:
    """``gold/limits`` of the governor that enforced limits while the recording was made (:data:`_LIMITS` columns,
    by ``version``).

    Raises:
        RecordingError: ``lake`` holds no ``gold/limits`` table.
    """
    frame = _table(Path(lake) / tables.GOLD_LIMITS, _LIMITS)
    if frame is None:
        raise RecordingError(f"--limits-lake {lake}: no {tables.GOLD_LIMITS} table there")
    return frame.collect().sort("version")
