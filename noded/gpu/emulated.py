"""Emulated GPUs for the demo and for tests on machines without NVIDIA hardware.

The device set is deterministic (UUIDs derive from a per-node seed, so two emulated nodes never
share one) and its topology is that of a typical PCIe server: ``gpus_per_switch`` GPUs behind
each PCIe switch, switches spread over NUMA nodes. Utilisation is not random: it follows the
jobs the daemon runs. A GPU held by a job with a live process reports ``busy_util`` (or the
rate-driven figure from the job's progress file, see :mod:`noded.gpu.progress`), an idle GPU 0.
Faults are injected with :meth:`EmulatedGpuBackend.inject_fault` and go through the same Xid
filter and sticky health as the NVML backend. A running daemon takes them from its fault
directory (``fault_dir``, noded's STATE_DIR/gpu-faults): each file ``*.xid`` holding
``INDEX XID`` is one Xid the "driver" raises on the next health poll, as a real driver's
event would arrive; the file is removed once read (:func:`write_fault`).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from noded.gpu.base import (
    APPLICATION_XIDS,
    GPU_IS_LOST,
    LOST_XIDS,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    GpuBackendError,
    GpuHealthEvent,
    GpuSample,
    Topology,
    check_job_gpus,
    switch_groups,
)
from noded.gpu.declared import MEMORY_FILE_NAME, UTIL_FILE_NAME, read_declared
from noded.gpu.devices import GpuDeviceNodes
from noded.gpu.emudevices import make_device_files
from noded.gpu.health import HealthTracker
from noded.gpu.progress import PROGRESS_ENV, PROGRESS_FILE_NAME, ProgressMeter
from shared.model import GpuInfo, check_name
from shared.schema import bounded

log = logging.getLogger("trellis.gpu.emulated")

# Fixed namespace so the same seed gives the same UUIDs on every run and every machine.
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "trellis:emulated-gpu")
# Names the directory of the emulated GPUs' device files in a job's environment.
DEV_DIR_ENV = "TRELLIS_EMULATED_DEV_DIR"


@dataclass(frozen=True)
class EmulatedGpuConfig:
    count: int = bounded(4, min=0, max=1024)
    model: str = bounded("A100-SXM4-40GB", max_len=128)
    memory_mib: int = bounded(40960, min=1, max=1 << 30)
    gpus_per_switch: int = bounded(2, min=1, max=1024)
    # GPUs attached to each NUMA node; None spreads ``count`` evenly over ``numa_nodes``.
    gpus_per_numa: int | None = bounded(None, min=1, max=1024)
    numa_nodes: int = bounded(1, min=1, max=1024)
    # Usually the node's name: makes the UUIDs differ between nodes and stay put across restarts.
    uuid_seed: str = bounded("node-name", max_len=255)
    busy_util: float = bounded(90.0, min=0, max=100)
    # Memory a live job holds on each of its GPUs; None means three quarters of memory_mib.
    busy_memory_mib: int | None = bounded(None, min=0, max=1 << 30)
    # Where per-job progress directories go; None means a private temporary directory, removed
    # on close (noded gives its state directory's gpu-progress, which outlives a restart).
    progress_dir: str | None = bounded(None, max_len=4096)
    rate_window_s: float = bounded(10.0, min=0.001, max=3600)
    min_rate_interval_s: float = bounded(1.0, min=0, max=3600)
    # Where Xid faults are dropped for a running daemon to raise (None: nowhere).
    fault_dir: str | None = bounded(None, max_len=4096)
    # Where the GPUs' device files are created (character devices 195:N and nvidiactl 195:255,
    # noded.gpu.emudevices; needs root); None: the emulated GPUs have no device files.
    dev_dir: str | None = bounded(None, max_len=4096)

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise ValueError("model must not be empty")
        if not self.uuid_seed:
            raise ValueError("uuid_seed must not be empty")
        if not 0 < self.busy_util <= 100:
            raise ValueError(f"busy_util must be in (0, 100], got {self.busy_util}")
        if self.busy_memory_mib is not None and self.busy_memory_mib > self.memory_mib:
            raise ValueError(
                f"busy_memory_mib ({self.busy_memory_mib}) exceeds memory_mib ({self.memory_mib})"
            )
        if self.min_rate_interval_s >= self.rate_window_s:
            raise ValueError(
                f"min_rate_interval_s ({self.min_rate_interval_s}) must be shorter than "
                f"rate_window_s ({self.rate_window_s})"
            )
        per_numa = self.numa_group_size
        if per_numa * self.numa_nodes < self.count:
            raise ValueError(
                f"gpus_per_numa ({per_numa}) x numa_nodes ({self.numa_nodes}) is less than "
                f"count ({self.count})"
            )
        if self.count > per_numa and per_numa % self.gpus_per_switch:
            raise ValueError(
                f"a PCIe switch cannot span NUMA nodes: gpus_per_numa ({per_numa}) must be a "
                f"multiple of gpus_per_switch ({self.gpus_per_switch})"
            )

    @property
    def numa_group_size(self) -> int:
        if self.gpus_per_numa is not None:
            return self.gpus_per_numa
        return max(1, math.ceil(self.count / self.numa_nodes))

    @property
    def job_memory_mib(self) -> int:
        if self.busy_memory_mib is not None:
            return self.busy_memory_mib
        return self.memory_mib * 3 // 4


def emulated_uuid(seed: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{seed}/{index}')}"


def emulated_topology(config: EmulatedGpuConfig) -> Topology:
    switch = [i // config.gpus_per_switch for i in range(config.count)]
    numa = [i // config.numa_group_size for i in range(config.count)]

    def level(i: int, j: int) -> int:
        if i == j:
            return TOPOLOGY_INTERNAL
        if switch[i] == switch[j]:
            return TOPOLOGY_SINGLE
        if numa[i] == numa[j]:
            return TOPOLOGY_NODE
        return TOPOLOGY_SYSTEM

    return tuple(tuple(level(i, j) for j in range(config.count)) for i in range(config.count))


def _process_start(pid: int) -> float | None:
    """Start time of a live, non-zombie process; None if there is none."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


