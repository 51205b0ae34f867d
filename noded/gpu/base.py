"""The node daemon's view of its GPUs: data types, the backend protocol, shared helpers.

Two backends implement :class:`GpuBackend`: ``nvml`` (the real devices through pynvml) and
``emulated`` (a deterministic device set whose utilisation follows the jobs the daemon runs).
The daemon only ever talks to this protocol, so the demo and the tests run the same daemon code
as a real GPU server.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from noded.gpu.devices import GpuDeviceNodes
from shared.model import GpuInfo

# Re-exported: the Xid catalogue (application, fatal and other Xids, names) lives in
# shared/xid.py, shared with the master, which decides what a fault means for the job on it.
from shared.xid import APPLICATION_XIDS as APPLICATION_XIDS
from shared.xid import LOST_XIDS as LOST_XIDS
from shared.xid import XID_NAMES as XID_NAMES
from shared.xid import xid_reason as xid_reason

if TYPE_CHECKING:
    from noded.gpu.emulated import EmulatedGpuConfig

log = logging.getLogger("trellis.gpu")

# NVML topology levels (nvmlGpuTopologyLevel_t); the emulation uses the same numbers.
TOPOLOGY_INTERNAL = 0  # same board (multi-GPU board)
TOPOLOGY_SINGLE = 10  # one PCIe switch between the two GPUs
TOPOLOGY_MULTIPLE = 20  # several PCIe switches, no host bridge
TOPOLOGY_HOSTBRIDGE = 30  # through a PCIe host bridge
TOPOLOGY_NODE = 40  # through the interconnect between host bridges inside one NUMA node
TOPOLOGY_SYSTEM = 50  # across NUMA nodes (SMP interconnect)
TOPOLOGY_LEVELS = frozenset(
    {
        TOPOLOGY_INTERNAL,
        TOPOLOGY_SINGLE,
        TOPOLOGY_MULTIPLE,
        TOPOLOGY_HOSTBRIDGE,
        TOPOLOGY_NODE,
        TOPOLOGY_SYSTEM,
    }
)

GPU_IS_LOST = "GPU is lost"


class GpuBackendError(RuntimeError):
    """The GPU backend cannot be opened or used; the message says why and what to check."""


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization_pct: float  # device utilisation 0..100
    memory_used_mib: int
    memory_total_mib: int
    processes: tuple[tuple[int, int], ...]  # (pid, used MiB)
    healthy: bool
    error: str | None = None  # shown to operators, e.g. "GPU is lost"


@dataclass(frozen=True)
class GpuHealthEvent:
    index: int
    uuid: str
    healthy: bool
    reason: str  # e.g. "Xid 79 (GPU has fallen off the bus)"
    # The Xid that took the GPU out of service; None for other causes (NVML lost the
    # device, a reset is required) and for a return to service.
    xid: int | None = None


Topology = tuple[tuple[int, ...], ...]


@runtime_checkable
class GpuBackend(Protocol):
    name: str  # "nvml" | "emulated"

    def inventory(self) -> tuple[tuple[GpuInfo, ...], Topology]:
        """The GPUs (with current health) and the pairwise NVML topology-level matrix."""
        ...

    def sample(self) -> list[GpuSample]:
        """One sample per GPU; never raises for device errors (they become sample state)."""
        ...

    def poll_health(self, timeout_ms: int = 0) -> list[GpuHealthEvent]:
        """Health transitions since the last call, waiting up to ``timeout_ms`` for one."""
        ...

    def job_env(self, job_id: str, owner_uid: int | None = None) -> dict[str, str]:
        """Environment to add to a job's processes before they start (the emulation's
        progress channel); ``owner_uid`` is the user the job runs as."""
        ...

    def job_started(self, job_id: str, gpus: tuple[int, ...], pids: tuple[int, ...]) -> None: ...

    def job_pids(self, job_id: str, pids: tuple[int, ...]) -> None: ...

    def job_ended(self, job_id: str) -> None: ...

    def recover(self, index: int, reason: str = "recovered by operator") -> None:
        """Operator's word (or a passed health check's) that GPU ``index`` is fine again;
        reported by the next poll_health."""
        ...

    def close(self) -> None: ...

    def device_nodes(self) -> GpuDeviceNodes:
        """The GPUs' device files (by GPU index), the control files every GPU job needs and
        the driver's user-space libraries: what the GPU device fence and a container's CDI
        spec are made from (noded.gpu.devices)."""
        ...


def check_topology(matrix: Topology, count: int) -> None:
    """Raise ValueError unless ``matrix`` is a symmetric count x count matrix of NVML levels."""
    if len(matrix) != count or any(len(row) != count for row in matrix):
        raise ValueError(f"topology matrix must be {count}x{count}")
    for i in range(count):
        if matrix[i][i] != TOPOLOGY_INTERNAL:
            raise ValueError(f"topology[{i}][{i}] must be {TOPOLOGY_INTERNAL}")
        for j in range(count):
            if matrix[i][j] not in TOPOLOGY_LEVELS:
                raise ValueError(f"topology[{i}][{j}]={matrix[i][j]} is not an NVML level")
            if matrix[i][j] != matrix[j][i]:
                raise ValueError(f"topology is not symmetric at [{i}][{j}]")


def switch_groups(matrix: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """PCIe switch id per GPU: GPUs connected at level <= MULTIPLE share an id.

    Connectivity is transitive (union-find) because a PCIe tree is: two GPUs under the same
    switch tree reach each other without a host bridge. Ids are numbered 0.. in order of each
    group's lowest GPU index, so they are stable for a given topology.
    """
    n = len(matrix)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in range(n):
        for j in range(i + 1, n):
            if matrix[i][j] <= TOPOLOGY_MULTIPLE:
                ri, rj = find(i), find(j)
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
    ids: dict[int, int] = {}
    return tuple(ids.setdefault(find(i), len(ids)) for i in range(n))


def check_job_gpus(job_id: str, gpus: tuple[int, ...], count: int) -> None:
    bad = [g for g in gpus if not isinstance(g, int) or isinstance(g, bool) or not 0 <= g < count]
    if bad:
        raise ValueError(
            f"job {job_id!r}: GPU index {bad[0]!r} does not exist on this node "
            f"(valid: 0..{count - 1})"
            if count
            else f"job {job_id!r}: this node has no GPUs, got GPU index {bad[0]!r}"
        )


def open_backend(
    kind: str,
    config: EmulatedGpuConfig | None = None,
    *,
    nvml: Any | None = None,
) -> GpuBackend:
    """Open the GPU backend the daemon's configuration names.

    ``nvml``: the real devices; fails with :class:`GpuBackendError` when NVML cannot start.
    ``emulated``: the emulated device set described by ``config`` (defaults if None).
    ``auto``: NVML if it initialises; otherwise the emulation if ``config`` is given, else a
    clear error (a GPU server silently running emulated GPUs would be worse than not starting).
    ``nvml`` (keyword) replaces the pynvml module, for tests.
    """
    # Imported here: both backends import this module for the shared types.
    from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
    from noded.gpu.nvml import NvmlGpuBackend

    if kind == "emulated":
        return EmulatedGpuBackend(config if config is not None else EmulatedGpuConfig())
    if kind == "nvml":
        return NvmlGpuBackend(nvml=nvml)
    if kind == "auto":
        try:
            return NvmlGpuBackend(nvml=nvml)
        except GpuBackendError as exc:
            if config is None:
                raise GpuBackendError(
                    f"{exc}; gpu backend 'auto' found no usable NVML and no emulated GPU "
                    "configuration: configure emulated GPUs, or set the backend to 'nvml' on "
                    "a GPU server once the driver works"
                ) from None
            log.warning(
                "gpu_backend=emulated reason=%r count=%d", str(exc), config.count
            )
            return EmulatedGpuBackend(config)
    raise ValueError(f"unknown GPU backend {kind!r}: use 'nvml', 'emulated' or 'auto'")
