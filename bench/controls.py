"""Operators' controls: what partitions, priority classes and accounts cost the scheduling
pass, and how fast a production job gets a preemptible job's GPUs on real daemons.

    python bench/controls.py [--events 200] [--trials 50] [--part overhead,preempt]

**overhead** (in-process): one ``SchedulingCore`` with the ``fifo`` policy, 1,000 nodes × 8
GPUs full of running jobs and 10,000 waiting; then, repeatedly, one running job ends, one
job arrives, and one pass (``core.schedule``) is timed. Two cores are built alike and
measured alternately in the same run: **bare**, and **controlled**: 8 partitions (125 nodes
each, the first the default), 4 priority classes (the top two preempting the lowest), 200
accounts with GPU quotas and borrowing under quota admission, 20 reservations of 5 nodes each
(half begun, half ahead by 1 to 19 hours, stamped on the nodes as the master stamps them),
and every job in a partition, a class and an account drawn at random, with a time limit drawn
from 30 min, 1 h, 4 h or none, and one in 20 in a begun reservation. ``overhead_ratio`` is
controlled over bare, p99 of the pass's wall time (``*_cpu_ms`` beside it: the thread's CPU
time). Per-flavor quotas do not exist yet and are not in it.

**preempt** (root, real daemons): a master with classes ``production`` (preempts
``preemptible``), ``normal`` and ``preemptible`` (``preempt_grace_s`` 20) and one
trellis-noded with 2 emulated GPUs. Each trial starts a 2-GPU preemptible job that traps
SIGUSR1 (its ``--signal``), writes ``$TRELLIS_PREEMPTED_FILE``'s line to a file and exits,
waits until it runs, then submits a 2-GPU production job: ``preempt_s`` is from that
submission to the production job's start (the master's clock: ``start_time -
submit_time``), the victim's grace not counted because it uses none; ``victims_unwarned``
counts trials whose victim did not get its warning and reason before it was stopped. The
requeued victim is cancelled before the next trial.

Last line, JSON: ``overhead_ratio`` (target ≤ 1.3), ``bare_ms_p99``,
``controlled_ms_p99``, their CPU times, ``preempt_s_p50``, ``preempt_s_p99`` (target ≤ 2 s),
``victims_unwarned`` (target 0), ``trials``, ``targets_met``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.schedule import inventory  # noqa: E402
from masterd.core.policies import make_policy  # noqa: E402
from masterd.core.policy import Start  # noqa: E402
from masterd.core.quotas import QuotaAdmission  # noqa: E402
from masterd.core.scheduler import SchedulingCore  # noqa: E402
from shared.accounts import Account, AccountTree, Resources  # noqa: E402
from shared.model import Job, JobKind, JobSpec, NodeSelector, ReservationHold  # noqa: E402
from shared.priorityclasses import ClassTable, PriorityClass  # noqa: E402

NODES = 1000
WAITING = 10_000
PARTITIONS = 8
ACCOUNTS = 200
RESERVATIONS = 20
RESERVED_NODES = 5  # per reservation: nodes 0-99
CLASSES = ClassTable.of([
    PriorityClass("production", 100, preempts=("preemptible",)),
    PriorityClass("high", 50, preempts=("preemptible",)),
    PriorityClass("normal", 0, default=True),
    PriorityClass("preemptible", -100),
])


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class Cluster:
    """One core and what drives it: the same jobs, with or without the controls."""

    def __init__(self, controlled: bool, seed: int) -> None:
        self.controlled = controlled
        self.rng = random.Random(seed)
        self.core = SchedulingCore(make_policy("fifo"))
        self.seq = 0
        for i in range(NODES):
            node = inventory(i)
            if controlled:
                node = replace(node, partitions=(f"p{i * PARTITIONS // NODES}",))
                k = i // RESERVED_NODES
                if k < RESERVATIONS:  # even ones have begun, odd ones begin in k hours
                    node = replace(node, reservations=(
                        ReservationHold(f"r{k}", 0.0 if k % 2 == 0 else 3600.0 * k),))
            self.core.node_up(node)
        if controlled:
            self.core.set_priority_classes(CLASSES)
            per = NODES * 8 // ACCOUNTS
            self.core.set_admission(QuotaAdmission(AccountTree.of(
                Account(f"a{k}", users=("bench",), default_for=("bench",) if k == 0 else (),
                        quota=Resources(gpus=per), borrowing_limit=Resources(gpus=4 * per))
                for k in range(ACCOUNTS))))

    def job(self, now: float) -> Job:
        self.seq += 1
        rng = self.rng
        gpus = rng.choice((1, 1, 2, 4, 8))
        extra: dict[str, Any] = {}
        if self.controlled:
            reservation = (f"r{2 * rng.randrange(RESERVATIONS // 2)}"
                           if rng.random() < 0.05 else "")
            extra = {
                "tenant": f"a{rng.randrange(ACCOUNTS)}",
                "priority_class": rng.choices(list(CLASSES.classes), weights=(1, 2, 6, 3))[0],
                "selector": NodeSelector(partitions=() if reservation else (
                    f"p{rng.randrange(PARTITIONS)}",), reservation=reservation),
                "time_limit_s": rng.choice((1800.0, 3600.0, 4 * 3600.0, None)),
            }
        spec = JobSpec(name=f"j{self.seq}", command=("true",), user="bench",
                       kind=JobKind.TRAINING, gpus=gpus, cpus=gpus, **extra)
        return Job(id=f"j{self.seq}", spec=spec, submit_time=now)

    def fill(self) -> None:
        now = 0.0
        while len(self.core.queue()) + len(self.core.running()) < WAITING:
            self.core.submit(self.job(now))
        self.apply(self.core.schedule(now), now)
        while len(self.core.queue()) < WAITING:
            self.core.submit(self.job(now))

    def apply(self, decisions: list[Any], now: float) -> None:
        for d in decisions:
            if isinstance(d, Start):
                for node in d.placement.nodes:
                    self.core.node_started(d.job_id, node, now)
            else:  # a preemption: its parts exit at once
                job = self.core.jobs[d.job_id]
                for node in list(job.node_states):
                    self.core.node_exited(d.job_id, node, None, 9, now)

    def event(self, now: float) -> tuple[float, float]:
        """One job ends, one arrives; the pass is timed (wall, CPU seconds)."""
        running = [j for j in self.core.running().values() if not j.stopping]
        if running:
            ending = self.rng.choice(running)
            for node in list(ending.node_states):
                self.core.node_exited(ending.id, node, 0, None, now)
        self.core.submit(self.job(now))
        wall, cpu = time.perf_counter(), time.thread_time()
        decisions = self.core.schedule(now)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        self.apply(decisions, now)
        return wall, cpu


def overhead(events: int, seed: int) -> dict[str, Any]:
    clusters = {name: Cluster(name == "controlled", seed) for name in ("bare", "controlled")}
    for c in clusters.values():
        c.fill()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in clusters}
    for i in range(events):
        now = 10.0 + i
        for name in (("bare", "controlled") if i % 2 == 0 else ("controlled", "bare")):
            times[name].append(clusters[name].event(now))
    out: dict[str, Any] = {}
    for name, pairs in times.items():
        out[f"{name}_ms_p50"] = round(1000 * nearest_rank([w for w, _ in pairs], 0.5), 3)
        out[f"{name}_ms_p99"] = round(1000 * nearest_rank([w for w, _ in pairs], 0.99), 3)
        out[f"{name}_cpu_ms_p99"] = round(1000 * nearest_rank([c for _, c in pairs], 0.99), 3)
    out["overhead_ratio"] = round(out["controlled_ms_p99"] / out["bare_ms_p99"], 3)
    out["overhead_cpu_ratio"] = round(out["controlled_cpu_ms_p99"] / out["bare_cpu_ms_p99"], 3)
    return out


def preempt(trials: int) -> dict[str, Any]:
    from demo.cluster import LocalCluster, default_job_user
    from demo.harness import exit_on_signals, scratch_dir

    user = default_job_user()
    classes = [
        {"name": "production", "priority": 100, "preempts": ["preemptible"]},
        {"name": "normal", "priority": 0, "default": True},
        {"name": "preemptible", "priority": -100, "preempt_grace_s": 20},
    ]
    latencies: list[float] = []
    unwarned = 0
    with exit_on_signals(), scratch_dir("trellis-test-controls-", mode=0o777) as root:
        marks = root / "marks"
        marks.mkdir(mode=0o777)
        os.chmod(marks, 0o777)
        cluster = LocalCluster(root / "cluster", nodes=1, gpus_per_node=2,
                               prefix="trellis-test-controls",
                               extra_master={"priority_classes": classes})
        with cluster:
            cluster.start()
            client = cluster.client(timeout=30)

            def view(job_id: str) -> dict[str, Any]:
                return client.call("job", {"id": job_id})["job"]

            def wait(what: str, check: Any, timeout: float = 60.0) -> Any:
                deadline = time.monotonic() + timeout
                while not (value := check()):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"timed out waiting for {what}")
                    time.sleep(0.02)
                return value

            for trial in range(trials):
                why = marks / f"why-{trial}"
                up = marks / f"up-{trial}"
                script = (f'trap \'cat "$TRELLIS_PREEMPTED_FILE" > {why}; exit 0\' USR1\n'
                          f'echo up > {up}\nwhile :; do sleep 0.1; done\n')
                low = client.call("submit", {"job": {
                    "name": f"low{trial}", "user": user, "gpus": 2, "cpus": 0,
                    "priority_class": "preemptible", "command": ["sh", "-c", script],
                    "stop": {"warning": {"signal": "SIGUSR1", "seconds": 60}}}})["job"]["id"]
                wait("the preemptible job to run", up.exists)
                prod = client.call("submit", {"job": {
                    "name": f"prod{trial}", "user": user, "gpus": 2, "cpus": 0,
                    "priority_class": "production",
                    "command": ["sleep", "0.2"]}})["job"]["id"]
                started = wait("the production job to start",
                               lambda p=prod: (v := view(p))["start_time"] is not None and v)
                latencies.append(started["start_time"] - started["submit_time"])
                told = why.read_text() if why.exists() else ""
                if not told.startswith(f"for job {prod}"):
                    unwarned += 1
                    print(f"trial {trial}: victim {low} not warned: {told!r} "
                          f"{view(low)}", file=sys.stderr)
                wait("the production job to end", lambda p=prod: view(p)["state"] in (
                    "finished", "failed"))
                client.call("cancel", {"id": low})
                wait("the victim to end", lambda v=low: view(v)["state"] in (
                    "cancelled", "finished", "failed"))
                print(f"trial {trial}: {latencies[-1]:.3f} s", file=sys.stderr, flush=True)
    return {"preempt_s_p50": round(nearest_rank(latencies, 0.5), 3),
            "preempt_s_p99": round(nearest_rank(latencies, 0.99), 3),
            "victims_unwarned": unwarned, "trials": trials}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=200)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--part", default="overhead,preempt")
    args = p.parse_args()
    parts = {s.strip() for s in args.part.split(",")}
    if not parts <= {"overhead", "preempt"} or args.events < 1 or args.trials < 1:
        p.error("--part: overhead and/or preempt; --events and --trials at least 1")
    if "preempt" in parts and os.geteuid() != 0:
        p.error("the preempt part needs root (cgroups for the real node daemon)")
    result: dict[str, Any] = {}
    if "overhead" in parts:
        result.update(overhead(args.events, args.seed))
    if "preempt" in parts:
        result.update(preempt(args.trials))
    met = []
    if "overhead_ratio" in result:
        met.append(result["overhead_ratio"] <= 1.3)
    if "preempt_s_p99" in result:
        met += [result["preempt_s_p99"] <= 2.0, result["victims_unwarned"] == 0]
    result["targets_met"] = all(met)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
