"""Operator commands of the RocketMQ admin sink: ``show`` the rates that are not the broker's default, ``restore``
what the governor set.

    python -m pipelines.writeback.rocketmq_sink show    --conf C [--lake DIR]
    python -m pipelines.writeback.rocketmq_sink restore --conf C [--lake DIR] [--resource R ...] [--all [--yes]]

Each master's defaults are read from the broker itself (``GET_BROKER_CONFIG``, or the older line's view body;
:mod:`pipelines.writeback.rocketmq_admin`). The rate to restore is the one the ledger recorded from before the governor
took the resource over on that master (a rate set by hand in MQCloud stays), else the broker's default.

* ``restore`` sets back only what the ledger owns; ``--resource R`` (repeatable: a topic or ``%RETRY%<group>``)
  names resources instead, owned or not.
* ``restore --all`` considers every limiter of every master (rates set by hand included); it prints what it
  would change and changes nothing unless ``--yes`` is given too.
* Restore never lowers a rate: a rate at or above its restore rate is left as it is (and released from the
  ledger). Every change is printed before it is sent, then read back; a master left unrestored makes the command
  print one line and exit 1.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from control import remoting as rm
from pipelines.cli import OneLineParser, fail
from pipelines.config import ConfigError, RocketMQSinkConfig, load_config
from pipelines.writeback.rocketmq_admin import RATE_TOLERANCE, BrokerAdmin, Defaults, RateView, admin_client
from pipelines.writeback.rocketmq_ledger import Ledger, ledger_path

#: Operator commands have no publish deadline: each request still has ``timeout_ms``.
NO_DEADLINE_S = 3600.0


@dataclass(frozen=True)
class Cluster:
    """What the operator commands work through: the admin requests to one cluster's masters and the ledger of the
    rates the governor owns there (the file the sink keeps, :mod:`pipelines.writeback.rocketmq_ledger`)."""

    admin: BrokerAdmin
    ledger: Ledger

    @classmethod
    def connect(cls, cfg: RocketMQSinkConfig, lake_root: str) -> Cluster:
        """The cluster of ``cfg``, its ledger under ``lake_root`` unless ``cfg.ledger_file`` names one.

        Raises:
            ConfigError: ACL keys configured but unusable (:func:`control.acl.load_credentials`).
        """
        return cls(BrokerAdmin(cfg, admin_client(cfg)), Ledger(ledger_path(cfg.ledger_file, lake_root)))

    def masters(self) -> dict[str, str]:
        """``{brokerName: address}`` of the cluster's masters (raises ``rm.RemotingError`` when no name server
        answers)."""
        return self.admin.masters(time.monotonic() + NO_DEADLINE_S)

    def read_master(self, broker: str, addr: str) -> tuple[RateView, Defaults]:
        """One master's rates and defaults (:meth:`BrokerAdmin.read_master`)."""
        return self.admin.read_master(broker, addr, time.monotonic() + NO_DEADLINE_S)

    def close(self) -> None:
        self.admin.client.close()


@dataclass(frozen=True)
class Change:
    """One rate ``restore`` would raise: on master ``broker`` (``addr``), ``resource`` from ``have`` to ``to``
    qps, because ``why``."""

    broker: str
    addr: str
    resource: str
    have: float
    to: float
    why: str

    def line(self) -> str:
        return f"{self.broker}\t{self.addr}\t{self.resource}\t{self.have} -> {self.to} qps ({self.why})"


def plan(cluster: Cluster, scope: str | set[str]) -> tuple[list[Change], list[str]]:
    """What ``restore`` would change: (changes, problems per master). ``scope`` is ``"owned"`` (the ledger's),
    ``"all"`` (every limiter) or a set of resources. Resources already at or above their restore rate, or
    without a limiter, are released from the ledger here."""
    masters = cluster.masters()
    cluster.ledger.adopt_legacy(sorted(masters))
    changes, problems = [], []
    for broker, addr in masters.items():
        try:
            view, defaults = cluster.read_master(broker, addr)
        except (rm.RemotingError, ValueError) as exc:
            problems.append(f"{broker} ({addr}): {exc}")
            continue
        owned = cluster.ledger.owned(broker)
        names = set(owned) if scope == "owned" else set(view.rates) if scope == "all" else set(scope)
        done = set()
        for resource in sorted(names):
            prior = owned.get(resource)
            to = prior if prior is not None else defaults.for_resource(resource)
            have = view.rates.get(resource)
            if have is None or have >= to - RATE_TOLERANCE:
                done.add(resource)
                continue
            why = (f"its rate before the governor" if prior is not None
                   else f"broker default, {defaults.source}")
            changes.append(Change(broker, addr, resource, have, to, why))
        cluster.ledger.release(broker, done)
    return changes, problems


