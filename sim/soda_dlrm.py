"""SODA's inference placer (§V-D) replayed on a second, independent workload: Alibaba's
disaggregated DLRM inference instances (cluster-trace-gpu-v2025, ``dlrm-inference.csv``).

Each app with GPU-node (``HN``) instances is one service. The trace does not record query
load; its own service manager kept ``n(t)`` GPU instances alive, and a manager that adds a
replica at 80 % of the maximum load (§V-D1) keeps the load at most ``0.8 * n(t) * bs_gpu``:
that is the load reported to the placer (assumption). The placer
(``masterd.core.inference.InferencePlacer``, the master's own) then decides CPU or GPU
replicas and how many, on a cluster of GPU nodes sized for the trace's peak (8 GPUs and 96
cores per node: the instances' ``max_instance_per_node`` and 12 cores per GPU instance;
assumption), with no other jobs. The trace's CPU-node (``CN``) instances are the embedding
side of the disaggregated design and run elsewhere; they are not replayed.

Profiles: ``bs_gpu`` 32 as in sim/soda_truth.py; a CPU replica on 16 cores serves
``cpu_batch`` 4 using 26.3 GB/s (assumption: DLRM's dense layers are small; the figures of
SODA's Table III/IV for a mid-size model); GPU replicas take the instances' own cores.

What is compared: GPU-hours the trace's instances held against the placer's GPU replicas,
the CPU core-hours the placer's CPU replicas took instead, replica launches and retirements.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from masterd.core.inference import (
    InferencePlacer,
    InferenceProfile,
    LaunchReplica,
    PlacerConfig,
    ReplicaKind,
    RetireReplica,
)
from masterd.core.policies import make_policy
from masterd.core.scheduler import SchedulingCore
from shared.model import Job, JobKind, JobSpec, JobState
from sim.cluster import NodeGroup, build_cluster
from sim.soda_truth import SodaTruthConfig
from sim.tables import Table, fmt
from sim.workloads.base import TraceError

DLRM_FILE = "dlrm-inference.csv"
GPUS_PER_NODE = 8
CORES_PER_NODE = 96
CPU_BATCH = 4
CPU_CORES = 16
CPU_MBW_GBPS = 26.3
STEP_S = 300.0  # load reports and plans every five minutes of trace time
HEADROOM_GBPS = 0.75 * 2 * SodaTruthConfig().peak_gbps_per_socket  # a two-socket node


@dataclass
class _App:
    name: str
    intervals: list[tuple[float, float]] = field(default_factory=list)  # HN instances
    cores: int = 8

    def alive_per_step(self, steps: int) -> list[int]:
        """Instances alive at each step's start (``k * STEP_S``)."""
        diff = [0] * (steps + 1)
        for s, e in self.intervals:
            first, last = math.ceil(s / STEP_S), min(steps, math.ceil(e / STEP_S))
            if first < last:
                diff[first] += 1
                diff[last] -= 1
        out, n = [], 0
        for k in range(steps):
            n += diff[k]
            out.append(n)
        return out


@dataclass
class DlrmReplay:
    apps: int
    instances: int
    nodes: int
    horizon_s: float
    trace_gpu_hours: float
    placer_gpu_hours: float
    placer_cpu_core_hours: float
    launches: int
    retires: int
    gpu_mode_share_pct: float  # of service-steps served by GPU replicas
    short_gpu_steps: int  # service-steps whose load the replicas could not carry
    wall_s: float

    def setup_text(self) -> str:
        return (
            "**Inference placer on a second workload (generated).** "
            f"`{DLRM_FILE}`: {self.apps} apps with GPU-node instances ({self.instances} "
            f"instances over {fmt(self.horizon_s / 86400, '{:.1f}')} days) are services whose "
            "load is what the trace's own instance count could carry at the 80 % scale-out "
            "point; the master's inference placer serves them on "
            f"{self.nodes} GPU nodes of {GPUS_PER_NODE} GPUs and {CORES_PER_NODE} cores, "
            f"planning every {STEP_S:g} s (`sim/soda_dlrm.py` lists the assumptions)."
        )

    def table(self) -> Table:
        t = Table(
            "openb-dlrm",
            ["replay", "GPU-hours", "CPU core-hours", "replica launches", "retirements",
             "service-time on GPU %", "steps short of capacity"],
            ["{}", "{:.0f}", "{:.0f}", "{:d}", "{:d}", "{:.1f}", "{:d}"],
            caption="DLRM inference: the trace's GPU instances against the inference "
                    "placer's replicas for the same load.",
        )
        t.add("trace (instances as recorded)", self.trace_gpu_hours, 0.0, self.instances, 0,
              100.0, 0)
        t.add("SODA inference placer", self.placer_gpu_hours, self.placer_cpu_core_hours,
              self.launches, self.retires, self.gpu_mode_share_pct, self.short_gpu_steps)
        return t

    def data(self) -> dict[str, Any]:
        return dict(self.__dict__)


