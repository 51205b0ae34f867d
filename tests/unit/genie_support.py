"""Builders and a brute-force Algorithm 1 shared by the GENIE tests (test_genie_*.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from masterd.core.cluster import ClusterSnapshot, ClusterState
from masterd.core.genie import model as perf
from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.plan import GenieSettings
from masterd.core.genie.qos import cer, cost, ect, meets_ect
from masterd.core.placement import FreePool, pack, realise
from masterd.core.policy import Decision, Start
from shared.model import (
    CpuCore,
    GpuInfo,
    Job,
    JobKind,
    JobSpec,
    NodeInventory,
    QosClass,
)

K80 = "Tesla K80"


def node(
    name: str,
    gpus: int = 4,
    gpu_model: str = K80,
    cpus: int = 16,
    memory_mib: int = 65536,
) -> NodeInventory:
    """A node whose GPUs sit two per PCIe switch and half per NUMA node."""
    half = max(1, gpus // 2)
    return NodeInventory(
        name=name,
        hostname=name,
        address="127.0.0.1",
        gpus=tuple(
            GpuInfo(
                index=g,
                uuid=f"GPU-{name}-{g}",
                model=gpu_model,
                memory_mib=12288,
                numa_node=g // half,
                pcie_switch=g // 2,
            )
            for g in range(gpus)
        ),
        cpus=tuple(
            CpuCore(id=c, socket=c * 2 // max(cpus, 1), numa_node=c * 2 // max(cpus, 1), core=c)
            for c in range(cpus)
        ),
        memory_mib=memory_mib,
    )


def cluster(*inventories: NodeInventory) -> ClusterState:
    state = ClusterState()
    for inventory in inventories:
        state.upsert_node(inventory)
    return state


def job(
    job_id: str,
    *,
    model_type: str | None = "ResNet50",
    batch: int | None = 64,
    iterations: int | None = 1000,
    gpus: int = 4,
    qos: QosClass = QosClass.NORMAL,
    submit: float = 0.0,
    kind: JobKind | None = None,
    cpus: int = 1,
    memory_mib: int = 0,
    deadline: float | None = None,
    max_nodes: int | None = None,
    gpu_model: str | None = None,
    family: str | None = None,
    params_m: float | None = None,
    requeue_priority: int = 0,
) -> Job:
    if kind is None:
        kind = JobKind.CPU if gpus == 0 else JobKind.TRAINING
    spec = JobSpec(
        name=job_id,
        command=("train",),
        user="alice",
        kind=kind,
        qos=qos,
        gpus=gpus,
        gpu_model=gpu_model,
        cpus=cpus,
        memory_mib=memory_mib,
        model_type=model_type,
        model_family=family,
        model_params_m=params_m,
        batch=batch,
        iterations=iterations,
        deadline=deadline,
        max_nodes=max_nodes,
    )
    return Job(id=job_id, spec=spec, submit_time=submit, requeue_priority=requeue_priority)


# ---------------------------------------------------------------------------------------------
# A literal, unoptimised Algorithm 1: every job, every placement, every pass.


@dataclass(frozen=True)
class RefCandidate:
    gpu_model: str
    d_node: int
    d_gpn: int
    rate: float
    cer: float
    latency: float
    score: float  # CER, or N-free CER when the job sees one GPU model (see plan.Candidate)


@dataclass(frozen=True)
class RefChoice:
    job: Job
    ect: float
    candidate: RefCandidate
    key: float  # e − l: the waiting allowance plus now
    late: int = 0  # 1: deferred behind every job that can still meet its ECT


def ref_platform(snapshot: ClusterSnapshot) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for view in snapshot.nodes.values():
        if view.total_gpus and view.gpu_model is not None:
            n, g = out.get(view.gpu_model, (0, 0))
            out[view.gpu_model] = (n + 1, max(g, view.total_gpus))
    return out


def ref_candidates(
    j: Job, snapshot: ClusterSnapshot, db: ModelDB, settings: GenieSettings
) -> tuple[list[RefCandidate], float]:
    """All placements of a job with their latency, and the job's ECT."""
    spec = j.spec
    inference = spec.kind is JobKind.INFERENCE
    has_work = spec.batch is not None and spec.iterations is not None
    work = spec.batch * spec.iterations if has_work else None  # type: ignore[operator]
    opaque_work = work if work is not None else settings.default_rate * settings.default_duration_s
    out: list[RefCandidate] = []
    baselines: list[float] = []
    eligible = {
        model: ng for model, ng in ref_platform(snapshot).items()
        if spec.gpu_model is None or model == spec.gpu_model
    }

    def ranked(model: str, dn: int, dg: int, rate: float, lat: float) -> RefCandidate:
        n_nodes, g = eligible[model]
        c = cost(dn, dg, n_nodes, g, settings.theta)
        ratio = cer(rate, c)
        score = ratio if len(eligible) > 1 else rate / (dn * dg / g + settings.theta * dn)
        return RefCandidate(model, dn, dg, rate, ratio, lat, score)

    for model, (n_nodes, g) in sorted(eligible.items()):
        max_nodes = min(n_nodes, spec.max_nodes or n_nodes)
        every = [(dn, dg) for dn in range(1, max_nodes + 1) for dg in range(1, g + 1)]
        res = None
        if has_work:
            res = db.resolve(
                spec.model_type, model, "inference" if inference else "training",
                spec.model_family, spec.model_params_m,
            )
        modelled: list[RefCandidate] = []
        if res is not None:
            for dn, dg in every:
                d = dn * dg
                if settings.shape_mode != "any" and (
                    d > spec.gpus or (settings.shape_mode == "exact" and d != spec.gpus)
                ):
                    continue
                rate = perf.processing_rate(res.coefficients, spec.batch, dn, dg, inference)
                if rate is None:
                    continue
                lat = perf.latency(res.coefficients, spec.batch, spec.iterations, dn, dg,
                                   inference)
                modelled.append(ranked(model, dn, dg, rate, lat))
        if modelled:
            out.extend(modelled)
            nominal = perf.nominal_single_gpu_latency(res.coefficients, spec.batch,
                                                      spec.iterations)
            if nominal is not None:
                baselines.append(nominal)
        else:
            for dn, dg in every:
                if dn * dg != spec.gpus:
                    continue
                rate = dn * dg * settings.default_rate
                out.append(ranked(model, dn, dg, rate, opaque_work / rate))
            baselines.append(opaque_work / settings.default_rate)
    if baselines:
        single = min(baselines)
    elif out:
        single = min(c.latency for c in out)
    else:
        single = opaque_work / settings.default_rate
    return out, ect(spec.qos, j.submit_time, single, spec.deadline)