def apply(cluster: Cluster, changes: list[Change]) -> tuple[int, list[str]]:
    """Send the changes, read them back; (rates restored, problems). Restored resources leave the ledger."""
    restored, problems = 0, []
    by_master: dict[tuple[str, str], list[Change]] = {}
    for change in changes:
        by_master.setdefault((change.broker, change.addr), []).append(change)
    for (broker, addr), todo in by_master.items():
        deadline = time.monotonic() + NO_DEADLINE_S
        try:
            for change in todo:
                cluster.admin.update(broker, addr, change.resource, change.to, deadline)
            after = cluster.admin.view(broker, addr, deadline)
        except (rm.RemotingError, ValueError) as exc:
            problems.append(f"{broker} ({addr}): {exc}")
            continue
        ok = {c.resource for c in todo if after.rates.get(c.resource, c.to) >= c.to - RATE_TOLERANCE}
        problems += [f"{broker} ({addr}): {c.resource} still at {after.rates[c.resource]} qps"
                     for c in todo if c.resource not in ok]
        restored += len(ok)
        cluster.ledger.release(broker, ok)
    return restored, problems


def show(cluster: Cluster) -> list[str]:
    """One line per limiter that differs from its broker's default or that the governor owns: broker, address,
    resource, rate, the default (and where it was read), who set it."""
    lines = []
    for broker, addr in cluster.masters().items():
        view, defaults = cluster.read_master(broker, addr)
        owned = cluster.ledger.owned(broker)
        for resource, qps in sorted(view.rates.items()):
            default = defaults.for_resource(resource)
            if abs(qps - default) <= RATE_TOLERANCE and resource not in owned:
                continue
            if resource in owned:
                before = owned[resource]
                who = f"governor (before: {'default' if before is None else f'{before} qps'})"
            else:
                who = "not the governor"
            lines.append(f"{broker}\t{addr}\t{resource}\t{qps}\tdefault {default} ({defaults.source})\t{who}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.writeback.rocketmq_sink {show,restore}`` (module docstring); the exit code."""
    parser = OneLineParser(prog="python -m pipelines.writeback.rocketmq_sink",
                           description="Operator commands of the RocketMQ admin sink.")
    parser.add_argument("command", choices=["restore", "show"],
                        help="restore: set the rates the governor set back to what they were (never lowers a "
                             "rate); show: list the rates that differ from each master's own default")
    parser.add_argument("--conf", required=True, help="config file with a [sink.rocketmq] section")
    parser.add_argument("--lake", help="lake directory (overrides lake.path; holds the ledger)")
    parser.add_argument("--resource", action="append", default=[], metavar="R",
                        help="restore: this resource (a topic or %%RETRY%%<group>) instead of the ledger's; "
                             "repeatable")
    parser.add_argument("--all", action="store_true",
                        help="restore: every limiter below its restore rate, also rates set by hand; prints the "
                             "plan and needs --yes to apply it")
    parser.add_argument("--yes", action="store_true", help="restore --all: apply the printed plan")
    args = parser.parse_args(argv)
    prog = parser.prog
    if args.all and args.resource:
        return fail(prog, "--all and --resource exclude each other")
    try:
        cfg = load_config(args.conf).with_paths(lake=args.lake)
        if not cfg.sink.rocketmq.namesrv_addr:
            raise ConfigError(f"{args.conf}: [sink.rocketmq] namesrv_addr is empty")
        cluster = Cluster.connect(cfg.sink.rocketmq, cfg.lake.path)
    except ConfigError as exc:
        return fail(prog, exc)
    try:
        if args.command == "show":
            for line in show(cluster):
                print(line)
            return 0
        scope = "all" if args.all else set(args.resource) if args.resource else "owned"
        changes, problems = plan(cluster, scope)
        for change in changes:
            print(("would set " if args.all and not args.yes else "setting ") + change.line())
        if args.all and not args.yes:
            print(f"dry run: {len(changes)} rates would be raised; nothing changed (add --yes to apply)")
            restored = 0
        else:
            restored, failed = apply(cluster, changes)
            problems += failed
    except rm.RemotingError as exc:
        return fail(prog, exc)
    finally:
        cluster.close()
    if problems:
        print(f"{prog}: restored {restored} rates; not restored: {'; '.join(problems)}", file=sys.stderr)
        return 1
    if not (args.all and not args.yes):
        print(f"restored {restored} rates")
    return 0
