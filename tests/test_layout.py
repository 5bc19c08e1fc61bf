"""The layout rules of docs/architecture.md §3 that a change could break silently (no Spark needed)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("pipelines", "control", "udfs")


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


#: The decision plane's layers, lowest first (pipelines/decide/__init__.py): a module imports only modules of its own
#: layer or of a lower one, so a newcomer reads the plane from the bottom up.
DECIDE_LAYERS = (
    ("pipelines.decide.words", "pipelines.decide.arrow", "pipelines.decide.text"),
    ("pipelines.decide.records",),
    ("pipelines.decide.rules",),
    ("pipelines.decide.limits",),
    ("pipelines.decide.catalogue",),
    ("pipelines.decide.paths",),
)


def _layer(module: str) -> int | None:
    return next((n for n, layer in enumerate(DECIDE_LAYERS)
                 if any(module == name or module.startswith(name + ".") for name in layer)), None)


def test_the_decision_plane_imports_only_downwards():
    files = _modules(ROOT / "pipelines" / "decide")
    upward = {}
    for module, path in files.items():
        own = _layer(module)
        if own is None:
            assert module == "pipelines.decide", module  # every module of the plane is in a layer
            continue
        above = sorted(name for name in imported_modules(path, module, set(files))
                       if (_layer(name) or 0) > own)
        if above:
            upward[module] = above
    assert upward == {}


# --- every package: no import cycle, no long function ---------------------------------------------------------------

#: A function longer than this many lines of code (see :func:`lines_of_code`) holds more than one step.
MAX_FUNCTION_LINES = 60


def _modules(package: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module under ``package``, subpackages included."""
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in _module_files(package)}


def imported_modules(path: Path, module: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that the module ``module`` (file ``path``) imports anywhere: at the top, inside
    functions, under ``TYPE_CHECKING``. ``from a.b import c`` imports ``a.b.c`` when that is a module, else ``a.b``;
    relative imports are resolved against the module's package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            base = ".".join(part for part in (base, node.module or "") if part)
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    return found & known


def import_cycles(package: Path) -> list[tuple[str, ...]]:
    """One import cycle per group of modules under ``package`` that import each other (a strongly connected component
    of the import graph of :func:`imported_modules`), as the modules around it, the first repeated last; [] when
    none."""
    files = _modules(package)
    graph = {m: sorted(imported_modules(p, m, set(files))) for m, p in files.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        order[module] = low[module] = len(order)
        stack.append(module)
        for name in graph[module]:
            if name not in order:
                visit(name)
                low[module] = min(low[module], low[name])
            elif name in stack:
                low[module] = min(low[module], order[name])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1 or module in graph[module]:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return [_cycle_through(group, graph) for group in sorted(groups)]


def _cycle_through(group: list[str], graph: dict[str, list[str]]) -> tuple[str, ...]:
    """The shortest cycle from the first module of ``group`` back to it, within the group (breadth first)."""
    start = group[0]
    paths = {start: (start,)}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for name in graph[module]:
                if name == start:
                    return paths[module] + (start,)
                if name in group and name not in paths:
                    paths[name] = paths[module] + (name,)
                    following.append(name)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def lines_of_code(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """The lines of a function from its ``def`` to its last line, nested functions included, without blank lines,
    comment lines and docstrings (its own and those of what it nests)."""
    docstrings = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for n in range(node.lineno, node.end_lineno + 1)
               if n not in docstrings and lines[n - 1].strip() and not lines[n - 1].lstrip().startswith("#"))


def long_functions(package: Path, most: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{"<file>:<line> <function>": lines of code}`` of every function, method and nested function under
    ``package`` (:func:`_modules`) longer than ``most`` lines of code (:func:`lines_of_code`)."""
    long = {}
    for path in _modules(package).values():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := lines_of_code(node, lines)) > most:
                long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    return long


@pytest.mark.parametrize("package", PRODUCT)
def test_no_import_cycle_in_any_package(package):
    # a module never needs one that needs it back, through whatever import: a shared piece lives where both can
    # import it
    assert import_cycles(ROOT / package) == []


@pytest.mark.parametrize("package", PRODUCT)
def test_no_function_is_over_60_lines_of_code(package):
    # one step per function: a longer one is split into named steps
    assert long_functions(ROOT / package) == {}


MAX_LINE = 120


@pytest.mark.parametrize("package", PRODUCT)
def test_no_line_is_over_120_characters(package):
    # a line a reader sees whole, beside another file: characters, not bytes (a '→' is one)
    long = [f"{path.relative_to(ROOT)}:{n} ({len(line)})" for path in _module_files(ROOT / package)
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > MAX_LINE]
    assert long == []
