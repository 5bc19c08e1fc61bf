"""The layout rules of docs/architecture.md §3 that a change could break silently (no Spark needed)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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


PLANES = ("dataplane", "decide", "writeback", "job", "ops", "sim", "backtest")


def _module_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _offending(folder: Path, allowed) -> dict[str, list[str]]:
    out = {}
    for p in _module_files(folder):
        bad = sorted(n for n in _imports(p) if not allowed(n))
        if bad:
            out[str(p.relative_to(ROOT))] = bad
    return out


def _top_level(name: str) -> bool:
    """A shared top-level module of pipelines/ (pipelines/<name>.py), not a plane."""
    parts = name.split(".")
    return parts[0] == "pipelines" and len(parts) == 2 and (ROOT / "pipelines" / f"{parts[1]}.py").is_file()


def test_every_plane_folder_says_what_it_owns_and_may_import():
    for plane in PLANES:
        doc = ast.get_docstring(ast.parse((ROOT / "pipelines" / plane / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "May import" in doc, plane
    for init in sorted((ROOT / "pipelines").rglob("__init__.py")):
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), str(init.relative_to(ROOT))


def test_the_decision_plane_imports_no_spark_and_no_other_plane():
    # Spark reduces, the driver decides: the rules, the fold and the reconciliation over Arrow only; the one
    # exception is the gold/limits expectations, defined once with the quality suites
    exceptions = {"pipelines.dataplane.quality.suites", "pipelines.dataplane.quality.data_docs"}

    def allowed(name: str) -> bool:
        root = name.split(".")[0]
        if root in ("pyspark", "py4j", "control", "udfs"):
            return False
        if root != "pipelines":
            return True
        return name.startswith("pipelines.decide") or _top_level(name) or name in exceptions or name == "pipelines"
    assert _offending(ROOT / "pipelines" / "decide", allowed) == {}


def test_the_data_plane_never_decides():
    assert _offending(ROOT / "pipelines" / "dataplane", lambda n: not n.startswith("pipelines.decide")) == {}


def test_nothing_imports_the_backtest():
    offending = {}
    for package in PRODUCT:
        for p in _module_files(ROOT / package):
            if (ROOT / "pipelines" / "backtest") in p.parents:
                continue
            bad = sorted(n for n in _imports(p) if n.startswith("pipelines.backtest"))
            if bad:
                offending[str(p.relative_to(ROOT))] = bad
    assert offending == {}


@pytest.mark.parametrize("package", ["pipelines.decide", "pipelines.sim"])
def test_the_decision_plane_and_the_simulator_load_without_spark(package):
    # transitively: importing every module of the package loads no pyspark (the sweep runs without a JVM)
    folder = ROOT / package.replace(".", "/")
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for p in _module_files(folder) if p.name != "__main__.py"]
    code = ("import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_decision_plane_has_no_import_cycle():
    # one owner per concern: a module never needs one that needs it back (fold.py and limit_policy.py did, through
    # a TYPE_CHECKING import, before issue 50); every import counts, those for type checking too
    folder = ROOT / "pipelines" / "decide"
    graph = {f"pipelines.decide.{p.stem}": {n for n in _imports(p) if n.startswith("pipelines.decide.")}
             for p in _module_files(folder) if p.name != "__init__.py"}
    done: set[str] = set()

    def cycle(module: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        if module in path:
            return path[path.index(module):] + (module,)
        if module in done:
            return None
        for name in sorted(graph.get(module, ())):
            found = cycle(name, path + (module,))
            if found:
                return found
        done.add(module)
        return None

    assert [c for m in sorted(graph) if (c := cycle(m, ()))] == []
