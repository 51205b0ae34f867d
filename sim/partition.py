"""Replaying a workload as independent partitions (one scheduling core each) and merging them.

Helios schedules each Philly virtual cluster separately: its own nodes and its own queue. The
per-VC loader (``philly.load(per_vc=True)``) labels each VC's nodes with their own GPU model and
pins each job to it, which keeps placements inside the VC; but one core still has one queue, so
a FIFO head waiting for its VC would block every other VC's jobs. Running one core per GPU
model label gives each VC its own queue as well, without touching the core. Results are merged
into one :class:`SimResult` so every metric and report treats the cluster as a whole.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, replace

from masterd.core.policy import Policy
from sim.engine import Annotator, Sample, SimConfig, SimResult
from sim.engines import Engine, engine_for
from sim.workloads.base import Workload

ProgressFn = Callable[[float, int, int], None]


@dataclass(frozen=True)
class Partition:
    label: str  # the GPU model label shared by its nodes ("" for jobs no node can host)
    workload: Workload


def split_by_gpu_model(workload: Workload) -> list[Partition]:
    """One partition per GPU model label of the nodes, holding the jobs that ask for it.

    Every job must name a GPU model (as per-VC jobs do); jobs naming a label no node carries
    form a partition without nodes, where the core rejects them as never fitting.
    """
    nodes_by_model: dict[str, list] = {}
    for node in workload.nodes:
        nodes_by_model.setdefault(node.gpu_model or "", []).append(node)
    jobs_by_model: dict[str, list] = {label: [] for label in nodes_by_model}
    orphans = []
    for job in workload.jobs:
        model = job.spec.gpu_model
        if model is None:
            raise ValueError(
                f"job {job.id} names no GPU model: partitioned replay needs every job pinned "
                "to one partition's label (per-VC loading does that)"
            )
        if model in jobs_by_model:
            jobs_by_model[model].append(job)
        else:
            orphans.append(job)
    parts = [
        Partition(label, replace(workload, name=workload.name, jobs=jobs_by_model[label],
                                 nodes=nodes, skipped=[]))
        for label, nodes in nodes_by_model.items()
        if jobs_by_model[label] or nodes
    ]
    if orphans:
        parts.append(Partition("", replace(workload, jobs=orphans, nodes=[], skipped=[])))
    return parts


def simulate_partitioned(
    workload: Workload,
    make_policy: Callable[[], Policy],
    config: SimConfig,
    progress: ProgressFn | None = None,
    make_annotator: Callable[[], Annotator] | None = None,
    engine: Engine | None = None,
) -> SimResult:
    """Replay each partition with its own core and policy instance (and annotator, if any:
    an estimator learns from its own partition's jobs, as a per-VC scheduler would); merge
    the results."""
    parts = split_by_gpu_model(workload)
    if config.sample_interval is None:
        # One interval for every partition, so their samples fall on the same instants.
        horizon = workload.jobs[-1].submit if workload.jobs else 0.0
        config = replace(config, sample_interval=max(60.0, horizon / 500.0))
    total = len(workload.jobs)
    results: list[SimResult] = []
    gpu_nodes: list[int] = []
    done_before = 0
    for part in parts:
        inner = None
        if progress is not None:
            offset = done_before

            def inner(t: float, done: int, _total: int, offset: int = offset) -> None:
                progress(t, offset + done, total)

        annotator = make_annotator() if make_annotator is not None else None
        policy = make_policy()
        chosen = engine if engine is not None else engine_for([policy])
        results.append(chosen.replay(part.workload, policy, config, inner, annotator))
        gpu_nodes.append(sum(1 for n in part.workload.nodes if n.gpus))
        done_before += len(part.workload.jobs)
    return merge_results(results, gpu_nodes, workload)


def _merge_usage(series: list[list[tuple[float, int, float]]]) -> list[tuple[float, int, float]]:
    """Sum step functions given as change points (time, allocated, effective)."""
    current = [(0, 0.0)] * len(series)
    events = heapq.merge(*[[(t, i, a, e) for t, a, e in s] for i, s in enumerate(series)])
    merged: list[tuple[float, int, float]] = []
    for t, i, a, e in events:
        current[i] = (a, e)
        point = (t, sum(c[0] for c in current), sum(c[1] for c in current))
        if merged and merged[-1][0] == t:
            merged[-1] = point
        else:
            merged.append(point)
    return merged


def _merge_busy(series: list[list[tuple[float, int]]]) -> list[tuple[float, int]]:
    """Sum step functions given as change points (time, busy nodes)."""
    current = [0] * len(series)
    merged: list[tuple[float, int]] = []
    for t, i, busy in heapq.merge(*[[(t, i, b) for t, b in s] for i, s in enumerate(series)]):
        current[i] = busy
        point = (t, sum(current))
        if merged and merged[-1][0] == t:
            merged[-1] = point
        else:
            merged.append(point)
    return merged


def _merge_samples(results: list[SimResult], gpu_nodes: list[int]) -> list[Sample]:
    """Sum samples taken at the same instant; a partition that has finished counts as idle."""
    by_time: dict[float, list[tuple[int, Sample]]] = {}
    for index, result in enumerate(results):
        for s in result.samples:
            by_time.setdefault(s.time, []).append((index, s))
    all_gpu_nodes = sum(gpu_nodes)
    merged = []
    for t in sorted(by_time):
        parts = by_time[t]
        frag = sum(s.fragmentation * gpu_nodes[i] for i, s in parts)
        merged.append(
            Sample(
                time=t,
                allocated_gpus=sum(s.allocated_gpus for _, s in parts),
                effective_gpus=sum(s.effective_gpus for _, s in parts),
                queued=sum(s.queued for _, s in parts),
                running=sum(s.running for _, s in parts),
                fragmentation=frag / all_gpu_nodes if all_gpu_nodes else 0.0,
                nodes_down=sum(s.nodes_down for _, s in parts),
            )
        )
    return merged


def merge_results(
    results: list[SimResult], gpu_nodes: list[int], workload: Workload
) -> SimResult:
    if not results:
        raise ValueError("no partition results to merge")
    records = [r for result in results for r in result.records]
    notes = dict(workload.notes)
    notes["partitions"] = len(results)
    return SimResult(
        policy=results[0].policy,
        workload=workload.name,
        seed=results[0].seed,
        records=records,
        total_gpus=sum(r.total_gpus for r in results),
        usage=_merge_usage([r.usage for r in results]),
        samples=_merge_samples(results, gpu_nodes),
        events=sum(r.events for r in results),
        passes=sum(r.passes for r in results),
        stale_events=sum(r.stale_events for r in results),
        end_time=max(r.end_time for r in results),
        notes=notes,
        busy_nodes=_merge_busy([r.busy_nodes for r in results]),
        total_nodes=sum(r.total_nodes for r in results),
    )
