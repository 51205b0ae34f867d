"""EASY backfill against plain backfill and strict FIFO on the Philly trace (issue 28).

The setup is the Philly study's (sim/studies/philly.py, Helios §4.2.3): ``philly-jobs.csv``
submitted 2017-10-01 to 2017-12-01, every VC of ``philly-vcs.csv`` on its own nodes with its
own queue (one core per VC), Helios' consolidated placement, jobs running exactly their
recorded duration, at VC scale 0.2125: the scale at which the Philly study's search finds
FIFO's node utilisation at Helios' 69 % (docs/results.md, "philly-scale-search").

The trace has no time limits. Each job gets one drawn as a multiple of its recorded duration,
fixed before any result was looked at: ``time_limit_s = max(60, ceil(duration × f))`` with
``f ~ U(1.2, 3.0)``, drawn per job from ``random.Random(f"{seed}:{job id}:time-limit")``
(users over-ask, by up to 3× here; a minute is Slurm's granularity). No job then reaches its
limit unless its placement runs it slower than the recorded run (none does here: the replay
counts timeouts to show it).

Compared: ``fifo`` with ``backfill=false`` (strict), ``backfill=true`` (plain) and
``backfill="easy"``. The head-of-queue wait is the wait (submission to first start) of the
jobs that were ever the first job of their VC's queue after a scheduling pass, the jobs
EASY's reservation protects; its maximum and p99 are the figures of interest, beside the
average JCT and queueing delay of all finished jobs and node and GPU utilisation.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from masterd.core.policies import make_policy
from masterd.core.policy import Policy
from sim.engine import SimConfig, SimResult
from sim.metrics import head_waits, mean, percentile, summarise
from sim.studies.common import finished, queue_stats, replay
from sim.studies.philly import _day
from sim.truth import TruthConfig, TruthModel
from sim.workloads import philly
from sim.workloads.base import LoadOptions, Workload

# The scale of the Philly study (docs/results.md: FIFO's node utilisation 69.9 % there).
HELIOS_VC_SCALE = 0.2125
LIMIT_FACTOR = (1.2, 3.0)  # time limit = recorded duration × U(low, high)
MIN_LIMIT_S = 60
VARIANTS: dict[str, dict[str, Any]] = {
    "strict": {"backfill": False, "placement": "consolidate"},
    "plain": {"backfill": True, "placement": "consolidate"},
    "easy": {"backfill": "easy", "placement": "consolidate"},
}


def time_limit(duration: float, seed: int, key: str,
               factor: tuple[float, float] = LIMIT_FACTOR) -> int:
    """A job's drawn time limit: ``max(60, ceil(duration × U(low, high)))``, seeded per job."""
    draw = random.Random(f"{seed}:{key}:time-limit").uniform(*factor)
    return max(MIN_LIMIT_S, math.ceil(duration * draw))


def with_time_limits(workload: Workload, seed: int,
                     factor: tuple[float, float] = LIMIT_FACTOR) -> Workload:
    """Every job of a known-duration workload with a drawn time limit."""
    jobs = []
    for job in workload.jobs:
        duration = job.truth.known_duration
        if duration is None:
            raise ValueError(f"job {job.id} has no recorded duration to draw a limit from")
        limit = time_limit(duration, seed, job.id, factor)
        jobs.append(replace(job, spec=replace(job.spec, time_limit_s=limit)))
    return replace(workload, jobs=jobs)


@dataclass(frozen=True)
class BackfillStudy:
    since: str = "2017-10-01"
    until: str = "2017-12-01"
    vc_scale: float = HELIOS_VC_SCALE
    seed: int = 1
    limit: int | None = None  # the first N jobs only (tests use a small slice)
    variants: tuple[str, ...] = tuple(VARIANTS)


def stats(result: SimResult) -> dict[str, Any]:
    done = finished(result)
    jct = [r.jct for r in done if r.jct is not None]
    summary = summarise(result)
    heads = head_waits(result.records)
    util, active = summary["node_utilisation"], summary["gpu_active_rate"]
    return {
        "jobs": len(result.records),
        "finished": len(done),
        "timeout": summary["timeout"],
        "unfinished": summary["unfinished"],
        "rejected": summary["rejected"],
        "head_jobs": heads["jobs"],
        "head_never_started": heads["never_started"],
        "head_wait_max_s": heads["max_s"],
        "head_wait_p99_s": heads["p99_s"],
        "head_wait_avg_s": heads["avg_s"],
        "at_head_max_s": heads["at_head_max_s"],
        "at_head_p99_s": heads["at_head_p99_s"],
        "at_head_avg_s": heads["at_head_avg_s"],
        "avg_jct_s": mean(jct),
        "p99_jct_s": percentile(jct, 99),
        "avg_queue_s": queue_stats(done)["avg_s"],
        "node_util_pct": None if util is None else 100 * util,
        "gpu_active_pct": None if active is None else 100 * active,
    }


def load(study: BackfillStudy, trace_dir: Path) -> Workload:
    truth = TruthModel(TruthConfig(noise_sigma=0.0, interference=False), study.seed)
    workload = philly.load(trace_dir, LoadOptions(seed=study.seed, limit=study.limit), truth,
                           per_vc=True, since=_day(study.since, "since"),
                           until=_day(study.until, "until"), vc_scale=study.vc_scale)
    return with_time_limits(workload, study.seed)


def factory(variant: str) -> Callable[[], Policy]:
    options = VARIANTS[variant]
    return lambda: make_policy("fifo", **options)


def run(study: BackfillStudy, trace_dir: Path, show: bool = False,
        progress: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every variant on the same workload: {variant: stats (with wall_s)} and the setup."""
    started = time.monotonic()
    workload = load(study, trace_dir)
    config = SimConfig(seed=study.seed, truth=TruthConfig(noise_sigma=0.0, interference=False))
    out: dict[str, Any] = {"setup": {
        "since": study.since, "until": study.until, "vc_scale": study.vc_scale,
        "seed": study.seed, "jobs": len(workload.jobs), "nodes": workload.notes["nodes"],
        "limit_factor": list(LIMIT_FACTOR), "min_limit_s": MIN_LIMIT_S, "limit": study.limit,
        "mean_limit_over_duration": mean([
            j.spec.time_limit_s / j.truth.known_duration for j in workload.jobs
            if j.spec.time_limit_s and j.truth.known_duration]),
    }, "runs": {}}
    for variant in study.variants:
        result, wall = replay(f"philly x{study.vc_scale:g} fifo {variant}", workload,
                              factory(variant), config, show, partitioned=True)
        out["runs"][variant] = dict(stats(result), wall_s=wall)
        if progress is not None:
            progress(variant, out["runs"][variant])
    out["seconds"] = time.monotonic() - started
    return out
