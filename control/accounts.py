"""trellisctl's ``account`` command: list and show accounts with their limits and use, and
(admins) add, change and remove them and their users (docs/governance.md)."""

from __future__ import annotations

import argparse

from control.client import MasterClient
from control.usage import UsageError

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ACTIONS = ("list", "show", "add", "set", "remove", "add-user", "remove-user")
# account set's flat limits: option -> parameter (-1 or "none" clears one).
LIMITS = {"quota_gpus": "quota_gpus", "quota_cpus": "quota_cpus",
          "quota_memory_mib": "quota_memory_mib", "borrow_gpus": "borrow_gpus",
          "borrow_cpus": "borrow_cpus", "borrow_memory_mib": "borrow_memory_mib",
          "max_running": "running_jobs", "max_submitted": "submitted_jobs",
          "max_gpus_per_job": "gpus_per_job", "max_time": "time_limit_s"}


def _limit(text: str) -> int:
    if text.strip().lower() in ("none", "-1"):
        return -1
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (or none)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (none clears a limit)")
    return value


def _limit_options(p: argparse.ArgumentParser) -> None:
    for name, unit in (("gpus", "GPUs"), ("cpus", "CPU cores"), ("memory-mib", "MiB")):
        p.add_argument(f"--quota-{name}", type=_limit, metavar="N",
                       help=f"nominal quota of {unit}, guaranteed (none: unset)")
        p.add_argument(f"--borrow-{name}", type=_limit, metavar="N",
                       help=f"{unit} it may borrow over its quota while idle (none: no bound)")
    p.add_argument("--max-running", type=_limit, metavar="N", help="jobs running at once")
    p.add_argument("--max-submitted", type=_limit, metavar="N",
                   help="jobs queued or running at once (more are refused)")
    p.add_argument("--max-gpus-per-job", type=_limit, metavar="N", help="GPUs one job may ask")
    p.add_argument("--max-time", metavar="TIME",
                   help="the longest time limit a job may ask (Slurm's forms; none: no cap)")
    p.add_argument("--shares", type=float, help="fair-share weight among its siblings")
    p.add_argument("--force", action="store_true",
                   help="apply even if a limit falls below what the account runs now "
                        "(nothing is stopped; new jobs wait)")


def add_account(p: argparse.ArgumentParser, command: Any) -> None:
    actions = p.add_subparsers(dest="account_action", metavar="ACTION")
    command(actions, "list", help="every account with its limits and use")
    show = command(actions, "show", help="one account")
    show.add_argument("name")
    add = command(actions, "add", help="add an account (admins)")
    add.add_argument("name")
    add.add_argument("--parent", help="its parent account (default: a root)")
    add.add_argument("--users", default="", help="comma-separated Unix users")
    add.add_argument("--default-for", default="",
                     help="comma-separated users (among --users) whose default it is")
    _limit_options(add)
    change = command(actions, "set", help="change an account's limits or parent (admins)")
    change.add_argument("name")
    change.add_argument("--parent", help="its new parent ('' or none: a root)")
    _limit_options(change)
    remove = command(actions, "remove", help="remove an account without jobs (admins)")
    remove.add_argument("name")
    add_user = command(actions, "add-user", help="let a user run jobs under it (admins)")
    add_user.add_argument("name")
    add_user.add_argument("user")
    add_user.add_argument("--default", action="store_true",
                          help="make it the user's default account")
    remove_user = command(actions, "remove-user", help="take a user out of it (admins)")
    remove_user.add_argument("name")
    remove_user.add_argument("user")


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for option, param in LIMITS.items():
        value = getattr(args, option, None)
        if value is None:
            continue
        if option == "max_time":
            if value.strip().lower() in ("none", "-1"):
                value = -1
            else:
                from shared.slurmtime import parse_time_limit

                try:
                    value = parse_time_limit(value)
                except ValueError as exc:
                    raise UsageError(f"--max-time: {exc}") from None
        out[param] = value
    if args.shares is not None:
        out["shares"] = args.shares
    return out


def _names(text: str) -> list[str]:
    return [u.strip() for u in text.split(",") if u.strip()]


