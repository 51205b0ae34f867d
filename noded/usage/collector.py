"""Sampling what every running job part uses, and reporting it (``job_usage``, ``job_phase``).

Every ``usage_interval_s`` each running part is sampled: CPU time and memory from its groups
(:mod:`.cgroupstat`; psutil's process figures where it has none), its GPUs' utilisation (the
job's own share where the backend knows it, as the emulation does for shared GPUs; else the
mean over its GPUs) and its GPU memory (the per-process figures of its processes, the largest
per GPU). CPU is kept as the rate over each interval (cores), so its peak is Liquid's "CPU
(max)". Network bytes are the kernel's counters for the job's v2 group (:mod:`.netcount`),
read when a report is due. A report covers the part's whole run so far: at exit (``final``)
and every ``usage_report_s`` while it runs. The post-phase detector (:mod:`.phase`) reads the
same utilisation samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noded.gpu.base import GpuBackend, GpuSample
from noded.jobs import JobPart, JobRunner
from noded.policy.stats import Running
from noded.usage.acctgroup import AccountingGroups
from noded.usage.cgroupstat import (
    JobGroups,
    Mounts,
    cpu_seconds,
    groups_of,
    memory_bytes,
    processes_usage,
)
from noded.usage.netcount import NetCounters
from noded.usage.phase import PhaseDetector
from shared.messages import JobPhase, JobUsage
from shared.schema import encode

log = logging.getLogger("trellis.node.usage")

MIB = 1 << 20


@dataclass(frozen=True)
class UsageSettings:
    interval_s: float = 1.0
    report_s: float = 300.0
    phase_threshold_pct: float = 15.0
    phase_samples: int = 3


@dataclass
class _Track:
    job_id: str
    gpus: tuple[int, ...]
    started: float
    v2_path: str | None = None  # the v2 group the network counters watch
    groups: JobGroups | None = None
    last_cpu: tuple[float, float] | None = None  # (time, CPU seconds) of the last reading
    cpu: Running = field(default_factory=Running)
    memory_peak: int | None = None
    gpu_util: Running = field(default_factory=Running)
    gpu_memory_peak: float | None = None
    phase: PhaseDetector = field(default_factory=PhaseDetector)
    last_report: float = 0.0
    samples: int = 0


class UsageCollector:
    def __init__(
        self,
        runner: JobRunner,
        gpus: GpuBackend,
        samples: Callable[[], list[GpuSample]],
        send: Callable[[str, dict[str, Any]], Awaitable[None]],
        settings: UsageSettings,
        accounting: AccountingGroups | None = None,
        counters: NetCounters | None = None,
        mounts: Mounts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.gpus = gpus
        self.samples = samples
        self.send = send
        self.settings = settings
        self.accounting = accounting
        self.counters = counters
        self.mounts = mounts or Mounts.read()
        self.clock = clock
        self.tracks: dict[str, _Track] = {}
        self._last_util: dict[str, float] = {}
        self._unremoved: set[str] = set()  # accounting groups still holding processes
        self._tasks: set[asyncio.Task[None]] = set()
        # (job id, mounts) -> the groups to meter, or None for the first process's groups.
        self.group_finders: list[Callable[[str, Mounts], JobGroups | None]] = []
        runner.attach_providers.append(self.attach)
        runner.cleanup_hooks.append(self.cleanup)

    # -- hooks of the job runner ---------------------------------------------------------
    def attach(self, job_id: str) -> list[Path]:
        """A part is starting: its accounting group (joined by the shim) and counters."""
        part = self.runner.parts.get(job_id)
        gpus = tuple(part.prepare.allocation.gpus) if part is not None else ()
        track = self._track(job_id, gpus)
        track.last_cpu = (track.started, 0.0)
        files: list[Path] = []
        if self.accounting is not None:
            try:
                files.append(self.accounting.create(job_id))
                track.v2_path = "/" + str(self.accounting.root.relative_to(
                    self.mounts.v2 or self.accounting.root.parent) / job_id)
            except (OSError, ValueError) as exc:
                log.warning("job=%s usage accounting group not made: %s", job_id, exc)
        else:
            # The job's own group, when the backend makes v2 groups.
            for procs in self.runner.cgroups.attach_files(job_id):
                path = self._v2_path(procs.parent)
                if path is not None:
                    track.v2_path = path
        if self.counters is not None and track.v2_path is not None:
            try:
                self.counters.watch(job_id, track.v2_path)
            except Exception as exc:  # nft failing must not stop the job
                log.warning("job=%s network bytes not counted: %s", job_id, exc)
                track.v2_path = None
        return files

    def cleanup(self, part: JobPart) -> None:
        """The part's processes are gone: read what it used last and report it."""
        track = self.tracks.pop(part.job_id, None)
        self._last_util.pop(part.job_id, None)
        if track is None:
            return
        with contextlib.suppress(Exception):
            self._sample(track, self.clock(), final=True)
        task = asyncio.get_running_loop().create_task(self._final(track))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _final(self, track: _Track) -> None:
        net = await self._net(track.job_id)
        await self._report(track, net, final=True)
        # A newer part of the same job (requeued onto this node) may have started while the
        # report was sent: the counters and accounting group of that name are its own now,
        # and removing them would keep its shim from joining (or counting) them.
        if track.job_id in self.tracks:
            return
        if self.counters is not None and track.v2_path is not None:
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(
                    None, self.counters.forget, track.job_id)
        if track.job_id in self.tracks:
            return
        if self.accounting is not None and not self.accounting.remove(track.job_id):
            self._unremoved.add(track.job_id)

    # -- the loop ------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("usage sampling failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.interval_s)
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5.0)

    async def tick(self) -> None:
        now = self.clock()
        for part in list(self.runner.parts.values()):
            if part.state != "running":
                continue
            track = self._track(part.job_id, tuple(part.prepare.allocation.gpus))
            self._sample(track, now)
            util = self._last_util.pop(track.job_id, None)
            if util is not None and track.phase.add(now, util):
                log.info("job=%s phase=post util=%.1f pre_s=%s", track.job_id, util,
                         track.phase.pre_s)
                await self.send("job_phase", encode(JobPhase(
                    job_id=track.job_id, phase="post", gpu_util=util,
                    pre_s=track.phase.pre_s)))
            report = self.settings.report_s
            if report > 0 and now - track.last_report >= report:
                await self._report(track, await self._net(track.job_id), final=False)
        for job_id in list(self._unremoved):
            if (job_id in self.tracks  # a newer part of the job uses that group now
                    or self.accounting is None or self.accounting.remove(job_id)):
                self._unremoved.discard(job_id)

    # -- sampling ------------------------------------------------------------------------
    def _own_groups(self, job_id: str) -> JobGroups | None:
        """Groups a finder knows better than the first process's (a container runtime moves
        the job's processes out of the accounting group into groups of its own)."""
        for find in self.group_finders:
            found = find(job_id, self.mounts)
            if found is not None:
                return found
        return None

    def _track(self, job_id: str, gpus: tuple[int, ...]) -> _Track:
        track = self.tracks.get(job_id)
        if track is None:
            now = self.clock()
            track = self.tracks[job_id] = _Track(
                job_id, gpus, now, last_report=now,
                phase=PhaseDetector(self.settings.phase_threshold_pct,
                                    self.settings.phase_samples))
        return track

    def _sample(self, track: _Track, now: float, final: bool = False) -> None:
        job_id = track.job_id
        try:
            pids = self.runner.cgroups.pids(job_id)
        except (OSError, ValueError, LookupError):
            pids = []
        if track.groups is None:
            track.groups = self._own_groups(job_id)
        if track.groups is None and pids:
            track.groups = groups_of(pids[0], self.mounts)
        groups = track.groups
        seconds = cpu_seconds(groups) if groups is not None else None
        memory = memory_bytes(groups) if groups is not None else None
        if seconds is None or memory is None:
            proc_cpu, proc_rss = processes_usage(pids)
            seconds = proc_cpu if seconds is None else seconds
            memory = proc_rss if memory is None else memory
        if track.last_cpu is not None and now > track.last_cpu[0]:
            rate = max(0.0, seconds - track.last_cpu[1]) / (now - track.last_cpu[0])
            track.cpu.add(rate)
        if not final or track.last_cpu is None:
            track.last_cpu = (now, seconds)
        if memory:
            track.memory_peak = max(track.memory_peak or 0, memory)
        if final or not track.gpus:
            track.samples += 1
            return
        util, gpu_memory = self._gpu(job_id, track.gpus, set(pids))
        if util is not None:
            track.gpu_util.add(util)
            self._last_util[job_id] = util
        if gpu_memory is not None:
            track.gpu_memory_peak = max(track.gpu_memory_peak or 0.0, gpu_memory)
        track.samples += 1

    def _gpu(self, job_id: str, gpus: tuple[int, ...],
             pids: set[int]) -> tuple[float | None, float | None]:
        mine = [s for s in self.samples() if s.index in gpus]
        if not mine:
            return None, None
        own = getattr(self.gpus, "job_utilization", None)
        util = own(job_id) if own is not None else None
        if util is None:
            util = sum(s.utilization_pct for s in mine) / len(mine)
        per_gpu = [sum(m for pid, m in s.processes if pid in pids) for s in mine]
        memory: float | None = float(max(per_gpu)) if any(per_gpu) else None
        if memory is None:
            held = getattr(self.gpus, "job_memory", None)
            value = held(job_id) if held is not None else None
            memory = float(value) if value is not None else None
        return min(100.0, util), memory

    async def _net(self, job_id: str) -> dict[str, int] | None:
        if self.counters is None:
            return None
        try:
            counts = await asyncio.get_running_loop().run_in_executor(None, self.counters.read)
        except Exception as exc:
            log.warning("job=%s network counters unreadable: %s", job_id, exc)
            return None
        return counts.get(job_id)

    async def _report(self, track: _Track, net: dict[str, int] | None, final: bool) -> None:
        track.last_report = self.clock()
        usage = JobUsage(
            job_id=track.job_id,
            seconds=max(0.0, track.last_report - track.started),
            samples=track.samples,
            cpu_peak=track.cpu.peak,
            cpu_mean=track.cpu.value(),
            memory_peak_mib=None if track.memory_peak is None else track.memory_peak / MIB,
            gpu_util_mean=track.gpu_util.value(),
            gpu_util_std=track.gpu_util.std if track.gpu_util.count else None,
            gpu_memory_peak_mib=track.gpu_memory_peak,
            net_tx_bytes=None if net is None else net.get("tx", 0),
            net_rx_bytes=None if net is None else net.get("rx", 0),
            final=final,
            # Phase lengths (Liquid §6.1): the launching phase once seen, the post phase
            # only in the final report (it lasts until the part exits).
            pre_s=track.phase.pre_s,
            post_s=track.phase.post_s(track.last_report) if final else None,
        )
        log.debug("job=%s usage final=%s cpu_peak=%s mem_mib=%s gpu=%s", track.job_id, final,
                  usage.cpu_peak, usage.memory_peak_mib, usage.gpu_util_mean)
        await self.send("job_usage", encode(usage))

    def _v2_path(self, group: Path) -> str | None:
        mount = self.mounts.v2
        if mount is None or not (group == mount or mount in group.parents):
            return None
        return "/" + str(group.relative_to(mount))

    def close(self) -> None:
        if self.counters is not None:
            with contextlib.suppress(Exception):
                self.counters.close()
        if self.accounting is not None:
            for job_id in self.accounting.leftovers():
                if job_id not in self.runner.parts:
                    self.accounting.remove(job_id)
            self.accounting.close()
