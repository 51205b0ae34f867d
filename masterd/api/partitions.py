"""The RPC of partitions and priority classes (``trellisctl partitions``, ``trellisctl
priority-classes``), served by their features (``masterd.features.partitions``,
``masterd.features.priorityclasses``). Open to every caller: names, nodes, limits and rules
are what a user needs to choose ``--partition`` and to know who may preempt them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masterd.features.partitions import Partitions
from masterd.features.priorityclasses import PriorityClasses
from shared.rpcdoc import returns


@dataclass(frozen=True)
class NoParams:
    pass


PARTITION_VIEW = (
    "a partition view: `name`, `default` (jobs naming no partition run here), `nodes` (its "
    "node list as configured, or `ALL`), `max_time_s` and `default_time_s` (nil: none), "
    "`allow_accounts` and `deny_accounts` (empty: every account), and now: `node_count` "
    "(its registered nodes), `schedulable` (those up and schedulable), `gpus`, `free_gpus` "
    "(free on schedulable nodes), `queued` and `running` (jobs that may run there)")


CLASS_VIEW = (
    "a priority class view: `name`, `priority` (higher queues first), `default`, `preempts` "
    "(the classes whose running jobs its waiting ones may preempt), `within_account`, "
    "`min_runtime_s` (its jobs run at least this long before they may be preempted), "
    "`preempt_grace_s` (a preempted job's time from its warning to its kill), and now: "
    "`queued`, `running`")


def method_table(partitions: Partitions, classes: PriorityClasses
                 ) -> Mapping[str, tuple[type, Any]]:
    """The entries for :class:`masterd.api.rpc.Rpc`'s method table."""

    @returns(f"`partitions`: one {PARTITION_VIEW} per partition, in configuration order; "
             "empty when the cluster has none.")
    async def partitions_list(_: NoParams) -> dict[str, Any]:
        """The cluster's partitions with their limits and what they hold now."""
        return {"partitions": partitions.listing()}

    @returns(f"`classes`: one {CLASS_VIEW} per class, highest first; empty when the "
             "cluster has none.")
    async def priority_classes(_: NoParams) -> dict[str, Any]:
        """The cluster's priority classes with their rules and jobs now."""
        return {"classes": classes.listing()}

    return {"partitions": (NoParams, partitions_list),
            "priority_classes": (NoParams, priority_classes)}
