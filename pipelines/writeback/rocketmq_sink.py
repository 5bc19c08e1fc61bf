"""RocketMQ admin write-back: the current limits pushed into the master brokers' rate limiter (article 001's
limiter in Sohu's RocketMQ fork, changed at run time the way MQCloud changes it).

Sources: sohutv/rocketmq ``RateLimitHandler``, ``RateLimitConfigManager``, ``TokenBucketRateLimiter``,
``AdminBrokerProcessor.updateSendMessageRateLimit`` / ``viewSendMessageRateLimit`` / ``getBrokerConfig``,
``UpdateSendMsgRateLimitRequestHeader`` (ext fields ``topic``, ``topicLimitQps``), ``BrokerRateLimitData`` /
``TopicRateLimit`` (branches 4.9.3-sohu, 5.1.1-sohu, 5.1.1-sohu-02/-03, 5.3.1-sohu-01; the fork lines, their defaults
and request codes: :mod:`pipelines.writeback.rocketmq_admin`); sohutv/mqcloud ``SohuMQAdmin`` / ``DefaultSohuMQAdmin``.

Mapping of a control record (docs/contracts.md §3) to a broker resource: ``topic`` → the topic; ``group`` → the
group's retry topic ``%RETRY%<group>`` (the policy limits a group's retry traffic, ``CONSUMER_SEND_MSG_BACK``).
Only ``enforce`` records that have not expired are pushed; ``advisory`` ones never are. Each master gets its own
figure, :func:`control.record.broker_limit` (its entry of the record's ``brokers``, else ``"*"``, else the
cluster-wide ``limit_qps``).

Each :meth:`RocketMQAdminSink.publish` (once per deciding micro-batch): find the masters (broker id 0) from the name
server (``GET_BROKER_CLUSTER_INFO``), then on each master, up to ``max_parallel_brokers`` at once and all within
``publish_deadline_ms``: read its default rates (``GET_BROKER_CONFIG`` when due; learns its version too), read its
rates (VIEW), push every resource whose rate differs from its target (UPDATE), read them back. Targets:

* a resource with a live limit: that master's figure, but never above the rate the resource had before the
  governor took it over (a rate set by hand stays a ceiling), nor above the broker's default;
* a resource the governor owns (:mod:`pipelines.writeback.rocketmq_ledger`) that is no longer limited (lifted, expired,
  turned advisory): the rate it had before, else the broker's default. A rate already at or above that is left as
  it is; lift and expiry never leave a rate below it and never lower one. The ledger entry goes once the master
  reads it back there.

Before the governor first changes a resource on a master, the ledger records the rate it had. A master that times
out, refuses the connection, answers an error code or an unreadable view is logged and kept in :attr:`status`
until a later publish reaches it; nothing is raised to the streaming query.

The brokers have no TTL of their own: the governor owns fail-open. If it stops, its last rates stay in force (the
current line even keeps them across broker restarts) until ``python -m pipelines.writeback.rocketmq_sink restore --conf
<toml>`` sets them back (:mod:`pipelines.writeback.rocketmq_restore`, which holds the operator commands this
module's ``main`` runs).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from control import remoting as rm
from control.record import broker_limit, parse_expires_at
from control.remoting_client import RemotingClient
from pipelines.config import RocketMQSinkConfig
from pipelines.writeback.rocketmq_admin import (
    RATE_TOLERANCE, BrokerAdmin, BrokerRefused, Defaults, RateView, admin_client,
)
from pipelines.writeback.rocketmq_ledger import Ledger, ledger_path
from pipelines.writeback.rocketmq_restore import main

__all__ = ["RocketMQAdminSink", "BrokerRefused", "broker_resource", "main"]

log = logging.getLogger("rate_governor.sink.rocketmq")

#: How long after the publish deadline the sink still collects answers already on their way (s).
DEADLINE_GRACE_S = 0.25


def broker_resource(record: Mapping[str, Any]) -> str:
    """The ``RateLimitHandler`` key a control record governs: the topic, or ``%RETRY%<group>`` for a group."""
    resource = str(record["resource"])
    return rm.retry_topic(resource) if record["resource_type"] == "group" else resource


def _utc(now: dt.datetime | None) -> dt.datetime:
    now = now or dt.datetime.now(dt.timezone.utc)
    return now if now.tzinfo else now.replace(tzinfo=dt.timezone.utc)


def prior_rate(have: float | None, defaults: Defaults, resource: str) -> float | None:
    """What to record as a resource's rate before the governor: None for no limiter or the broker's default (it is
    restored to the default of the moment), else the rate (set by hand, e.g. in MQCloud)."""
    if have is None or abs(have - defaults.for_resource(resource)) <= RATE_TOLERANCE:
        return None
    return have


class RocketMQAdminSink:
    """Pushes the limits to the master brokers of a Sohu RocketMQ cluster (see the module docstring).

    Attributes:
        status: broker address (or ``"namesrv"``) → the error of the last publish there; empty when every master
            was brought in line.
        last_rejections: ``(brokerName, resource)`` → ``lastRateLimitTimestamp`` of that master's limiter from its
            latest view (``TokenBucketRateLimiter``): epoch milliseconds (UTC) of the last request the limiter
            rejected, -1 when it has rejected none since it was created (at first traffic or broker start). A value
            that moves between two views is evidence that the limiter rejected sends in between. Filled by every
            view of :meth:`publish` (all resources with a limiter on that master, not only the governor's).
        ledger: the :class:`pipelines.writeback.rocketmq_ledger.Ledger` of owned resources and their prior rates.

    Raises:
        ConfigError: ACL keys configured but unusable (:func:`control.acl.load_credentials`).
    """

    name = "rocketmq"

    def __init__(self, cfg: RocketMQSinkConfig, lake_root: str | os.PathLike[str] = ".",
                 client: RemotingClient | None = None) -> None:
        self.cfg = cfg
        self.client = client if client is not None else admin_client(cfg)
        self.admin = BrokerAdmin(cfg, self.client)
        self.ledger = Ledger(ledger_path(cfg.ledger_file, lake_root))
        self.status: dict[str, str] = {}
        self.last_rejections: dict[tuple[str, str], int] = {}
        self._pool = ThreadPoolExecutor(max_workers=cfg.max_parallel_brokers, thread_name_prefix="rocketmq-sink")
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()

    @property
    def owned(self) -> set[str]:
        """Every broker resource the governor owns on some master."""
        return self.ledger.resources()

    def desired(self, records: list[Mapping[str, Any]],
                now: dt.datetime | None = None) -> dict[str, Mapping[str, Any]]:
        """``{broker resource: record}`` of the enforce records not expired at ``now`` (UTC)."""
        at = _utc(now)
        out = {}
        for r in records:
            try:
                live = r.get("mode") == "enforce" and parse_expires_at(r["expires_at"]) > at
            except (KeyError, ValueError):
                live = False
            if live:
                out[broker_resource(r)] = r
        return out

    # --- the sink ---------------------------------------------------------------------------------------------
    def publish(self, previous: list[Mapping[str, Any]], current: list[Mapping[str, Any]],
                now: dt.datetime | None = None) -> int:
        """Bring every master's rates in line with ``current``; returns the number of updates the brokers
        acknowledged. Returns within ``publish_deadline_ms`` (+ :data:`DEADLINE_GRACE_S`) whatever the brokers do.

        ``previous`` (the set last delivered) is not needed: the ledger records every resource before it is first
        changed. Never raises for broker-side trouble: it is logged per broker, kept in :attr:`status` and retried
        by the next publish.
        """
        deadline = time.monotonic() + self.cfg.publish_deadline_ms / 1000.0
        desired = self.desired(current, now)
        try:
            masters = self.admin.masters(deadline)
        except rm.RemotingError as exc:
            log.warning("rocketmq sink: cannot find the brokers (%s); retrying next micro-batch", exc)
            self.status = {"namesrv": str(exc)}
            return 0
        if not masters:
            log.warning("rocketmq sink: name server lists no master for cluster %r", self.cfg.cluster)
        self.ledger.adopt_legacy(sorted(masters))
        self._inflight = {n: f for n, f in self._inflight.items() if not f.done()}
        status: dict[str, str] = {}
        futures: dict[Future, tuple[str, str]] = {}
        for name, addr in masters.items():
            running = self._inflight.get(name)
            if running is not None and not running.done():
                status[addr] = "the previous publish to this master is still waiting for it"
                continue
            future = self._pool.submit(self._sync_master, name, addr, desired, deadline)
            futures[future] = (name, addr)
            self._inflight[name] = future
        done, _ = wait(futures, timeout=max(0.0, deadline - time.monotonic()) + DEADLINE_GRACE_S)
        sent = 0
        for future, (name, addr) in futures.items():
            if future not in done:
                future.cancel()
                status[addr] = f"no answer within the publish deadline ({self.cfg.publish_deadline_ms} ms)"
            else:
                try:
                    sent += future.result()
                    continue
                except (rm.RemotingError, ValueError) as exc:
                    status[addr] = str(exc)
                except Exception as exc:  # noqa: BLE001 - one master's surprise must not cost the others' results
                    status[addr] = f"{type(exc).__name__}: {exc}"
            log.warning("rocketmq sink: broker %s (%s): %s; retrying next micro-batch", name, addr, status[addr])
        self.status = status
        return sent

    def _note_rejections(self, broker: str, view: RateView) -> None:
        with self._lock:
            for key in [k for k in self.last_rejections if k[0] == broker]:
                del self.last_rejections[key]
            self.last_rejections.update({(broker, r): ts for r, ts in view.last_rejections.items()})

    def read_master(self, broker: str, addr: str, deadline: float) -> tuple[RateView, Defaults]:
        """One master's rates and defaults (:meth:`BrokerAdmin.read_master`); fills :attr:`last_rejections`."""
        view, defaults = self.admin.read_master(broker, addr, deadline)
        self._note_rejections(broker, view)
        return view, defaults

    def _sync_master(self, broker: str, addr: str, desired: dict[str, Mapping[str, Any]], deadline: float) -> int:
        """Push one master's off-target rates and read them back; returns the updates it acknowledged."""
        view, defaults = self.read_master(broker, addr, deadline)
        owned = self.ledger.owned(broker)
        plan: dict[str, float] = {}
        taken: dict[str, float | None] = {}
        release: set[str] = set()
        for resource, record in desired.items():
            have = view.rates.get(resource)
            prior = owned[resource] if resource in owned else prior_rate(have, defaults, resource)
            ceiling = prior if prior is not None else defaults.for_resource(resource)
            target = min(broker_limit(record, broker)[0], ceiling)
            if have is None or abs(have - target) > RATE_TOLERANCE:
                if resource not in owned:
                    taken[resource] = prior
                plan[resource] = target
        self.ledger.take(broker, taken)  # written before the first change
        for resource, prior in owned.items():
            if resource in desired:
                continue
            restore_to = prior if prior is not None else defaults.for_resource(resource)
            have = view.rates.get(resource)
            if have is None or have >= restore_to - RATE_TOLERANCE:
                release.add(resource)  # no limiter (created at the default on first traffic), or not below
            else:
                plan[resource] = restore_to
        for resource, target in plan.items():
            self.admin.update(broker, addr, resource, target, deadline)
            log.info("rocketmq sink: %s (%s) %s %s -> %s qps", broker, addr, resource, view.rates.get(resource),
                     target)
        after = view
        if plan:
            after = self.admin.view(broker, addr, deadline)
            self._note_rejections(broker, after)
        for resource, target in plan.items():
            have = after.rates.get(resource)
            if resource not in desired:
                if have is None or have >= target - RATE_TOLERANCE:
                    release.add(resource)
                else:
                    log.warning("rocketmq sink: %s reads %s at %s qps after restoring %s", broker, resource, have,
                                target)
            elif have is None:
                log.info("rocketmq sink: %s has no limiter for %s yet (no traffic since it started); pushing again "
                         "next micro-batch", broker, resource)
            elif abs(have - target) > RATE_TOLERANCE:
                log.warning("rocketmq sink: %s reads %s at %s qps after the push, wanted %s", broker, resource,
                            have, target)
        self.ledger.release(broker, release)
        return len(plan)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


if __name__ == "__main__":
    sys.exit(main())
