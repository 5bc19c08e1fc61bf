"""The file sink of the control records: ``<lake>/control/limits.json``, the whole current set, replaced atomically
(docs/contracts.md §3). The records themselves (shape, signature, verification) are :mod:`control.record`.

Content: ``{"generated_at": "YYYY-MM-DDTHH:MM:SSZ", "records": [...]}``, the records sorted by
``(resource_type, resource)``.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from control.timestamps import format_expires_at


def write_limits_file(
    records: list[dict[str, Any]],
    path: str | os.PathLike[str],
    *,
    generated_at: datetime | None = None,
    before_replace: Callable[[], None] | None = None,
) -> None:
    """Write the whole current set of control records to ``path``, atomically.

    Content: ``{"generated_at": "YYYY-MM-DDTHH:MM:SSZ", "records": [...]}`` with the records
    sorted by ``(resource_type, resource)``. The JSON is written to a temporary file in the same
    directory, flushed and fsynced, then moved over ``path`` with ``os.replace`` (atomic on POSIX
    and Windows), so a reader sees either the old file or the new one, never a half-written one.
    On any failure the temporary file is removed and the old file is left as it was. The parent
    directory is created if missing. Records are written as given (sign them first).
    ``before_replace`` is called once the temporary file is complete, before the rename (the
    governor's crash-test hook).
    """
    target = Path(path)
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    stamp = format_expires_at(generated_at if generated_at is not None else datetime.now(timezone.utc))
    ordered = sorted(records, key=lambda r: (str(r.get("resource_type")), str(r.get("resource"))))
    text = json.dumps(
        {"generated_at": stamp, "records": ordered},
        indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False,
    ) + "\n"
    data = text.encode("utf-8")

    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; brokers' operators must read it
        if before_replace is not None:
            before_replace()
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself (best effort; not possible on every platform)."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def read_limits_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read the records of a limits file written by :func:`write_limits_file`.

    Returns the ``records`` list as stored (not verified; see :func:`verify`). Raises
    ``FileNotFoundError`` when absent and ``ValueError`` when the file is not a JSON object with a
    ``records`` list.
    """
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"limits file {path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise ValueError(f"limits file {path} has no 'records' list")
    return list(doc["records"])
