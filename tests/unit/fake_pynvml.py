"""A stand-in for the pynvml module with a configurable set of fake GPUs.

Only what would call into libnvidia-ml is faked. The error classes (``NVMLError`` and its
per-code subclasses), the constants and the ctypes result structures (``c_nvmlMemory_t``,
``c_nvmlUtilization_t``, ``nvmlPciInfo_t``, affinity arrays, ``nvmlFriendlyObject`` process
records) are pynvml's own, none of which needs the library, so the backend under test sees
exactly the types the real module returns. ``test_gpu_nvml.py`` checks that every function here
exists in the installed pynvml with the same parameters.

Tests steer it: ``inject_xid``, ``lose_gpu``/``restore_gpu``, ``fail`` (one call returns an NVML
error), ``hide`` (the function does not exist, as in an old pynvml), ``set_busy``/``set_idle``.

It lives under tests/ rather than in the noded package: the demo's stand-in for GPUs is the
emulated backend, which models jobs; this fake models only the library surface, and nothing
that ships should be able to mistake it for a driver.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

MIB = 1 << 20


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    memory_total: int = 40960 * MIB  # bytes, as NVML reports
    memory_used: int = 0
    utilization: int = 0
    memory_utilization: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    bus_id: str = "00000000:00:00.0"
    numa_node: int | None = 0  # None: nvmlDeviceGetNumaNodeId answers NOT_SUPPORTED
    cpus: tuple[int, ...] = (0,)  # CPU affinity
    nvlink_count: int = 0  # links the device has; 0 = no NVLink (NOT_SUPPORTED)
    nvlinks: dict[int, tuple[int, str]] = field(default_factory=dict)  # link -> (type, bus)
    supported_events: int = (
        pynvml.nvmlEventTypeXidCriticalError
        | pynvml.nvmlEventTypeDoubleBitEccError
        | pynvml.nvmlEventTypeSingleBitEccError
    )
    lost: bool = False
    minor: int | None = None  # /dev/nvidiaN's minor number; None: the same as the index
    failures: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code


class FakeHandle:
    """Opaque like pynvml's c_nvmlDevice_t; the same object per index within one fake."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<FakeHandle {self.index}>"


@dataclass
class FakeEventData:
    """Field names of pynvml.c_nvmlEventData_t."""

    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class FakeEventSet:
    def __init__(self) -> None:
        self.masks: dict[int, int] = {}  # device index -> registered event types
        self.queue: deque[FakeEventData] = deque()
        self.freed = False


