"""The RPC of partitions (``trellisctl partitions``), served by the partitions feature
(``masterd.features.partitions``). Open to every caller: a partition's name, nodes and
limits are what a user needs to choose ``--partition``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masterd.features.partitions import Partitions
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


def method_table(partitions: Partitions) -> Mapping[str, tuple[type, Any]]:
    """The entries for :class:`masterd.api.rpc.Rpc`'s method table."""

    @returns(f"`partitions`: one {PARTITION_VIEW} per partition, in configuration order; "
             "empty when the cluster has none.")
    async def partitions_list(_: NoParams) -> dict[str, Any]:
        """The cluster's partitions with their limits and what they hold now."""
        return {"partitions": partitions.listing()}

    return {"partitions": (NoParams, partitions_list)}
