"""Every command the master sends a node is one noded knows: a command missing from
shared.messages.NODE_COMMANDS is refused by every node as 'unknown command' (a merge once
left signal_job out, and warnings before a time limit silently never arrived)."""

from __future__ import annotations

import ast
from pathlib import Path

from shared.messages import NODE_COMMANDS

MASTERD = Path(__file__).resolve().parents[2] / "masterd"


def sent_commands() -> dict[str, str]:
    """Command names passed as a literal to ``_command(node, NAME, ...)`` or
    ``nodes.send(node, NAME, ...)`` anywhere in masterd/, with where."""
    found: dict[str, str] = {}
    for path in MASTERD.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("_command", "send") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[1].value, str)):
                found[node.args[1].value] = f"{path.name}:{node.lineno}"
    return found


def test_every_command_the_master_sends_is_known_to_noded() -> None:
    sent = sent_commands()
    assert {"prepare_job", "start_job", "stop_job", "signal_job", "read_log"} <= set(sent)
    unknown = {name: where for name, where in sent.items() if name not in NODE_COMMANDS}
    assert not unknown, f"sent but not in NODE_COMMANDS: {unknown}"

