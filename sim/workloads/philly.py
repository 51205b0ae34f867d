"""Microsoft Philly (2017) as preprocessed for Pollux: philly-jobs.csv on philly-vcs.csv.

The trace has submit time, duration, GPU count, GPU time and virtual cluster per job; nothing
else. Filled in, seeded per job (docs/simulator.md): model type (uniform over GENIE's six) and
batch (uniform over the model's batch sizes), the iteration count a user would declare for the
recorded duration at the true packed speed, and the QoS class (GENIE's 5/35/60 mix). The VC is
the tenant. The replay cluster is one pool of sum(VC nodes) × 8 GPUs (Helios artifact), or,
per VC, each VC's own nodes (``per_vc``; see :func:`load`).

Every job also carries two annotations for Helios' policies: its recorded duration (what
Helios' SJF ranks by) and QSSF's duration estimate under the error model the Helios artifact
uses for Philly, which has neither users nor job names to learn from
(``estimators/philly_estimate.py``, :func:`helios_estimate`), seeded per job.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from masterd.core.helios.estimate import ESTIMATE_KEY, RECORDED_KEY
from shared.model import JobKind, JobSpec
from sim.cluster import NodeGroup, build_cluster
from sim.truth import NodeTopology, TruthModel, TruthParams
from sim.workloads.assign import iterations_for_duration, pick_model, pick_qos
from sim.workloads.base import (
    LoadOptions,
    RowError,
    SimJob,
    TraceError,
    Workload,
    finish,
    parse_float,
    parse_int,
    read_csv_rows,
)

JOBS_FILE = "philly-jobs.csv"
VCS_FILE = "philly-vcs.csv"
GPUS_PER_NODE = 8
_VC_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,58}")


# Helios' estimate errors (REFERENCES.md, Helios): (share of jobs, |relative error| range).
HELIOS_ERROR_BANDS = ((0.1, 0.0, 0.1), (0.4, 0.1, 0.5), (0.2, 0.5, 1.0), (0.2, 1.0, 10.0),
                      (0.1, 10.0, 100.0))


def helios_estimate(duration: float, seed: int, key: str) -> float:
    """``duration × (1 + e)``: e's magnitude drawn from HELIOS_ERROR_BANDS, its sign at random
    (the first band: uniform in ±10%). As in the artifact, a large negative error gives a
    negative estimate, which QSSF then runs first. Seeded by (seed, job key) only, so an
    estimate does not depend on which other jobs are loaded."""
    rng = random.Random(f"{seed}:{key}:helios-estimate")
    level = rng.random()
    cumulative = 0.0
    for share, low, high in HELIOS_ERROR_BANDS:
        cumulative += share
        if level <= cumulative or (share, low, high) == HELIOS_ERROR_BANDS[-1]:
            if low == 0.0:
                error = rng.uniform(-high, high)
            else:
                error = rng.uniform(low, high) * rng.choice((-1.0, 1.0))
            return duration * (1.0 + error)
    raise AssertionError("unreachable: the bands cover [0, 1]")


def philly_node_group(nodes: int) -> NodeGroup:
    # Philly's servers: 8 GPUs (the Helios artifact's sizing), two sockets. Core count, GPU
    # model and memory are our assumptions; they do not change known-duration jobs' speeds.
    return NodeGroup(
        count=nodes,
        gpus_per_node=GPUS_PER_NODE,
        gpu_model="P40",
        gpu_memory_mib=24576,
        cpu_cores=0,
        sockets=2,
        gpus_per_switch=4,
        memory_mib=262144,
        nic_mbps=100000,
        prefix="philly",
    )


def vc_gpu_model(vc: str) -> str:
    """The GPU model label of a VC's nodes under per-VC sizing: pins jobs to their VC."""
    return f"P40-vc{vc}"


def vc_node_group(vc: str, nodes: int) -> NodeGroup:
    """A VC's own nodes: Philly's node group with the VC's GPU model label and name prefix."""
    return replace(philly_node_group(nodes), gpu_model=vc_gpu_model(vc), prefix=f"vc{vc}")


@dataclass(frozen=True)
class _Row:
    line: int
    submit: float
    duration: float
    gpus: int
    vc: str