class FakeNvml:
    """Module-like object: pass it as ``NvmlGpuBackend(nvml=FakeNvml(...))``."""

    def __init__(
        self,
        devices: Sequence[FakeDevice],
        topology: Sequence[Sequence[int]],
        *,
        init_error: int | None = None,
        bytes_strings: bool = False,
    ) -> None:
        n = len(devices)
        if len(topology) != n or any(len(row) != n for row in topology):
            raise ValueError(f"topology must be {n}x{n}")
        self.devices = list(devices)
        self.topology = [list(row) for row in topology]
        self.init_error = init_error
        self.bytes_strings = bytes_strings  # pynvml before 11.5 returned bytes
        self.global_failures: dict[str, int] = {}
        self.init_count = 0
        self.shutdown_count = 0
        self.event_sets: list[FakeEventSet] = []
        self._hidden: set[str] = set()
        self._handles = [FakeHandle(i) for i in range(n)]
        self._cond = threading.Condition()
        self.waiting = threading.Event()  # set once a thread blocks in nvmlEventSetWait
        # In the real library, freeing an event set another thread waits on is a
        # use-after-free; the fake records it so a test can prove it never happens.
        self.freed_while_waiting = False

    @classmethod
    def standard(
        cls,
        count: int = 4,
        *,
        gpus_per_switch: int = 2,
        numa_nodes: int = 1,
        cpus_per_numa: int = 2,
        seed: str = "fake",
        **kwargs: Any,
    ) -> FakeNvml:
        """A PCIe server: switches of ``gpus_per_switch`` GPUs spread over NUMA nodes."""
        per_numa = -(-count // numa_nodes)
        devices = [
            FakeDevice(
                uuid=f"GPU-{seed}-{i:04d}-0000-0000-000000000000",
                bus_id=f"00000000:{0x10 + i:02X}:00.0",
                numa_node=i // per_numa,
                cpus=tuple(range((i // per_numa) * cpus_per_numa,
                                 (i // per_numa + 1) * cpus_per_numa)),
            )
            for i in range(count)
        ]

        def level(i: int, j: int) -> int:
            if i == j:
                return pynvml.NVML_TOPOLOGY_INTERNAL
            if i // gpus_per_switch == j // gpus_per_switch:
                return pynvml.NVML_TOPOLOGY_SINGLE
            if i // per_numa == j // per_numa:
                return pynvml.NVML_TOPOLOGY_HOSTBRIDGE
            return pynvml.NVML_TOPOLOGY_SYSTEM

        topology = [[level(i, j) for j in range(count)] for i in range(count)]
        return cls(devices, topology, **kwargs)

    # -- test controls -----------------------------------------------------------------------

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "_hidden"):
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return object.__getattribute__(self, name)

    def hide(self, name: str) -> None:
        """Make ``name`` absent, as in a pynvml release that predates it."""
        self._hidden.add(name)

    def fail(self, index: int | None, function: str, code: int) -> None:
        """Make ``function`` (on device ``index``, or on any call when None) return ``code``."""
        if index is None:
            self.global_failures[function] = code
        else:
            self.devices[index].failures[function] = code

    def heal(self, index: int | None, function: str) -> None:
        if index is None:
            self.global_failures.pop(function, None)
        else:
            self.devices[index].failures.pop(function, None)

    def inject_event(self, index: int, event_type: int, data: int, device: Any = None) -> None:
        """Deliver an event from GPU ``index`` to every event set registered for it.
        ``device`` replaces the handle carried in the event (e.g. one NVML cannot identify)."""
        handle = self._handles[index] if device is None else device
        with self._cond:
            for es in self.event_sets:
                if not es.freed and es.masks.get(index, 0) & event_type:
                    es.queue.append(FakeEventData(handle, event_type, data))
            self._cond.notify_all()

    def inject_xid(self, index: int, xid: int, device: Any = None) -> None:
        self.inject_event(index, pynvml.nvmlEventTypeXidCriticalError, xid, device)

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus: every call about it answers GPU_IS_LOST."""
        self.devices[index].lost = True

    def restore_gpu(self, index: int) -> None:
        self.devices[index].lost = False

    def set_busy(
        self, gpus: Sequence[int], pids: Sequence[int], util: int = 97, memory_mib: int = 30000
    ) -> None:
        for g in gpus:
            dev = self.devices[g]
            dev.utilization = util
            dev.memory_used = memory_mib * MIB
            dev.processes = [(pid, memory_mib * MIB // max(1, len(pids))) for pid in pids]

    def set_idle(self, gpus: Sequence[int]) -> None:
        for g in gpus:
            dev = self.devices[g]
            dev.utilization = 0
            dev.memory_used = 0
            dev.processes = []

    @property
    def initialised(self) -> bool:
        return self.init_count > self.shutdown_count

    # -- internals ---------------------------------------------------------------------------

    def _enter(self, function: str) -> None:
        if function in self.global_failures:
            raise pynvml.NVMLError(self.global_failures[function])
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: Any, function: str) -> FakeDevice:
        self._enter(function)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev = self.devices[handle.index]
        if dev.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if function in dev.failures:
            raise pynvml.NVMLError(dev.failures[function])
        return dev

    def _str(self, text: str) -> str | bytes:
        return text.encode() if self.bytes_strings else text

    # -- library -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        if "nvmlInit" in self.global_failures:
            raise pynvml.NVMLError(self.global_failures["nvmlInit"])
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.shutdown_count += 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion")
        return self._str("550.54.15")

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev = self.devices[index]
        if dev.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if "nvmlDeviceGetHandleByIndex" in dev.failures:
            raise pynvml.NVMLError(dev.failures["nvmlDeviceGetHandleByIndex"])
        return self._handles[index]

    # -- device identity ---------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        return self._str(self._device(handle, "nvmlDeviceGetUUID").uuid)

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return self._str(self._device(handle, "nvmlDeviceGetName").name)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        dev = self._device(handle, "nvmlDeviceGetMinorNumber")
        return handle.index if dev.minor is None else dev.minor

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._device(handle, "nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        dev = self._device(handle, "nvmlDeviceGetPciInfo")
        return _pci_info(dev.bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        dev = self._device(handle, "nvmlDeviceGetMemoryInfo")
        return pynvml.c_nvmlMemory_t(
            total=dev.memory_total, free=dev.memory_total - dev.memory_used, used=dev.memory_used
        )

    # -- locality ----------------------------------------------------------------------------

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        dev = self._device(handle, "nvmlDeviceGetNumaNodeId")
        if dev.numa_node is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return dev.numa_node

    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpuSetSize: int) -> Any:
        dev = self._device(handle, "nvmlDeviceGetCpuAffinity")
        words = (ctypes.c_ulonglong * cpuSetSize)()
        for cpu in dev.cpus:
            if cpu // 64 < cpuSetSize:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        self._device(device1, "nvmlDeviceGetTopologyCommonAncestor")
        self._device(device2, "nvmlDeviceGetTopologyCommonAncestor")
        return self.topology[device1.index][device2.index]

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        dev = self._device(device, "nvmlDeviceGetNvLinkState")
        self._check_link(dev, link)
        return pynvml.NVML_FEATURE_ENABLED if link in dev.nvlinks else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> pynvml.nvmlPciInfo_t:
        dev = self._device(device, "nvmlDeviceGetNvLinkRemotePciInfo")
        self._check_link(dev, link)
        if link not in dev.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _pci_info(dev.nvlinks[link][1])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        dev = self._device(handle, "nvmlDeviceGetNvLinkRemoteDeviceType")
        self._check_link(dev, link)
        if link not in dev.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return dev.nvlinks[link][0]

    @staticmethod
    def _check_link(dev: FakeDevice, link: int) -> None:
        if dev.nvlink_count == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < dev.nvlink_count:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    # -- telemetry ---------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        dev = self._device(handle, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=dev.utilization, memory=dev.memory_utilization)

    def _processes(self, handle: Any, function: str) -> list[Any]:
        dev = self._device(handle, function)
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, used in dev.processes
        ]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v3")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v2")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        # pynvml wraps this in throwOnVersionMismatch: a driver without _v3 surfaces as
        # NVMLLibraryMismatchError, not as an NVMLError.
        try:
            return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses")
        except pynvml.NVMLError_FunctionNotFound:
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called") from None

    # -- events ------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        es = FakeEventSet()
        with self._cond:
            self.event_sets.append(es)
        return es

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetSupportedEventTypes").supported_events

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        dev = self._device(handle, "nvmlDeviceRegisterEvents")
        if eventTypes & ~dev.supported_events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._cond:
            eventSet.masks[handle.index] = eventSet.masks.get(handle.index, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> FakeEventData:
        self._enter("nvmlEventSetWait")
        if not isinstance(eventSet, FakeEventSet) or eventSet.freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._cond:
            if not eventSet.queue and timeoutms > 0:
                self.waiting.set()
                self._cond.wait_for(lambda: eventSet.queue or eventSet.freed, timeoutms / 1000.0)
                if eventSet.freed:
                    self.freed_while_waiting = True
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if not eventSet.queue:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return eventSet.queue.popleft()

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        with self._cond:
            eventSet.freed = True
            self._cond.notify_all()


def _pci_info(bus_id: str) -> pynvml.nvmlPciInfo_t:
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id.encode()[:15]
    domain, bus, devfn = bus_id.split(":")
    info.domain = int(domain, 16)
    info.bus = int(bus, 16)
    info.device = int(devfn.split(".")[0], 16)
    return info


# The same constants, error classes and result types the real module exposes.
for _name in dir(pynvml):
    if _name.startswith(("NVML_", "NVMLError", "nvmlEventType", "c_nvml")) or _name in (
        "NVMLLibraryMismatchError",
        "nvmlPciInfo_t",
        "nvmlFriendlyObject",
    ):
        setattr(FakeNvml, _name, getattr(pynvml, _name))
del _name
