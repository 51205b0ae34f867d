"""trellisctl's failure commands: ``gpu reset NODE INDEX`` returns a GPU that is out of
service (a fault its node reported) to service, and the parts of ``show`` and ``node`` that
say what failed."""

from __future__ import annotations

import argparse
import time

from control.client import MasterClient
from control.usage import UsageError

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def add_gpu(p: argparse.ArgumentParser, command: Any) -> None:
    actions = p.add_subparsers(dest="gpu_action", metavar="ACTION")
    reset = command(actions, "reset", help="return a GPU that is out of service (an Xid, a "
                                           "lost device) to service, once it was reset or "
                                           "replaced")
    reset.add_argument("node", help="node name")
    reset.add_argument("index", help="the GPU's index on the node")


def run_gpu(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str]:
    if getattr(args, "gpu_action", None) != "reset":
        raise UsageError("gpu needs an action: trellisctl gpu reset NODE INDEX")
    try:
        index = int(args.index)
    except ValueError:
        raise UsageError(f"gpu reset: INDEX must be a GPU's index (0, 1, ...), got "
                         f"{args.index!r}") from None
    if index < 0:
        raise UsageError(f"gpu reset: INDEX must be 0 or more, got {index}")
    result = client.call("gpu_reset", {"node": args.node, "index": index})
    was = result.get("was") or {}
    why = f" (was out: {was['reason']})" if was.get("reason") else ""
    return result, f"GPU {result['index']} of node {result['node']} is back in service{why}"


def fault_lines(node: str, gpus: list[dict[str, Any]]) -> list[str]:
    """``node``'s lines for its GPUs out of service: why, since when, how to return one."""
    lines = []
    for g in gpus:
        fault = g.get("fault")
        if not fault:
            continue
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(fault["since"]))
        stopped = "; its jobs were stopped" if fault.get("fatal") else ""
        lines.append(f"GPU {g['index']} out of service since {since}: {fault['reason']}"
                     f"{stopped}. Return it with: trellisctl gpu reset {node} {g['index']}")
    return lines


def health(g: dict[str, Any]) -> str:
    """A GPU's HEALTH cell: ok, or out (with its Xid when there is one)."""
    if g.get("healthy", True) and not g.get("fault"):
        return "ok"
    fault = g.get("fault") or {}
    return f"out (Xid {fault['xid']})" if fault.get("xid") is not None else "out"
