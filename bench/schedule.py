"""How long one SWAF scheduling pass takes after an event, at growing queue and cluster sizes.

For each (waiting jobs, nodes) the cluster (nodes × 8 emulated GPUs) is first filled by a cold
pass; then, repeatedly, one running job finishes (freeing its resources), a new job arrives,
the clock moves on, and one ``SwafPolicy.decide`` is timed; its decisions are applied so the
next event sees the result. Baselines timed in the same run on the same snapshot and queue:
``sort`` (sorting the queue by submission: the floor for any ordering policy) and ``fifo``
(``FifoPolicy.decide``, which stops at the first job that does not fit).

    /work/venv/bin/python bench/schedule.py [--events N] [--seed S] [--sizes 100x16,1000x128]

Prints a table, then one JSON line: per size ``pass_ms_p50`` / ``pass_ms_p99`` (wall clock;
``pass_cpu_ms_*`` is the thread's CPU time, which a busy shared machine disturbs less), the
baselines and ratios, plus ``growth_exponent``: the least-squares slope of log(p50) against
log(waiting jobs) — 1.0 is linear, n·log n over this range is about 1.1–1.2 — over all sizes
and over the last step, and the same slope for the ``sort`` baseline (Python's own slowdown
at scale, from caches, shows up there too).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from masterd.core.cluster import ClusterState
from masterd.core.genie.modeldb import DEFAULT_GPU_MODEL, DEFAULT_TABLE
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policies.swaf import SwafPolicy
from masterd.core.policy import Start
from shared.model import (
    CpuCore,
    GpuInfo,
    Job,
    JobKind,
    JobSpec,
    NodeInventory,
    QosClass,
)

GPUS_PER_NODE = 8
CORES_PER_NODE = 64
MODEL_TYPES = [p.model_type for p in DEFAULT_TABLE]


def inventory(i: int) -> NodeInventory:
    name = f"node{i:05d}"
    return NodeInventory(
        name=name,
        hostname=name,
        address="10.0.0.1",
        gpus=tuple(
            GpuInfo(index=g, uuid=f"GPU-{i}-{g}", model=DEFAULT_GPU_MODEL, memory_mib=12288,
                    numa_node=g // 4, pcie_switch=g // 2)
            for g in range(GPUS_PER_NODE)
        ),
        cpus=tuple(
            CpuCore(id=c, socket=c // 32, numa_node=c // 32, core=c % 32)
            for c in range(CORES_PER_NODE)
        ),
        memory_mib=512 * 1024,
    )


def make_job(rng: random.Random, seq: int, now: float) -> Job:
    """Table 3's mix: six model types, half training / half inference, 5/35/60% QoS classes."""
    qos = rng.choices(list(QosClass), weights=[5, 35, 60])[0]
    kind = JobKind.TRAINING if rng.random() < 0.5 else JobKind.INFERENCE
    spec = JobSpec(
        name=f"job{seq}",
        command=("python", "train.py"),
        user="bench",
        kind=kind,
        qos=qos,
        gpus=rng.choice([1, 1, 2, 2, 4, 8, 16]),
        cpus=rng.choice([1, 2, 4]),
        memory_mib=rng.choice([0, 4096, 16384]),
        model_type=rng.choice(MODEL_TYPES),
        batch=rng.choice([32, 64, 128, 256]),
        iterations=rng.randint(1_000, 100_000),
    )
    return Job(id=f"job{seq}", spec=spec, submit_time=now - rng.uniform(0, 3600))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def run_size(waiting: int, nodes: int, events: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    state = ClusterState()
    for i in range(nodes):
        state.upsert_node(inventory(i))
    now = 10_000.0
    seq = 0
    # Enough jobs to fill the cluster and still leave ``waiting`` in the queue.
    queue: list[Job] = []
    while len(queue) < waiting + nodes * GPUS_PER_NODE // 2:
        queue.append(make_job(rng, seq, now))
        seq += 1
    policy = SwafPolicy()
    running: list[str] = []

    def apply(decisions: list) -> None:
        started = set()
        for d in decisions:
            assert isinstance(d, Start)
            state.allocate(d.job_id, d.placement)
            running.append(d.job_id)
            started.add(d.job_id)
        queue[:] = [j for j in queue if j.id not in started]

    t0 = time.perf_counter()
    apply(policy.decide(state.snapshot({}), queue, now))
    cold_ms = (time.perf_counter() - t0) * 1000
    del queue[waiting:]  # keep the queue at the target size (the policy forgets the rest)

    swaf_ms: list[float] = []
    swaf_cpu_ms: list[float] = []
    sort_ms: list[float] = []
    fifo_ms: list[float] = []
    fifo = FifoPolicy()
    starts = 0
    for _ in range(events):
        # Event: a running job finishes and a new one arrives.
        if running:
            state.release(running.pop(rng.randrange(len(running))))
        now += rng.uniform(1, 120)
        queue.append(make_job(rng, seq, now))
        seq += 1
        snapshot = state.snapshot({})

        t0 = time.perf_counter()
        sorted(queue, key=lambda j: (j.submit_time, j.id))
        sort_ms.append((time.perf_counter() - t0) * 1000)

        t0 = time.perf_counter()
        fifo.decide(snapshot, queue, now)
        fifo_ms.append((time.perf_counter() - t0) * 1000)

        c0 = time.thread_time()
        t0 = time.perf_counter()
        decisions = policy.decide(snapshot, queue, now)
        swaf_ms.append((time.perf_counter() - t0) * 1000)
        swaf_cpu_ms.append((time.thread_time() - c0) * 1000)
        starts += len(decisions)
        apply(decisions)
    p50 = statistics.median(swaf_ms)
    return {
        "waiting": waiting,
        "nodes": nodes,
        "events": events,
        "starts_per_event": starts / events,
        "cold_pass_ms": cold_ms,
        "pass_ms_p50": p50,
        "pass_ms_p99": percentile(swaf_ms, 0.99),
        "pass_cpu_ms_p50": statistics.median(swaf_cpu_ms),
        "pass_cpu_ms_p99": percentile(swaf_cpu_ms, 0.99),
        "sort_ms_p50": statistics.median(sort_ms),
        "fifo_ms_p50": statistics.median(fifo_ms),
        "ratio_vs_sort": p50 / statistics.median(sort_ms),
        "ratio_vs_fifo": p50 / statistics.median(fifo_ms),
    }


def growth_exponent(results: list[dict[str, float]], key: str = "pass_ms_p50") -> float:
    xs = [math.log(r["waiting"]) for r in results]
    ys = [math.log(r[key]) for r in results]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200, help="timed passes per size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sizes", default="100x16,1000x128,10000x1000",
                        help="comma-separated WAITINGxNODES")
    args = parser.parse_args()
    sizes = []
    for part in args.sizes.split(","):
        waiting, _, nodes = part.partition("x")
        sizes.append((int(waiting), int(nodes)))
    results = []
    print(f"{'waiting':>8} {'nodes':>6} {'cold ms':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'cpu p99':>8} {'sort ms':>8} {'fifo ms':>8} {'x sort':>7} {'x fifo':>7} "
          f"{'starts/ev':>9}")
    for waiting, nodes in sizes:
        r = run_size(waiting, nodes, args.events, args.seed)
        results.append(r)
        print(f"{waiting:>8} {nodes:>6} {r['cold_pass_ms']:>9.1f} {r['pass_ms_p50']:>8.2f} "
              f"{r['pass_ms_p99']:>8.2f} {r['pass_cpu_ms_p99']:>8.2f} "
              f"{r['sort_ms_p50']:>8.2f} {r['fifo_ms_p50']:>8.3f} "
              f"{r['ratio_vs_sort']:>7.1f} {r['ratio_vs_fifo']:>7.1f} "
              f"{r['starts_per_event']:>9.2f}", flush=True)
    summary = {
        f"{int(r['waiting'])}x{int(r['nodes'])}": {
            k: round(v, 4) for k, v in r.items() if k not in ("waiting", "nodes")
        }
        for r in results
    }
    if len(results) > 1:
        summary["growth_exponent"] = round(growth_exponent(results), 3)
        summary["growth_exponent_last_step"] = round(growth_exponent(results[-2:]), 3)
        summary["sort_growth_exponent"] = round(growth_exponent(results, "sort_ms_p50"), 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
