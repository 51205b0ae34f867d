"""Node-level decisions are written once (DESIGN principle 6): ``noded.policy`` holds the
contention eliminator's and the CPU tuner's logic, which noded's loops and the simulator both
import. It must stay pure (no daemon I/O), and the simulator may take nothing else from noded.

Read with ``ast``: nothing is imported, so an import hidden in a function counts too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What a pure decision module may import besides the standard library.
ALLOWED_PROJECT = ("noded.policy", "shared.config", "shared.model")
ALLOWED_THIRD_PARTY = ("numpy",)


def _imports(path: Path) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_node_policy_imports_only_pure_modules() -> None:
    bad = []
    for path in sorted((ROOT / "noded" / "policy").rglob("*.py")):
        for name, line in _imports(path):
            top = name.split(".")[0]
            if top == "__future__" or top in sys.stdlib_module_names:
                continue
            if _within(name, ALLOWED_PROJECT) or _within(name, ALLOWED_THIRD_PARTY):
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not bad, "noded.policy must stay free of daemon I/O:\n" + "\n".join(bad)


def test_simulator_takes_only_pure_decisions_from_noded() -> None:
    bad = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        for name, line in _imports(path):
            if _within(name, ("noded",)) and not _within(name, ("noded.policy",)):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not bad, "sim may import only noded.policy from the node daemon:\n" + "\n".join(bad)
