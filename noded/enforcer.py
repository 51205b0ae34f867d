"""The contention eliminator's loop: measure, decide (noded/policy/contention.py), apply, report.

Every ``contention.interval_s`` (default 1 s) one pass, on the event loop (every step is a few
small file operations, as the CgroupManager contract promises for its own):

1. Each CPU job the eliminator may throttle gets a resctrl control group named
   ``rdt.group_for_job(job)`` when it is first seen running, and every thread of every process
   in its cgroup is assigned to it -- again each pass, which picks up threads and processes
   that appeared since (the kernel makes children inherit the group, but not threads that
   raced with the assignment; the emulation inherits nothing, so there this is what keeps a
   job's group complete). The group goes when the job stops running. Only throttleable jobs
   get groups: control groups are few (8-16 CLOSIDs on real parts) and the eliminator needs
   per-job bandwidth only for the jobs it may throttle; the node total comes from every group.
2. MBM counters (node total and each group) are turned into bytes/s by rdt.BandwidthMeter.
3. The controller decides; each decision is applied through rdt (``Resctrl.set_mb``) or the
   cgroup manager (``CgroupManager.update`` with fewer cores), logged, and sent to the master
   as a ``contention`` event. A decision that cannot be applied is reverted in the controller.

Between passes the node total alone is read ``onset_checks - 1`` more times per interval;
when one of those reads shows the bandwidth over the trailing interval at or above the
threshold while the last pass was below it, the next pass runs at once. Onset is so caught
within a fraction of the interval of becoming visible (a pass alone would see it up to a whole
interval late, or, with its window straddling the onset, average it away and see it later
still), while what counts stays an interval's average and throttle and restore steps keep the
interval's pace: no early pass runs once the pressure is at the threshold.

A job first seen with throttles left by an earlier noded (restart) starts unthrottled: its MBA
level is reset to 100 % and its cores to its allocation; the next pass throttles it again if
the pressure is still there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from noded.cgroups import CgroupError, CgroupManager
from noded.gpu.base import GpuSample
from noded.policy.contention import (
    ContentionController,
    Decision,
    JobSample,
    Observation,
    mba_levels,
)
from rdt import (
    BandwidthMeter,
    ProcessNotFound,
    Resctrl,
    ResctrlError,
    group_for_job,
)
from rdt.schemata import MAX_MBPS
from shared.config import ContentionConfig
from shared.messages import MEM_BANDWIDTH_REPORT_EVERY_S, Contention, MemBandwidth
from shared.schema import encode

if TYPE_CHECKING:
    from noded.jobs import JobRunner

log = logging.getLogger("trellis.node.contention")

NODE_KEY = ":node"  # BandwidthMeter key of the node total (no group name has a ':')
RETRY_GROUP_S = 30.0  # after a failed group creation (CLOSIDs exhausted), try again this late
MIB = 1 << 20
GB = 1e9
# A node's memory bandwidth goes to the master (for the inference placer) when it moved by
# this share of the limit since the last report, and at least every
# MEM_BANDWIDTH_REPORT_EVERY_S while measured.
BANDWIDTH_REPORT_CHANGE = 0.05


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    kind: str
    cpus: tuple[int, ...]
    gpus: tuple[int, ...] = ()


def running_jobs(runner: JobRunner) -> list[RunningJob]:
    """The job parts running on this node, as the enforcer needs them."""
    return [
        RunningJob(p.job_id, p.prepare.spec.kind.value, tuple(p.prepare.allocation.cpus),
                   tuple(p.prepare.allocation.gpus))
        for p in list(runner.parts.values()) if p.state == "running"
    ]


class ContentionEnforcer:
    def __init__(
        self,
        config: ContentionConfig,
        cgroups: CgroupManager,
        resctrl: Resctrl | None,
        jobs: Callable[[], list[RunningJob]],
        gpu_samples: Callable[[], Sequence[GpuSample]],
        send: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None,
        *,
        measure_peak: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``measure_peak`` returns the node's peak bandwidth in bytes/s; it is called (in a
        thread) once at start when MBM is available and ``peak_bandwidth_mbps`` is 0."""
        self.config = config
        self.cgroups = cgroups
        self.resctrl = resctrl
        self.jobs = jobs
        self.gpu_samples = gpu_samples
        self.send = send
        self.measure_peak = measure_peak
        self.clock = clock
        caps = resctrl.capabilities if resctrl is not None else None
        mon = caps.l3_mon if caps is not None else None
        self.mbm = mon is not None and mon.mbm
        self.event = "mbm_total_bytes" if mon and "mbm_total_bytes" in mon.features \
            else "mbm_local_bytes"
        self.mb = caps.mb if caps is not None else None
        self.groups_possible = caps is not None and caps.can_allocate
        self.peak_configured = config.peak_bandwidth_mbps > 0
        peak = config.peak_bandwidth_mbps * MIB if self.peak_configured else None
        levels: tuple[int, ...] = ()
        if self.mb is not None and resctrl is not None:
            floor = config.mba_min or self.mb.min_bandwidth
            # In MBps mode levels stay percentages of the peak; _mb_value converts them.
            rounding = None if self.mb.mbps else resctrl.mb_value
            levels = mba_levels(config.mba_step, max(1, floor), rounding)
        self.controller = ContentionController(config, peak_bps=peak, levels=levels)
        self.meter = BandwidthMeter()
        self._groups: dict[str, str] = {}  # job -> resctrl control group
        self._retry: dict[str, float] = {}  # job -> when to try creating its group again
        self._seen: set[str] = set()
        self._pressure: float | None = None  # node pressure at the last pass
        # Node-total readings (time, bytes) of the last interval, from passes and onset reads.
        self._totals: deque[tuple[float, int]] = deque()
        self._onset_rate: float | None = None  # set by an onset read, used by the next pass
        self._foreign = True  # whether control groups other than ours exist (until looked)
        self.passes = 0
        self.actions: Counter[str] = Counter()  # applied decisions by action, for /metrics
        # The last node bandwidth sent to the master (time, used GB/s) and the next to send.
        self._bandwidth_sent: tuple[float, float] | None = None
        self._bandwidth_due: MemBandwidth | None = None
        log.info("contention enforcer interval_s=%.2f mbm=%s mba=%s levels=%s peak_mibps=%s",
                 config.interval_s, self.mbm, self.mb is not None, list(levels),
                 f"{peak / MIB:.0f}" if peak else "measure" if self.mbm else "unused")

    # ------------------------------------------------------------------------------ loop
    async def run(self, stop: asyncio.Event) -> None:
        if self.mbm and self.controller.peak_bps is None and self.measure_peak is not None:
            try:
                self.controller.peak_bps = await asyncio.to_thread(self.measure_peak)
                log.info("contention peak_mibps=%.0f source=measured",
                         self.controller.peak_bps / MIB)
            except Exception as exc:  # the GPU-utilisation method still works without it
                log.error("contention cannot measure peak bandwidth (%s); set "
                          "contention.peak_bandwidth_mbps; watching GPU utilisation meanwhile",
                          exc)
        interval = self.config.interval_s
        checks = self.config.onset_checks
        next_at = self.clock()
        while not stop.is_set():
            try:
                decisions = self.step(self.clock(), self.jobs(), self.gpu_samples())
            except Exception:  # one bad pass must not end enforcement
                log.exception("contention pass failed")
                decisions = []
            for d in decisions:
                await self._report(d)
            await self._report_bandwidth()
            # A fixed schedule, not sleep(interval) after the pass: passes do not drift.
            started, next_at = next_at, next_at + interval
            if next_at < self.clock():
                started, next_at = self.clock(), self.clock() + interval
            # Between passes, cheap reads of the node total catch the onset of contention
            # within a fraction of the interval instead of up to a whole one.
            for k in range(1, checks):
                if await _sleep_until(self.clock, started + k * interval / checks, stop):
                    return
                if self.check_onset(self.clock()) is not None:
                    next_at = self.clock()
                    break
            if await _sleep_until(self.clock, next_at, stop):
                return

    def check_onset(self, now: float) -> float | None:
        """The node's bytes/s over the trailing interval, if that crossed the threshold.

        The same measure a pass uses (an interval's average, so a burst shorter than that does
        not count), evaluated onset_checks times per interval instead of once. The next pass
        then judges by this rate or its own, whichever is higher: its own window reaches back
        to the previous pass and can still be short of the crossing.
        """
        peak = self.controller.peak_bps
        if (not self.mbm or not peak or self._pressure is None
                or self._pressure >= self.config.threshold):
            return None  # throttling already runs at the pass cadence, or nothing to go by
        assert self.resctrl is not None
        try:
            total = _total(self._node_readings())
        except (OSError, ResctrlError):
            total = None
        rate = self._note_total(now, total)
        if rate is None or rate < self.config.threshold * peak:
            return None
        log.debug("contention onset node_mibps=%.0f peak_mibps=%.0f", rate / MIB, peak / MIB)
        self._onset_rate = rate
        return rate

    def _note_total(self, now: float, total: int | None) -> float | None:
        """Record a node-total reading; the rate over the trailing interval, when known."""
        history = self._totals
        if total is None or (history and total < history[-1][1]):
            history.clear()  # unreadable, or the count restarted: start over
            return None
        history.append((now, total))
        interval = self.config.interval_s
        horizon = now - interval
        # Keep the newest reading at least an interval old and everything after it.
        while len(history) > 2 and history[1][0] <= horizon:
            history.popleft()
        (t0, c0), (t1, c1) = history[0], history[1] if len(history) > 1 else history[0]
        if t0 > horizon + interval * 0.05 or now <= t0:
            return None  # not yet an interval's worth of readings
        if t0 < horizon < t1:
            # The count at exactly one interval ago, taking the rate between the two readings
            # around it as steady: the window is then the interval, not up to one more gap.
            c0 = c0 + (c1 - c0) * (horizon - t0) / (t1 - t0)
            t0 = horizon
        return (total - c0) / (now - t0)

    async def _report(self, d: Decision) -> None:
        if self.send is None:
            return
        body = encode(Contention(job_id=d.job_id, action=d.action, value=d.value,
                                 previous=d.previous, reason=d.reason[:512]))
        try:
            await self.send("contention", body)
        except Exception as exc:  # the master learns the state from the next events anyway
            log.warning("contention event not sent job=%s error=%s", d.job_id, exc)

    def _note_bandwidth(self, now: float, node_bps: float) -> None:
        """Queue a ``mem_bandwidth`` report if the measurement moved or the last is old."""
        peak = self.controller.peak_bps
        if not peak:
            return
        used = node_bps / GB
        limit = self.config.threshold * peak / GB
        last = self._bandwidth_sent
        if (last is not None and now - last[0] < MEM_BANDWIDTH_REPORT_EVERY_S
                and abs(used - last[1]) < BANDWIDTH_REPORT_CHANGE * limit):
            return
        self._bandwidth_sent = (now, used)
        self._bandwidth_due = MemBandwidth(used_gbps=round(used, 4),
                                           limit_gbps=round(limit, 4),
                                           window_s=self.config.interval_s)

    async def _report_bandwidth(self) -> None:
        report, self._bandwidth_due = self._bandwidth_due, None
        if report is None or self.send is None:
            return
        try:
            await self.send("mem_bandwidth", encode(report))
        except Exception as exc:  # the next report carries a fresh figure
            log.warning("memory bandwidth report not sent error=%s", exc)

    # ------------------------------------------------------------------------------ one pass
    def step(self, now: float, jobs: list[RunningJob],
             samples: Sequence[GpuSample]) -> list[Decision]:
        """Measure, decide and apply once; returns the decisions that were applied."""
        self.passes += 1
        throttleable = [j for j in jobs if self._throttleable(j)]
        self._sync(throttleable, now)
        mbm = self.mbm and bool(self.controller.peak_bps)
        node_bw: float | None = None
        job_bw: dict[str, float | None] = {}
        onset, self._onset_rate = self._onset_rate, None
        if mbm:
            node_bw, job_bw = self._read_bandwidth(now, throttleable)
            if node_bw is not None and onset is not None:
                node_bw = max(node_bw, onset)
            peak = self.controller.peak_bps or 0.0
            if node_bw is not None and node_bw > peak and not self.peak_configured:
                log.info("contention peak raised peak_mibps=%.0f from=%.0f source=mbm",
                         node_bw / MIB, peak / MIB)
                self.controller.peak_bps = node_bw
            self._pressure = None if node_bw is None else node_bw / (self.controller.peak_bps
                                                                       or 1.0)
            if node_bw is not None:
                self._note_bandwidth(now, node_bw)
        by_index = {s.index: s for s in samples}
        obs = Observation(
            now=now,
            jobs=tuple(
                JobSample(
                    job_id=j.job_id, kind=j.kind, cpus=j.cpus, gpus=len(j.gpus),
                    bandwidth_bps=job_bw.get(j.job_id),
                    gpu_util=_mean_util(j.gpus, by_index),
                    mba=self.mb is not None and j.job_id in self._groups,
                )
                for j in jobs
            ),
            mbm=mbm,
            node_bandwidth_bps=node_bw,
        )
        applied = []
        for d in self.controller.observe(obs):
            try:
                self._apply(d)
            except (OSError, ValueError, ResctrlError, CgroupError) as exc:
                log.warning("contention apply failed %s error=%s", d.describe(), exc)
                self.controller.revert(d)
                continue
            log.info("contention applied %s", d.describe())
            self.actions[d.action] += 1
            applied.append(d)
        return applied

    def _throttleable(self, job: RunningJob) -> bool:
        return not job.gpus and job.kind in self.config.throttle_kinds and bool(job.cpus)

    # ---- groups -------------------------------------------------------------------------
    def _sync(self, jobs: list[RunningJob], now: float) -> None:
        live = {j.job_id for j in jobs}
        for job_id in [j for j in self._groups if j not in live]:
            self._drop_group(job_id)
        for job_id in [j for j in self._seen if j not in live]:
            self._seen.discard(job_id)
            self._retry.pop(job_id, None)
        for job in jobs:
            if job.job_id not in self._seen:
                self._seen.add(job.job_id)
                self._reset_cores(job)
            if self.resctrl is None or not self.groups_possible:
                continue
            if job.job_id not in self._groups and self._retry.get(job.job_id, 0.0) <= now:
                self._create_group(job, now)
            name = self._groups.get(job.job_id)
            if name is not None:
                self._assign(job.job_id, name)

    def _reset_cores(self, job: RunningJob) -> None:
        try:
            limits = self.cgroups.limits(job.job_id)
            if set(limits.cpus) != set(job.cpus):
                self.cgroups.update(job.job_id, replace(limits, cpus=job.cpus))
                log.info("contention reset job=%s cpus=%s reason=first_seen_with_other_cores",
                         job.job_id, list(job.cpus))
        except (CgroupError, OSError, ValueError) as exc:
            log.debug("contention cannot check cores job=%s error=%s", job.job_id, exc)

    def _create_group(self, job: RunningJob, now: float) -> None:
        rc = self.resctrl
        assert rc is not None
        name = group_for_job(job.job_id)
        try:
            created = rc.create_group(name)
            if not created and self.mb is not None:
                rc.set_mb(name, self._mb_value(100))  # left by an earlier noded: start afresh
        except ResctrlError as exc:
            # Out of CLOSIDs or RMIDs: the job is throttled by cores instead, and monitored
            # only as part of the node total. Warned once per job; retries are quiet.
            level = logging.DEBUG if job.job_id in self._retry else logging.WARNING
            log.log(level, "contention no resctrl group job=%s error=%s retry_s=%.0f",
                    job.job_id, exc, RETRY_GROUP_S)
            self._retry[job.job_id] = now + RETRY_GROUP_S
            return
        self._groups[job.job_id] = name
        log.info("contention group job=%s group=%s created=%s", job.job_id, name, created)

    def _assign(self, job_id: str, name: str) -> None:
        rc = self.resctrl
        assert rc is not None
        try:
            pids = self.cgroups.pids(job_id)
            present = set(rc.tasks(name))
        except (CgroupError, OSError, ResctrlError) as exc:
            log.debug("contention cannot list job=%s error=%s", job_id, exc)
            return
        for pid in pids:
            try:
                if present.issuperset(rc.threads_of(pid)):
                    continue
                moved = rc.assign_pid(name, pid)
                log.debug("contention assigned job=%s pid=%d tids=%s", job_id, pid, moved)
            except ProcessNotFound:
                continue
            except ResctrlError as exc:
                log.warning("contention cannot assign job=%s pid=%d error=%s", job_id, pid, exc)

    def _drop_group(self, job_id: str) -> None:
        name = self._groups.pop(job_id)
        self.meter.forget(name)
        assert self.resctrl is not None
        try:
            self.resctrl.remove_group(name)
            log.info("contention group removed job=%s group=%s", job_id, name)
        except ResctrlError as exc:
            log.warning("contention cannot remove group=%s error=%s", name, exc)

    # ---- measuring ----------------------------------------------------------------------
    def _read_bandwidth(
        self, now: float, jobs: list[RunningJob]
    ) -> tuple[float | None, dict[str, float | None]]:
        rc = self.resctrl
        assert rc is not None
        readings: dict[str, dict[int, int | None]] = {}
        per_job: dict[str, float | None] = {}
        for job in jobs:
            name = self._groups.get(job.job_id)
            if name is None:
                continue
            try:
                readings[name] = rc.read_mbm(name, event=self.event)
                per_job[job.job_id] = _rate(self.meter, name, readings[name], now)
            except (OSError, ResctrlError) as exc:
                log.debug("contention cannot read MBM job=%s error=%s", job.job_id, exc)
                per_job[job.job_id] = None
        try:
            ours = set(self._groups.values())
            self._foreign = any(g not in ours for g in rc.all_groups())
            node_readings = self._node_readings(readings)
        except (OSError, ResctrlError) as exc:
            log.warning("contention cannot read node MBM error=%s", exc)
            self._note_total(now, None)
            return None, per_job
        self._note_total(now, _total(node_readings))
        return _rate(self.meter, NODE_KEY, node_readings, now), per_job

    def _node_readings(
        self, ours: dict[str, dict[int, int | None]] | None = None
    ) -> dict[int, int | None]:
        """Node total per domain: the default group plus every control group.

        While every control group is one of ours (checked each pass), that is the default group
        plus our groups' readings, which a pass has already taken; otherwise the kernel's
        whole listing is summed (rdt's read_node_mbm).
        """
        rc = self.resctrl
        assert rc is not None
        if self._foreign:
            return rc.read_node_mbm(self.event)
        if ours is None:
            ours = {name: rc.read_mbm(name, event=self.event) for name in self._groups.values()}
        total = dict(rc.read_mbm(None, event=self.event))
        for part in ours.values():
            for domain, value in part.items():
                prev = total.get(domain, 0)
                total[domain] = None if prev is None or value is None else prev + value
        return total

    # ---- applying -----------------------------------------------------------------------
    def _apply(self, d: Decision) -> None:
        if d.action in ("mba", "restore_mba"):
            name = self._groups.get(d.job_id)
            if name is None or self.resctrl is None:
                raise ValueError(f"job {d.job_id} has no resctrl group to throttle")
            self.resctrl.set_mb(name, self._mb_value(d.value))
            return
        limits = self.cgroups.limits(d.job_id)
        self.cgroups.update(d.job_id, replace(limits, cpus=d.cpus))

    def _mb_value(self, percent: int) -> int:
        """The schemata value for an MBA level: the percentage itself, or with mba_MBps that
        share of the peak per cache domain (100 % = no limit)."""
        mb = self.mb
        assert mb is not None and self.resctrl is not None
        if not mb.mbps:
            return self.resctrl.mb_value(percent)
        if percent >= 100 or not self.controller.peak_bps:
            return MAX_MBPS
        per_domain = self.controller.peak_bps / MIB / max(1, len(mb.domains))
        return self.resctrl.mb_value(max(1, round(per_domain * percent / 100)))


def _rate(meter: BandwidthMeter, key: str, readings: dict[int, int | None],
          now: float) -> float | None:
    """Total bytes/s over every domain, or None unless every domain gave a rate."""
    rates = meter.update(key, readings, now)
    if not readings or len(rates) != len(readings):
        return None
    return sum(rates.values())


def _total(readings: dict[int, int | None]) -> int | None:
    if not readings or any(v is None for v in readings.values()):
        return None
    return sum(v for v in readings.values() if v is not None)


async def _sleep_until(clock: Callable[[], float], when: float, stop: asyncio.Event) -> bool:
    """Wait until ``when`` on ``clock``; True if ``stop`` was set meanwhile."""
    delay = when - clock()
    if delay > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
    return stop.is_set()


def _mean_util(gpus: tuple[int, ...], samples: dict[int, GpuSample]) -> float | None:
    values = [samples[g].utilization_pct for g in gpus if g in samples and samples[g].healthy]
    return sum(values) / len(values) if values else None