def ref_rank(c: RefCandidate) -> tuple[float, float, str, int, int]:
    return (-c.score, -c.rate, c.gpu_model, c.d_node, c.d_gpn)


def ref_order(
    snapshot: ClusterSnapshot,
    queue: Sequence[Job],
    now: float,
    db: ModelDB,
    settings: GenieSettings,
    late_tasks: str = "serve",
) -> list[RefChoice]:
    """Algorithm 1: each GPU job's placement and the SWAF order (ties by queue order);
    ``late_tasks="defer"`` puts jobs no placement lets meet their ECT (urgent ones placed
    as soon as possible excepted) behind the others."""
    choices: list[RefChoice] = []
    for j in queue:
        if j.spec.gpus == 0:
            continue
        candidates, e = ref_candidates(j, snapshot, db, settings)
        if not candidates:
            continue
        meeting = [c for c in candidates if meets_ect(c.latency, now, e)]
        urgent = j.spec.qos is QosClass.URGENT and j.spec.deadline is None
        asap = urgent and settings.urgent_placement == "fastest"
        if asap:
            best = min(candidates, key=lambda c: (c.latency, ref_rank(c)))
        else:
            best = min(meeting or candidates, key=ref_rank)
        late = int(late_tasks == "defer" and not meeting and not asap)
        choices.append(RefChoice(j, e, best, e - best.latency, late))
    choices.sort(key=lambda c: (c.late, c.key, -c.job.requeue_priority, c.job.submit_time,
                                c.job.id))
    return choices


def ref_decide(
    snapshot: ClusterSnapshot,
    queue: Sequence[Job],
    now: float,
    db: ModelDB,
    settings: GenieSettings,
    late_tasks: str = "serve",
) -> list[Decision]:
    pool = FreePool(snapshot)
    decisions: list[Decision] = []
    for choice in ref_order(snapshot, queue, now, db, settings, late_tasks):
        c = choice.candidate
        names = [n for n, v in pool.views.items() if v.gpu_model == c.gpu_model]
        placement = realise(choice.job.spec, pool, c.d_node, c.d_gpn, names)
        if placement is not None:
            pool.take(placement)
            decisions.append(Start(choice.job.id, placement))
    for j in queue:
        if j.spec.gpus == 0:
            placement = pack(j.spec, pool)
            if placement is not None:
                pool.take(placement)
                decisions.append(Start(j.id, placement))
    return decisions
