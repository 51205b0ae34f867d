"""The scheduling pass with accounts and quotas on, against the same pass without accounts.

Two SchedulingCores (the master's own; policy ``fifo``, the master's default, unless --policy)
get the same cluster (1,000 nodes × 8 GPUs) and the same stream of jobs; one has quota
admission (masterd/core/quotas.py) over 200 accounts (20 organisations of 9 groups each and
the organisations themselves), each group with a GPU quota proportional to its share, an
equal borrowing limit and a running_jobs cap. Each core is first filled by a cold pass, then,
repeatedly: a running job ends, a new job arrives, and one whole ``SchedulingCore.schedule``
is timed (admission gates, the policy, the starts, reclaim). Preemptions (reclaim) end their
jobs at once, untimed. The queue is kept at --waiting jobs.

    /work/main/.venv/bin/python bench/governance.py [--events N] [--waiting 10000]
        [--nodes 1000] [--policy fifo] [--seed 1]

Prints a line per core, then one JSON line: ``pass_ms_p99_with``, ``pass_ms_p99_without``,
``overhead_ratio`` (with / without, wall-clock p99; target <= 1.3), the same p99s in thread
CPU time, medians, preemptions (reclaim), follow-up passes and ``seconds``.

The two runs schedule differently (quotas gate jobs, so a strict FIFO head blocked without
accounts may be gated with them and the jobs behind it start): the ratio compares whole
passes as each configuration runs them, not the same decisions.
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

from bench.governance_report import measure
from masterd.core.policies import make_policy
from masterd.core.policy import Preempt, Start
from masterd.core.quotas import QuotaAdmission
from masterd.core.scheduler import SchedulingCore
from shared.accounts import Account, AccountCaps, AccountTree, Resources
from shared.model import CpuCore, GpuInfo, Job, JobKind, JobSpec, NodeInventory

GPUS_PER_NODE = 8
CORES_PER_NODE = 64
ORGS = 20
GROUPS_PER_ORG = 9  # 20 + 180 = 200 accounts


def inventory(i: int) -> NodeInventory:
    name = f"node{i:05d}"
    return NodeInventory(
        name=name, hostname=name, address="10.0.0.1",
        gpus=tuple(GpuInfo(index=g, uuid=f"GPU-{i}-{g}", model="A100", memory_mib=40960,
                           numa_node=g // 4, pcie_switch=g // 2)
                   for g in range(GPUS_PER_NODE)),
        cpus=tuple(CpuCore(id=c, socket=c // 32, numa_node=c // 32, core=c % 32)
                   for c in range(CORES_PER_NODE)),
        memory_mib=512 * 1024)


def accounts(total_gpus: int) -> list[Account]:
    """20 organisations of 9 groups; groups' weights vary (1 to 4), quotas proportional."""
    rng = random.Random(7)
    weights = {(o, g): rng.randint(1, 4) for o in range(ORGS) for g in range(GROUPS_PER_ORG)}
    whole = sum(weights.values())
    out = []
    for o in range(ORGS):
        org_quota = 0
        for g in range(GROUPS_PER_ORG):
            quota = max(1, total_gpus * weights[o, g] // whole)
            org_quota += quota
            out.append(Account(f"g{o:02d}-{g}", parent=f"org{o:02d}",
                               users=(f"u{o:02d}{g}",),
                               quota=Resources(gpus=quota), borrowing_limit=Resources(gpus=quota),
                               caps=AccountCaps(running_jobs=max(4, quota // 2))))
        out.append(Account(f"org{o:02d}", quota=Resources(gpus=org_quota)))
    return out


def make_job(rng: random.Random, seq: int, now: float, groups: list[str]) -> Job:
    spec = JobSpec(name=f"job{seq}", command=("python", "train.py"), user="bench",
                   kind=JobKind.TRAINING, tenant=rng.choice(groups),
                   gpus=rng.choice([1, 1, 2, 2, 4, 8, 16]), cpus=rng.choice([1, 2, 4]),
                   memory_mib=rng.choice([0, 4096, 16384]))
    return Job(id=f"job{seq}", spec=spec, submit_time=now)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


class Run:
    """One core and its running jobs, driven by the shared event stream."""

    def __init__(self, policy: str, options: dict, nodes: int,
                 quotas: AccountTree | None) -> None:
        self.core = SchedulingCore(make_policy(policy, **options))
        for i in range(nodes):
            self.core.node_up(inventory(i))
        if quotas is not None:
            self.core.set_admission(QuotaAdmission(quotas))
        self.running: list[str] = []
        self.pass_ms: list[float] = []
        # The thread's CPU time per pass: what a busy shared machine disturbs less.
        self.pass_cpu_ms: list[float] = []
        self.starts = 0
        self.preemptions = 0
        self.follow_ups = 0

    def apply(self, decisions: list, now: float) -> None:
        core = self.core
        for d in decisions:
            job = core.jobs[d.job_id]
            if isinstance(d, Start):
                for node in d.placement.nodes:
                    core.node_started(d.job_id, node, now)
                self.running.append(d.job_id)
                self.starts += 1
            elif isinstance(d, Preempt):
                for node in list(job.node_states):
                    core.node_exited(d.job_id, node, None, 15, now)
                self.running.remove(d.job_id)
                self.preemptions += 1

    def end_one(self, rng: random.Random, now: float) -> None:
        if not self.running:
            return
        job_id = self.running.pop(rng.randrange(len(self.running)))
        for node in list(self.core.jobs[job_id].node_states):
            self.core.node_exited(job_id, node, 0, None, now)

    def timed_pass(self, now: float) -> None:
        """A pass, and the follow-up passes it asks for (wake_at: admission held starts
        back), each timed as a pass of its own, as the master runs them."""
        for _ in range(10):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            decisions = self.core.schedule(now)
            self.pass_ms.append((time.perf_counter() - t0) * 1000)
            self.pass_cpu_ms.append((time.thread_time() - c0) * 1000)
            self.apply(decisions, now)
            if self.core.wake_at is None or self.core.wake_at > now:
                return
            self.follow_ups += 1

    def waiting(self) -> int:
        return len(self.core.queue()) + len(self.core.blocked())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300, help="timed passes per core")
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--backfill", choices=("none", "easy", "any"), default="none",
                        help="fifo's backfill (the master's default: none)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-report", action="store_true",
                        help="skip report_s (writing a year of journal takes minutes)")
    parser.add_argument("--journal", help="time the report over this journal (one "
                        "bench/governance_report.py --keep left) instead of writing one")
    args = parser.parse_args()
    began = time.perf_counter()
    tree = AccountTree.of(accounts(args.nodes * GPUS_PER_NODE))
    groups = sorted(n for n, a in tree.accounts.items() if a.parent is not None)
    options: dict = {}
    if args.policy == "fifo" and args.backfill != "none":
        options["backfill"] = True if args.backfill == "any" else "easy"
    runs = {"without": Run(args.policy, options, args.nodes, None),
            "with": Run(args.policy, options, args.nodes, tree)}
    for name, run in runs.items():
        rng = random.Random(args.seed)  # the same job stream for both
        now = 10_000.0
        seq = 0
        fill = args.waiting + args.nodes * GPUS_PER_NODE // 2
        for _ in range(fill):
            run.core.submit(make_job(rng, seq, now, groups))
            seq += 1
        run.apply(run.core.schedule(now), now)  # the cold pass fills the cluster
        # Back to the target queue length: drop the newest waiting jobs.
        extra = run.waiting() - args.waiting
        for job in sorted([*run.core.queue(), *run.core.blocked().values()],
                          key=lambda j: -j.submit_time)[:max(0, extra)]:
            run.core.cancel(job.id, now)
        for _ in range(args.events):
            run.end_one(rng, now)
            now += rng.uniform(1, 120)
            run.core.submit(make_job(rng, seq, now, groups))
            seq += 1
            run.timed_pass(now)
        print(f"{name:>8}: waiting {run.waiting():>6}  running {len(run.running):>5}  "
              f"pass p50 {statistics.median(run.pass_ms):7.2f} ms  "
              f"p99 {percentile(run.pass_ms, 0.99):7.2f} ms  starts {run.starts}  "
              f"preemptions {run.preemptions}  follow-up passes {run.follow_ups}", flush=True)
    report = None if args.no_report else measure(journal=args.journal)
    with_p99 = percentile(runs["with"].pass_ms, 0.99)
    without_p99 = percentile(runs["without"].pass_ms, 0.99)
    print(json.dumps({
        "policy": args.policy, "backfill": args.backfill, "waiting": args.waiting,
        "nodes": args.nodes,
        "accounts": len(tree.accounts), "events": args.events,
        "pass_ms_p50_with": round(statistics.median(runs["with"].pass_ms), 3),
        "pass_ms_p50_without": round(statistics.median(runs["without"].pass_ms), 3),
        "pass_ms_p99_with": round(with_p99, 3),
        "pass_ms_p99_without": round(without_p99, 3),
        "overhead_ratio": round(with_p99 / without_p99, 3),
        "pass_cpu_ms_p99_with": round(percentile(runs["with"].pass_cpu_ms, 0.99), 3),
        "pass_cpu_ms_p99_without": round(percentile(runs["without"].pass_cpu_ms, 0.99), 3),
        "preemptions_with": runs["with"].preemptions,
        "follow_up_passes_with": runs["with"].follow_ups,
        # A year of journal at 1,000 jobs a day (bench/governance_report.py).
        "report_s": report["report_s"] if report else None,
        "seconds": round(time.perf_counter() - began, 1),
    }))


if __name__ == "__main__":
    main()
