"""The real GPUs, through NVML (pynvml from the nvidia-ml-py package).

Every NVML failure becomes state an operator can read (``GpuSample.error``, ``healthy``) instead
of an exception escaping into the daemon: a GPU that falls off the bus must cost one GPU, not the
node daemon. Health comes from NVML's Xid critical-error events, filtered like the NVIDIA device
plugin does (application Xids are ignored), and is sticky: a GPU taken out of service stays out
until the operator recovers it or a re-initialisation of NVML finds it working.

The pynvml module is injectable (``NvmlGpuBackend(nvml=module)``) so tests drive this exact code
against a fake device set.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from noded.gpu.base import (
    APPLICATION_XIDS,
    GPU_IS_LOST,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_LEVELS,
    TOPOLOGY_SYSTEM,
    GpuBackendError,
    GpuHealthEvent,
    GpuSample,
    Topology,
    check_job_gpus,
    switch_groups,
    xid_reason,
)
from noded.gpu.devices import GpuDeviceNodes
from noded.gpu.health import HealthTracker
from noded.gpu.numa import affinity_node, mask_words
from noded.gpu.nvdevices import PROC_DEVICES, nvidia_device_nodes, read_proc_devices, run_ldconfig
from shared.model import GpuInfo

log = logging.getLogger("trellis.gpu.nvml")

MIB = 1 << 20
MAX_EVENTS_PER_POLL = 256  # an Xid storm must not keep the health thread in one call forever
# Newest first: _v3 needs a recent driver, the unversioned name exists in old pynvml only or
# raises NVMLLibraryMismatchError in new pynvml when the driver lacks _v3.
PROCESS_FUNCTIONS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
_INIT_HINT = (
    "is the NVIDIA driver loaded and libnvidia-ml.so.1 on the library path? "
    "(nvidia-smi must work for this user)"
)

T = TypeVar("T")


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def bus_key(bus_id: Any) -> str | None:
    """Canonical ``domain:bus:device.function`` so NVML's ``00000000:3B:00.0`` and a
    ``0000:3b:00.0`` spelling compare equal; None when it is not a PCI address."""
    text = _text(bus_id).strip().rstrip("\x00")
    try:
        domain, bus, devfn = text.split(":")
        dev, _, fn = devfn.partition(".")
        return f"{int(domain, 16):x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0', 16)}"
    except ValueError:
        return None


def _same_handle(a: Any, b: Any) -> bool:
    if a is b:
        return True
    # pynvml hands out a fresh ctypes pointer object per call; compare what they point to.
    if isinstance(a, ctypes._Pointer) and isinstance(b, ctypes._Pointer):
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    return False


@dataclass(frozen=True)
class _Static:
    """What NVML says about a device that does not change while it runs."""

    uuid: str
    model: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int


@dataclass
class _Devices:
    """One NVML session's view of the node: rebuilt as a whole by :meth:`reinit`."""

    handles: list[Any]  # None where NVML gave no handle
    static: list[_Static]
    broken: dict[int, str]  # index -> why it was unusable at discovery
    topology: Topology
    nvlink: Topology
    event_set: Any
    events_supported: list[bool]


class _DeviceLost(Exception):
    """Internal: a query found the GPU lost; the remaining queries of that sample are moot."""


