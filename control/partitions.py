"""trellisctl's ``partition`` command: an admin sets a partition's state at run time
(Slurm's ``scontrol update PartitionName=gpu State=DOWN``); ``trellisctl partitions`` lists
them (docs/partitions.md)."""

from __future__ import annotations

import argparse

from control.client import MasterClient
from control.usage import UsageError

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STATES = ("up", "down", "drain", "inactive")


def add_partition(p: argparse.ArgumentParser, command: Any) -> None:
    actions = p.add_subparsers(dest="partition_action", metavar="ACTION")
    update = command(actions, "update", help="set a partition's state (admins)")
    update.add_argument("name")
    update.add_argument("--state", required=True, choices=STATES,
                        help="up; down: jobs queue, none starts; drain: no new jobs, queued "
                             "ones start; inactive: neither")
    update.add_argument("--reason", default="", help="why (shown by trellisctl partitions)")


def run_partition(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str]:
    if getattr(args, "partition_action", None) != "update":
        raise UsageError("partition needs an action: update (trellisctl partitions lists them)")
    result = client.call("partition_update", {"name": args.name, "state": args.state,
                                              "reason": args.reason})
    p = result["partition"]
    return result, f"partition {p['name']} is {p['state']}"
