"""The master's architecture, held by its source: no import cycle anywhere in ``masterd``,
each layer imports only the layers below it, and no module touches another module's
private names.

Read with the standard library's ``ast`` (nothing is imported), so a cycle hidden behind
``if TYPE_CHECKING:`` or inside a function counts too: it is a knot in the design whether or
not Python trips over it at import time.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "masterd"

# Lowest first: a module may import its own layer and the layers before it in this list.
LAYERS = (
    "masterd.core",
    "masterd.journal",
    "masterd.runtime",
    "masterd.features",
    "masterd.service",
    "masterd.api",
    "masterd.main",
)
# Project packages masterd must never import (the daemons and tools beside it).
FORBIDDEN = ("noded", "control", "sim", "demo", "bench", "tests", "rdt")


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (a name imported from a module counts as the module)
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _absolute(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: set[str]) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(Import(name, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, name, path.name == "__init__.py")
            for alias in node.names:
                child = f"{module}.{alias.name}"
                found.append(Import(name, child if child in known else module, node.lineno))
    return found


def graph() -> dict[str, list[Import]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing
    itself), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int | None:
    for rank, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["a"]}) == [["a"]]
    assert cycles({"a": ["b"], "b": []}) == []


def test_no_import_cycle_in_masterd() -> None:
    g = graph()
    edges = {m: sorted({i.target for i in imps if i.target in g}) for m, imps in g.items()}
    found = cycles(edges)
    assert not found, "import cycles in masterd: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [m for m in modules() if m != PACKAGE and layer_of(m) is None
                and m != "masterd.gcpause"]
    assert not unplaced, f"modules outside the layers {LAYERS}: {unplaced}"


def test_layers_import_only_downwards() -> None:
    wrong = []
    for module, imps in graph().items():
        rank = layer_of(module)
        if module == "masterd.gcpause":
            rank = layer_of("masterd.main")
        for imp in imps:
            top = imp.target.split(".")[0]
            if top in FORBIDDEN:
                wrong.append(f"{module}:{imp.line} imports {imp.target} (not part of masterd)")
                continue
            target_rank = layer_of(imp.target)
            if rank is None or target_rank is None:
                continue
            if target_rank > rank:
                wrong.append(f"{module}:{imp.line} ({LAYERS[rank]}) imports {imp.target} "
                             f"({LAYERS[target_rank]}, a layer above)")
    assert not wrong, "\n".join(wrong)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_privates(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, attributes it assigns."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if _private(n)}


def _outside_modules(tree: ast.AST) -> set[str]:
    """Names bound to modules from outside the project (``os._exit`` is the standard
    library's own business)."""
    project = {PACKAGE, "shared", *FORBIDDEN}
    return {(alias.asname or alias.name).split(".")[0]
            for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names if alias.name.split(".")[0] not in project}


def private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    own = _defined_privates(tree)
    outside = _outside_modules(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"line {node.lineno}: imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls", *outside):
                continue
            if node.attr in own:  # its own private name, on another instance of its class
                continue
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_the_private_name_check_sees_both_forms(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("import os\nfrom x import _hidden\n"
                    "class A:\n"
                    "    def __init__(self):\n        self._mine = 1\n"
                    "    def same(self, other):\n        return other._mine\n"
                    "def f(master):\n    os._exit(master._spawn(1))\n")
    assert private_uses(path) == ["line 2: imports x._hidden", "line 9: ._spawn"]


def test_no_module_touches_another_modules_private_names() -> None:
    wrong = [f"{name}: {use}" for name, path in modules().items() for use in private_uses(path)]
    assert not wrong, "private names used across modules:\n" + "\n".join(wrong)
