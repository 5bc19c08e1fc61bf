"""RocketMQ admin write-back: the current limits pushed into the master brokers' rate limiter (article 001's
limiter in Sohu's RocketMQ fork, changed at run time the way MQCloud changes it).

Sources: sohutv/rocketmq ``RateLimitHandler`` (one ``TokenBucketRateLimiter`` per topic and per ``%RETRY%<group>``,
created on first traffic at ``sendMsgRateLimitQps`` 2000 / ``sendRetryMsgRateLimitQps`` 100; ``updateLimitQps``
changes an existing limiter only), ``RateLimitConfigManager`` (persists every non-default rate, so a set rate
survives a broker restart), ``AdminBrokerProcessor.updateSendMessageRateLimit`` / ``viewSendMessageRateLimit``,
``UpdateSendMsgRateLimitRequestHeader`` (ext fields ``topic``, ``topicLimitQps``), ``BrokerRateLimitData`` /
``TopicRateLimit`` (the view body); sohutv/mqcloud ``SohuMQAdmin`` (codes 9003/9002, 330/329 on older brokers).

Mapping of a control record (docs/contracts.md §3) to a broker resource: ``topic`` → the topic; ``group`` → the
group's retry topic ``%RETRY%<group>`` (the policy limits a group's retry traffic, ``CONSUMER_SEND_MSG_BACK``).
Only ``enforce`` records that have not expired are pushed; ``advisory`` ones never are.

Each :meth:`RocketMQAdminSink.publish` (once per gold micro-batch): find the masters (broker id 0) from the name
server (``GET_BROKER_CLUSTER_INFO``); on each master read the rates (VIEW), push every resource whose rate differs
from its target (UPDATE) and read them back. The target of a resource with a live limit is that limit; of a
resource this sink set earlier and that is no longer limited (lifted, expired, turned advisory) the broker's
default. Those resources are kept in a ledger file until every master shows them at the default again. A broker
that times out, refuses the connection or answers an error code is logged and retried at the next call; nothing is
raised to the streaming query.

The brokers have no TTL of their own: the governor owns fail-open. If it stops, its last rates stay in force (and
survive broker restarts) until ``python -m pipelines.io.rocketmq_sink restore --conf <toml>`` sets them back.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from control import remoting as rm
from control.record import parse_expires_at
from pipelines.config import ConfigError, RocketMQSinkConfig, load_config

log = logging.getLogger("rate_governor.sink.rocketmq")

LEDGER_FILE = "control/rocketmq_owned.json"
#: Rates closer than this (qps) are equal: the broker stores a double and echoes it back.
RATE_TOLERANCE = 1e-6


class BrokerRefused(rm.RemotingError):
    """A broker or name server answered with a response code other than SUCCESS."""


def broker_resource(record: Mapping[str, Any]) -> str:
    """The ``RateLimitHandler`` key a control record governs: the topic, or ``%RETRY%<group>`` for a group."""
    resource = str(record["resource"])
    return rm.retry_topic(resource) if record["resource_type"] == "group" else resource


def _utc(now: dt.datetime | None) -> dt.datetime:
    now = now or dt.datetime.now(dt.timezone.utc)
    return now if now.tzinfo else now.replace(tzinfo=dt.timezone.utc)


class RocketMQAdminSink:
    """Pushes the limits to the master brokers of a Sohu RocketMQ cluster (see the module docstring).

    ``status`` maps a broker address (or ``"namesrv"``) to the last error seen there; ``owned`` is the set of broker
    resources this sink has set and not yet seen back at their default on every master.
    """

    name = "rocketmq"

    def __init__(self, cfg: RocketMQSinkConfig, lake_root: str | os.PathLike[str] = ".",
                 client: rm.RemotingClient | None = None) -> None:
        self.cfg = cfg
        self.update_code, self.view_code = rm.RATE_LIMIT_CODES[cfg.request_codes]
        self.client = client or rm.RemotingClient(timeout_s=cfg.timeout_ms / 1000.0)
        self.ledger = Path(cfg.ledger_file) if cfg.ledger_file else Path(lake_root) / LEDGER_FILE
        self.owned: set[str] = read_ledger(self.ledger)
        self.status: dict[str, str] = {}

    # --- broker facts -----------------------------------------------------------------------------------------
    def default_for(self, resource: str) -> float:
        """The broker's default rate for a resource: retry topics ``sendRetryMsgRateLimitQps``, else
        ``sendMsgRateLimitQps``."""
        retry = resource.startswith(rm.RETRY_GROUP_TOPIC_PREFIX)
        return self.cfg.default_retry_qps if retry else self.cfg.default_topic_qps

    def desired(self, records: list[Mapping[str, Any]], now: dt.datetime | None = None) -> dict[str, float]:
        """``{broker resource: limit_qps}`` of the enforce records not expired at ``now`` (UTC)."""
        at = _utc(now)
        out = {}
        for r in records:
            try:
                live = r.get("mode") == "enforce" and parse_expires_at(r["expires_at"]) > at
            except (KeyError, ValueError):
                live = False
            if live:
                out[broker_resource(r)] = float(r["limit_qps"])
        return out

    def masters(self) -> dict[str, str]:
        """``{brokerName: address}`` of the cluster's masters, from the first name server that answers.

        Raises:
            rm.RemotingError: no name server answered with a cluster info.
        """
        errors = []
        for addr in self.cfg.namesrv_addr:
            try:
                reply = self.client.invoke(addr, rm.GET_BROKER_CLUSTER_INFO)
                if reply.code != rm.SUCCESS:
                    raise BrokerRefused(f"code {reply.code}: {reply.remark}")
                return rm.cluster_masters(rm.fastjson_loads(reply.body), self.cfg.cluster)
            except (rm.RemotingError, ValueError) as exc:
                errors.append(f"{addr}: {exc}")
        raise rm.RemotingError("no name server answered: " + "; ".join(errors or ["none configured"]))

    def view(self, addr: str) -> dict[str, float]:
        """The broker's rate map ``{resource: limitQps}`` (VIEW_SEND_MESSAGE_RATE_LIMIT, ``BrokerRateLimitData``)."""
        reply = self.client.invoke(addr, self.view_code)
        if reply.code != rm.SUCCESS:
            raise BrokerRefused(f"view rates: code {reply.code}: {reply.remark}")
        try:
            data = rm.fastjson_loads(reply.body) if reply.body else {}
            return {str(t["topic"]): float(t["limitQps"]) for t in data.get("topicRateLimitList") or []}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise rm.RemotingProtocolError(f"view rates: unreadable BrokerRateLimitData: {exc}") from None

    def update(self, addr: str, resource: str, qps: float) -> None:
        """Set one rate (UPDATE_SEND_MESSAGE_RATE_LIMIT, ext fields ``topic`` and ``topicLimitQps``)."""
        if not (math.isfinite(qps) and qps > 0):
            raise ValueError(f"rate for {resource} must be a finite number > 0, got {qps!r}")
        reply = self.client.invoke(addr, self.update_code, {"topic": resource, "topicLimitQps": repr(float(qps))})
        if reply.code != rm.SUCCESS:
            raise BrokerRefused(f"update {resource}: code {reply.code}: {reply.remark}")

    # --- the sink ---------------------------------------------------------------------------------------------
    def publish(self, previous: list[Mapping[str, Any]], current: list[Mapping[str, Any]],
                now: dt.datetime | None = None) -> int:
        """Bring every master's rates in line with ``current``; returns the number of updates the brokers acknowledged.

        ``previous`` (the last published set) names resources set by an earlier run, so a restart still restores
        them. Never raises for broker-side trouble: it is logged per broker, kept in :attr:`status` and retried.
        """
        desired = self.desired(current, now)
        self._own(set(desired) | set(self.desired(previous, now)))
        targets = {r: desired.get(r, self.default_for(r)) for r in sorted(self.owned)}
        try:
            masters = self.masters()
        except rm.RemotingError as exc:
            log.warning("rocketmq sink: cannot find the brokers (%s); retrying next micro-batch", exc)
            self.status["namesrv"] = str(exc)
            return 0
        self.status.pop("namesrv", None)
        if not masters:
            log.warning("rocketmq sink: name server lists no master for cluster %r", self.cfg.cluster)
        sent, unconfirmed = 0, set()
        for name, addr in masters.items():
            try:
                accepted, off_target = self._sync_broker(addr, targets, desired)
                sent += accepted
                unconfirmed |= off_target
                self.status.pop(addr, None)
            except (rm.RemotingError, ValueError) as exc:
                log.warning("rocketmq sink: broker %s (%s): %s; retrying next micro-batch", name, addr, exc)
                self.status[addr] = str(exc)
                unconfirmed |= set(targets)
        self._own(self.owned - {r for r in targets if r not in desired and r not in unconfirmed}, replace=True)
        return sent

    def _sync_broker(self, addr: str, targets: dict[str, float], desired: dict[str, float]) -> tuple[int, set[str]]:
        """Push the off-target rates of one master, read them back; (accepted pushes, resources still off target)."""
        have = self.view(addr)
        accepted = 0
        for resource, want in targets.items():
            rate = have.get(resource)
            if rate is None and resource not in desired:
                continue  # no limiter: it will be created at the default on first traffic
            if rate is None or abs(rate - want) > RATE_TOLERANCE:
                self.update(addr, resource, want)
                accepted += 1
                log.info("rocketmq sink: %s %s %s -> %s qps", addr, resource, rate, want)
        after = self.view(addr) if accepted else have
        off_target = set()
        for resource, want in targets.items():
            rate = after.get(resource)
            if rate is None:
                if resource in desired:
                    off_target.add(resource)
                    log.info("rocketmq sink: %s has no limiter for %s yet (no traffic since it started); "
                             "pushing again next micro-batch", addr, resource)
            elif abs(rate - want) > RATE_TOLERANCE:
                off_target.add(resource)
                log.warning("rocketmq sink: %s reads %s at %s qps after the push, wanted %s",
                            addr, resource, rate, want)
        return accepted, off_target

    def _own(self, resources: set[str], replace: bool = False) -> None:
        owned = set(resources) if replace else self.owned | resources
        if owned != self.owned:
            self.owned = owned
            try:
                write_ledger(self.ledger, owned)
            except OSError as exc:
                log.warning("rocketmq sink: cannot write ledger %s: %s", self.ledger, exc)

    def close(self) -> None:
        self.client.close()


