"""SCHED²'s workload (seeds/sched2.md §IV-A) resampled from the public Philly trace.

The paper's trace is private: 6,261 jobs, 68% of them on one GPU, a mean inter-arrival time
of 172 s, replayed on 15 servers × 8 GPUs, in episodes of 1,000 jobs (30 to train on, 30 held
out). What it gives, we keep; the rest comes from ``philly-jobs.csv`` (October–November 2017,
the window Helios evaluates), seeded per episode:

- **Jobs**: GPU count and duration drawn together from a Philly job. ``one_gpu_share`` p
  draws a one-GPU job with probability p and a multi-GPU job otherwise (the paper's mix is
  68%; it also evaluates 60% and 75%); ``None`` draws from Philly as it is (93.5% one-GPU).
  With a mix, only jobs of ``min_duration_s``–``max_duration_s`` are drawn: the paper's jobs
  run "from several minutes to hours" (§II-B), Philly's for up to a month (its multi-GPU jobs
  average 20 h); Philly as it is keeps every duration.
- **Load**: a Philly job's GPUs and duration come together, so its mean work at the 68% mix
  is about 37,400 GPU-seconds against 172 s × 120 GPUs = 20,640 offered: load 1.81, where
  every queue grows without bound. The paper's own figures imply far less (Little's law on
  its Fig. 10): a mean run of 5,422 s at one arrival per 172 s keeps 5,422 / 172 = 31.5 jobs
  running, at 2.64 GPUs a job (the 68% mix's mean demand, Philly's multi-GPU jobs averaging
  6.13) about 83 GPUs of 120, a load of 0.69 (``IMPLIED_LOAD``; 5,422 s is SCHED²'s *actual*
  run time, so the ideal load the paper ran at was at most that). ``load`` scales every
  drawn duration by one factor so the *expected* offered load, mean GPU-seconds a job ÷
  (``mean_gap_s`` × GPUs), is ``load``: ``duration_scale``; ``None`` keeps Philly's durations.
  Each episode's realised load (``notes["offered_load"]``) scatters around it.
- **Arrivals**: gaps drawn from Philly's own inter-arrival gaps in the window (bursty, not
  Poisson: "the intervals ... follow the distribution of the original trace"), scaled so
  their mean is ``mean_gap_s``.
- **Models**: category CV / NLP / Speech with 10 / 60 / 30% (§IV-A). CV is VGG16 or
  Inception3 (the two CV models whose locality penalty §II-A gives; AlexNet and ResNet-50 of
  Table II are left out for want of one), NLP is Transformer, Speech is DeepSpeech; their
  slowdowns over two servers are in ``sim.truth.SCHED2_SLOWDOWNS``. Batch 128.
- **QSSF's estimate**: the paper has no users or job names to learn from, so each job
  carries Helios' error model around its drawn duration (``sim.workloads.philly
  .helios_estimate``, seeded by the job's key), as the Philly replay of Helios does.
- **Cluster**: 15 servers × 8 GPUs, one PCIe switch and one socket per server (SCHED² models
  locality at the server boundary only), no CPU cores or memory asked or modelled.

Episode ``i`` is drawn from ``random.Random(f"{seed}/sched2/{i}")``: the same seed and index
give the same episode whatever else is loaded. ``TRAIN_EPISODES`` and ``TEST_EPISODES`` are
the paper's split.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from masterd.core.helios.estimate import ESTIMATE_KEY
from shared.model import JobKind, JobSpec
from sim.cluster import NodeGroup, build_cluster
from sim.truth import NodeTopology, TruthModel, TruthParams
from sim.workloads.assign import ModelFill, iterations_for_duration, pick_weighted
from sim.workloads.base import (
    LoadOptions,
    RowError,
    SimJob,
    TraceError,
    Workload,
    parse_float,
    parse_int,
    read_csv_rows,
)
from sim.workloads.philly import helios_estimate

JOBS_FILE = "philly-jobs.csv"
TRAIN_EPISODES = range(0, 30)
TEST_EPISODES = range(30, 60)
CATEGORIES: tuple[tuple[str, float], ...] = (("cv", 0.10), ("nlp", 0.60), ("speech", 0.30))
CATEGORY_MODELS: dict[str, tuple[str, ...]] = {
    "cv": ("vgg16", "inception3"),
    "nlp": ("transformer",),
    "speech": ("deepspeech",),
}
BATCH = 128
GPU_MODEL = "P40"
# Little's law on the paper's Fig. 10 (see the module's docstring): mean run 5,422 s, one
# arrival per 172 s, 2.64 GPUs a job, 120 GPUs.
PAPER_RUN_S, PAPER_GAP_S, PAPER_GPUS_PER_JOB, PAPER_GPUS = 5422.0, 172.0, 2.64, 120
IMPLIED_LOAD = round(PAPER_RUN_S / PAPER_GAP_S * PAPER_GPUS_PER_JOB / PAPER_GPUS, 2)


@dataclass(frozen=True)
class Sched2Options:
    one_gpu_share: float | None = 0.68  # None: Philly's own mix
    jobs: int = 1000
    mean_gap_s: float = 172.0
    servers: int = 15
    gpus_per_server: int = 8
    since: str = "2017-10-01"
    until: str = "2017-12-01"
    min_duration_s: float = 60.0  # applied with a mix only (see the module's docstring)
    max_duration_s: float = 86400.0
    seed: int = 1
    load: float | None = IMPLIED_LOAD  # expected offered load; None: Philly's durations

    def __post_init__(self) -> None:
        if self.load is not None and not (self.load > 0 and math.isfinite(self.load)):
            raise ValueError(f"load must be a positive number, got {self.load}")
        p = self.one_gpu_share
        if p is not None and not 0.0 <= p <= 1.0:
            raise ValueError(f"one_gpu_share must be within [0, 1], got {p}")
        for name in ("jobs", "servers", "gpus_per_server"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not (self.mean_gap_s > 0 and math.isfinite(self.mean_gap_s)):
            raise ValueError(f"mean_gap_s must be a positive number, got {self.mean_gap_s}")
        if not 0 <= self.min_duration_s < self.max_duration_s:
            raise ValueError("min_duration_s must be >= 0 and below max_duration_s")

    @property
    def label(self) -> str:
        if self.one_gpu_share is None:
            return "philly-as-is"
        return f"{round(100 * self.one_gpu_share)}pct-one-gpu"


@dataclass(frozen=True)
class TraceJob:
    duration: float
    gpus: int
    vc: str


@dataclass(frozen=True)
class Pool:
    """The trace's jobs in the window, split by GPU count, and its inter-arrival gaps."""

    one_gpu: tuple[TraceJob, ...]
    multi_gpu: tuple[TraceJob, ...]
    gaps: tuple[float, ...]

    @property
    def mean_gap(self) -> float:
        return math.fsum(self.gaps) / len(self.gaps)


