"""The layout rules of docs/architecture.md §3 that a change could break silently (no Spark needed)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("pipelines", "control", "udfs")
MAX_LINES = 400


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_control_imports_nothing_of_pipelines():
    # control/ runs beside the brokers without the governor's package (and without Spark)
    offending = {str(p.relative_to(ROOT)): sorted(n for n in _imports(p) if n.split(".")[0] in ("pipelines", "pyspark"))
                 for p in sorted((ROOT / "control").glob("*.py"))}
    assert not {k: v for k, v in offending.items() if v}


def test_every_product_module_is_at_most_400_lines():
    long = {str(p.relative_to(ROOT)): n for package in PRODUCT for p in sorted((ROOT / package).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long
