"""Known brokers: the brokers whose stats lines and send failures the governor takes as evidence.

Anyone who can write the landing directory or produce to the stats and failures topics can name any broker, so a
record naming a broker the cluster does not have is quarantined (``unknown broker <name> (not in <source>)``,
:mod:`pipelines.dataplane.transforms.known`, docs/contracts.md §1) and never reaches a window, the census or a
decision.

* **Where the set comes from** (:class:`KnownBrokerSource`): with ``[sink.rocketmq] enabled``, the broker names
  the name servers list for ``[sink.rocketmq] cluster`` (``GET_BROKER_CLUSTER_INFO``: ``ClusterInfo``'s
  ``clusterAddrTable``, else every name of ``brokerAddrTable``), the union over the name servers that answer,
  read at start and again every ``[brokers] refresh_seconds`` on a thread of its own. A name server that does not
  answer, or lists no broker (a restarted one knows none until they register again), is not an answer: the set
  read before stays. Without a name server's answer at start the set is ``[brokers] known`` (names and
  ``*``/``?`` patterns); with neither, every broker name is trusted (``None``) and a WARNING says so once, at start.
* **Replay** (:class:`BatchRecords`): the set each ingest micro-batch used is written next to the checkpoint
  (``<checkpoint root>/known_brokers/batch-<N>.json``) before the batch is judged, and a replayed batch reads it
  back, so a replay after a crash judges exactly as the first run did. Records of batches more than
  :data:`RETAINED_BATCHES` behind are removed. The records belong to the ingest checkpoint's batch ids, as the
  events files do (:mod:`pipelines.dataplane.events`): a new checkpoint directory starts without them.
* **Changes**: a broker that joins is accepted from the next refresh on; what was quarantined before stays there.
  A broker that leaves is unknown from the next refresh, and :func:`expected_brokers` drops it from the fast
  path's census; its windows already in gold stay.

RocketMQ facts (docs/rocketmq-formats.md §9): apache/rocketmq ``RouteInfoManager`` (``getAllClusterInfo``,
``unregisterBroker``, ``scanNotActiveBroker``: a broker name leaves ``brokerAddrTable`` with its last address, at
the latest 120 s after its last heartbeat), ``BrokerConfig.registerNameServerPeriod`` (30 s).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from control import remoting as rm
from pipelines.config import GovernorConfig

log = logging.getLogger("rate_governor.known_brokers")

#: ``<source>`` of the quarantine reason when the set is ``[brokers] known``.
CONFIGURED = "[brokers] known"
#: ``<source>`` of the reason for an ``ip:port`` that ``[brokers] addresses`` does not map to a name.
ADDRESSES = "[brokers] addresses"
#: A broker given as ``host:port`` (what ``[brokers] addresses`` left unmapped): never a known broker's name.
ADDRESS = r"[0-9A-Za-z._\[\]:-]+:[0-9]{1,5}"
#: Characters that make an entry of ``[brokers] known`` a pattern (fnmatch's ``*`` and ``?``).
WILDCARDS = "*?"
#: Per-batch records kept behind the newest (Spark's ``spark.sql.streaming.minBatchesToRetain`` default).
RETAINED_BATCHES = 100
KNOWN_DIR = "known_brokers"


def name_server_source(cluster: str) -> str:
    """``<source>`` of the reason when the set comes from the name servers."""
    return f"the name server's cluster {cluster}" if cluster else "the name server's brokers"


def is_address(broker: str) -> bool:
    """True for ``host:port`` (:data:`ADDRESS`)."""
    return re.fullmatch(ADDRESS, broker) is not None


@dataclass(frozen=True)
class KnownBrokers:
    """One known set: exact ``names`` (sorted), fnmatch-style ``patterns`` and the ``source`` the quarantine
    reason names. The Column twin of :meth:`admits` is :func:`pipelines.dataplane.transforms.known.unknown_broker`."""

    names: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    source: str = CONFIGURED

    @classmethod
    def of(cls, entries: Iterable[str], source: str = CONFIGURED) -> KnownBrokers:
        """Entries with ``*`` or ``?`` are patterns, the others names."""
        entries = sorted(set(entries))
        return cls(tuple(e for e in entries if not any(c in e for c in WILDCARDS)),
                   tuple(e for e in entries if any(c in e for c in WILDCARDS)), source)

    def admits(self, broker: str | None) -> bool:
        """Whether a record naming ``broker`` is evidence: a name of the set or matching one of its patterns,
        never a ``host:port``. ``None`` (a send failure that names no broker) is not judged: True."""
        if broker is None:
            return True
        if is_address(broker):
            return False
        return broker in self.names or any(fnmatchcase(broker, p) for p in self.patterns)

    def to_json(self) -> dict:
        return {"names": list(self.names), "patterns": list(self.patterns), "source": self.source}

    @classmethod
    def from_json(cls, data: dict) -> KnownBrokers:
        return cls(tuple(data["names"]), tuple(data["patterns"]), str(data["source"]))


def expected_brokers(newest_final_brokers: list[str], known: KnownBrokers | None) -> list[str]:
    """The fast path's census (brokers expected in an open window): the brokers of the newest finalized window
    that are still known (a broker that left the name server's list is not waited for); all of them when every
    broker is trusted (``known`` None). In the order given (sorted by :func:`pipelines.dataplane.transforms.fast
    .newest_final_window`)."""
    return [b for b in newest_final_brokers if known is None or known.admits(b)]


def cluster_broker_names(cluster_info: dict, cluster: str) -> list[str]:
    """A ``ClusterInfo`` body → the broker names of ``cluster`` (``clusterAddrTable``; ``""``: every name of
    ``brokerAddrTable``), sorted; slaves and masters alike (a broker name stays while any of its addresses does)."""
    if cluster:
        return sorted((cluster_info.get("clusterAddrTable") or {}).get(cluster) or [])
    return sorted(cluster_info.get("brokerAddrTable") or {})


class KnownBrokerSource:
    """The current known set of one governor (see the module docstring). :meth:`current` reads it the first time
    it is asked (synchronously, logging the trust line once); :meth:`start` also starts the refresh thread when the
    name servers are the source; :meth:`stop` ends it. Thread-safe.

    Raises (constructor):
        ConfigError: ``[sink.rocketmq]`` ACL keys configured but unusable.
    """

    def __init__(self, cfg: GovernorConfig, client=None) -> None:
        self.cfg = cfg
        self.ns = cfg.sink.rocketmq
        self.configured = KnownBrokers.of(cfg.brokers.known) if cfg.brokers.known else None
        self._client = client
        self._lock = threading.Lock()
        self._read = False
        self._known: KnownBrokers | None = None
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> KnownBrokers | None:
        """The known set now; None: every broker name is trusted."""
        with self._lock:
            if not self._read:
                self._first_read()
            return self._known

    def _first_read(self) -> None:
        self._read = True
        why = "the RocketMQ sink is off"
        if self.ns.enabled:
            try:
                self._known = self._from_name_servers()
                log.info("known brokers: %s", _describe(self._known))
                return
            except (rm.RemotingError, ValueError) as exc:
                why = f"no name server answered at start ({exc})"
                self._failing = True
        self._known = self.configured
        if self._known is None:
            log.warning("every broker name is trusted: %s and [brokers] known is empty; whoever can write the "
                        "landing directory or the stats and failures topics can name any broker", why)
        else:
            log.warning("known brokers: %s (%s)", _describe(self._known), why)

    def refresh(self) -> KnownBrokers | None:
        """Read the name servers once; their answer replaces the set (changes logged), no answer keeps it
        (logged once per outage). Returns the set now."""
        try:
            fresh = self._from_name_servers()
        except (rm.RemotingError, ValueError) as exc:
            with self._lock:
                if not self._failing:
                    log.warning("known brokers: no name server answered (%s); keeping %s", exc,
                                _describe(self._known))
                self._failing = True
                return self._known
        with self._lock:
            old = self._known
            if old != fresh:
                before = set(old.names) if old is not None else set()
                log.info("known brokers: %s (joined: %s; left: %s)", _describe(fresh),
                         ", ".join(sorted(set(fresh.names) - before)) or "none",
                         ", ".join(sorted(before - set(fresh.names))) or "none")
            self._known, self._failing, self._read = fresh, False, True
            return fresh

    def _from_name_servers(self) -> KnownBrokers:
        """The union of the broker names every answering name server lists for the cluster.

        Raises:
            rm.RemotingError: no name server answered with a broker of the cluster.
        """
        if self._client is None:
            from pipelines.writeback.rocketmq_admin import admin_client

            self._client = admin_client(self.ns)
        names, errors = set(), []
        for addr in self.ns.namesrv_addr:
            try:
                reply = self._client.invoke(addr, rm.GET_BROKER_CLUSTER_INFO, timeout_s=self.ns.timeout_ms / 1000)
                if reply.code != rm.SUCCESS:
                    raise rm.RemotingError(f"code {reply.code}: {reply.remark}")
                listed = cluster_broker_names(rm.fastjson_loads(reply.body), self.ns.cluster)
                if not listed:
                    raise rm.RemotingError(f"lists no broker of cluster {self.ns.cluster or '(any)'}")
                names.update(listed)
            except (rm.RemotingError, ValueError, AttributeError, TypeError) as exc:  # AttributeError: not a map
                errors.append(f"{addr}: {exc}")
        if not names:
            raise rm.RemotingError("; ".join(errors) or "no name server configured")
        return KnownBrokers(tuple(sorted(names)), (), name_server_source(self.ns.cluster))

    def start(self) -> None:
        """Read the set (if not yet) and, when the name servers are the source, refresh it every
        ``[brokers] refresh_seconds`` on a daemon thread until :meth:`stop`."""
        self.current()
        if self.ns.enabled and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="known-brokers", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.brokers.refresh_seconds):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the refresh goes on; the set read before stays
                log.exception("known brokers: refresh failed")

    def stop(self) -> None:
        """End the refresh thread (the set stays readable)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._client is not None:
            self._client.close()


def _describe(known: KnownBrokers | None) -> str:
    if known is None:
        return "every broker name (trusted)"
    return f"{', '.join(known.names + known.patterns)} from {known.source}"


def known_dir(cfg: GovernorConfig) -> Path:
    """Where the per-batch records live: ``<checkpoint root>/known_brokers``."""
    return Path(cfg.checkpoint_root) / KNOWN_DIR


class BatchRecords:
    """The known set each ingest micro-batch used, recorded next to the checkpoint (see the module docstring).

    Example:
        >>> records = BatchRecords(known_dir(cfg), source)
        >>> records.for_batch(42)      # the set batch 42 is judged with: recorded now, or read back on a replay
    """

    def __init__(self, directory: Path, source: KnownBrokerSource) -> None:
        self.directory = Path(directory)
        self.source = source

    def path(self, batch_id: int) -> Path:
        return self.directory / f"batch-{batch_id:09d}.json"

    def for_batch(self, batch_id: int) -> KnownBrokers | None:
        """The set of ``batch_id``: the recorded one when the batch ran before (a replay), else the source's
        current set, recorded first (JSON written to a hidden file and renamed into place). An unreadable record
        is logged and replaced by the current set.

        Raises:
            OSError: the record could not be written (the batch fails before judging anything; Spark retries it).
        """
        target = self.path(batch_id)
        if target.exists():
            try:
                data = json.loads(target.read_text(encoding="utf-8"))
                return None if data.get("trusted") == "all" else KnownBrokers.from_json(data["known"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("known brokers: the record of batch %d is unreadable (%s); judging with the current set",
                            batch_id, exc)
        known = self.source.current()
        record = {"batch_id": batch_id, **({"trusted": "all"} if known is None else {"known": known.to_json()})}
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.directory / f".{target.name}.tmp"
        temporary.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
        os.replace(temporary, target)
        self._prune(batch_id)
        return known

    def _prune(self, batch_id: int) -> None:
        for old in self.directory.glob("batch-*.json"):
            try:
                if int(old.stem.removeprefix("batch-")) < batch_id - RETAINED_BATCHES:
                    old.unlink(missing_ok=True)
            except ValueError:
                continue