# --- ledger ---------------------------------------------------------------------------------------------------------
def read_ledger(path: Path) -> set[str]:
    """The resources recorded in a ledger file (empty when it does not exist or cannot be read)."""
    try:
        return set(json.loads(path.read_text(encoding="utf-8"))["resources"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def write_ledger(path: Path, resources: set[str]) -> None:
    """Replace the ledger atomically: ``{"resources": [...]}`` sorted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"resources": sorted(resources)}, out)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- operator command -----------------------------------------------------------------------------------------------
def restore(sink: RocketMQAdminSink, resources: set[str] | None) -> tuple[int, list[str]]:
    """Set ``resources`` (None: every resource whose rate is not its default) back to the broker default on every
    master; returns (rates restored, problems). The ledger is emptied when nothing is left off default."""
    problems: list[str] = []
    restored = 0
    try:
        masters = sink.masters()
    except rm.RemotingError as exc:
        return 0, [str(exc)]
    for name, addr in masters.items():
        try:
            have = sink.view(addr)
            names = set(have) if resources is None else resources
            off = {r for r in names if r in have and abs(have[r] - sink.default_for(r)) > RATE_TOLERANCE}
            for r in sorted(off):
                sink.update(addr, r, sink.default_for(r))
                restored += 1
            after = sink.view(addr) if off else have
            problems += [f"{name} ({addr}): {r} still at {after[r]} qps" for r in sorted(off)
                         if abs(after.get(r, sink.default_for(r)) - sink.default_for(r)) > RATE_TOLERANCE]
        except (rm.RemotingError, ValueError) as exc:
            problems.append(f"{name} ({addr}): {exc}")
    if not problems:
        sink._own(set(), replace=True)
    return restored, problems


def main(argv: list[str] | None = None) -> int:
    from control.record import read_limits_file
    from pipelines.cli import OneLineParser, fail

    parser = OneLineParser(prog="python -m pipelines.io.rocketmq_sink",
                           description="Operator commands of the RocketMQ admin sink.")
    parser.add_argument("command", choices=["restore", "show"],
                        help="restore: set every governor-set rate back to the broker default; show: list rates "
                             "that differ from the default on every master")
    parser.add_argument("--conf", required=True, help="config file with a [sink.rocketmq] section")
    parser.add_argument("--lake", help="lake directory (overrides lake.path; holds the ledger and limits.json)")
    parser.add_argument("--all", action="store_true",
                        help="restore: every non-default rate, also those the governor did not set")
    args = parser.parse_args(argv)
    prog = parser.prog
    try:
        cfg = load_config(args.conf).with_paths(lake=args.lake)
    except ConfigError as exc:
        return fail(prog, exc)
    if not cfg.sink.rocketmq.namesrv_addr:
        return fail(prog, f"{args.conf}: [sink.rocketmq] namesrv_addr is empty")
    sink = RocketMQAdminSink(cfg.sink.rocketmq, cfg.lake.path)
    try:
        if args.command == "show":
            masters = sink.masters()
            for name, addr in masters.items():
                for r, qps in sorted(sink.view(addr).items()):
                    if abs(qps - sink.default_for(r)) > RATE_TOLERANCE:
                        print(f"{name}\t{addr}\t{r}\t{qps}")
            return 0
        resources = None
        if not args.all:
            try:
                published = read_limits_file(Path(cfg.lake.path) / "control/limits.json")
            except (OSError, ValueError):
                published = []
            resources = sink.owned | {broker_resource(r) for r in published}
        restored, problems = restore(sink, resources)
    except rm.RemotingError as exc:
        return fail(prog, exc)
    finally:
        sink.close()
    if problems:
        print(f"{prog}: restored {restored} rates; not restored: {'; '.join(problems)}", file=sys.stderr)
        return 1
    print(f"restored {restored} rates to the broker defaults")
    return 0


if __name__ == "__main__":
    sys.exit(main())