def load_apps(path: Path) -> tuple[dict[str, _App], float]:
    try:
        f = path.open(newline="")
    except OSError as exc:
        raise TraceError(path, None, f"cannot read: {exc.strerror}") from None
    apps: dict[str, _App] = {}
    rows: list[tuple[str, float | None, float | None, int]] = []
    horizon = 0.0
    with f:
        reader = csv.DictReader(f)
        need = {"role", "app_name", "cpu_request", "creation_time", "deletion_time"}
        if reader.fieldnames is None or not need <= set(reader.fieldnames):
            raise TraceError(path, 1, f"expected columns {', '.join(sorted(need))}")
        for line, row in enumerate(reader, start=2):
            try:
                start = float(row["creation_time"]) if row["creation_time"] else None
                end = float(row["deletion_time"]) if row["deletion_time"] else None
                cores = int(float(row["cpu_request"]))
            except ValueError as exc:
                raise TraceError(path, line, f"not a number: {exc}") from None
            horizon = max(horizon, start or 0.0, end or 0.0)
            if row["role"] == "HN":
                rows.append((row["app_name"], start, end, cores))
    for name, start, end, cores in rows:
        app = apps.setdefault(name, _App(name))
        # No creation time: alive when the trace began; no deletion: still alive at its end.
        app.intervals.append((start or 0.0, end if end is not None else horizon))
        app.cores = cores
    return apps, horizon


def replay_dlrm(trace_dir: Path, seed: int = 1, apps: int | None = None) -> DlrmReplay:
    started = time.monotonic()
    table, horizon = load_apps(trace_dir / DLRM_FILE)
    chosen = sorted(table.values(), key=lambda a: int(a.name.rsplit("_", 1)[-1])
                    if a.name.rsplit("_", 1)[-1].isdigit() else 0)
    if apps is not None:
        chosen = chosen[:apps]
    steps = max(1, math.ceil(horizon / STEP_S))
    alive = {a.name: a.alive_per_step(steps) for a in chosen}
    peak = max((sum(alive[a.name][k] for a in chosen) for k in range(steps)), default=0)
    nodes = max(1, math.ceil(peak / GPUS_PER_NODE))
    inventories = build_cluster([NodeGroup(count=nodes, gpus_per_node=GPUS_PER_NODE,
                                           gpu_model="GPU", cpu_cores=CORES_PER_NODE,
                                           prefix="dlrm")])
    core = SchedulingCore(make_policy("fifo"))
    for inv in inventories:
        core.node_up(inv)
    bs_gpu = SodaTruthConfig().bs_gpu
    placer = InferencePlacer(PlacerConfig(max_replicas=1024))
    for app in chosen:
        placer.register(InferenceProfile(
            service=app.name, bs_gpu=bs_gpu, cpu_batch=CPU_BATCH, cpu_cores=CPU_CORES,
            cpu_mbw_gbps=CPU_MBW_GBPS, gpu_replica_cpus=app.cores))
    headroom = {inv.name: HEADROOM_GBPS for inv in inventories}
    kinds: dict[str, ReplicaKind] = {}
    trace_gpu_s = placer_gpu_s = cpu_core_s = 0.0
    launches = retires = short = gpu_steps = service_steps = 0
    for k in range(steps):
        now = k * STEP_S
        for app in chosen:
            n = alive[app.name][k]
            trace_gpu_s += n * STEP_S
            placer.report_load(app.name, 0.8 * n * bs_gpu, now)
        for action in placer.plan(core.snapshot(), now, headroom):
            if isinstance(action, LaunchReplica):
                r = action.replica
                spec = JobSpec(name=r.id[:63], command=("replica",), user="dlrm",
                               kind=JobKind.INFERENCE, gpus=1 if r.gpu is not None else 0,
                               cpus=len(r.cpus))
                core.cluster.allocate(r.id, r.placement)
                core.submit(Job(id=r.id, spec=spec, submit_time=now, state=JobState.STARTING,
                                placement=r.placement, attempts=1,
                                node_states={r.node: "preparing"}))
                core.node_started(r.id, r.node, now)
                kinds[r.id] = r.kind
                launches += 1
            elif isinstance(action, RetireReplica):
                core.cancel(action.replica.id, now)
                core.node_exited(action.replica.id, action.replica.node, None, 15, now)
                kinds.pop(action.replica.id, None)
                retires += 1
        for app in chosen:
            reps = placer.replicas(app.name)
            load = placer.load(app.name)
            capacity = sum(bs_gpu if r.kind is ReplicaKind.GPU else CPU_BATCH for r in reps)
            if load > 0:
                service_steps += 1
                gpu_steps += placer.mode(app.name) is ReplicaKind.GPU
                short += capacity < load
            for r in reps:
                if r.kind is ReplicaKind.GPU:
                    placer_gpu_s += STEP_S
                else:
                    cpu_core_s += STEP_S * len(r.cpus)
    return DlrmReplay(
        apps=len(chosen), instances=sum(len(a.intervals) for a in chosen), nodes=nodes,
        horizon_s=horizon, trace_gpu_hours=trace_gpu_s / 3600,
        placer_gpu_hours=placer_gpu_s / 3600, placer_cpu_core_hours=cpu_core_s / 3600,
        launches=launches, retires=retires,
        gpu_mode_share_pct=100.0 * gpu_steps / service_steps if service_steps else 0.0,
        short_gpu_steps=short, wall_s=time.monotonic() - started,
    )
