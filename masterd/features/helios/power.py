"""Cluster Energy Saving in the live master (Helios §4.3), ``[master.power]``, off by default.

* **History.** The number of busy nodes (running any job) is sampled ten times per periodic
  check; each 10-minute bucket's maximum is journalled (``power_history``), the forecaster's
  training data, which survives restarts.
* **Forecast.** Once ``forecast_min_steps`` buckets exist, a LightGBM forecaster
  (:mod:`masterd.core.helios.forecast`, strictly causal) is trained in the master's worker
  process every ``forecast_retrain_s`` and forecasts ``2 × future_steps`` buckets ahead.
* **Decisions.** Every ``check_interval_s`` :func:`masterd.core.helios.ces.step` (Algorithm 2)
  gives the number of nodes to keep powered; before each pass, when running plus queued
  demand exceeds the powered nodes, or a waiting job fits only nodes that are powered down,
  nodes are woken at once (``demand + σ``).
* **Acting as Slurm does.** ``suspend_program NODE...`` and ``resume_program NODE...`` are the
  operator's executables. A node goes ``powering_down`` (nothing is placed on it; refused if
  it runs a job or is drained), then ``powered_down`` when the program succeeds; a wake-up
  makes it ``powering_up`` until the node's daemon says hello again (then it is on), or, after
  ``resume_timeout_s``, it is marked down with the reason. A program that is missing, fails or
  runs past ``program_timeout_s`` (killed) gives a ``power_failed`` event and leaves the node
  on and usable. States are journalled by the master (``NodeCommands.set_power``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import tempfile
from collections import deque
from typing import Any

import numpy as np

from masterd.core.cluster import ClusterSnapshot
from masterd.core.helios import ces
from masterd.core.helios.forecast import STEP_S, Forecaster
from masterd.core.placement import fits_cluster
from masterd.core.scheduler import JobError
from masterd.features.helios.trainer import train_forecaster
from masterd.journal.helios import create_tables, load_history, save_history
from masterd.runtime.context import FeatureContext
from masterd.runtime.workers import WorkerError
from shared.config import PowerConfig

log = logging.getLogger("trellis.master.power")

SAMPLES_PER_CHECK = 10
HISTORY_STEPS = 60 * 144  # buckets kept in memory (60 days)


def params_of(config: PowerConfig) -> ces.CesParams:
    return ces.CesParams(buffer=config.buffer_nodes, history_steps=config.history_steps,
                         future_steps=config.future_steps,
                         history_threshold=config.history_threshold,
                         future_threshold=config.future_threshold,
                         min_decrease=config.min_decrease, cooldown_steps=config.cooldown_steps)


class PowerManager:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        config = ctx.config().power
        self.enabled = config.enabled
        self.params = params_of(config)
        self.state = ces.CesState(powered=0)
        self.checks = 0
        self.recent: deque[int] = deque(maxlen=max(self.params.history_steps, 1))
        self.buckets: dict[int, int] = {}  # 10-minute step -> max busy nodes
        self.forecaster: Forecaster | None = None
        self.forecast_meta: dict[str, Any] | None = None
        self.wakeups = 0  # wake actions
        self.nodes_woken = 0
        self.node_seconds_saved = 0.0
        self.last_decision: dict[str, Any] | None = None
        self.failures = 0
        self._last_sample: float | None = None
        self._deadlines: dict[str, asyncio.TimerHandle] = {}
        self._busy_programs: set[str] = set()  # nodes a program is running for
        self._saved_steps: set[int] = set()  # buckets already journalled
        self._waking = False  # an arrival check's wake-up is on its way
        if not self.enabled:
            return
        ctx.journal.now(create_tables)
        ctx.events.restored.subscribe(self.start)
        ctx.events.before_pass.subscribe(self.arrival_check)
        ctx.events.node_ready.subscribe(self.node_ready)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        config = self.ctx.config().power
        for step, busy, _ in self.ctx.journal.now(load_history, HISTORY_STEPS):
            self.buckets[step] = busy
            self._saved_steps.add(step)
        for node in self._nodes_in("powering_up"):
            self._watch_resume(node)  # the deadline restarts with the master
        for node in self._nodes_in("powering_down"):  # the suspend was cut short: again
            self.ctx.tasks.spawn(self._suspend([node]), f"power-suspend-{node}")
        tasks = self.ctx.tasks
        tasks.every(config.check_interval_s / SAMPLES_PER_CHECK, self.sample, "power-sample")
        tasks.every(config.check_interval_s, self.periodic_check, "power-check")
        if config.forecast:
            tasks.spawn(self.retrain(), "power-forecast-train")
            tasks.every(config.forecast_retrain_s, self.retrain, "power-forecast-retrain")
        log.info("power manager started buffer=%d check_interval_s=%g history_steps=%d",
                 self.params.buffer, config.check_interval_s, len(self.buckets))

    # -- what the cluster is doing -------------------------------------------------------
    def _nodes_in(self, state: str) -> list[str]:
        return sorted(v.name for v in self.ctx.core.nodes()
                      if self.ctx.nodes.power_state(v.name) == state)

    def busy_nodes(self) -> set[str]:
        busy: set[str] = set()
        for job in self.ctx.core.active_jobs().values():
            if job.placement is not None:
                busy.update(job.placement.nodes)
        return busy

    def counts(self) -> dict[str, int]:
        states: dict[str, int] = {"powering_down": 0, "powered_down": 0, "powering_up": 0}
        total = 0
        for view in self.ctx.core.nodes():
            total += 1
            state = self.ctx.nodes.power_state(view.name)
            if state is not None:
                states[state] += 1
        return {"total": total, "busy": len(self.busy_nodes()), **states}

    def sample(self) -> None:
        now = self.ctx.clock()
        counts = self.counts()
        if self._last_sample is not None:
            self.node_seconds_saved += counts["powered_down"] * max(0.0, now - self._last_sample)
        self._last_sample = now
        step = int(now // STEP_S)
        closed = [s for s in self.buckets if s < step and s not in self._saved_steps]
        previous = self.buckets.get(step)
        self.buckets[step] = max(previous or 0, counts["busy"])
        for s in closed:
            self._saved_steps.add(s)
            self.ctx.tasks.spawn(self.ctx.journal.call(save_history, s, self.buckets[s],
                                                       counts["total"]))
        if len(self.buckets) > HISTORY_STEPS:
            for s in sorted(self.buckets)[:len(self.buckets) - HISTORY_STEPS]:
                del self.buckets[s]
                self._saved_steps.discard(s)

    def series(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Completed buckets as a contiguous series (gaps carry the previous value)."""
        now_step = int(self.ctx.clock() // STEP_S)
        steps = sorted(s for s in self.buckets if s < now_step)
        if not steps:
            return None
        first, last = steps[0], steps[-1]
        y = np.empty(last - first + 1)
        value = float(self.buckets[first])
        for i in range(last - first + 1):
            value = float(self.buckets.get(first + i, value))
            y[i] = value
        return y, (first + np.arange(len(y))) * STEP_S

    def forecast(self) -> list[float] | None:
        if self.forecaster is None:
            return None
        series = self.series()
        if series is None or len(series[0]) < 2:
            return None
        y, times = series
        return list(self.forecaster.predict(y, times, [len(y) - 1])[0])

    # -- decisions -----------------------------------------------------------------------
    async def periodic_check(self) -> dict[str, Any]:
        counts = self.counts()
        busy, total = counts["busy"], counts["total"]
        powered = total - counts["powering_down"] - counts["powered_down"]
        self.state.powered = powered
        i = self.checks
        self.checks += 1
        prediction = self.forecast()
        result = ces.step(self.params, self.state, i, list(self.recent), busy, prediction,
                          total)
        self.recent.append(busy)
        decision = {"time": self.ctx.clock(), "busy": busy, "powered": powered,
                    "total": total, "target": result.powered,
                    "forecast_used": prediction is not None}
        self.last_decision = decision
        if result.powered > powered:
            await self.wake(result.powered - powered, "periodic check: busy nodes exceed "
                            "the powered ones")
        elif result.powered < powered:
            await self.shed(powered - result.powered)
        return decision

    def arrival_check(self) -> None:
        """Before a pass (JOBARRIVALCHECK): wake nodes when the demand needs them."""
        if self._waking or not self._nodes_in("powered_down"):
            return  # a wake-up in flight has not marked its nodes powering_up yet
        demand, reason = self.demand()
        counts = self.counts()
        powered = counts["total"] - counts["powering_down"] - counts["powered_down"]
        wake = ces.wake_for(self.params, powered, demand, counts["total"])
        if wake:
            self._waking = True
            self.ctx.tasks.spawn(self.wake(wake, reason), "power-wake")

    def demand(self) -> tuple[int, str]:
        """Nodes the running and waiting jobs need: busy nodes plus the waiting GPUs that the
        powered nodes' free GPUs cannot hold, in whole nodes; and all nodes but the powered
        down ones for a waiting job that fits only those."""
        snapshot = self.ctx.core.snapshot()
        powered = {name: v for name, v in snapshot.nodes.items()
                   if self.ctx.nodes.power_state(name) not in ("powered_down", "powering_down")}
        per_node = max((v.total_gpus for v in snapshot.nodes.values()), default=0) or 1
        free = sum(len(v.free_gpus) for v in powered.values() if v.schedulable)
        waiting = list(self.ctx.core.queue())
        wanted = sum(j.spec.gpus for j in waiting)
        busy = len(self.busy_nodes())
        extra = math.ceil(max(0, wanted - free) / per_node)
        reason = f"{len(waiting)} waiting job(s) need {wanted} GPUs, {free} free"
        powered_only = ClusterSnapshot(nodes=powered, running={})
        for job in waiting[:256]:  # the head of the queue is what waits for nodes
            if fits_cluster(job.spec, powered_only) is not None and \
                    fits_cluster(job.spec, snapshot) is None:
                needed = len(powered) + max(1, math.ceil(job.spec.gpus / per_node))
                return max(busy + extra, needed - self.params.buffer), \
                    f"job {job.id} fits only nodes that are powered down"
        return busy + extra, reason

    # -- acting --------------------------------------------------------------------------
    async def shed(self, count: int) -> list[str]:
        """Power down up to ``count`` idle nodes (ready, no job, no power state)."""
        busy = self.busy_nodes()
        idle = [v.name for v in sorted(self.ctx.core.nodes(), key=lambda v: v.name,
                                       reverse=True)
                if v.name not in busy and self.ctx.nodes.status(v.name) == "ready"
                and v.name not in self._busy_programs]
        chosen: list[str] = []
        for name in idle[:count]:
            try:
                await self.ctx.nodes.set_power(name, "powering_down", "CES: idle, trends down")
            except JobError as exc:  # a job landed there meanwhile, or it was drained
                log.info("node=%s not powered down: %s", name, exc)
                continue
            chosen.append(name)
        if chosen:
            await self._suspend(chosen)
        return chosen

    async def _suspend(self, nodes: list[str]) -> None:
        config = self.ctx.config().power
        error = await self._run(config.suspend_program, "suspend_program", nodes)
        for node in nodes:
            if error is None:
                await self.ctx.nodes.set_power(node, "powered_down", "suspend_program done")
            else:
                await self._failed(node, error)

    async def wake(self, count: int, reason: str) -> list[str]:
        """Power up to ``count`` powered-down nodes."""
        try:
            down = [n for n in self._nodes_in("powered_down") if n not in self._busy_programs]
            chosen = down[:count]
            if not chosen:
                return []
            self.wakeups += 1
            self.nodes_woken += len(chosen)
            for node in chosen:
                await self.ctx.nodes.set_power(node, "powering_up", f"CES: {reason}")
        finally:
            self._waking = False
        config = self.ctx.config().power
        error = await self._run(config.resume_program, "resume_program", chosen)
        for node in chosen:
            if error is not None:
                await self._failed(node, error)
            elif self.ctx.nodes.power_state(node) == "powering_up":  # not back yet
                self._watch_resume(node)
        return chosen

    async def _failed(self, node: str, error: str) -> None:
        self.failures += 1
        log.error("node=%s power program failed: %s; the node stays on and usable", node, error)
        await self.ctx.nodes.set_power(node, None, f"power_failed: {error}")
        await self.ctx.journal.persist([], [(self.ctx.clock(), None, node, "power_failed",
                                             {"error": error})])

    async def _run(self, program: str, what: str, nodes: list[str]) -> str | None:
        """Run the program with the node names; None on success, else why it failed."""
        if not program:
            return f"no {what} is configured"
        timeout = self.ctx.config().power.program_timeout_s
        self._busy_programs.update(nodes)
        # Output goes to a file, not a pipe: a program that starts a daemon (resume) must not
        # make the master wait for the daemon's inherited pipe to close.
        with tempfile.TemporaryFile() as output:
            try:
                proc = await asyncio.create_subprocess_exec(
                    program, *nodes, stdin=asyncio.subprocess.DEVNULL, stdout=output,
                    stderr=output, start_new_session=True)
            except OSError as exc:
                self._busy_programs.difference_update(nodes)
                return f"{what} {program!r} cannot be run: {exc.strerror or exc}"
            try:
                code = await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                self._busy_programs.difference_update(nodes)
                return f"{what} {program!r} did not finish within {timeout:g} s; killed"
            finally:
                self._busy_programs.difference_update(nodes)
            if code != 0:
                output.seek(0)
                tail = output.read()[-400:].decode(errors="replace").strip()
                return f"{what} {program!r} exited with status {code}" + \
                    (f": {tail}" if tail else "")
        return None

    def _watch_resume(self, node: str) -> None:
        timeout = self.ctx.config().power.resume_timeout_s
        old = self._deadlines.pop(node, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._deadlines[node] = loop.call_later(
            timeout, lambda: self.ctx.tasks.spawn(self._resume_timeout(node, timeout)))

    async def _resume_timeout(self, node: str, timeout: float) -> None:
        self._deadlines.pop(node, None)
        if self.ctx.nodes.power_state(node) != "powering_up":
            return
        reason = f"did not rejoin within resume_timeout_s={timeout:g} s after resume_program"
        log.error("node=%s down: %s", node, reason)
        await self.ctx.nodes.set_power(node, None, f"down: {reason}")
        await self.ctx.journal.persist([], [(self.ctx.clock(), None, node,
                                             "power_resume_timeout", {"reason": reason})])

    def node_ready(self, node: str) -> None:
        if self.ctx.nodes.power_state(node) in ("powering_up", "powered_down"):
            self.ctx.tasks.spawn(self.node_ready_async(node), f"power-ready-{node}")

    async def node_ready_async(self, node: str) -> None:
        handle = self._deadlines.pop(node, None)
        if handle is not None:
            handle.cancel()
        if self.ctx.nodes.power_state(node) in ("powering_up", "powered_down"):
            await self.ctx.nodes.set_power(node, None, "rejoined")

    # -- forecaster ----------------------------------------------------------------------
    async def retrain(self) -> dict[str, Any] | None:
        config = self.ctx.config().power
        series = self.series()
        if series is None or len(series[0]) < config.forecast_min_steps:
            return None
        y, times = series
        steps = [int(t // STEP_S) for t in times]
        horizon = 2 * self.params.future_steps
        try:
            result = await self.ctx.workers.run(train_forecaster, steps, [float(v) for v in y],
                                                horizon, name="helios-forecast-train")
            model = await asyncio.to_thread(Forecaster, result["model"], horizon)
        except (WorkerError, ValueError) as exc:
            log.warning("forecaster training failed: %s", exc)
            self.forecast_meta = {"error": str(exc)}
            return None
        self.forecaster = model
        self.forecast_meta = {k: v for k, v in result.items() if k != "model"}
        log.info("forecaster trained steps=%d rounds=%s", len(y), result["rounds"])
        return self.forecast_meta

    # -- views ---------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        if not self.enabled:
            raise JobError("not_supported", "Cluster Energy Saving is off ([master.power] "
                           "enabled = true turns it on)")
        return {"counts": self.counts(), "params": dict(vars(self.params)),
                "wakeups": self.wakeups, "nodes_woken": self.nodes_woken,
                "node_hours_saved": self.node_seconds_saved / 3600.0,
                "failures": self.failures, "last_decision": self.last_decision,
                "history_steps": len(self.buckets), "forecaster": self.forecast_meta,
                "nodes": {n: self.ctx.nodes.power_state(n) for n in
                          sorted(v.name for v in self.ctx.core.nodes())
                          if self.ctx.nodes.power_state(n) is not None}}
