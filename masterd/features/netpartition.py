"""Nodes' network partitions (SODA §V-E), as their ``partition`` events report them.

noded switches the partition of its data NIC on when a multi-node GPU job starts there and off
when the last one ends (noded/netpartition.py). Each switch is journalled as a ``partition``
event of the node (``trellisctl events`` lists it) and the latest state of every node is kept
for ``trellisctl node`` (the ``node`` RPC's ``partition`` section). The state lives in memory:
a restarted master learns it again at the node's next switch.
"""

from __future__ import annotations

import logging
from typing import Any

from masterd.runtime.context import FeatureContext
from shared.messages import NetPartitionSwitch

log = logging.getLogger("trellis.master.partition")


class NetPartitions:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.state: dict[str, dict[str, Any]] = {}
        ctx.events.node_event.subscribe(self.on_node_event)

    def of(self, node: str) -> dict[str, Any] | None:
        """The node's last reported partition, or None if it never reported one."""
        return self.state.get(node)

    async def on_node_event(self, node: str, event: Any) -> None:
        if not isinstance(event, NetPartitionSwitch):
            return
        detail = {
            "active": event.active, "interface": event.interface,
            "link_mbit": event.link_mbit, "gpu_share": event.gpu_share,
            "cpu_share": event.cpu_share, "jobs": list(event.jobs), "reason": event.reason,
            "since": self.ctx.clock(),
        }
        self.state[node] = detail
        log.info("node=%s partition active=%s interface=%s jobs=%s reason=%r", node,
                 event.active, event.interface, ",".join(event.jobs) or "-", event.reason)
        await self.ctx.journal.persist([], [(detail["since"], None, node, "net_partition",
                                             {k: v for k, v in detail.items() if k != "since"})])
