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
from shared.model import NAME_PATTERN
from shared.rpcdoc import returns
from shared.schema import bounded


@dataclass(frozen=True)
class NoParams:
    pass


@dataclass(frozen=True)
class StateParams:
    name: str = bounded(pattern=NAME_PATTERN)
    # up; down (jobs queue, none starts); drain (no new jobs, queued ones start); inactive.
    state: str = bounded(pattern="up|down|drain|inactive")
    reason: str = bounded("", max_len=512)


PARTITION_VIEW = (
    "partition view: `name`, `default` (jobs naming no partition run here), `nodes` (its "
    "node list as configured, or `ALL`), `state` (`up`, `down`, `drain` or `inactive`) and "
    "`state_reason` (an admin's, when one set it), `priority_tier` (its jobs queue before those "
    "of lower tiers, after their class), `max_time_s` and `default_time_s` (nil: none), "
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

    @returns(f"`partition`: its {PARTITION_VIEW}.", ("invalid_partition", "forbidden"))
    async def partition_update(p: StateParams) -> dict[str, Any]:
        """Set a partition's state (admins only), at once and across restarts and reloads:
        `down` starts nothing through it (its jobs queue), `drain` takes no new job (its
        queued ones start), `inactive` both, `up` neither."""
        await partitions.set_state(p.name, p.state, " ".join(p.reason.split()))
        return {"partition": next(r for r in partitions.listing() if r["name"] == p.name)}

    return {"partitions": (NoParams, partitions_list),
            "partition_update": (StateParams, partition_update),
            "priority_classes": (NoParams, priority_classes)}