@dataclass
class _EmulatedJob:
    gpus: tuple[int, ...]
    # pid -> start time when registered; comparing it defeats pid reuse.
    pids: dict[int, float | None] = field(default_factory=dict)
    meter: ProgressMeter | None = None
    progress_dir: Path | None = None
    last: tuple[float, int] | None = None  # (utilisation %, memory MiB) at the last sample

    def declared(self, default_mib: int) -> tuple[float | None, int]:
        """(utilisation, memory) the job declared in its progress directory, if it did."""
        if self.progress_dir is None:
            return None, default_mib
        util = read_declared(self.progress_dir / UTIL_FILE_NAME, 100.0)
        memory = read_declared(self.progress_dir / MEMORY_FILE_NAME, float(1 << 30))
        return util, default_mib if memory is None else int(memory)

    def set_pids(self, pids: tuple[int, ...]) -> None:
        self.pids = {pid: _process_start(pid) for pid in pids}

    def alive_pids(self) -> list[int]:
        return [
            pid
            for pid, start in self.pids.items()
            if start is not None and _process_start(pid) == start
        ]


class EmulatedGpuBackend:
    name = "emulated"

    def __init__(
        self,
        config: EmulatedGpuConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        ignored_xids: frozenset[int] = APPLICATION_XIDS,
    ) -> None:
        self.config = config if config is not None else EmulatedGpuConfig()
        self._clock = clock
        cfg = self.config
        self._uuids = tuple(emulated_uuid(cfg.uuid_seed, i) for i in range(cfg.count))
        self._topology = emulated_topology(cfg)
        self._switch = switch_groups(self._topology)
        self._health = HealthTracker(self._uuids, ignored_xids)
        self._lock = threading.Lock()
        self._jobs: dict[str, _EmulatedJob] = {}
        self._lost: set[int] = set()
        self._closed = False
        self._own_progress_root = cfg.progress_dir is None
        self._progress_root = Path(
            tempfile.mkdtemp(prefix="trellis-gpu-progress-")
            if cfg.progress_dir is None
            else cfg.progress_dir
        )
        if not self._own_progress_root:
            self._progress_root.mkdir(parents=True, exist_ok=True)
        # Job users must reach their own directory but need not list the others.
        os.chmod(self._progress_root, 0o711)
        self._progress_dirs: dict[str, Path] = {}
        # Left in place on close: jobs outlive a restart of the daemon and keep using them.
        self._device_nodes = (make_device_files(cfg.dev_dir, cfg.count) if cfg.dev_dir
                              else GpuDeviceNodes({}))
        log.info(
            "gpu_backend=emulated count=%d model=%s switches=%d numa_nodes=%d progress_dir=%s",
            cfg.count, cfg.model, len(set(self._switch)), cfg.numa_nodes, self._progress_root,
        )

    # -- inventory ---------------------------------------------------------------------------

    def _bus_id(self, index: int) -> str:
        return f"{index // 256:08X}:{index % 256:02X}:00.0"

    def inventory(self) -> tuple[tuple[GpuInfo, ...], Topology]:
        cfg = self.config
        gpus = tuple(
            GpuInfo(
                index=i,
                uuid=self._uuids[i],
                model=cfg.model,
                memory_mib=cfg.memory_mib,
                numa_node=i // cfg.numa_group_size,
                pci_bus_id=self._bus_id(i),
                pcie_switch=self._switch[i],
                healthy=self._health.healthy(i),
            )
            for i in range(cfg.count)
        )
        return gpus, self._topology

    def device_nodes(self) -> GpuDeviceNodes:
        """The emulated GPUs' device files in ``dev_dir`` (none without one)."""
        return self._device_nodes

    # -- telemetry ---------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        cfg = self.config
        now = self._clock()
        util = [0.0] * cfg.count
        mem = [0] * cfg.count
        procs: list[list[tuple[int, int]]] = [[] for _ in range(cfg.count)]
        with self._lock:
            self._check_open()
            for job in self._jobs.values():
                alive = job.alive_pids()
                if not alive:
                    continue
                job_util = cfg.busy_util
                if job.meter is not None:
                    job.meter.update(now)
                    measured = job.meter.utilization()
                    if measured is not None:
                        job_util = measured
                # What the job declared it uses (noded.gpu.declared), where it did.
                declared_util, job_mem = job.declared(cfg.job_memory_mib)
                if declared_util is not None:
                    job_util = declared_util
                job.last = (job_util, job_mem)
                # Every live process of the job is listed on each of its GPUs, sharing the
                # job's memory there: which process holds which context is not modelled.
                # Jobs sharing a GPU add up on it (utilisation and memory), as on a real one.
                share, extra = divmod(job_mem, len(alive))
                for g in job.gpus:
                    util[g] += job_util
                    mem[g] += job_mem
                    for k, pid in enumerate(alive):
                        procs[g].append((pid, share + (extra if k == 0 else 0)))
            lost = set(self._lost)
        samples = []
        for g in range(cfg.count):
            if g in lost:
                samples.append(GpuSample(g, 0.0, 0, cfg.memory_mib, (), False, GPU_IS_LOST))
                continue
            samples.append(
                GpuSample(
                    index=g,
                    utilization_pct=min(100.0, util[g]),
                    memory_used_mib=min(cfg.memory_mib, mem[g]),
                    memory_total_mib=cfg.memory_mib,
                    processes=tuple(procs[g]),
                    healthy=self._health.healthy(g),
                    error=self._health.reason(g),
                )
            )
        return samples

    # -- health ------------------------------------------------------------------------------

    def poll_health(self, timeout_ms: int = 0) -> list[GpuHealthEvent]:
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
        self._raise_dropped_faults()
        return self._health.take(timeout_ms / 1000.0)

    def _raise_dropped_faults(self) -> None:
        """Raise the Xids dropped in the fault directory (oldest first) and remove them."""
        if self.config.fault_dir is None:
            return
        root = Path(self.config.fault_dir)
        try:
            dropped = sorted(root.glob("*.xid"), key=lambda p: p.stat().st_mtime_ns)
        except OSError:
            return  # the directory (or a file) vanished meanwhile: nothing to raise
        for path in dropped:
            try:
                text = path.read_text()
                path.unlink()
            except OSError:
                continue
            try:
                index, xid = (int(word) for word in text.split())
                self.inject_fault(index, xid)
            except ValueError as exc:
                log.warning("gpu_fault_file_ignored file=%s content=%r error=%s", path.name,
                            text[:64], exc)

    def inject_fault(self, index: int, xid: int) -> bool:
        """Raise Xid ``xid`` on GPU ``index`` as the driver would; returns whether it took the
        GPU out of service (application Xids do not). Xid 79 also makes the GPU lost."""
        self._check_index(index)
        if not isinstance(xid, int) or isinstance(xid, bool) or xid < 0:
            raise ValueError(f"xid must be a non-negative integer, got {xid!r}")
        log.warning("gpu_fault_injected index=%d xid=%d", index, xid)
        took = self._health.xid(index, xid)
        if xid in LOST_XIDS and xid not in self._health.ignored_xids:
            with self._lock:
                self._lost.add(index)
        return took

    def recover(self, index: int, reason: str = "recovered by operator") -> None:
        self._check_index(index)
        with self._lock:
            self._lost.discard(index)
        self._health.recover(index, reason)

    # -- jobs --------------------------------------------------------------------------------

    def job_env(self, job_id: str, owner_uid: int | None = None) -> dict[str, str]:
        check_name(job_id, "job id")
        with self._lock:
            self._check_open()
            path = self._progress_dirs.get(job_id)
            if path is None:
                path = self._progress_root / job_id
                path.mkdir(mode=0o700, exist_ok=True)
                self._progress_dirs[job_id] = path
            if owner_uid is not None:
                os.chown(path, owner_uid, -1)
        env = {PROGRESS_ENV: str(path / PROGRESS_FILE_NAME)}
        if self._device_nodes.gpus:
            # Where this machine's stand-in for /dev/nvidia* is, for jobs (and probes) to open.
            env[DEV_DIR_ENV] = str(self.config.dev_dir)
        return env

    def job_started(self, job_id: str, gpus: tuple[int, ...], pids: tuple[int, ...]) -> None:
        check_name(job_id, "job id")
        check_job_gpus(job_id, gpus, self.config.count)
        job = _EmulatedJob(gpus=tuple(gpus))
        job.set_pids(tuple(pids))
        with self._lock:
            self._check_open()
            progress = self._progress_dirs.get(job_id)
            if progress is None and (self._progress_root / job_id).is_dir():
                # A job a restarted daemon re-adopts: it still writes where it was told to.
                progress = self._progress_dirs[job_id] = self._progress_root / job_id
            if progress is not None:
                job.progress_dir = progress
                job.meter = ProgressMeter(
                    progress / PROGRESS_FILE_NAME,
                    self.config.rate_window_s,
                    self.config.min_rate_interval_s,
                )
            self._jobs[job_id] = job
        log.info("gpu_job_started job=%s gpus=%s pids=%s", job_id, list(gpus), list(pids))

    def job_pids(self, job_id: str, pids: tuple[int, ...]) -> None:
        """Replace the job's process set (the daemon reports it as processes come and go)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise ValueError(f"job {job_id!r} is not running on the emulated GPUs")
            job.set_pids(tuple(pids))

    def job_utilization(self, job_id: str) -> float | None:
        """The job's own share of its GPUs' utilisation at the last sample (what a shared
        GPU's total hides), or None before one."""
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None or job.last is None else job.last[0]

    def job_memory(self, job_id: str) -> int | None:
        """GPU memory the job held on each of its GPUs at the last sample (MiB)."""
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None or job.last is None else job.last[1]

    def job_ended(self, job_id: str) -> None:
        check_name(job_id, "job id")
        with self._lock:
            self._jobs.pop(job_id, None)
            # Not registered: a job that ended while a previous daemon was down.
            path = self._progress_dirs.pop(job_id, self._progress_root / job_id)
        shutil.rmtree(path, ignore_errors=True)
        log.info("gpu_job_ended job=%s", job_id)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._jobs.clear()
            self._progress_dirs.clear()
        self._health.close()
        # A configured root outlives the daemon: its jobs keep running (and writing progress)
        # while it is down, and the next daemon re-adopts them; job_ended removes each one's.
        if self._own_progress_root:
            shutil.rmtree(self._progress_root, ignore_errors=True)

    def _check_open(self) -> None:
        if self._closed:
            raise GpuBackendError("the emulated GPU backend is closed")

    def _check_index(self, index: int) -> None:
        if not isinstance(index, int) or isinstance(index, bool) or not (
            0 <= index < self.config.count
        ):
            raise ValueError(
                f"GPU index {index!r} does not exist (this node emulates {self.config.count})"
            )


def write_fault(fault_dir: str | Path, index: int, xid: int) -> Path:
    """Drop Xid ``xid`` on GPU ``index`` for the daemon owning ``fault_dir`` to raise: written
    whole under another name first, so the daemon never reads half a fault."""
    root = Path(fault_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{time.time_ns()}-{index}-{xid}.xid"
    partial = final.with_suffix(".part")
    partial.write_text(f"{index} {xid}\n")
    os.replace(partial, final)
    return final