def _account_map(args: argparse.Namespace) -> dict[str, Any]:
    """account add's options as an account map (set's flat limits folded in)."""
    flat = _limits(args)
    account: dict[str, Any] = {"name": args.name, "users": _names(args.users),
                               "default_for": _names(args.default_for)}
    if args.parent:
        account["parent"] = args.parent
    if "shares" in flat:
        account["shares"] = flat.pop("shares")
    groups = {"quota": {}, "borrowing_limit": {}, "caps": {}}  # type: dict[str, dict[str, Any]]
    for key, value in flat.items():
        if value == -1:
            continue  # unset is the default of a new account
        if key.startswith("quota_"):
            groups["quota"][key[len("quota_"):]] = value
        elif key.startswith("borrow_"):
            groups["borrowing_limit"][key[len("borrow_"):]] = value
        else:
            groups["caps"][key] = value
    account.update({k: v for k, v in groups.items() if v})
    return account


def run_account(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str]:
    action = getattr(args, "account_action", None)
    if action is None:
        raise UsageError(f"account needs an action: {', '.join(ACTIONS)}")
    if action == "list":
        result = client.call("account_list")
        return result, show_accounts(result["accounts"])
    if action == "show":
        result = client.call("account_show", {"name": args.name})
        return result, show_account(result["account"])
    if action == "add":
        result = client.call("account_add", {"account": _account_map(args),
                                             "force": args.force})
        return result, f"account {result['account']['name']} added"
    if action == "set":
        params = {"name": args.name, **_limits(args), "force": args.force}
        if args.parent is not None:
            params["parent"] = "" if args.parent.lower() in ("", "none") else args.parent
        if len(params) == 2:
            raise UsageError("account set changes nothing: give --parent, --shares, a "
                             "--quota-*, --borrow-* or --max-* option")
        result = client.call("account_set", params)
        return result, f"account {result['account']['name']} changed"
    if action == "remove":
        result = client.call("account_remove", {"name": args.name})
        return result, f"account {result['removed']} removed"
    method = "account_add_user" if action == "add-user" else "account_remove_user"
    params = {"name": args.name, "user": args.user}
    if action == "add-user":
        params["default"] = args.default
    result = client.call(method, params)
    verb = "added to" if action == "add-user" else "removed from"
    return result, f"user {args.user} {verb} account {result['account']['name']}"


def _amount(value: Any) -> str:
    return "-" if value is None else str(value)


def show_accounts(accounts: list[dict[str, Any]]) -> str:
    from control.tables import render_table

    if not accounts:
        return "accounts are off (no [[master.accounts]] and none added)"
    depth: dict[str, int] = {}
    rows = []
    for a in accounts:
        depth[a["name"]] = depth.get(a["parent"], -1) + 1 if a["parent"] else 0
        use = a["usage"]
        rows.append(["  " * depth[a["name"]] + a["name"],
                     f"{use['gpus']}/{_amount(a['quota']['gpus'])}"
                     f"+{_amount(a['borrowing_limit']['gpus'])}",
                     f"{use['running_jobs']}/{_amount(a['caps']['running_jobs'])}",
                     str(use["queued_jobs"]), "yes" if use["borrowing"] else "",
                     ",".join(a["users"])])
    return render_table(["ACCOUNT", "GPUS USED/QUOTA+BORROW", "RUNNING/CAP", "QUEUED", "BORROWING",
                  "USERS"], rows)


def show_account(a: dict[str, Any]) -> str:
    use = a["usage"]
    lines = [f"Account:         {a['name']}",
             f"Parent:          {a['parent'] or '-'}",
             f"Children:        {', '.join(a['children']) or '-'}",
             f"Users:           {', '.join(a['users']) or '-'}",
             f"Default for:     {', '.join(a['default_for']) or '-'}",
             f"Shares:          {a['shares']:g}"]
    for key, title in (("quota", "Quota"), ("borrowing_limit", "Borrowing limit")):
        r = a[key]
        lines.append(f"{title + ':':<17}gpus {_amount(r['gpus'])}, cpus {_amount(r['cpus'])}, "
                     f"memory_mib {_amount(r['memory_mib'])}")
    caps = a["caps"]
    lines.append("Caps:            " + ", ".join(f"{k} {_amount(v)}" for k, v in caps.items()))
    lines.append(f"Use:             {use['running_jobs']} running, {use['queued_jobs']} "
                 f"queued, gpus {use['gpus']}, cpus {use['cpus']}, memory_mib "
                 f"{use['memory_mib']}{' (borrowing)' if use['borrowing'] else ''}")
    return "\n".join(lines)
