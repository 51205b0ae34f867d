"""What a reconnect storm costs the master: every node says hello at once, each reporting
its running parts (after a failover or a restart of the master, or a network blip).

    python bench/reconnect.py [--small 500] [--large 5000] [--parts 8] [--repeat 3]

Setup, per size: a real master (its scheduling core, features and SQLite journal) that has
just restored ``nodes x parts`` running one-GPU jobs, as after a failover, with none of its
nodes connected. Timed: the hello of every node, each reporting its ``parts`` running parts,
through ``Master.node_hello`` -- the code the node channel's WebSocket handler calls after
decoding the frame (the frames themselves are left out: their cost is per node whatever the
cluster's size). Each hello claims the node's jobs' resources, reconciles its reports and
journals the node, so the total is O(parts) when every step is O(the node's own jobs), and
O(nodes x jobs) when one step scans the whole cluster.

The ratio of the large size's seconds to the small one's, same run, is the figure: 10 for
exactly linear work (10 times the nodes and parts), 100 for quadratic. Best of ``--repeat``.

Last line: JSON with seconds_small, seconds_large, per_hello_us of each, and
reconnect_ratio_10x (large over small; the issue's bound is 12).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.schedule import GPUS_PER_NODE, inventory  # noqa: E402
from masterd.service.master import Master  # noqa: E402
from shared.config import MasterConfig  # noqa: E402
from shared.messages import Hello, JobReport  # noqa: E402
from shared.model import (  # noqa: E402
    Job,
    JobKind,
    JobSpec,
    JobState,
    NodeAllocation,
    Placement,
)
from shared.schema import decode  # noqa: E402


class QuietSession:
    """A connected node as the master holds it: commands are answered at once (a reconnect
    of healthy nodes sends none; a stray or a lost part would)."""

    silent_s = 0.0

    def __init__(self, name: str) -> None:
        self.name = name

    async def request(self, type_: str, body: Any, timeout_s: float = 5.0) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def restored_master(state: Path, nodes: int, parts: int) -> tuple[Master, list[Hello]]:
    """A master that restored ``nodes x parts`` running jobs, and the hellos that follow."""
    config = decode(MasterConfig, {"state_dir": str(state), "node_lost_s": 0}, "master")
    master = Master(config)
    master.restore()
    spec = JobSpec(name="train", command=("train",), user="nobody", kind=JobKind.TRAINING,
                   gpus=1, cpus=1, max_nodes=1)
    hellos = []
    for n in range(nodes):
        inv = inventory(n)  # bench/schedule.py's node: 8 GPUs, one part on each
        name = inv.name
        master.core.node_up(inv)
        reports = []
        for p in range(parts):
            job_id = f"{name}-j{p}"
            alloc = NodeAllocation(node=name, gpus=(p,), cpus=(p,))
            master.core.restore(Job(id=job_id, spec=spec, submit_time=0.0,
                                    state=JobState.RUNNING, placement=Placement((alloc,)),
                                    start_time=1.0, node_states={name: "running"}))
            reports.append(JobReport(job_id=job_id, state="running", pid=1000 + p,
                                     gpus=(p,)))
        master.core.node_down(name)  # restored: nobody is connected yet
        hellos.append(Hello(inventory=inv, jobs=tuple(reports)))
    return master, hellos


async def storm(nodes: int, parts: int) -> float:
    with tempfile.TemporaryDirectory(prefix="trellis-test-reconnect-") as state:
        master, hellos = restored_master(Path(state), nodes, parts)
        try:
            gc.collect()
            start = time.perf_counter()
            for hello in hellos:
                await master.node_hello(QuietSession(hello.inventory.name), hello)  # type: ignore[arg-type]
            took = time.perf_counter() - start
            held = sum(1 for _ in master.core.cluster.allocations)
            if held != nodes * parts:
                raise SystemExit(f"reconnect: {held} of {nodes * parts} jobs claimed their "
                                 "resources; the storm did not reconcile")
            return took
        finally:
            await master.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=500)
    parser.add_argument("--large", type=int, default=5000)
    parser.add_argument("--parts", type=int, default=8, help="running parts per node")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not 1 <= args.parts <= GPUS_PER_NODE:
        parser.error(f"--parts must be 1 to {GPUS_PER_NODE} (one one-GPU part per GPU)")
    result: dict[str, Any] = {"parts_per_node": args.parts}
    for label, nodes in (("small", args.small), ("large", args.large)):
        best = min(asyncio.run(storm(nodes, args.parts)) for _ in range(args.repeat))
        result[f"nodes_{label}"] = nodes
        result[f"seconds_{label}"] = round(best, 3)
        result[f"per_hello_us_{label}"] = round(best / nodes * 1e6, 1)
        print(f"reconnect: {nodes} nodes x {args.parts} parts: {best:.3f} s "
              f"({best / nodes * 1e6:.0f} us a hello)", flush=True)
    result["reconnect_ratio_10x"] = round(result["seconds_large"] / result["seconds_small"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
