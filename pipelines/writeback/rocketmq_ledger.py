"""The RocketMQ admin sink's ledger: which broker rates the governor owns, and what each was before it took over.

One file (default ``<lake>/control/rocketmq_owned.json``), replaced atomically on every change::

    {"format": 2,
     "brokers": {"broker-a": {"%RETRY%g1": {"prior_qps": null},       # was at the broker's default
                              "orders":    {"prior_qps": 500.0}}}}     # was set by hand (MQCloud) to 500

per master (by ``brokerName``, stable across address changes) and broker resource (a topic or
``%RETRY%<group>``). ``prior_qps`` is the rate the limiter had just before the governor first changed it on that
master, or null when it was at the broker's own default or had no limiter yet (it is then set back to the
broker's default of the moment, read from the broker). An entry is written **before** the first update is sent, so
a crash between the two leaves the prior known; it is removed once that master reads the resource back at (or
above) the rate to restore.

The format before this one (``{"resources": [...]}``, one set for every master) is read as "owned on every master,
prior unknown": the entries sit under ``"*"`` until :meth:`Ledger.adopt_legacy` copies them to the masters of the
next publish. A file that cannot be read is an empty ledger (logged), never a crash.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("rate_governor.sink.rocketmq")

LEDGER_FORMAT = 2
#: The ledger's place in the lake when ``[sink.rocketmq] ledger_file`` is empty.
LEDGER_FILE = "control/rocketmq_owned.json"
#: Pseudo broker name of the entries read from a format-1 ledger (owned on every master).
ANY_MASTER = "*"


def ledger_path(ledger_file: str, lake_root: str | os.PathLike[str]) -> Path:
    """The ledger file: ``ledger_file`` (``[sink.rocketmq] ledger_file``) when set, else
    ``<lake_root>/control/rocketmq_owned.json``."""
    return Path(ledger_file) if ledger_file else Path(lake_root) / LEDGER_FILE


class Ledger:
    """Thread-safe view of the ledger file (module docstring); every change is written through at once.

    ``path`` None keeps it in memory only.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._owned: dict[str, dict[str, float | None]] = read_ledger(path) if path is not None else {}

    def owned(self, broker: str) -> dict[str, float | None]:
        """``{resource: prior_qps}`` the governor owns on master ``broker`` (a copy)."""
        with self._lock:
            return dict(self._owned.get(broker, {}))

    def all(self) -> dict[str, dict[str, float | None]]:
        with self._lock:
            return {b: dict(r) for b, r in self._owned.items()}

    def resources(self) -> set[str]:
        """Every resource owned on any master."""
        with self._lock:
            return {r for owned in self._owned.values() for r in owned}

    def take(self, broker: str, priors: dict[str, float | None]) -> None:
        """Record that the governor is about to change these resources on ``broker``: ``{resource: prior_qps}``
        (None: the broker's default or no limiter). A resource already owned keeps its first prior. One write."""
        with self._lock:
            entry = self._owned.setdefault(broker, {})
            new = {r: q for r, q in priors.items() if r not in entry}
            if not new:
                if not entry:
                    self._owned.pop(broker, None)
                return
            entry.update(new)
            self._write()

    def release(self, broker: str, resources: set[str]) -> None:
        """``broker`` reads these resources back at their restore rate: no longer the governor's."""
        with self._lock:
            entry = self._owned.get(broker, {})
            gone = resources & set(entry)
            if not gone:
                return
            for r in gone:
                del entry[r]
            if not entry:
                self._owned.pop(broker, None)
            self._write()

    def adopt_legacy(self, brokers: list[str]) -> None:
        """Copy the format-1 entries (``"*"``) to each of ``brokers`` (prior unknown) and drop them."""
        with self._lock:
            legacy = self._owned.pop(ANY_MASTER, None)
            if not legacy:
                return
            for broker in brokers:
                entry = self._owned.setdefault(broker, {})
                for resource in legacy:
                    entry.setdefault(resource, None)
            log.info("rocketmq sink: ledger of the old format adopted for %d masters (%d resources, rates before "
                     "the governor unknown: restored to the broker default)", len(brokers), len(legacy))
            self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        try:
            write_ledger(self.path, self._owned)
        except OSError as exc:
            log.warning("rocketmq sink: cannot write ledger %s: %s", self.path, exc)


def read_ledger(path: Path) -> dict[str, dict[str, float | None]]:
    """``{broker: {resource: prior_qps}}`` from a ledger file of either format ({} when absent or unreadable; a
    format-1 file's resources under :data:`ANY_MASTER`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("rocketmq sink: ledger %s unreadable (%s); starting empty", path, exc)
        return {}
    try:
        if isinstance(data, dict) and isinstance(data.get("resources"), list):  # format 1
            return {ANY_MASTER: {str(r): None for r in data["resources"]}} if data["resources"] else {}
        out: dict[str, dict[str, float | None]] = {}
        for broker, owned in data["brokers"].items():
            out[str(broker)] = {str(r): (None if e.get("prior_qps") is None else float(e["prior_qps"]))
                                for r, e in owned.items()}
        return out
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        log.warning("rocketmq sink: ledger %s has an unknown shape (%s); starting empty", path, exc)
        return {}


def write_ledger(path: Path, owned: dict[str, dict[str, float | None]]) -> None:
    """Replace the ledger atomically (format 2, sorted)."""
    body = {"format": LEDGER_FORMAT,
            "brokers": {b: {r: {"prior_qps": owned[b][r]} for r in sorted(owned[b])} for b in sorted(owned)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(body, out, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
