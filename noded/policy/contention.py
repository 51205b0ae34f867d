"""The contention eliminator's decisions (SODA §V-E): plain, synchronous, deterministic.

One :class:`Observation` per interval goes in; a list of :class:`Decision` comes out, which the
node's async loop (noded/enforcer.py) applies to the kernel and reports to the master. Nothing
here reads a clock, a file or a device, so the behaviour is tested with scripted observations.

Two ways to see contention:

* **MBM** (memory-bandwidth monitoring): node bandwidth / peak bandwidth is the *pressure*.
  At ``threshold`` (75 %) or more, the CPU jobs that together account for the excess over the
  threshold -- heaviest first; all of them when per-job bandwidth is unknown -- are throttled
  one step each, every interval until the pressure falls below the threshold. Below
  ``restore_threshold`` (60 %) for ``restore_intervals`` consecutive intervals, every
  throttled job steps back up one step; the count then starts again, so a full restore is
  gradual. Between the two thresholds nothing changes (the hysteresis band), which is what
  keeps a node hovering around 75 % from flapping.
* **GPU utilisation**, where MBM is absent: each training job's stable utilisation is the
  highest of its last ``gpu_stable_window`` samples (once ``gpu_warmup_intervals`` samples
  exist). Falling more than ``gpu_drop_points`` below it for ``gpu_drop_intervals``
  consecutive intervals while throttleable CPU jobs run is contention: every CPU job is
  throttled one step, then ``gpu_settle_intervals`` pass before the next step (utilisation
  answers slowly). Restoring probes: after a wait of calm intervals (no training job below
  its stable level; ``restore_intervals`` at first) each throttled job steps up one step; if
  contention is detected again before a whole wait has passed calmly since that step, the
  wait doubles (up to 64x), so a real conflict settles at the throttle it needs instead of
  oscillating, while a mere phase change of a training job (which no throttle cures, and
  which the rolling window forgets) is undone.

One step is, where the job can be throttled with MBA, the next lower MBA level (e.g. 100 → 80
→ 60 … down to the hardware minimum, as rounded by the kernel); where MBA is absent or the job
already sits at the lowest level, halving its cores (never below one). A restore step undoes
the last kind first: cores double back (up to the allocation), then MBA steps up.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shared.config import ContentionConfig

log = logging.getLogger("trellis.node.contention")

MBA_MAX = 100
GPU_RESTORE_WAIT_CAP = 64  # the probe wait doubles up to this many restore_intervals


@dataclass(frozen=True)
class JobSample:
    """One running job as seen in one interval."""

    job_id: str
    kind: str  # JobKind value: "training", "inference" or "cpu"
    cpus: tuple[int, ...]  # the cores the job was allocated (a restore returns to these)
    gpus: int = 0
    bandwidth_bps: float | None = None  # MBM bytes/s over the last interval; None = unknown
    gpu_util: float | None = None  # mean utilisation of its GPUs, 0..100
    mba: bool = False  # whether MBA can throttle this job (it has a resctrl control group)


@dataclass(frozen=True)
class Observation:
    now: float
    jobs: tuple[JobSample, ...]
    # Whether this node monitors memory bandwidth at all (decides the detection method).
    mbm: bool = False
    # Node total bytes/s over the last interval; None when it could not be read this time.
    node_bandwidth_bps: float | None = None


@dataclass(frozen=True)
class Decision:
    job_id: str
    action: str  # "mba" | "cores" | "restore_mba" | "restore_cores"
    value: int  # MBA: the new level in percent; cores: how many cores the job keeps
    previous: int
    reason: str
    cpus: tuple[int, ...] = ()  # cores actions: the cores the job keeps

    def describe(self) -> str:
        return (f"job={self.job_id} action={self.action} value={self.value} "
                f"previous={self.previous} reason={self.reason}")


@dataclass
class _Throttle:
    total: int  # cores allocated
    level: int = 0  # index into the MBA levels; 0 = unthrottled
    cores: int | None = None  # cores kept; None = all allocated


@dataclass
class _GpuTrack:
    history: deque[float]
    below: int = 0  # consecutive intervals under the stable level by more than the drop


@dataclass
class _Victim:
    job_id: str
    util: float
    stable: float


def mba_levels(
    step: int, floor: int, kernel_value: Callable[[int], int] | None = None
) -> tuple[int, ...]:
    """MBA percentages from 100 down to ``floor`` in ``step``s, as the kernel would store them.

    ``kernel_value`` is Resctrl.mb_value (clamps to the hardware minimum and rounds up to its
    granularity); levels the rounding merges are listed once, so every step changes something.
    """
    if step < 1:
        raise ValueError(f"mba_step must be at least 1, got {step}")
    fix = kernel_value or (lambda v: v)
    wanted = [*range(MBA_MAX, floor, -step), floor]
    out: list[int] = []
    for value in wanted:
        stored = fix(max(1, value))
        if not out or stored < out[-1]:
            out.append(stored)
    return tuple(out)


def _mibps(bps: float) -> str:
    return f"{bps / (1 << 20):.0f}"


class ContentionController:
    def __init__(
        self,
        config: ContentionConfig,
        *,
        peak_bps: float | None = None,
        levels: Sequence[int] = (),
    ) -> None:
        """``peak_bps``: node peak bandwidth (None until measured); ``levels``: the MBA levels
        (see :func:`mba_levels`); empty where the node has no MBA."""
        if levels and (levels[0] != MBA_MAX or list(levels) != sorted(set(levels), reverse=True)):
            raise ValueError(f"MBA levels must fall strictly from {MBA_MAX}, got {list(levels)}")
        self.config = config
        self.peak_bps = peak_bps
        self.levels = tuple(levels)
        self._state: dict[str, _Throttle] = {}
        self._gpu: dict[str, _GpuTrack] = {}
        self._calm = 0  # consecutive intervals without pressure (either method)
        self._settle = 0  # GPU method: intervals to wait before the next throttle step
        self._restore_wait = config.restore_intervals
        self._probing = False  # GPU method: a restore step was taken since the last throttle
        self._warned_peak = False

    # ------------------------------------------------------------------------------ state
    def throttled(self) -> dict[str, tuple[int, int | None]]:
        """Job -> (MBA level in percent, cores kept or None) for every throttled job."""
        return {
            j: (self.levels[s.level] if self.levels else MBA_MAX, s.cores)
            for j, s in self._state.items() if s.level or s.cores is not None
        }

    def revert(self, decision: Decision) -> None:
        """The decision could not be applied: put the job's state back to what it was."""
        st = self._state.setdefault(decision.job_id, _Throttle(total=decision.previous))
        if decision.action in ("mba", "restore_mba"):
            if decision.previous in self.levels:
                st.level = self.levels.index(decision.previous)
        else:
            st.cores = None if decision.previous >= st.total else decision.previous
        self._cleanup(decision.job_id)

    # ------------------------------------------------------------------------------ decide
    def observe(self, obs: Observation) -> list[Decision]:
        present = {j.job_id for j in obs.jobs}
        for gone in [j for j in self._state if j not in present]:
            del self._state[gone]
        for gone in [j for j in self._gpu if j not in present]:
            del self._gpu[gone]
        cpu_jobs = [j for j in obs.jobs if self._throttleable(j)]
        by = self._by_bandwidth if obs.mbm else self._by_gpu
        decisions = by(obs, cpu_jobs)
        for d in decisions:
            log.info("contention decision %s", d.describe())
        return decisions

    def _throttleable(self, job: JobSample) -> bool:
        return job.gpus == 0 and job.kind in self.config.throttle_kinds and bool(job.cpus)

    def _can_throttle(self, job: JobSample) -> bool:
        st = self._state.get(job.job_id) or _Throttle(len(job.cpus))
        if job.mba and self.levels and st.level < len(self.levels) - 1:
            return True
        return (st.cores if st.cores is not None else len(job.cpus)) > 1

    # ---- MBM ----------------------------------------------------------------------------
    def _by_bandwidth(self, obs: Observation, cpu_jobs: list[JobSample]) -> list[Decision]:
        node = obs.node_bandwidth_bps
        if node is None:
            return []  # an unreadable interval: hold, neither throttle nor count as calm
        peak = self.peak_bps
        if not peak:
            if not self._warned_peak:
                log.warning("contention peak bandwidth unknown: no decisions until measured")
                self._warned_peak = True
            return []
        pressure = node / peak
        cfg = self.config
        if pressure >= cfg.threshold:
            self._calm = 0
            candidates = [j for j in cpu_jobs if self._can_throttle(j)]
            if not candidates:
                if cpu_jobs:
                    log.debug("contention pressure=%.2f but every CPU job is at its floor",
                              pressure)
                return []
            excess = node - cfg.threshold * peak
            known = sorted((j for j in candidates if j.bandwidth_bps is not None),
                           key=lambda j: (-(j.bandwidth_bps or 0.0), j.job_id))
            chosen = [j for j in candidates if j.bandwidth_bps is None]
            covered = 0.0
            for j in known:
                if covered >= excess and chosen:
                    break
                chosen.append(j)
                covered += j.bandwidth_bps or 0.0
            base = (f"node_mibps={_mibps(node)} peak_mibps={_mibps(peak)} "
                    f"pressure={pressure:.2f}>={cfg.threshold:.2f}")
            out = []
            for j in chosen:
                job_bw = ("unknown" if j.bandwidth_bps is None else _mibps(j.bandwidth_bps))
                d = self._throttle(j, f"{base} job_mibps={job_bw}")
                if d is not None:
                    out.append(d)
            return out
        if pressure < cfg.restore_threshold:
            self._calm += 1
            if self._calm >= cfg.restore_intervals and self._any_throttled(cpu_jobs):
                self._calm = 0
                reason = (f"node_mibps={_mibps(node)} pressure={pressure:.2f}"
                          f"<{cfg.restore_threshold:.2f} for={cfg.restore_intervals}")
                return self._restore_all(cpu_jobs, reason)
            return []
        self._calm = 0  # inside the hysteresis band: hold what is in force
        return []

    # ---- GPU utilisation ----------------------------------------------------------------
    def _by_gpu(self, obs: Observation, cpu_jobs: list[JobSample]) -> list[Decision]:
        cfg = self.config
        victims: list[_Victim] = []
        for job in obs.jobs:
            if job.gpus == 0 or job.gpu_util is None or job.kind != "training":
                continue
            track = self._gpu.get(job.job_id)
            if track is None:
                track = self._gpu[job.job_id] = _GpuTrack(deque(maxlen=cfg.gpu_stable_window))
            util = job.gpu_util
            if len(track.history) >= cfg.gpu_warmup_intervals and cpu_jobs:
                stable = max(track.history)
                if stable - util > cfg.gpu_drop_points:
                    track.below += 1
                else:
                    track.below = 0
                if track.below >= cfg.gpu_drop_intervals:
                    victims.append(_Victim(job.job_id, util, stable))
            else:
                track.below = 0  # no CPU job to blame, or no stable level yet
            # Dropped samples enter the window too: a lasting change of the job's own pace
            # (evaluation, checkpointing) becomes its new stable level once the window passes.
            track.history.append(util)
        waiting = self._settle > 0
        if waiting:
            self._settle -= 1
        if victims:
            self._calm = 0
            if waiting:
                return []
            v = min(victims, key=lambda x: (x.util - x.stable, x.job_id))
            reason = (f"victim={v.job_id} gpu_util={v.util:.0f} stable={v.stable:.0f} "
                      f"drop={v.stable - v.util:.0f}>{cfg.gpu_drop_points:.0f} "
                      f"for={cfg.gpu_drop_intervals}")
            out = [d for j in cpu_jobs if self._can_throttle(j)
                   if (d := self._throttle(j, reason)) is not None]
            if out:
                self._settle = cfg.gpu_settle_intervals
                if self._probing:
                    # Contention came back after a restore step: hold longer before the next.
                    self._restore_wait = min(self._restore_wait * 2,
                                             cfg.restore_intervals * GPU_RESTORE_WAIT_CAP)
                    self._probing = False
            return out
        self._calm += 1
        if not self._any_throttled(cpu_jobs):
            if self._calm >= self._restore_wait:
                # A whole wait without contention or throttles: the last probe held.
                self._restore_wait = cfg.restore_intervals
                self._probing = False
            return []
        if self._calm < self._restore_wait:
            return []
        self._calm = 0
        self._probing = True
        return self._restore_all(cpu_jobs, f"no_gpu_drop_for={self._restore_wait} probe=true")

    # ---- steps --------------------------------------------------------------------------
    def _any_throttled(self, jobs: list[JobSample]) -> bool:
        return any(j.job_id in self._state for j in jobs)

    def _throttle(self, job: JobSample, reason: str) -> Decision | None:
        st = self._state.setdefault(job.job_id, _Throttle(len(job.cpus)))
        if job.mba and self.levels and st.level < len(self.levels) - 1:
            previous = self.levels[st.level]
            st.level += 1
            return Decision(job.job_id, "mba", self.levels[st.level], previous, reason)
        have = st.cores if st.cores is not None else len(job.cpus)
        if have > 1:
            keep = max(1, have // 2)
            st.cores = keep
            why = reason + (" mba=absent" if not (job.mba and self.levels) else " mba=at_floor")
            return Decision(job.job_id, "cores", keep, have, why, cpus=job.cpus[:keep])
        self._cleanup(job.job_id)
        return None

    def _restore_all(self, jobs: list[JobSample], reason: str) -> list[Decision]:
        out = []
        for job in sorted(jobs, key=lambda j: j.job_id):
            d = self._restore(job, reason)
            if d is not None:
                out.append(d)
        return out

    def _restore(self, job: JobSample, reason: str) -> Decision | None:
        st = self._state.get(job.job_id)
        if st is None:
            return None
        total = len(job.cpus)
        d: Decision | None = None
        if st.cores is not None and st.cores < total:
            have = st.cores
            keep = min(total, have * 2)
            st.cores = None if keep >= total else keep
            d = Decision(job.job_id, "restore_cores", keep, have, reason, cpus=job.cpus[:keep])
        elif st.level > 0 and self.levels:
            previous = self.levels[st.level]
            st.level -= 1
            d = Decision(job.job_id, "restore_mba", self.levels[st.level], previous, reason)
        self._cleanup(job.job_id)
        return d

    def _cleanup(self, job_id: str) -> None:
        st = self._state.get(job_id)
        if st is not None and st.level == 0 and st.cores is None:
            del self._state[job_id]

