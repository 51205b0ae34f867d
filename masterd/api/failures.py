"""The RPC of failures: ``gpu_reset``, an operator's return of a GPU to service, served by
the GPU faults feature (``masterd.features.gpufaults``). Admin-only (masterd/api/authn.py:
a method no role lists is an admin's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masterd.features.gpufaults import GpuFaults
from shared.model import NAME_PATTERN
from shared.rpcdoc import returns
from shared.schema import bounded


@dataclass(frozen=True)
class GpuResetParams:
    # The node the GPU is in.
    node: str = bounded(pattern=NAME_PATTERN)
    # The GPU's index on that node.
    index: int = bounded(min=0, max=1023)


def method_table(faults: GpuFaults) -> Mapping[str, tuple[type, Any]]:
    """The entries for :class:`masterd.api.rpc.Rpc`'s method table."""

    @returns("`node`, `index`, `healthy` (true) and `was`: the fault it was held out for "
             "(`{xid, reason, fatal, since}`, nil when only the node held it). Journalled as "
             "`gpu_reset`.", ("unknown_node", "unknown_gpu", "gpu_in_service",
                             "node_unreachable", "forbidden"))
    async def gpu_reset(p: GpuResetParams) -> dict[str, Any]:
        """Return a GPU that is out of service (a fault its node reported: an Xid, a lost
        device) to service, once the operator has reset or replaced it. The node daemon
        clears its own record first, so the node must be connected; new jobs may then be
        placed on the GPU. Refused, with nothing changed, for a GPU in service."""
        return await faults.reset(p.node, p.index)

    return {"gpu_reset": (GpuResetParams, gpu_reset)}
