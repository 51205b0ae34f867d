"""trellisctl's ``reservation`` command: list reservations, and (admins) create, update and
delete them (docs/reservations.md), as Slurm's ``scontrol create reservation``."""

from __future__ import annotations

import argparse

from control.client import MasterClient
from control.usage import UsageError

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ACTIONS = ("list", "create", "update", "delete")
WHEN = ("YYYY-MM-DD HH:MM[:SS] (local time), YYYY-MM-DDTHH:MM, or now+TIME (now+2:00:00, "
        "Slurm's time forms)")


def add_reservation(p: argparse.ArgumentParser, command: Any) -> None:
    actions = p.add_subparsers(dest="reservation_action", metavar="ACTION")
    command(actions, "list", help="planned and active reservations, their jobs, and the "
                                  "jobs running into them")
    create = command(actions, "create", help="create a reservation (admins)")
    update = command(actions, "update", help="change a reservation (admins): what is given")
    for sub, required in ((create, True), (update, False)):
        sub.add_argument("name")
        sub.add_argument("--start", required=required, metavar="WHEN", help=WHEN)
        ends = sub.add_mutually_exclusive_group(required=required)
        ends.add_argument("--end", metavar="WHEN", help="when it ends (as --start)")
        ends.add_argument("--duration", metavar="TIME",
                          help="how long (Slurm's time forms: 2:00:00)")
        sub.add_argument("--users", metavar="USERS", help="who may use it: alice,bob")
        sub.add_argument("--accounts", metavar="ACCOUNTS",
                         help="accounts whose jobs may use it: course,demo")
        sub.add_argument("--flags", metavar="FLAGS",
                         help="maint, ignore_jobs, flex (comma-separated)")
        sub.add_argument("--reason", help="what it is for")
    where = create.add_mutually_exclusive_group(required=True)
    where.add_argument("--nodes", metavar="NODES", help="its nodes: gpu01,gpu07 or gpu[01-04]")
    where.add_argument("--gpus", type=int, metavar="N",
                       help="a count of GPUs: the fewest whole nodes holding N")
    create.add_argument("--gpu-model", metavar="MODEL", help="the model of --gpus' GPUs")
    update.add_argument("--nodes", metavar="NODES", help="its nodes, replacing them")
    delete = command(actions, "delete", help="delete a reservation (admins)")
    delete.add_argument("name")


def _names(text: str | None, flag: str) -> list[str] | None:
    if text is None:
        return None
    names = [part.strip() for part in text.split(",") if part.strip()]
    if text.strip() and not names:
        raise UsageError(f"{flag} {text!r}: give names separated by commas")
    return names


def run_reservation(client: MasterClient, args: argparse.Namespace,
                    now: float | None = None) -> tuple[Any, str]:
    import time

    from control.maintenance import parse_when

    action = getattr(args, "reservation_action", None)
    if action is None:
        raise UsageError(f"reservation needs an action: {', '.join(ACTIONS)}")
    if action == "list":
        result = client.call("reservation_list")
        return result, show_reservations(result["reservations"])
    if action == "delete":
        result = client.call("reservation_delete", {"name": args.name})
        return result, f"reservation {result['reservation']} deleted"
    clock = time.time() if now is None else now
    params: dict[str, Any] = {"name": args.name}
    if args.start is not None:
        params["start"] = parse_when(args.start, "--start", clock)
    if args.end is not None:
        params["end"] = parse_when(args.end, "--end", clock)
    elif args.duration is not None:
        from shared.slurmtime import parse_time_limit

        try:
            params["duration_s"] = parse_time_limit(args.duration)
        except ValueError as exc:
            raise UsageError(f"--duration {args.duration!r}: {exc}") from None
    for key, flag in (("users", "--users"), ("accounts", "--accounts"), ("flags", "--flags")):
        names = _names(getattr(args, key), flag)
        if names is not None:
            params[key] = names
    if args.reason is not None:
        params["reason"] = args.reason
    if args.nodes is not None:
        params["nodes"] = args.nodes
    if action == "create":
        if args.gpus is not None:
            params["gpus"] = args.gpus
        if args.gpu_model is not None:
            params["gpu_model"] = args.gpu_model
    result = client.call(f"reservation_{action}", params)
    r = result["reservation"]
    done = "created" if action == "create" else "updated"
    return result, (f"reservation {r['name']} {done}: {r['nodes']} ({r['gpus']} GPUs) from "
                    f"{_when(r['start'])} to {_when(r['end'])}")


def _when(stamp: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def show_reservations(reservations: list[dict[str, Any]]) -> str:
    if not reservations:
        return "no reservation is planned"
    from control.tables import render_table

    rows = [[r["name"], r["state"], _when(r["start"]), _when(r["end"]), r["nodes"],
             str(r["gpus"]), ",".join(r["users"] + [f"account:{a}" for a in r["accounts"]])
             or "-", ",".join(r["flags"]) or "-", ",".join(r["jobs"]) or "-",
             ",".join(r["running_across"]) or "-", r["reason"] or "-"] for r in reservations]
    return render_table(["RESERVATION", "STATE", "START", "END", "NODES", "GPUS", "FOR",
                         "FLAGS", "JOBS", "RUNNING INTO IT", "REASON"], rows)
