"""trellisctl's ``maintenance`` command: list the maintenance windows, and (admins) plan and
remove them (docs/maintenance.md)."""

from __future__ import annotations

import argparse

from control.client import MasterClient
from control.usage import UsageError

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ACTIONS = ("list", "plan", "remove")


def add_maintenance(p: argparse.ArgumentParser, command: Any) -> None:
    actions = p.add_subparsers(dest="maintenance_action", metavar="ACTION")
    command(actions, "list", help="planned and active windows, and the jobs running into them")
    plan = command(actions, "plan", help="plan a window (admins)")
    plan.add_argument("name")
    plan.add_argument("--nodes", required=True, metavar="NODES",
                      help="its nodes: gpu01,gpu07 or gpu[01-04,07]")
    plan.add_argument("--start", required=True, metavar="WHEN",
                      help="YYYY-MM-DD HH:MM[:SS] (local time), YYYY-MM-DDTHH:MM, or now+TIME "
                           "(now+2:00:00, now+90 minutes as Slurm's time forms)")
    ends = plan.add_mutually_exclusive_group(required=True)
    ends.add_argument("--end", metavar="WHEN", help="when it ends (as --start)")
    ends.add_argument("--duration", metavar="TIME", help="how long (Slurm's time forms: 4:00:00)")
    plan.add_argument("--reason", default="", help="what it is for (shown on its nodes)")
    remove = command(actions, "remove", help="remove a window (admins)")
    remove.add_argument("name")


def parse_when(text: str, flag: str, now: float) -> float:
    """A moment as people write it: a local date and time, or now+TIME."""
    from datetime import datetime

    from shared.slurmtime import parse_time_limit

    spec = text.strip()
    if spec == "now":
        return now
    if spec.startswith("now+"):
        try:
            return now + parse_time_limit(spec[4:])
        except ValueError as exc:
            raise UsageError(f"{flag} {text!r}: {exc}") from None
    try:
        return datetime.fromisoformat(spec).timestamp()  # naive: local time
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected YYYY-MM-DD HH:MM[:SS] or now+TIME"
                         ) from None


def run_maintenance(client: MasterClient, args: argparse.Namespace,
                    now: float | None = None) -> tuple[Any, str]:
    import time

    action = getattr(args, "maintenance_action", None)
    if action is None:
        raise UsageError(f"maintenance needs an action: {', '.join(ACTIONS)}")
    if action == "list":
        result = client.call("maintenance_list")
        return result, show_windows(result["windows"])
    if action == "remove":
        result = client.call("maintenance_remove", {"name": args.name})
        return result, f"maintenance window {result['window']} removed"
    clock = time.time() if now is None else now
    params: dict[str, Any] = {"name": args.name, "nodes": args.nodes, "reason": args.reason,
                              "start": parse_when(args.start, "--start", clock)}
    if args.end is not None:
        params["end"] = parse_when(args.end, "--end", clock)
    else:
        from shared.slurmtime import parse_time_limit

        try:
            params["duration_s"] = parse_time_limit(args.duration)
        except ValueError as exc:
            raise UsageError(f"--duration {args.duration!r}: {exc}") from None
    result = client.call("maintenance_plan", params)
    w = result["window"]
    return result, (f"maintenance window {w['name']} planned on {w['nodes']} from "
                    f"{_when(w['start'])} to {_when(w['end'])}")


def _when(stamp: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def show_windows(windows: list[dict[str, Any]]) -> str:
    if not windows:
        return "no maintenance window is planned"
    from control.tables import render_table

    rows = [[w["name"], w["state"], _when(w["start"]), _when(w["end"]), w["nodes"],
             ",".join(w["running_across"]) or "-", w["reason"] or "-"] for w in windows]
    return render_table(["WINDOW", "STATE", "START", "END", "NODES", "RUNNING INTO IT",
                         "REASON"], rows)
