"""What the console shows: the governor's own lines by default, Spark's start-up chatter only with ``--verbose``.

Two halves, one switch:

* the driver JVM logs through log4j2; quiet runs point it at the project's ``conf/log4j2.properties`` (Spark's
  own mechanism, ``-Dlog4j2.configurationFile``), which keeps Spark's warnings but hides its start-up and planning
  notices (each hidden logger is named there with the message it hides);
* the Python side logs through :mod:`logging`: ``rate_governor*`` loggers at INFO (progress, decisions), every
  other library at WARNING, so a sink that fails (kafka-python's warnings) or a warning of the governor
  (late data dropped, quarantine growing, see :mod:`pipelines.ops.progress`) still shows.

Example:
    >>> configure_logging(verbose=False)                 # in a CLI's main()
    >>> build_session(cfg.spark, verbose=False)          # adds driver_java_options(False)
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

#: The project's log4j2 configuration for a quiet driver (``conf/log4j2.properties`` of this checkout).
LOG4J2_CONFIG = Path(__file__).resolve().parents[2] / "conf" / "log4j2.properties"
#: Spark's setting that carries JVM options to a driver launched by pyspark (client mode).
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: Loggers of the governor itself: shown at INFO in both modes.
GOVERNOR_LOGGER = "rate_governor"
#: Python libraries that log at INFO/WARNING about things an operator cannot act on (py4j's callback server,
#: GX's data-context notices, e.g. "Created temporary directory ... for ephemeral docs site" at INFO from a logger
#: GX sets to INFO itself); quiet mode shows only their errors.
CHATTY_LOGGERS = ("py4j", "great_expectations")
CONSOLE_FORMAT = "%(asctime)s %(message)s"
VERBOSE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _QuietFilter(logging.Filter):
    """Quiet mode's handler filter: every ``rate_governor*`` record, other libraries' warnings and errors, and
    only errors of :data:`CHATTY_LOGGERS`. A filter rather than logger levels, because a library may set its own
    logger's level when it is imported, after the CLI configured logging (GX does)."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name == GOVERNOR_LOGGER or name.startswith(GOVERNOR_LOGGER + "."):
            return True
        if any(name == chatty or name.startswith(chatty + ".") for chatty in CHATTY_LOGGERS):
            return record.levelno >= logging.ERROR
        return record.levelno >= logging.WARNING


class _LevelPrefix(logging.Formatter):
    """``HH:MM:SS message``; warnings and errors get their level in front so they stand out."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if record.levelno >= logging.WARNING:
            stamp, _, message = line.partition(" ")
            return f"{stamp} {record.levelname}: {message}"
        return line


def configure_logging(verbose: bool = False, stream=None) -> None:
    """Set up the Python loggers for a CLI run (call once, from ``main``).

    Quiet (default): one handler on stderr, ``HH:MM:SS message``; ``rate_governor*`` at INFO, the rest at
    WARNING, :data:`CHATTY_LOGGERS` at ERROR. Verbose: level and logger name on every line, ``rate_governor*`` at
    DEBUG, the chatty loggers left at their own levels.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        logging.Formatter(VERBOSE_FORMAT, "%H:%M:%S") if verbose else _LevelPrefix(CONSOLE_FORMAT, "%H:%M:%S")
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    if not verbose:
        handler.addFilter(_QuietFilter())
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    # verbose adds the governor's DEBUG lines, e.g. rows and seconds per table of every micro-batch
    logging.getLogger(GOVERNOR_LOGGER).setLevel(logging.DEBUG if verbose else logging.INFO)



def driver_java_options(verbose: bool, existing: str | None = None) -> str | None:
    """The value of :data:`DRIVER_JAVA_OPTIONS` for a session: the project's log4j2 file in front of
    ``existing`` (options from the config keep working), or ``existing`` unchanged when ``verbose``.

    Only a driver JVM that pyspark launches sees it; under spark-submit the JVM is already running, pass
    ``--driver-java-options -Dlog4j2.configurationFile=file:conf/log4j2.properties`` there instead.
    """
    if verbose or "log4j2.configurationFile" in (existing or ""):
        return existing
    option = f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"
    return f"{option} {existing}" if existing else option


def limit_stories(rows: list[dict]) -> list[str]:
    """``gold/limits`` rows (``resource_type``, ``resource``, ``action``, ``limit_qps`` msg/s cluster-wide, ``mode``,
    ``basis``, ``window_end`` UTC, ``version``) → one line per resource telling what happened to its limit, in
    version order: "group g: set at 10:51 to 30.3 msg/s (enforce), refreshed 5 times, still in force". A row at the
    value in force is a refresh (or a final row confirming a preliminary one: not counted); a lift ends the limit;
    a resource whose last row is not a lift is still in force (until it expires, ``limits.ttl_seconds`` after its
    last row)."""
    by_resource: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by_resource.setdefault((r["resource_type"], r["resource"]), []).append(r)
    out = []
    for (rtype, name), mine in sorted(by_resource.items()):
        events, current, refreshes, last_end = [], None, 0, None

        def flush() -> None:
            nonlocal refreshes
            if refreshes:
                events.append(f"refreshed {refreshes} time{'s' if refreshes > 1 else ''}")
            refreshes = 0

        for r in sorted(mine, key=lambda r: r["version"]):
            at = f"{r['window_end']:%H:%M}"
            if r["action"] == "lift":
                flush()
                events.append(f"lifted at {at}")
                current = None
            elif current is None:
                events.append(f"{r['action']} at {at} to {r['limit_qps']:.1f} msg/s ({r['mode']})")
                current = r["limit_qps"]
            elif abs(r["limit_qps"] - current) <= 1e-9 * max(1.0, current):
                refreshes += r["window_end"] != last_end  # a final row confirming its preliminary one is no refresh
            else:
                flush()
                how = "raised" if r["limit_qps"] > current else "lowered"
                events.append(f"{how} to {r['limit_qps']:.1f} msg/s at {at}")
                current = r["limit_qps"]
            last_end = r["window_end"]
        flush()
        if current is not None:
            events.append("still in force")
        out.append(f"{rtype} {name}: " + ", ".join(events))
    return out
