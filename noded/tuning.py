"""The node's half of SODA's adaptive CPU allocator (§V-B2, §VI-H): tune running jobs' cores.

For every running job part whose ``prepare_job`` carried a :class:`~shared.messages.CorePlan`,
a task drives :class:`noded.policy.tuner.CoreTuner`: pin the count it asks for (a live update of the
job's cgroup cpuset, or of its CPU affinity — the job is never restarted), let the job settle,
average the job's GPU utilisation over one window (``GpuBackend.sample()`` on the job's GPUs),
feed it back, and so on until the tuner converges; then pin the best fit for the rest of the
run.

**Which cores.** The master gave the part its whole budget up front (see
:mod:`masterd.features.adaptive`). The part's cores are ranked once — cores on its GPUs' NUMA nodes
first, then by id — and the part always runs on a prefix of that ranking, so growing and
shrinking move as few threads as possible. The part *holds* the prefix as long as the largest
count the tuner may still ask for (the top of its bracket); everything past it is handed back.

**Events.** Each change of the pinned or held set is a ``cores_changed`` event to the master,
which frees the cores the part no longer holds at once and, on the converged one, records the
count as the owner's history. The last event is also written to ``cores.json`` in the part's
directory: a restarted noded does not re-tune a converged part, resumes an unfinished one within
what it still holds, and re-sends the last event whenever the connection to the master comes
back (the master treats a repeat as a no-op resize).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from noded.cgroups import CgroupError, CgroupManager
from noded.gpu.base import GpuBackend
from noded.jobs import JobPart, JobRunner
from noded.policy.tuner import TunerError
from noded.policy.tuning import PartTuning, Pin, rank_cores
from noded.shim import write_atomic
from shared.config import TunerConfig
from shared.messages import CorePlan, CoresChanged
from shared.schema import SchemaError, decode, encode

log = logging.getLogger("trellis.node.tuning")

STATE_FILE = "cores.json"
POLL_S = 0.2  # how often new and ended job parts are noticed

Send = Callable[[str, dict[str, Any]], Awaitable[None]]
__all__ = ["STATE_FILE", "CoreTuning", "TuningStopped", "rank_cores"]


@dataclass
class _PartTuning:
    job_id: str
    task: asyncio.Task[None]
    last: CoresChanged | None = None


class TuningStopped(RuntimeError):
    """A part's tuning cannot continue (its group vanished, the kernel refused a cpuset)."""


