"""The streaming checkpoints' compatibility with the config and with the Spark line: a restart may change
thresholds, limits and the trigger, but not the settings the saved stream state depends on, nor go back to an older
Spark line than the one that last ran on the checkpoint. Also the repair of a query killed before it planned its
first micro-batch (:func:`clear_unplanned_first_batch`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from pipelines.config import ConfigError, GovernorConfig

log = logging.getLogger("rate_governor")

#: Settings a checkpoint depends on: changing one makes the saved stream state meaningless.
CHECKPOINT_BOUND_SETTINGS = {
    "windows.length_seconds": lambda cfg: cfg.windows.length_seconds,
    "source.kind": lambda cfg: cfg.source.kind,
}
CHECKPOINT_SETTINGS_FILE = "governor-settings.json"
#: Key in the settings file: the Spark version (``pyspark.__version__``) that last started on the checkpoint.
SPARK_VERSION_KEY = "spark.version"


class CheckpointMismatchError(ConfigError):
    """The config changes a setting the existing checkpoint depends on (e.g. the window length), or the running
    Spark line is older than the one that last wrote the checkpoint."""


def spark_line(version: str) -> tuple[int, int]:
    """``"4.3.0"`` → ``(4, 3)``: Spark keeps a checkpoint's format within a feature line (major.minor)."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def check_checkpoint(cfg: GovernorConfig, spark_version: str | None = None) -> None:
    """Refuse a restart whose config or Spark line is incompatible with the existing checkpoint; record the
    settings on first start and the Spark version on every start. Other settings (thresholds, limits, trigger) may
    change between restarts.

    Spark lines: a newer line continues on a checkpoint an older one wrote (pyspark 4.0 → 4.3 is tested on a
    committed 4.0 checkpoint, ``tests/e2e/test_spark_upgrade.py``). Going back is refused: a checkpoint a newer
    line started records state settings an older one does not know and ignores (pyspark 4.3 records
    ``spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion = 2`` and
    ``spark.sql.dropDuplicates.deterministicKeyOrder.enabled = true`` in every offset-log entry; 4.0.5 restarted on
    it without an error, reading the state as 4.0 writes it). A checkpoint recorded without a Spark version was
    written before versions were recorded, i.e. by pyspark 4.0.

    Args:
        spark_version: the running Spark version; default ``pyspark.__version__`` (the driver's, which equals the
            cluster's: spark-submit puts the cluster's pyspark first).

    Raises:
        CheckpointMismatchError: names the setting or the Spark versions, and what to do.
    """
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    root = Path(cfg.checkpoint_root)
    current = {name: read(cfg) for name, read in CHECKPOINT_BOUND_SETTINGS.items()}
    saved_file = root / CHECKPOINT_SETTINGS_FILE
    if saved_file.is_file():
        saved = json.loads(saved_file.read_text())
        for name, value in current.items():
            if name in saved and saved[name] != value:
                raise CheckpointMismatchError(
                    f"{name} is {value} but the checkpoint in {root} was made with {saved[name]}; restore "
                    f"{name} = {saved[name]!r}, or start a new stream with another lake.checkpoint_dir "
                    "(and a new lake, since windows of both lengths would mix)"
                )
        written_by = saved.get(SPARK_VERSION_KEY)
        if written_by is not None and spark_line(spark_version) < spark_line(written_by):
            major, minor = spark_line(written_by)
            raise CheckpointMismatchError(
                f"the checkpoint in {root} was last run by Spark {written_by} and this governor runs Spark "
                f"{spark_version}, an older line that ignores the state settings the newer one recorded there; run it "
                f"with pyspark {major}.{minor} or newer (pip install 'pyspark>={major}.{minor}'), or start a new "
                "stream with another lake.checkpoint_dir"
            )
        if written_by != spark_version:
            _write_json(saved_file, {**saved, SPARK_VERSION_KEY: spark_version})
        return
    if root.exists() and any(root.iterdir()):
        return  # a checkpoint from before settings were recorded: nothing to compare against
    root.mkdir(parents=True, exist_ok=True)
    _write_json(saved_file, {**current, SPARK_VERSION_KEY: spark_version})


#: A query checkpoint's directories that Spark requires empty when the query starts at batch 0
#: (``MicroBatchExecution.verifyNewCheckpointDirectory``, Spark 4.x; on by default through
#: ``spark.sql.streaming.verifyCheckpointDirectoryEmptyOnStart``).
BATCH_ZERO_DIRS = ("offsets", "commits", "state")


def clear_unplanned_first_batch(cfg: GovernorConfig) -> list[Path]:
    """Remove what a query killed before it planned its first micro-batch left in its checkpoint, so that it can
    start again. Call it only while holding the lake's lease (no other governor can be writing there).

    Spark writes a batch's offset-log entry to a temporary file (``offsets/.0.<uuid>.tmp``) and renames it. A
    governor killed (SIGKILL, OOM, a lost node) between the two leaves that temporary file and no batch: on restart
    Spark sees no batch, starts at batch 0, finds ``offsets/`` not empty and refuses with
    ``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``, on every restart. Nothing of batch 0 was planned, run or
    committed, so the leftovers carry nothing; the source's own log (``sources/``) is kept, so the files it had
    listed are read by the new batch 0 and none is lost.

    A query checkpoint is a directory under ``cfg.checkpoint_root`` with an ``offsets/`` directory. It is cleared
    only when neither ``offsets/`` nor ``commits/`` holds a batch file (a file named by a batch number); a
    checkpoint with any batch is never touched.

    Returns:
        The files removed (empty when there was nothing to repair); each repaired query is logged as a warning.
    """
    root = Path(cfg.checkpoint_root)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for query in sorted(p for p in root.iterdir() if (p / "offsets").is_dir()):
        if _has_batch(query / "offsets") or _has_batch(query / "commits"):
            continue
        leftovers = sorted(p for name in BATCH_ZERO_DIRS for p in (query / name).rglob("*") if p.is_file())
        if not leftovers:
            continue
        for name in BATCH_ZERO_DIRS:
            shutil.rmtree(query / name, ignore_errors=True)
        log.warning(
            "query %s was stopped before it planned its first micro-batch; removed what it left in its checkpoint "
            "(%s) so that it starts at batch 0 again", query.name,
            ", ".join(str(p.relative_to(query)) for p in leftovers))
        removed += leftovers
    return removed


def _has_batch(directory: Path) -> bool:
    """Whether a checkpoint log directory holds a batch file (Spark names them by batch number: ``0``, ``1``, ...)."""
    return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def _write_json(path: Path, data: dict) -> None:
    """Replace ``path`` atomically (a crash leaves the old file or the new one)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temporary, path)
