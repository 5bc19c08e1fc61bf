"""Module paths across the layout change of issue 43, for benchmarks that run this tree's script against a baseline
commit's tree (``--baseline COMMIT``: :mod:`ab`, ``same_decisions.py``, ``same_preliminary.py``,
``micro_batch_costs.py``).

Before that change the modules lived in ``pipelines/io``, ``pipelines/transforms``, ``pipelines/quality``,
``pipelines/flows`` and at the top of ``pipelines/``. Importing this module installs an import hook that, only when
the tree on ``sys.path`` has the old layout (no ``pipelines/dataplane``), loads a module asked for by its new name
from its old one: a benchmark names every module once, by today's path. In today's tree it does nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: New module path -> the same module's path before the layout change (longest first when matching).
MOVED = {
    "pipelines.dataplane.lake": "pipelines.io.lake",
    "pipelines.dataplane.sources": "pipelines.io.sources",
    "pipelines.dataplane.events": "pipelines.io.events",
    "pipelines.dataplane.known_brokers": "pipelines.io.known_brokers",
    "pipelines.tables": "pipelines.io.tables",
    "pipelines.writeback.publish": "pipelines.io.publish",
    "pipelines.writeback.records": "pipelines.io.records",
    "pipelines.writeback.sinks": "pipelines.io.sinks",
    "pipelines.writeback.kafka_sink": "pipelines.io.kafka_sink",
    "pipelines.writeback.rocketmq_admin": "pipelines.io.rocketmq_admin",
    "pipelines.writeback.rocketmq_ledger": "pipelines.io.rocketmq_ledger",
    "pipelines.writeback.rocketmq_restore": "pipelines.io.rocketmq_restore",
    "pipelines.writeback.rocketmq_sink": "pipelines.io.rocketmq_sink",
    "pipelines.job.lease": "pipelines.io.lease",
    "pipelines.job.checkpoint": "pipelines.io.checkpoint",
    "pipelines.job.queries": "pipelines.governor",
    "pipelines.job.run": "pipelines.governor",
    "pipelines.dataplane.transforms": "pipelines.transforms",
    "pipelines.dataplane.quality": "pipelines.quality",
    "pipelines.dataplane.session": "pipelines.session",
    "pipelines.dataplane.spark_compat": "pipelines.spark_compat",
    "pipelines.job.flows": "pipelines.flows",
    "pipelines.ops.query": "pipelines.query",
    "pipelines.ops.demo": "pipelines.demo",
    "pipelines.sim.settings": "pipelines.backtest.settings",
    "pipelines.sim.figures": "pipelines.backtest.figures",
    "pipelines.sim.report": "pipelines.backtest.report",
    "pipelines.backtest.results": "pipelines.backtest.figures",
}
#: Folders that exist only in the new layout: imported as empty namespaces in an old tree.
NEW_FOLDERS = ("pipelines.dataplane", "pipelines.writeback", "pipelines.job")


def _old_layout() -> bool:
    spec = importlib.util.find_spec("pipelines")
    if spec is None or not spec.submodule_search_locations:
        return False
    from pathlib import Path

    return not any((Path(p) / "dataplane").is_dir() for p in spec.submodule_search_locations)


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str | None) -> None:
        self.old = old

    def create_module(self, spec):
        if self.old is None:  # a new-only folder: an empty package
            return None
        return importlib.import_module(self.old)

    def exec_module(self, module) -> None:
        if self.old is None:
            module.__path__ = []


class _OldLayoutFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if not name.startswith("pipelines."):
            return None
        for new in sorted(MOVED, key=len, reverse=True):
            if name == new or name.startswith(new + "."):
                old = MOVED[new] + name[len(new):]
                return importlib.util.spec_from_loader(name, _Alias(old), is_package=True)
        if name in NEW_FOLDERS:
            return importlib.util.spec_from_loader(name, _Alias(None), is_package=True)
        return None


if _old_layout() and not any(isinstance(f, _OldLayoutFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _OldLayoutFinder())