def _day(text: str) -> float:
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ValueError(f"{text!r} is not a date (YYYY-MM-DD)") from None


def _parse(row: Mapping[str, str], line: int) -> tuple[float, TraceJob]:
    raw = row["timestamp"].strip()
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        raise RowError(f"column timestamp: {raw!r} is not a timestamp") from None
    duration = parse_float(row, "duration", min_value=0.0)
    gpus = parse_int(row, "num_gpus", min_value=1)
    assert duration is not None and gpus is not None
    return stamp.replace(tzinfo=UTC).timestamp(), TraceJob(duration, gpus, row["cluster"].strip())


@functools.lru_cache(maxsize=8)
def load_pool(trace_dir: Path, since: str, until: str, max_gpus: int) -> Pool:
    """Philly's jobs submitted in [since, until) that fit ``max_gpus`` GPUs (cached)."""
    start, end = _day(since), _day(until)
    rows = [
        (t, job) for t, job in read_csv_rows(
            trace_dir / JOBS_FILE, ("timestamp", "duration", "num_gpus", "cluster"), _parse,
            LoadOptions(), [])
        if start <= t < end
    ]
    if len(rows) < 2:
        raise TraceError(trace_dir / JOBS_FILE, None, f"fewer than two jobs in {since}..{until}")
    times = sorted(t for t, _ in rows)
    gaps = tuple(b - a for a, b in itertools.pairwise(times))
    if not math.fsum(gaps) > 0:
        raise TraceError(trace_dir / JOBS_FILE, None, "every job arrives at the same instant")
    jobs = [job for _, job in rows if job.gpus <= max_gpus]
    return Pool(tuple(j for j in jobs if j.gpus == 1), tuple(j for j in jobs if j.gpus > 1),
                gaps)


def node_group(options: Sched2Options) -> NodeGroup:
    return NodeGroup(count=options.servers, gpus_per_node=options.gpus_per_server,
                     gpu_model=GPU_MODEL, gpu_memory_mib=24576, cpu_cores=0, sockets=1,
                     gpus_per_switch=options.gpus_per_server, memory_mib=262144,
                     prefix="s2")


def pick_model(r: random.Random) -> tuple[str, str]:
    category = pick_weighted(r, CATEGORIES)
    models = CATEGORY_MODELS[category]
    return category, models[r.randrange(len(models))]


