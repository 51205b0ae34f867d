"""Alibaba cluster-trace-gpu-v2023 "openb": openb-pods.csv on openb-gpu-nodes.csv.

Pods ask for milli-CPUs, memory, whole GPUs (``num_gpu``) and a per-GPU share (``gpu_milli``).
The core allocates whole GPUs and whole cores, so (docs/simulator.md):

* a fractional GPU request (gpu_milli < 1000) is rounded up to whole GPUs, ceil(num_gpu ×
  gpu_milli / 1000); the count of rounded pods is reported, since this overstates GPU demand;
* cpu_milli is rounded up to whole cores;
* runtime = deletion − scheduled for pods the trace saw scheduled, deletion − creation for pods
  it never scheduled (how long their owner kept them);
* kind: no GPU → cpu job; latency-sensitive (LS) GPU pods → inference; other GPU pods →
  training. QoS: Guaranteed → urgent, LS → prior, Burstable and BE → normal; the trace's QoS
  label (lower-cased) is the tenant;
* GPU pods get a seeded model type and batch as Philly jobs do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shared.model import JobKind, JobSpec, NodeInventory, QosClass, is_valid_name
from sim.cluster import NodeGroup, build_node
from sim.truth import NodeTopology, TruthModel, TruthParams
from sim.workloads.assign import iterations_for_duration, pick_model
from sim.workloads.base import (
    LoadOptions,
    RowError,
    SimJob,
    TraceError,
    Workload,
    finish,
    parse_int,
    read_csv_rows,
)

PODS_FILE = "openb-pods.csv"
GPU_NODES_FILE = "openb-gpu-nodes.csv"

QOS_MAP = {
    "Guaranteed": QosClass.URGENT,
    "LS": QosClass.PRIOR,
    "Burstable": QosClass.NORMAL,
    "BE": QosClass.NORMAL,
}
PHASES = frozenset({"Running", "Succeeded", "Failed", "Pending"})
GPU_MEMORY_MIB = {"V100M32": 32768, "A10": 24576}


@dataclass(frozen=True)
class _Pod:
    name: str
    cpus: int
    memory_mib: int
    gpus: int
    fractional: bool
    gpu_milli: int  # per GPU, as the trace asks (1000 for whole GPUs)
    gpu_model: str | None
    qos: str
    submit: float
    runtime: float


def _parse_pod(row: Mapping[str, str], line: int) -> _Pod:
    name = row["name"].strip()
    if not is_valid_name(name):
        raise RowError(f"column name: {name!r} is not a valid job name")
    cpu_milli = parse_int(row, "cpu_milli", min_value=0)
    memory = parse_int(row, "memory_mib", min_value=0)
    num_gpu = parse_int(row, "num_gpu", min_value=0)
    gpu_milli = parse_int(row, "gpu_milli", min_value=0)
    assert cpu_milli is not None and memory is not None
    assert num_gpu is not None and gpu_milli is not None
    if gpu_milli > 1000:
        raise RowError(f"column gpu_milli: {gpu_milli} exceeds one whole GPU (1000)")
    if num_gpu == 0 and gpu_milli:
        raise RowError(f"gpu_milli {gpu_milli} given for a pod with num_gpu 0")
    if num_gpu and not gpu_milli:
        raise RowError(f"num_gpu {num_gpu} given with gpu_milli 0")
    if num_gpu == 0 and cpu_milli == 0:
        raise RowError("the pod asks for neither CPU nor GPU")
    qos = row["qos"].strip()
    if qos not in QOS_MAP:
        raise RowError(f"column qos: {qos!r} is not one of {', '.join(QOS_MAP)}")
    phase = row["pod_phase"].strip()
    if phase not in PHASES:
        raise RowError(f"column pod_phase: {phase!r} is not one of {', '.join(sorted(PHASES))}")
    created = parse_int(row, "creation_time", min_value=0)
    deleted = parse_int(row, "deletion_time", min_value=0)
    scheduled = parse_int(row, "scheduled_time", min_value=0, allow_empty=True)
    assert created is not None and deleted is not None
    if deleted < created:
        raise RowError(f"deletion_time {deleted} is before creation_time {created}")
    if scheduled is not None and not created <= scheduled <= deleted:
        raise RowError(
            f"scheduled_time {scheduled} is outside [creation_time, deletion_time] = "
            f"[{created}, {deleted}]"
        )
    runtime = deleted - (scheduled if scheduled is not None else created)
    spec_raw = row["gpu_spec"].strip()
    # gpu_spec lists acceptable models separated by '|'; the core takes one model or any.
    models = [m for m in spec_raw.split("|") if m]
    gpus = math.ceil(num_gpu * gpu_milli / 1000) if num_gpu else 0
    return _Pod(
        name=name,
        cpus=math.ceil(cpu_milli / 1000),
        memory_mib=memory,
        gpus=gpus,
        fractional=bool(num_gpu) and gpu_milli < 1000,
        gpu_milli=gpu_milli,
        gpu_model=models[0] if len(models) == 1 else None,
        qos=qos,
        submit=float(created),
        runtime=float(runtime),
    )


def _parse_node(row: Mapping[str, str], line: int) -> NodeInventory:
    name = row["sn"].strip()
    if not is_valid_name(name):
        raise RowError(f"column sn: {name!r} is not a valid node name")
    cpu_milli = parse_int(row, "cpu_milli", min_value=0)
    memory = parse_int(row, "memory_mib", min_value=0)
    gpus = parse_int(row, "gpu", min_value=0)
    assert cpu_milli is not None and memory is not None and gpus is not None
    model = row["model"].strip()
    if gpus and not model:
        raise RowError(f"node with {gpus} GPUs has no GPU model")
    if cpu_milli < 1000 and not gpus:
        raise RowError("node has neither a whole core nor a GPU")
    cores = cpu_milli // 1000
    group = NodeGroup(
        count=1,
        gpus_per_node=gpus,
        gpu_model=model or "none",
        gpu_memory_mib=GPU_MEMORY_MIB.get(model, 16384),
        cpu_cores=cores,
        sockets=2 if cores >= 2 else 1,
        gpus_per_switch=4 if gpus > 4 else 2,
        memory_mib=memory,
        nic_mbps=25000,
    )
    return build_node(name, group)


def load_nodes(path: Path, options: LoadOptions, skipped: list[str]) -> list[NodeInventory]:
    nodes = list(
        read_csv_rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"), _parse_node,
                      options, skipped)
    )
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise TraceError(path, None, f"node {dup} is listed twice")
    if not nodes:
        raise TraceError(path, None, "no nodes")
    return nodes


def load(
    trace_dir: Path,
    options: LoadOptions,
    truth: TruthModel,
    nodes_file: Path | None = None,
    arrival_scale: float = 1.0,
    node_stride: int = 1,
    since: float | None = None,
    honour_fractional: bool = False,
) -> Workload:
    """Load pods and nodes. ``arrival_scale`` > 1 compresses time: every creation time is
    divided by it (runtimes are kept), so the same pods arrive ``arrival_scale`` times more
    densely. ``node_stride`` k > 1 keeps every k-th node of the node list (file order), a
    smaller cluster with the same mix of node types. ``honour_fractional``: a one-GPU pod asking
    for part of a GPU keeps its ``gpu_milli`` (else it is rounded up to the whole GPU, as every
    pod still is for policies that do not share). ``since`` (trace seconds) keeps the pods
    created at or after it, before scaling: most pods arrive in the trace's last weeks. All
    exist because openb's pods span 149 days and barely load its nodes: without them nothing
    queues (docs/simulator.md)."""
    if not arrival_scale > 0:
        raise ValueError(f"arrival scale must be positive, got {arrival_scale:g}")
    if node_stride < 1:
        raise ValueError(f"node stride must be at least 1, got {node_stride}")
    skipped: list[str] = []
    nodes = load_nodes(nodes_file or trace_dir / GPU_NODES_FILE, options, skipped)
    listed = len(nodes)
    nodes = nodes[::node_stride]
    topo = NodeTopology.of(nodes)
    pods = list(
        read_csv_rows(
            trace_dir / PODS_FILE,
            ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos",
             "pod_phase", "creation_time", "deletion_time", "scheduled_time"),
            _parse_pod,
            options,
            skipped,
        )
    )
    jobs: list[SimJob] = []
    seen: set[str] = set()
    fractional = 0
    honoured = 0  # fractional pods given gpu_milli instead of rounded up
    in_trace = len(pods)
    if since is not None:
        pods = [p for p in pods if p.submit >= since]
        if not pods:
            raise TraceError(trace_dir / PODS_FILE, None, f"no pods created at or after {since:g}")
    for pod in pods:
        if pod.name in seen:
            raise TraceError(trace_dir / PODS_FILE, None, f"pod {pod.name} is listed twice")
        seen.add(pod.name)
        fractional += pod.fractional
        honoured += honour_fractional and pod.fractional and pod.gpus == 1
        tenant = pod.qos.lower()
        if pod.gpus == 0:
            spec = JobSpec(
                name=pod.name, command=("openb-pod",), user="openb", kind=JobKind.CPU,
                tenant=tenant, qos=QOS_MAP[pod.qos], gpus=0, cpus=pod.cpus,
                memory_mib=pod.memory_mib,
            )
            params = TruthParams(known_duration=pod.runtime, known_gpus=0)
        else:
            kind = JobKind.INFERENCE if pod.qos == "LS" else JobKind.TRAINING
            fill = pick_model(options.seed, pod.name)
            iterations = iterations_for_duration(
                truth, fill, kind, pod.runtime, pod.gpus, topo
            )
            spec = JobSpec(
                name=pod.name, command=("openb-pod",), user="openb", kind=kind,
                tenant=tenant, qos=QOS_MAP[pod.qos], gpus=pod.gpus, gpu_model=pod.gpu_model,
                cpus=pod.cpus, memory_mib=pod.memory_mib, model_type=fill.model_type,
                batch=fill.batch, iterations=iterations,
                # Honoured, a one-GPU pod's share stays a share (Liquid's sharing may place it
                # beside others); a policy that does not share still gives it a whole GPU.
                gpu_milli=pod.gpu_milli if honour_fractional and pod.fractional and pod.gpus == 1
                else None,
            )
            params = TruthParams(
                model_type=fill.model_type, batch=fill.batch,
                known_duration=pod.runtime, known_gpus=pod.gpus,
            )
        jobs.append(
            SimJob(id=pod.name, spec=spec, submit=pod.submit / arrival_scale, truth=params)
        )
    workload = Workload(
        name="openb",
        jobs=jobs,
        nodes=nodes,
        skipped=skipped,
        notes={
            "nodes": len(nodes),
            "nodes_listed": listed,
            "node_stride": node_stride,
            "arrival_scale": arrival_scale,
            "pods_in_trace": in_trace,
            "pods_since": since,
            "gpus": sum(len(n.gpus) for n in nodes),
            "cpu_cores": sum(len(n.cpus) for n in nodes),
            "fractional_gpu_pods_rounded_up": fractional - honoured,
        },
    )
    if honour_fractional:
        workload.notes["fractional_gpu_pods_honoured"] = honoured
    return finish(workload, options)


def gpu_shares(trace_dir: Path, options: LoadOptions) -> dict[str, float]:
    """Pod name -> the share of each GPU it asked for (``gpu_milli / 1000``), for the pods that
    asked for less than a whole GPU. :func:`load` rounds such requests up to whole GPUs; a
    replay that models GPU busy time (sim/soda.py) caps a pod's busy share at what it asked."""
    skipped: list[str] = []
    out: dict[str, float] = {}

    def parse(row: Mapping[str, str], line: int) -> tuple[str, float]:
        name = row["name"].strip()
        milli = parse_int(row, "gpu_milli", min_value=0)
        assert milli is not None
        return name, milli / 1000.0

    for name, share in read_csv_rows(trace_dir / PODS_FILE, ("name", "gpu_milli"), parse,
                                     options, skipped):
        if 0.0 < share < 1.0:
            out[name] = share
    return out
