"""Cost of one multi-array pass relative to plain FIFO on the same cluster and queue.

Run: /work/venv/bin/python bench/bench_arrays.py [--nodes 64] [--jobs 600] [--repeat 5]

Prints the median seconds per pass for FIFO (backfill), DRF, and ``soda-arrays`` with FIFO
(backfill) inside every array (lending "idle", the default, and "free", SODA's rule), and each
as a ratio to FIFO measured in the same run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from masterd.core.cluster import ClusterSnapshot
from masterd.core.policies import soda_arrays
from masterd.core.policies.drf import DrfPolicy
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Policy
from masterd.core.scheduler import SchedulingCore
from shared.model import CpuCore, GpuInfo, Job, JobKind, JobSpec, NodeInventory


def node(name: str, gpus: int, model: str, cores: int) -> NodeInventory:
    return NodeInventory(
        name=name, hostname=name, address="127.0.0.1",
        gpus=tuple(GpuInfo(index=i, uuid=f"{name}-{i}", model=model, memory_mib=40_000,
                           numa_node=i * 2 // max(gpus, 1), pcie_switch=i * 4 // max(gpus, 1))
                   for i in range(gpus)),
        cpus=tuple(CpuCore(id=c, socket=c * 2 // cores, numa_node=c * 2 // cores, core=c)
                   for c in range(cores)),
        memory_mib=512_000,
    )


def build(policy: Policy, nodes: int, jobs: int, seed: int) -> SchedulingCore:
    rng = random.Random(seed)
    core = SchedulingCore(policy)
    for i in range(nodes):
        core.node_up(node(f"g{i:03d}", 8, "A100" if i % 4 else "V100", 64))
    for i in range(nodes // 4):
        core.node_up(node(f"c{i:03d}", 0, "", 64))
    for i in range(jobs):
        gpus = rng.choice([0, 0, 1, 1, 1, 2, 4, 8, 16])
        spec = JobSpec(
            name=f"j{i}", command=("true",), user="bench",
            kind=JobKind.TRAINING if gpus else JobKind.CPU,
            tenant=rng.choice(["t1", "t2", "t3"]), gpus=gpus,
            gpu_model=rng.choice(["A100", "V100", None]) if gpus else None,
            cpus=rng.randint(1, 8), memory_mib=rng.choice([0, 8_000]),
        )
        core.submit(Job(id=spec.name, spec=spec, submit_time=float(i)))
    return core


def time_pass(make: Callable[[], Policy], nodes: int, jobs: int, repeat: int) -> float:
    samples = []
    for r in range(repeat):
        policy = make()
        core = build(policy, nodes, jobs, seed=r)
        snapshot: ClusterSnapshot = core.snapshot()
        queue = core.queue()
        start = time.perf_counter()
        policy.decide(snapshot, queue, 0.0)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    inner = {"small": "fifo", "large": "fifo", "cpu": "fifo"}
    candidates: dict[str, Callable[[], Policy]] = {
        "fifo": lambda: FifoPolicy(backfill=True),
        "drf": DrfPolicy,
        "soda-arrays(fifo)": lambda: soda_arrays(
            inner={k: {"name": v, "backfill": True} for k, v in inner.items()}
        ),
        # SODA's lending rule: whether an array lends is re-checked against every waiting
        # owner after each start (a pack per owner), where "idle" caches a fit per job.
        "soda-arrays(free)": lambda: soda_arrays(
            inner={k: {"name": v, "backfill": True} for k, v in inner.items()},
            lending="free",
        ),
    }
    base = None
    for name, make in candidates.items():
        seconds = time_pass(make, args.nodes, args.jobs, args.repeat)
        base = base or seconds
        print(f"{name:20s} {seconds * 1000:8.1f} ms/pass  ratio {seconds / base:5.2f}")


if __name__ == "__main__":
    main()