def _candidates(trace_dir: Path, options: Sched2Options) -> tuple[tuple[TraceJob, ...], ...]:
    """The jobs an episode draws from: one group (Philly as it is) or (one-GPU, multi-GPU)."""
    pool = load_pool(trace_dir, options.since, options.until,
                     options.servers * options.gpus_per_server)
    p = options.one_gpu_share
    low, high = options.min_duration_s, options.max_duration_s
    if p is None:
        return (pool.one_gpu + pool.multi_gpu,)
    candidates = tuple(
        tuple(j for j in group if low <= j.duration <= high)
        for group in (pool.one_gpu, pool.multi_gpu))
    if (not candidates[0] and p > 0) or (not candidates[1] and p < 1):
        raise TraceError(trace_dir / JOBS_FILE, None, "no jobs of the asked kind in the "
                         f"duration window {low:g}-{high:g} s")
    return candidates


def expected_work(candidates: tuple[tuple[TraceJob, ...], ...], share: float | None) -> float:
    """Mean GPU-seconds of a drawn job: the mix's weights over the groups' means."""
    def mean(group: tuple[TraceJob, ...]) -> float:
        return math.fsum(j.gpus * j.duration for j in group) / len(group) if group else 0.0
    if share is None:
        return mean(candidates[0])
    return share * mean(candidates[0]) + (1.0 - share) * mean(candidates[1])


def duration_scale(trace_dir: Path, options: Sched2Options) -> float:
    """The factor on every drawn duration that makes the expected offered load ``load``:
    load × mean gap × GPUs ÷ expected GPU-seconds a job (1.0 when ``load`` is None)."""
    if options.load is None:
        return 1.0
    work = expected_work(_candidates(trace_dir, options), options.one_gpu_share)
    gpus = options.servers * options.gpus_per_server
    return options.load * options.mean_gap_s * gpus / work


def episode(trace_dir: Path, options: Sched2Options, index: int,
            truth: TruthModel) -> Workload:
    """Episode ``index`` (``TRAIN_EPISODES``, ``TEST_EPISODES``) of the workload."""
    pool = load_pool(trace_dir, options.since, options.until,
                     options.servers * options.gpus_per_server)
    p = options.one_gpu_share
    candidates = _candidates(trace_dir, options)
    stretch = duration_scale(trace_dir, options)
    nodes = build_cluster([node_group(options)])
    topo = NodeTopology.of(nodes)
    r = random.Random(f"{options.seed}/sched2/{index}")
    scale = options.mean_gap_s / pool.mean_gap
    jobs: list[SimJob] = []
    categories = {c: 0 for c, _ in CATEGORIES}
    submit = 0.0
    for n in range(options.jobs):
        if n:
            submit += pool.gaps[r.randrange(len(pool.gaps))] * scale
        group = candidates[0] if p is None or r.random() < p else candidates[1]
        drawn = group[r.randrange(len(group))]
        picked = TraceJob(drawn.duration * stretch, drawn.gpus, drawn.vc)
        category, model = pick_model(r)
        categories[category] += 1
        key = f"s2-e{index}-{n:04d}"
        fill = ModelFill(model, BATCH)
        iterations = iterations_for_duration(truth, fill, JobKind.TRAINING, picked.duration,
                                             picked.gpus, topo)
        spec = JobSpec(name=key, command=("sched2-job",), user="sched2", tenant=picked.vc,
                       gpus=picked.gpus, cpus=0, model_type=model, model_family=category,
                       batch=BATCH, iterations=iterations)
        params = TruthParams(model_type=model, batch=BATCH, known_duration=picked.duration,
                             known_gpus=picked.gpus)
        jobs.append(SimJob(id=key, spec=spec, submit=submit, truth=params, annotations={
            ESTIMATE_KEY: helios_estimate(picked.duration, options.seed, key)}))
    work = math.fsum(j.truth.known_duration * j.spec.gpus for j in jobs  # type: ignore[operator]
                     )
    gpus = options.servers * options.gpus_per_server
    return Workload(
        name=f"sched2-{options.label}",
        jobs=jobs,
        nodes=nodes,
        notes={
            "episode": index,
            "mix": options.label,
            "one_gpu_share": sum(j.spec.gpus == 1 for j in jobs) / len(jobs),
            "mean_gap_s": submit / max(1, len(jobs) - 1),
            "offered_load": work / (max(submit, 1.0) * gpus),
            "target_load": options.load,
            "duration_scale": stretch,
            "categories": categories,
            "servers": options.servers,
            "gpus_per_server": options.gpus_per_server,
        },
    )
