"""The engine's floors, as tests: no import cycle in journal/ (imports inside functions counted), no
import inside a function but where Django's app loading needs one, the import-linter contracts,
and a run's status written by one module only."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JOURNAL = ROOT / "journal"
# Modules that may import inside a function, because Django's app loading requires it (each says so).
APP_LOADING = {"journal.apps"}
STATUS_OWNER = "journal.store.runstate"


def _modules() -> dict[str, Path]:
    out = {}
    for path in JOURNAL.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, bool, int]]:
    """(imported journal module, inside a function?, line) for every import, TYPE_CHECKING blocks excepted."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    in_function: set[int] = set()
    type_checking: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function |= {id(n) for n in ast.walk(node)}
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_checking |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, id(node) in in_function, node.lineno))
    return found


def test_journal_has_no_import_cycle_even_counting_imports_inside_functions():
    modules = _modules()
    graph = {name: {t for t, _, _ in _imports(name, path, modules)} for name, path in modules.items()}
    # Depth-first search for a back edge; report the cycle it closes.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_inside_functions_only_where_app_loading_requires_them_and_each_says_so():
    modules = _modules()
    for name, path in modules.items():
        inner = [(target, line) for target, inside, line in _imports(name, path, modules) if inside]
        if name not in APP_LOADING:
            assert not inner, f"{name} imports inside a function: {inner} (make a seam instead)"
            continue
        lines = path.read_text().splitlines()
        for _target, line in inner:
            context = "\n".join(lines[max(0, line - 6):line])  # the comment heads the block of imports
            assert "app loading" in context, f"{name}:{line} imports inside a function without saying why"


def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("lint-imports is not installed (it is in the dev extra)")
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def _chain_root(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def test_a_runs_status_is_written_in_one_module_only():
    """No ``Run.objects….update(status=…)``, ``Run.objects.create(status=…)`` or ``run.status = …``
    outside the run state's owner."""
    offenders = []
    for name, path in _modules().items():
        if name == STATUS_OWNER or name.startswith("journal.models"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            writes = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "update", "create", "get_or_create", "update_or_create", "bulk_update")
            if writes and _chain_root(node.func) == "Run" and any(k.arg == "status" for k in node.keywords):
                offenders.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "status" and \
                            ast.unparse(target.value) in ("run", "self.run", "ctx.run"):
                        offenders.append(f"{name}:{node.lineno}")
    assert not offenders, f"a run's status is written outside {STATUS_OWNER}: {offenders}"