class CoreTuning:
    """Runs one tuning task per tunable running job part of this node."""

    def __init__(
        self,
        runner: JobRunner,
        gpus: GpuBackend,
        cgroups: CgroupManager,
        config: TunerConfig,
        send: Send,
        numa_of: dict[int, int] | None = None,
        connected: asyncio.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.gpus = gpus
        self.cgroups = cgroups
        self.config = config
        self.send = send
        self.numa_of = numa_of or {}
        self.connected = connected
        self.clock = clock
        self.tunings: dict[str, _PartTuning] = {}
        self.done: set[str] = set()  # parts whose tuning has finished (or cannot run)
        self.results: dict[str, int] = {}  # job id -> converged core count
        self.last: dict[str, CoresChanged] = {}  # job id -> its latest step, for /metrics

    # -- the supervisor ----------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        if not self.config.enabled:
            log.info("core tuning disabled")
            return
        was_connected = False
        try:
            while not stop.is_set():
                self.sync()
                now_connected = self.connected is None or self.connected.is_set()
                if now_connected and not was_connected:
                    await self.resend()
                was_connected = now_connected
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), POLL_S)
        finally:
            await self.close()

    def sync(self) -> None:
        """Start tuning parts that are running with a plan; stop tuning parts that are not."""
        parts = self.runner.parts
        for job_id, tuning in list(self.tunings.items()):
            part = parts.get(job_id)
            if part is None or part.state != "running":
                tuning.task.cancel()
                del self.tunings[job_id]
        for job_id in list(self.done):
            if job_id not in parts:
                self.done.discard(job_id)
                self.results.pop(job_id, None)
        for job_id in [j for j in self.last if j not in parts]:
            del self.last[job_id]
        for job_id, part in parts.items():
            plan = part.prepare.cores
            if (part.state != "running" or plan is None or job_id in self.tunings
                    or job_id in self.done or part.stopping):
                continue
            task = asyncio.get_running_loop().create_task(self._tune(part, plan))
            self.tunings[job_id] = _PartTuning(job_id, task)
            task.add_done_callback(lambda t, j=job_id: self._finished(j, t))

    def _finished(self, job_id: str, task: asyncio.Task[None]) -> None:
        tuning = self.tunings.get(job_id)
        if tuning is not None and tuning.task is task:
            del self.tunings[job_id]
            if not task.cancelled():
                self.done.add(job_id)
        if not task.cancelled() and task.exception() is not None:
            log.error("job=%s tuning failed", job_id, exc_info=task.exception())

    async def resend(self) -> None:
        """The master (re)connected: repeat every part's last event so it holds the truth."""
        for part in list(self.runner.parts.values()):
            if part.state != "running":
                continue
            saved = _read_state(part.dir)
            if saved is not None:
                await self._send(replace(saved, reason="resync after reconnect"))

    async def close(self) -> None:
        tasks = [t.task for t in self.tunings.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tunings.clear()

    # -- one part ----------------------------------------------------------------------------
    async def _tune(self, part: JobPart, plan: CorePlan) -> None:
        try:
            await self._tune_part(part, plan)
        except TuningStopped as exc:
            log.warning("job=%s tuning stopped: %s", part.job_id, exc)

    async def _tune_part(self, part: JobPart, plan: CorePlan) -> None:
        cfg = self.config
        alloc = part.prepare.allocation
        saved = _read_state(part.dir)
        if saved is not None and saved.converged:
            self.results[part.job_id] = len(saved.pinned)
            log.info("job=%s already tuned to %d core(s)", part.job_id, len(saved.pinned))
            return
        budget = list(saved.cpus) if saved is not None else list(alloc.cpus)
        order = rank_cores(budget, self.numa_of, self._gpu_numa(alloc.gpus))
        max_cores = len(order)
        if max_cores < 2:
            return
        try:
            session = PartTuning(
                n_start=plan.n_start, warm=plan.warm, launch_cores=plan.launch_cores,
                min_cores=plan.min_cores, max_cores=max_cores, config=cfg,
                pinned=len(saved.pinned) if saved is not None else None,
                step=saved.step if saved is not None else 0,
            )
            # Build the probe plan off the loop: O(n^3) for a node of many cores.
            await asyncio.get_running_loop().run_in_executor(
                None, session.tuner.plan.worst_case, session.tuner.min_cores - 1, max_cores)
        except TunerError as exc:
            log.warning("job=%s cannot tune: %s", part.job_id, exc)
            return
        log.info("job=%s tuning n_start=%d launch=%d max=%d warm=%s window=%.1fs",
                 part.job_id, plan.n_start, session.launch, max_cores, plan.warm, cfg.window_s)
        pin = session.begin()
        if pin is not None:
            await self._apply(part, order, pin)
        await asyncio.sleep(cfg.warmup_s)
        while not session.converged:
            pin = session.next_window()
            if pin is not None:
                await self._apply(part, order, pin)
                await asyncio.sleep(cfg.settle_s)
            value = await self._measure(alloc.gpus)
            if value is None:
                log.warning("job=%s no GPU samples for its GPUs %s; tuning stopped",
                            part.job_id, list(alloc.gpus))
                return
            count = session.pinned
            pin = session.observe(value)
            log.info("job=%s window cores=%d util=%.1f bracket=%s", part.job_id, count, value,
                     session.tuner.bracket)
            if pin is not None:
                if pin.converged:
                    self.results[part.job_id] = pin.pinned
                    log.info("job=%s tuned best=%d steps=%d windows=%d", part.job_id,
                             pin.pinned, session.tuner.steps, session.tuner.windows)
                await self._apply(part, order, pin)

    async def _apply(self, part: JobPart, order: list[int], pin: Pin) -> None:
        """Carry out one change of the session: re-pin if asked, then report it."""
        if pin.repin:
            await self._pin(part, order[:pin.pinned])
        await self._report(part, order[:pin.held], order[:pin.pinned], pin.step,
                           pin.utilisation, pin.measured, pin.converged, pin.reason)

    def _gpu_numa(self, gpus: tuple[int, ...]) -> set[int]:
        try:
            infos, _ = self.gpus.inventory()
        except Exception as exc:  # the ranking is a preference, never a reason to fail
            log.debug("GPU inventory unavailable for core ranking: %s", exc)
            return set()
        return {g.numa_node for g in infos if g.index in gpus and g.numa_node >= 0}

    async def _pin(self, part: JobPart, cpus: list[int]) -> None:
        """Move every thread of the running part onto ``cpus`` (no restart)."""
        try:
            current = self.cgroups.limits(part.job_id)
            self.cgroups.update(part.job_id, replace(current, cpus=tuple(cpus)))
        except (CgroupError, OSError, ValueError) as exc:
            raise TuningStopped(f"job {part.job_id}: cannot re-pin to {cpus}: {exc}") from exc
        log.info("job=%s pinned cpus=%s", part.job_id, cpus)

    async def _measure(self, gpus: tuple[int, ...]) -> float | None:
        """Mean utilisation of the part's GPUs over one window."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        wanted = set(gpus)
        values: list[float] = []
        end = self.clock() + cfg.window_s
        while True:
            samples = await loop.run_in_executor(None, self.gpus.sample)
            here = [s.utilization_pct for s in samples if s.index in wanted]
            if here:
                values.append(sum(here) / len(here))
            left = end - self.clock()
            if left <= 0:
                break
            await asyncio.sleep(min(cfg.sample_interval_s, left))
        if not values:
            return None
        mean = sum(values) / len(values)
        return min(100.0, max(0.0, mean)) if math.isfinite(mean) else None

    async def _report(
        self, part: JobPart, held: list[int], pinned: list[int], step: int,
        util: float | None, measured: int | None, converged: bool, reason: str,
    ) -> None:
        event = CoresChanged(
            job_id=part.job_id, cpus=tuple(sorted(held)), pinned=tuple(sorted(pinned)),
            step=step, utilisation=util, measured_cores=measured, converged=converged,
            reason=reason,
        )
        _write_state(part.dir, event)
        self.last[part.job_id] = event
        await self._send(event)

    async def _send(self, event: CoresChanged) -> None:
        await self.send("cores_changed", encode(event))


def _write_state(jobdir: Path, event: CoresChanged) -> None:
    with contextlib.suppress(OSError):  # the part may be being removed under us
        write_atomic(jobdir / STATE_FILE, encode(event))


def _read_state(jobdir: Path) -> CoresChanged | None:
    try:
        data = json.loads((jobdir / STATE_FILE).read_text())
        return decode(CoresChanged, data)
    except (OSError, ValueError, SchemaError):
        return None