class NvmlGpuBackend:
    name = "nvml"

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        ignored_xids: frozenset[int] = APPLICATION_XIDS,
        sys_root: str | Path = "/sys",
        proc_devices: Path = PROC_DEVICES,
        ldconfig: Callable[[], str] = run_ldconfig,
        dev_root: Path = Path("/dev"),
    ) -> None:
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                raise GpuBackendError(
                    "pynvml is not installed (install the nvidia-ml-py package)"
                ) from None
        self._nvml = nvml
        self._sys_root = Path(sys_root)
        # Where device_nodes() looks (tests give a /proc/devices text and ldconfig's output).
        self._proc_devices, self._ldconfig, self._dev_root = proc_devices, ldconfig, dev_root
        self._device_nodes: GpuDeviceNodes | None = None
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        self._mismatch: tuple[type[BaseException], ...] = (mismatch,) if mismatch else ()
        self._lock = threading.Lock()  # guards self._dev against reinit/close
        self._poll_lock = threading.Lock()  # no event set is freed while a thread waits on it
        self._closed = False
        self._proc_fn: str | None = None
        # Last UUID read at each index: names a GPU that stops answering, and tells a GPU that
        # comes back after re-initialisation from a different one.
        self._known: dict[int, str] = {}
        self._dev = self._discover()
        self._health = HealthTracker([s.uuid for s in self._dev.static], ignored_xids)
        for index, reason in self._dev.broken.items():
            # The inventory already carries this; no event for a state the daemon never saw.
            self._health.mark_unhealthy(index, reason, announce=False)

    # -- device files ------------------------------------------------------------------------

    def device_nodes(self) -> GpuDeviceNodes:
        """The GPUs' device files (by minor number), the control files and the driver's
        libraries (noded.gpu.nvdevices); read once, they do not change while the driver is
        loaded. A GPU whose minor number NVML cannot tell has no entry: the fence then cannot
        name it, and a job can never be given it (the device is broken anyway)."""
        if self._device_nodes is not None:
            return self._device_nodes
        nv = self._nvml
        with self._lock:
            handles = list(self._dev.handles)
        minors: dict[int, int] = {}
        for i, handle in enumerate(handles):
            if handle is None:
                continue
            try:
                minors[i] = int(nv.nvmlDeviceGetMinorNumber(handle))
            except nv.NVMLError as exc:
                log.warning("gpu_minor_unknown index=%d error=%r", i, self._describe("minor", exc))
        nodes = nvidia_device_nodes(minors, read_proc_devices(self._proc_devices),
                                    self._ldconfig(), self._dev_root)
        log.info("gpu_device_files gpus=%s control=%s libraries=%d",
                 {i: n.path for i, n in nodes.gpus.items()}, [n.path for n in nodes.control],
                 len(nodes.libraries))
        self._device_nodes = nodes
        return nodes

    # -- discovery ---------------------------------------------------------------------------

    def _is(self, exc: BaseException, name: str) -> bool:
        return getattr(exc, "value", None) == getattr(self._nvml, name, object())

    def _describe(self, what: str, exc: BaseException) -> str:
        if self._is(exc, "NVML_ERROR_GPU_IS_LOST"):
            return GPU_IS_LOST
        if self._is(exc, "NVML_ERROR_NOT_SUPPORTED") or self._is(
            exc, "NVML_ERROR_FUNCTION_NOT_FOUND"
        ):
            return f"{what}: not supported"
        if self._is(exc, "NVML_ERROR_NO_PERMISSION"):
            return f"{what}: insufficient permissions"
        return f"{what}: {exc}"

    def _discover(self) -> _Devices:
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise GpuBackendError(f"NVML initialisation failed: {exc}; {_INIT_HINT}") from None
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            self._shutdown_quietly()
            raise GpuBackendError(f"NVML could not count the GPUs: {exc}") from None
        handles: list[Any] = []
        static: list[_Static] = []
        broken: dict[int, str] = {}
        for i in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError as exc:
                handle = None
                broken[i] = self._describe("device handle", exc)
            handles.append(handle)
            static.append(self._read_static(i, handle, broken))
            if i not in broken:
                self._known[i] = static[-1].uuid
        topology = self._read_topology(handles)
        nvlink = self._read_nvlink(handles, [s.pci_bus_id for s in static])
        event_set, supported = self._register_events(handles)
        log.info(
            "gpu_backend=nvml count=%d models=%s switches=%d broken=%s",
            count, sorted({s.model for s in static}),
            len(set(switch_groups(topology))), broken or "none",
        )
        return _Devices(handles, static, broken, topology, nvlink, event_set, supported)

    def _read_static(self, i: int, handle: Any, broken: dict[int, str]) -> _Static:
        nv = self._nvml

        def read(what: str, fn: Callable[[], T], default: T) -> T:
            if handle is None:
                return default
            try:
                return fn()
            except nv.NVMLError as exc:
                reason = self._describe(what, exc)
                log.warning("gpu_query_failed index=%d what=%s error=%r", i, what, reason)
                if reason == GPU_IS_LOST or what == "uuid":
                    broken.setdefault(i, reason)
                return default

        uuid = read("uuid", lambda: _text(nv.nvmlDeviceGetUUID(handle)),
                    self._known.get(i, f"unknown-gpu-{i}"))
        model = read("name", lambda: _text(nv.nvmlDeviceGetName(handle)), "unknown")
        memory = read("memory", lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).total) // MIB, 0)
        bus = read("pci info", lambda: _text(nv.nvmlDeviceGetPciInfo(handle).busId), "")
        numa = self._numa_node(i, handle) if handle is not None and i not in broken else -1
        return _Static(uuid[:128], model[:128], memory, bus[:64], numa)

    def _numa_node(self, i: int, handle: Any) -> int:
        nv = self._nvml
        numa_fn = getattr(nv, "nvmlDeviceGetNumaNodeId", None)
        if numa_fn is not None:
            try:
                node = int(numa_fn(handle))
                if node >= 0:
                    return node
            except nv.NVMLError as exc:
                log.debug("gpu_numa_id_unavailable index=%d error=%r", i, str(exc))
        try:
            words = nv.nvmlDeviceGetCpuAffinity(handle, mask_words(os.cpu_count() or 1))
        except nv.NVMLError as exc:
            log.warning("gpu_numa_unknown index=%d error=%r", i, str(exc))
            return -1
        return affinity_node(list(words), self._sys_root)

    def _read_topology(self, handles: list[Any]) -> Topology:
        nv = self._nvml
        n = len(handles)
        matrix = [[TOPOLOGY_INTERNAL if i == j else TOPOLOGY_SYSTEM for j in range(n)]
                  for i in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                if handles[i] is None or handles[j] is None:
                    continue  # unknown path: assume the farthest, never a false locality
                try:
                    level = int(nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
                except nv.NVMLError as exc:
                    log.warning("gpu_topology_unknown pair=%d,%d error=%r", i, j, str(exc))
                    continue
                if level not in TOPOLOGY_LEVELS:
                    log.warning("gpu_topology_level_unknown pair=%d,%d level=%d", i, j, level)
                    continue
                matrix[i][j] = matrix[j][i] = level
        return tuple(tuple(row) for row in matrix)

    def _read_nvlink(self, handles: list[Any], bus_ids: list[str]) -> Topology:
        """Active NVLink links between each GPU pair (0 where none).

        Links to another GPU of this node count for that pair. Links to an NVSwitch connect a
        GPU to every other switch-attached GPU, so such a pair counts the smaller of the two
        GPUs' switch-link counts. Links to anything else (a CPU's NPU) are not GPU paths.
        """
        nv = self._nvml
        n = len(handles)
        by_bus = {k: i for i, b in enumerate(bus_ids) if (k := bus_key(b)) is not None}
        direct = [[0] * n for _ in range(n)]
        to_switch = [0] * n
        max_links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
        enabled = getattr(nv, "NVML_FEATURE_ENABLED", 1)
        switch_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        gpu_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
        type_fn = getattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        for i, handle in enumerate(handles):
            if handle is None:
                continue
            for link in range(max_links):
                try:
                    if nv.nvmlDeviceGetNvLinkState(handle, link) != enabled:
                        continue
                except nv.NVMLError:
                    break  # NOT_SUPPORTED: no NVLink; INVALID_ARGUMENT: past the last link
                remote_type = None
                if type_fn is not None:
                    try:
                        remote_type = type_fn(handle, link)
                    except nv.NVMLError:
                        remote_type = None
                if remote_type == switch_type:
                    to_switch[i] += 1
                    continue
                try:
                    peer = by_bus.get(bus_key(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                                              .busId) or "")
                except nv.NVMLError:
                    continue
                if peer is not None and peer != i:
                    direct[i][peer] += 1
                elif peer is None and remote_type is None:
                    # No device type available: a remote that is not one of our GPUs is, on
                    # every NVLink system without NPUs, an NVSwitch.
                    to_switch[i] += 1
                elif remote_type not in (None, gpu_type):
                    log.debug("gpu_nvlink_other index=%d link=%d type=%s", i, link, remote_type)
        matrix = [[0] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                if i != j:
                    # Both ends see a direct link; the smaller count is the one both agree on.
                    matrix[i][j] = min(direct[i][j], direct[j][i]) + min(to_switch[i],
                                                                         to_switch[j])
        return tuple(tuple(row) for row in matrix)

    def _register_events(self, handles: list[Any]) -> tuple[Any, list[bool]]:
        nv = self._nvml
        supported = [False] * len(handles)
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.error("gpu_health_events_unavailable error=%r (no Xid health checks)", str(exc))
            return None, supported
        xid_mask = nv.nvmlEventTypeXidCriticalError
        for i, handle in enumerate(handles):
            if handle is None:
                continue
            try:
                types = nv.nvmlDeviceGetSupportedEventTypes(handle)
                if not types & xid_mask:
                    log.warning("gpu_health_events_unsupported index=%d (too old for Xid "
                                "events; faults will show only as failed queries)", i)
                    continue
                nv.nvmlDeviceRegisterEvents(handle, xid_mask, event_set)
                supported[i] = True
            except nv.NVMLError as exc:
                log.warning("gpu_health_events_unsupported index=%d error=%r", i, str(exc))
        return event_set, supported

    def _shutdown_quietly(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("nvml_shutdown_failed error=%r", str(exc))

    def _free_events(self, dev: _Devices) -> None:
        if dev.event_set is None:
            return
        try:
            self._nvml.nvmlEventSetFree(dev.event_set)
        except self._nvml.NVMLError as exc:
            log.debug("nvml_event_set_free_failed error=%r", str(exc))
        dev.event_set = None

    # -- inventory ---------------------------------------------------------------------------

    def inventory(self) -> tuple[tuple[GpuInfo, ...], Topology]:
        with self._lock:
            dev = self._dev
        switches = switch_groups(dev.topology)
        gpus = tuple(
            GpuInfo(
                index=i,
                uuid=s.uuid,
                model=s.model,
                memory_mib=s.memory_mib,
                numa_node=s.numa_node,
                pci_bus_id=s.pci_bus_id,
                pcie_switch=switches[i],
                healthy=self._health.healthy(i),
            )
            for i, s in enumerate(dev.static)
        )
        return gpus, dev.topology

    def nvlink_matrix(self) -> Topology:
        """Active NVLink links between GPU i and j (NVML-only; the PCIe matrix is separate)."""
        with self._lock:
            return self._dev.nvlink

    def health_events_supported(self) -> tuple[bool, ...]:
        with self._lock:
            return tuple(self._dev.events_supported)

    # -- telemetry ---------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        with self._lock:
            if self._closed:
                raise GpuBackendError("the NVML GPU backend is closed")
            dev = self._dev
        return [self._sample_one(i, dev) for i in range(len(dev.handles))]

    def _sample_one(self, i: int, dev: _Devices) -> GpuSample:
        nv = self._nvml
        handle = dev.handles[i]
        total = dev.static[i].memory_mib
        if handle is None:
            reason = dev.broken.get(i, GPU_IS_LOST)
            return GpuSample(i, 0.0, 0, total, (), False, reason)
        errors: list[str] = []
        failed = False

        def query(what: str, fn: Callable[[], T], default: T) -> T:
            nonlocal failed
            try:
                return fn()
            except nv.NVMLError as exc:
                reason = self._describe(what, exc)
                if reason == GPU_IS_LOST:
                    raise _DeviceLost from None
                if self._is(exc, "NVML_ERROR_RESET_REQUIRED"):
                    # Sticky, and the sticky reason heads the error list already.
                    self._health.mark_unhealthy(i, f"{what}: GPU requires reset")
                    return default
                if not reason.endswith(("not supported", "insufficient permissions")):
                    failed = True  # we cannot vouch for a GPU that errs on a basic query
                errors.append(reason)
                return default

        try:
            util = float(query("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu,
                               0))
            memory = query("memory", lambda: nv.nvmlDeviceGetMemoryInfo(handle), None)
            procs = query("processes", lambda: self._processes(handle), ())
        except _DeviceLost:
            self._health.mark_unhealthy(i, GPU_IS_LOST)
            return GpuSample(i, 0.0, 0, total, (), False, GPU_IS_LOST)
        except Exception as exc:  # a pynvml/driver surprise must not take the daemon down
            log.exception("gpu_sample_failed index=%d", i)
            return GpuSample(i, 0.0, 0, total, (), False, f"sampling failed: {exc!r}")
        used = int(memory.used) // MIB if memory is not None else 0
        if memory is not None:
            total = int(memory.total) // MIB
        sticky = self._health.reason(i)
        if sticky is not None:
            errors.insert(0, sticky)
        return GpuSample(
            index=i,
            utilization_pct=max(0.0, min(100.0, util)),
            memory_used_mib=used,
            memory_total_mib=total,
            processes=procs,
            healthy=sticky is None and not failed,
            error="; ".join(errors) or None,
        )

    def _processes(self, handle: Any) -> tuple[tuple[int, int], ...]:
        nv = self._nvml
        names = (self._proc_fn,) if self._proc_fn else PROCESS_FUNCTIONS
        last: BaseException | None = None
        for name in names:
            fn = getattr(nv, name, None)
            if fn is None:
                continue
            try:
                procs = fn(handle)
            except self._mismatch as exc:
                last = exc
                continue
            except nv.NVMLError as exc:
                if self._is(exc, "NVML_ERROR_FUNCTION_NOT_FOUND"):
                    last = exc
                    continue
                raise
            self._proc_fn = name
            return tuple(
                (int(p.pid), int(p.usedGpuMemory or 0) // MIB) for p in procs
            )
        if isinstance(last, nv.NVMLError):
            raise last
        raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)

    # -- health ------------------------------------------------------------------------------

    def poll_health(self, timeout_ms: int = 0) -> list[GpuHealthEvent]:
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
        nv = self._nvml
        with self._poll_lock:
            with self._lock:
                dev = self._dev
                closed = self._closed
            if closed or dev.event_set is None:
                return self._health.take(0 if closed else timeout_ms / 1000.0)
            wait = 0 if self._health.has_pending() else timeout_ms
            for _ in range(MAX_EVENTS_PER_POLL):
                try:
                    data = nv.nvmlEventSetWait(dev.event_set, wait)
                except nv.NVMLError as exc:
                    if not self._is(exc, "NVML_ERROR_TIMEOUT"):
                        log.warning("gpu_event_wait_failed error=%r", str(exc))
                        # Honour the timeout anyway so a failing wait cannot spin the thread.
                        return self._health.take(wait / 1000.0)
                    break
                wait = 0
                self._handle_event(dev, data)
        return self._health.take(0)

    def _handle_event(self, dev: _Devices, data: Any) -> None:
        nv = self._nvml
        if int(data.eventType) != nv.nvmlEventTypeXidCriticalError:
            log.debug("gpu_event_ignored type=%#x", int(data.eventType))
            return
        xid = int(data.eventData)
        index = self._event_index(dev, data.device)
        if index is not None:
            self._health.xid(index, xid)
            return
        if xid in self._health.ignored_xids:
            log.info("gpu_xid_ignored index=unknown xid=%d why=application-error", xid)
            return
        # Like the device plugin: an Xid we cannot attribute may be on any GPU, so none is
        # trusted until the operator looks.
        reason = f"{xid_reason(xid)} on an unidentified GPU"
        for i in range(len(dev.handles)):
            self._health.mark_unhealthy(i, reason, xid=xid)

    def _event_index(self, dev: _Devices, device: Any) -> int | None:
        nv = self._nvml
        try:
            uuid = _text(nv.nvmlDeviceGetUUID(device))
            for i, s in enumerate(dev.static):
                if s.uuid == uuid:
                    return i
        except nv.NVMLError:
            pass
        for i, handle in enumerate(dev.handles):
            if handle is not None and _same_handle(handle, device):
                return i
        return None

    def recover(self, index: int, reason: str = "recovered by operator") -> None:
        with self._lock:
            count = len(self._dev.handles)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
            raise ValueError(f"GPU index {index!r} does not exist (this node has {count})")
        self._health.recover(index, reason)

    def reinit(self) -> list[int]:
        """Restart the NVML session and re-read every device; returns the GPUs it recovered.

        A GPU is recovered when, after re-initialisation, the same UUID answers at its index.
        Raises :class:`GpuBackendError` when NVML does not come back (GPUs stay as they were).
        """
        with self._poll_lock, self._lock:
            if self._closed:
                raise GpuBackendError("the NVML GPU backend is closed")
            old = self._dev
            before = dict(self._known)
            self._free_events(old)
            self._shutdown_quietly()
            try:
                new = self._discover()
            except GpuBackendError:
                # Keep the old static view but without handles: they belong to a dead session.
                self._dev = _Devices(
                    [None] * len(old.handles), old.static,
                    dict.fromkeys(range(len(old.handles)), "NVML unavailable"),
                    old.topology, old.nvlink, None, [False] * len(old.handles),
                )
                raise
            self._dev = new
            self._proc_fn = None
        self._health.set_uuids([s.uuid for s in new.static])
        if len(new.static) != len(old.static):
            log.warning("gpu_count_changed before=%d after=%d", len(old.static), len(new.static))
        recovered = []
        for i, s in enumerate(new.static):
            if i in new.broken:
                self._health.mark_unhealthy(i, new.broken[i])
            elif before.get(i) in (None, s.uuid):
                if self._health.recover(i, "recovered by NVML re-initialisation"):
                    recovered.append(i)
            else:
                self._health.mark_unhealthy(i, f"a different GPU ({s.uuid}) appeared at index {i}")
        return recovered

    # -- jobs (NVML sees the processes itself) -----------------------------------------------

    def job_env(self, job_id: str, owner_uid: int | None = None) -> dict[str, str]:
        return {}

    def job_started(self, job_id: str, gpus: tuple[int, ...], pids: tuple[int, ...]) -> None:
        with self._lock:
            count = len(self._dev.handles)
        check_job_gpus(job_id, gpus, count)

    def job_pids(self, job_id: str, pids: tuple[int, ...]) -> None:
        return None

    def job_ended(self, job_id: str) -> None:
        return None

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        self._health.close()
        with self._poll_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            self._free_events(self._dev)
            self._shutdown_quietly()
        log.info("gpu_backend=nvml closed")