def _parse_timestamp(raw: str, column: str) -> float:
    raw = raw.strip()
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        raise RowError(
            f"column {column}: {raw!r} is not a timestamp (YYYY-MM-DD HH:MM:SS)"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _parse_job(row: Mapping[str, str], line: int) -> _Row:
    submit = _parse_timestamp(row["timestamp"], "timestamp")
    duration = parse_float(row, "duration", min_value=0.0)
    gpus = parse_int(row, "num_gpus", min_value=1)
    gpu_time = parse_float(row, "gpu_time", min_value=0.0)
    assert duration is not None and gpus is not None and gpu_time is not None
    expected = duration * gpus
    if abs(gpu_time - expected) > 1.0 + 1e-6 * expected:
        raise RowError(
            f"gpu_time {gpu_time:g} does not equal duration × num_gpus = {expected:g}"
        )
    vc = row["cluster"].strip()
    if not _VC_RE.fullmatch(vc):
        raise RowError(f"column cluster: {vc!r} is not a virtual cluster id")
    return _Row(line, submit, duration, gpus, vc)


def _parse_vc(row: Mapping[str, str], line: int) -> tuple[str, int]:
    vc = row["vc"].strip()
    if not _VC_RE.fullmatch(vc):
        raise RowError(f"column vc: {vc!r} is not a virtual cluster id")
    nodes = parse_int(row, "node num", min_value=1)
    assert nodes is not None
    return vc, nodes


def load_vcs(path: Path, options: LoadOptions, skipped: list[str]) -> dict[str, int]:
    vcs: dict[str, int] = {}
    for vc, nodes in read_csv_rows(path, ("vc", "node num"), _parse_vc, options, skipped):
        if vc in vcs:
            raise TraceError(path, None, f"virtual cluster {vc} is listed twice")
        vcs[vc] = nodes
    if not vcs:
        raise TraceError(path, None, "no virtual clusters")
    return vcs


def load(
    trace_dir: Path,
    options: LoadOptions,
    truth: TruthModel,
    nodes_override: int | None = None,
    per_vc: bool = False,
    since: float | None = None,
    until: float | None = None,
    vc_scale: float = 1.0,
) -> Workload:
    """Load the trace; ``since``/``until`` (epoch seconds, UTC) keep the jobs submitted in
    [since, until). ``per_vc`` gives every VC its own nodes, as Helios schedules Philly: each
    VC's nodes carry the GPU model label ``P40-vc<id>`` and each job asks for its VC's label, so
    the core places a job only on its VC's nodes (docs/simulator.md). ``vc_scale`` multiplies
    every VC's node count (rounded, at least one node) to study heavier load; jobs larger than
    their (scaled) VC are counted in the notes and rejected by the core as never fitting."""
    if not vc_scale > 0:
        raise ValueError(f"VC scale must be positive, got {vc_scale:g}")
    if vc_scale != 1.0 and not per_vc:
        raise ValueError("a VC scale needs per-VC sizing")
    if per_vc and nodes_override is not None:
        raise ValueError("per-VC sizing comes from philly-vcs.csv: it cannot be combined "
                         "with a node count override")
    if since is not None and until is not None and until <= since:
        raise ValueError(f"the time window is empty: until {until:g} <= since {since:g}")
    skipped: list[str] = []
    vcs = load_vcs(trace_dir / VCS_FILE, options, skipped)
    if vc_scale != 1.0:
        vcs = {vc: max(1, round(count * vc_scale)) for vc, count in vcs.items()}
    node_count = nodes_override or sum(vcs.values())
    rows = list(
        read_csv_rows(
            trace_dir / JOBS_FILE,
            ("timestamp", "duration", "num_gpus", "gpu_time", "cluster"),
            _parse_job,
            options,
            skipped,
        )
    )
    if not rows:
        raise TraceError(trace_dir / JOBS_FILE, None, "no jobs")
    in_trace = len(rows)
    rows = [
        r for r in rows
        if (since is None or r.submit >= since) and (until is None or r.submit < until)
    ]
    if not rows:
        raise TraceError(trace_dir / JOBS_FILE, None, "no jobs in the requested time window")
    if per_vc:
        nodes = build_cluster([vc_node_group(vc, count) for vc, count in vcs.items()])
    else:
        nodes = build_cluster([philly_node_group(node_count)])
    topo = NodeTopology.of(nodes)
    jobs: list[SimJob] = []
    unknown_vcs: set[str] = set()
    unsized_jobs = 0
    too_large = 0
    for row in rows:
        key = f"philly-{row.line:06d}"
        fill = pick_model(options.seed, key)
        iterations = iterations_for_duration(
            truth, fill, JobKind.TRAINING, row.duration, row.gpus, topo
        )
        if row.vc not in vcs:
            unknown_vcs.add(row.vc)
            unsized_jobs += 1
        elif row.gpus > vcs[row.vc] * GPUS_PER_NODE:
            too_large += 1
        spec = JobSpec(
            name=key,
            command=("philly-job",),
            user=f"vc-{row.vc.lower()}"[:32],
            kind=JobKind.TRAINING,
            tenant=row.vc,
            qos=pick_qos(options.seed, key),
            gpus=row.gpus,
            gpu_model=vc_gpu_model(row.vc) if per_vc else None,
            cpus=0,
            model_type=fill.model_type,
            batch=fill.batch,
            iterations=iterations,
        )
        params = TruthParams(
            model_type=fill.model_type,
            batch=fill.batch,
            known_duration=row.duration,
            known_gpus=row.gpus,
        )
        annotations = {RECORDED_KEY: row.duration,
                       ESTIMATE_KEY: helios_estimate(row.duration, options.seed, key)}
        jobs.append(SimJob(id=key, spec=spec, submit=row.submit, truth=params,
                           annotations=annotations))
    workload = Workload(
        name="philly",
        jobs=jobs,
        nodes=nodes,
        origin=0.0,
        skipped=skipped,
        notes={
            "nodes": len(nodes),
            "gpus": len(nodes) * GPUS_PER_NODE,
            "virtual_clusters": len(vcs),
            "per_vc": per_vc,
            "vc_scale": vc_scale,
            "jobs_in_trace": in_trace,
            "jobs_in_window": len(rows),
            # Whole-pool sizing: VCs missing from philly-vcs.csv share the one pool. Per-VC
            # sizing: they have no nodes, so the core rejects their jobs as never fitting.
            "vcs_without_size": sorted(unknown_vcs),
            "jobs_in_vcs_without_size": unsized_jobs,
            # Per-VC: rejected by the core as never fitting (their VC is too small).
            "jobs_larger_than_vc": too_large,
        },
    )
    if since is not None:
        workload.notes["since"] = datetime.fromtimestamp(since, UTC).isoformat()
    if until is not None:
        workload.notes["until"] = datetime.fromtimestamp(until, UTC).isoformat()
    return finish(workload, options)
