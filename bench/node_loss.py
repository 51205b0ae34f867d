"""Node loss: cut one node's link under 64 running jobs and time their requeue elsewhere.

    python bench/node_loss.py [--nodes 8] [--jobs 64] [--node-lost-s 10] [--multi 3]

Root only (network namespaces). Every trellis-noded runs in a network namespace of its own
(``trellis-test-TAG-nI``), joined to a bridge in the root namespace by a veth pair
(link-local 169.254.X.0/24: nothing leaves the machine); the master listens on the bridge.
Nodes offer cores 0-1 and 16 emulated GPUs each. ``--multi`` jobs of 2 GPUs and 4 cores
must span two nodes (a node has only two cores), the rest are 1-GPU jobs without cores of
their own; every job appends "NODE RESTARTS" to a file named after it and sleeps.

Once all ``--jobs`` run, the host end of the veth of a node holding a multi-node job's part
is set down (the node goes silent: no FIN, no RST). The master notices within 1.5 ×
``node_heartbeat_s`` (2 s here), marks the node unreachable after ``node_grace_s`` and
declares it lost ``node_lost_s`` after it lost the session; every job with a part there
must then run again elsewhere (state running, restarts 1). ``requeue_s`` of a job is from
the cut to that moment. The cut node cannot hear that its jobs moved: its node lease
(shared/nodelease.py) must have stopped them before the master requeued them.

Throughout the cut the job processes on every node are inspected (``/proc``: live processes
with this run's TRELLIS_JOB_ID, by TRELLIS_RESTART_COUNT and TRELLIS_NODE):
``parts_twice_during_cut`` is the most jobs seen at once with processes of two runs (two
restart counts) alive, ``cut_parts_gone_s`` when the last process of an affected job's first
run on the cut node was gone (from the cut; it must come before ``node_lost_s``). Then the
link comes back; once the node has reconnected and been reconciled, every job with a part
running on a node outside its current placement (an older run's part beside the new run)
counts in ``parts_twice``; ``settle_s`` is how long after the node reconnected that count
reached 0 (at most 30 s are waited), and ``fenced`` how many ``part_fenced`` events (parts
the node said it stopped on its own) the master journalled for the cut node.

The master runs with ``max_grace_s`` 3 (the jobs' grace, stop_grace_s) and
``node_fence_margin_s`` 1: the lease stops a requeueable part after node_lost_s - 1.5 ×
node_heartbeat_s - 1 - 3 s of silence (3 s at the defaults below).

Last line, JSON: ``requeue_s_p99`` (nearest rank over the affected jobs; target ≤
``node_lost_s`` + 5 s), ``node_lost_s``, ``affected``, ``lost_jobs`` (jobs not running
again at the end; target 0), ``parts_twice`` (target 0), ``parts_twice_during_cut`` (target
0), ``cut_parts_gone_s``, ``fenced``, ``seconds`` and ``targets_met``. Everything it made
(namespaces, links, daemons, jobs, cgroups, the scratch directory) is removed on exit, on
SIGTERM and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.harness import exit_on_signals, live_environs, scratch_dir, shielded  # noqa: E402

GPUS_PER_NODE = 16
HEARTBEAT_S = 2.0
GRACE_S = 2.0
TARGET_MARGIN_S = 5.0
# The jobs' stop grace (LocalCluster's stop_grace_s) is the most any stop gives, and the
# lease's own margin: node_lost_s must be at least GRACE_S + MAX_GRACE_S + 1.5 × HEARTBEAT_S
# + FENCE_MARGIN_S (the master refuses less).
MAX_GRACE_S = 3.0
FENCE_MARGIN_S = 1.0


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Fabric:
    """A bridge in the root namespace and one namespace per node, each on a veth pair."""

    nodes: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    subnet: int = field(default_factory=lambda: random.randint(200, 249))
    made_ns: list[str] = field(default_factory=list)
    made_links: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"tt{self.tag}br"  # interface names: at most 15 characters

    @property
    def host_ip(self) -> str:
        return f"169.254.{self.subnet}.1"

    def ns(self, i: int) -> str:
        return f"trellis-test-{self.tag}-n{i}"

    def host_if(self, i: int) -> str:
        return f"tt{self.tag}h{i}"

    def build(self) -> None:
        if f"169.254.{self.subnet}." in sh("ip", "-o", "addr").stdout:
            raise RuntimeError(f"169.254.{self.subnet}.0/24 is in use here; run again")
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made_links.append(self.bridge)
        sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i in range(1, self.nodes + 1):
            ns, host, peer = self.ns(i), self.host_if(i), f"tt{self.tag}n{i}"
            sh("ip", "netns", "add", ns)
            self.made_ns.append(ns)
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
            self.made_links.append(host)
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "link", "set", host, "master", self.bridge)
            sh("ip", "link", "set", host, "up")
            inside = ("ip", "netns", "exec", ns)
            sh(*inside, "ip", "addr", "add", f"169.254.{self.subnet}.{10 + i}/24", "dev", peer)
            sh(*inside, "ip", "link", "set", peer, "up")
            sh(*inside, "ip", "link", "set", "lo", "up")

    def cut(self, i: int) -> None:
        sh("ip", "link", "set", self.host_if(i), "down")

    def heal(self, i: int) -> None:
        sh("ip", "link", "set", self.host_if(i), "up")

    def remove(self) -> None:
        for ns in self.made_ns:
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            sh("ip", "netns", "del", ns, check=False)
        for link in reversed(self.made_links):
            sh("ip", "link", "del", link, check=False)


@contextlib.contextmanager
def fabric(nodes: int) -> Iterator[Fabric]:
    net = Fabric(nodes)
    try:
        net.build()
        yield net
    finally:
        with shielded():
            net.remove()


def parts_by_job(prefix: str) -> dict[str, set[str]]:
    """Job id -> the nodes where a live process of it runs (its TRELLIS_NODE), for this
    run's jobs: what really runs, read from every process's environment."""
    return {job: {node for _, node in seen} for job, seen in runs_by_job(prefix).items()}


def runs_by_job(prefix: str) -> dict[str, set[tuple[str, str]]]:
    """Job id -> (restart count, node) of every live process of this run's jobs."""
    found: dict[str, set[tuple[str, str]]] = {}
    for env in live_environs():
        job = env.get("TRELLIS_JOB_ID", "")
        if job.startswith(prefix):
            found.setdefault(job, set()).add((
                env.get("TRELLIS_RESTART_COUNT", ""), env.get("TRELLIS_NODE", "")))
    return found


def twice(prefix: str, placed: dict[str, list[str]]) -> int:
    """Jobs with a part running on a node outside their current placement (``placed``: job
    -> its nodes, as the master has it): an older run's part, running beside the new one.
    A two-node job's two parts are one run, not a part twice."""
    return sum(1 for job, nodes in parts_by_job(prefix).items()
               if nodes - set(placed.get(job, ())))


def wait(what: str, check: Any, timeout: float, period: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(period)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--jobs", type=int, default=64)
    p.add_argument("--multi", type=int, default=3, help="jobs spanning two nodes")
    p.add_argument("--node-lost-s", type=float, default=10.0)
    args = p.parse_args()
    if os.geteuid() != 0:
        p.error("needs root: it makes network namespaces and veth pairs")
    if args.nodes < 3 or not 0 < args.multi <= (args.nodes - 2) // 2:
        p.error("--nodes must be at least 3 and --multi 1 to (nodes - 2) / 2: the lost "
                "node's two-node job needs two other nodes with free cores")
    singles = args.jobs - args.multi
    if singles < 0 or args.jobs > (args.nodes - 1) * GPUS_PER_NODE - 2 * args.multi:
        p.error(f"--jobs must fit the {args.nodes - 1} nodes left after the loss")

    started = time.monotonic()
    run = f"nl{uuid.uuid4().hex[:4]}"
    user = default_job_user()
    with exit_on_signals(), scratch_dir("trellis-test-nodeloss-", mode=0o777) as root, \
            fabric(args.nodes) as net:
        marks = root / "marks"
        marks.mkdir()
        os.chmod(marks, 0o777)
        prefix = f"trellis-test-{net.tag}"
        names = [f"{prefix}-n{i}" for i in range(1, args.nodes + 1)]
        cluster = LocalCluster(
            root / "cluster", nodes=args.nodes, gpus_per_node=GPUS_PER_NODE, prefix=prefix,
            auth=True, listen_host=net.host_ip, cgroup_mode="affinity", node_grace_s=GRACE_S,
            node_settings={"cpus": "0-1"},
            node_wrapper={name: ["ip", "netns", "exec", net.ns(i)]
                          for i, name in enumerate(names, 1)},
            extra_master={"node_lost_s": args.node_lost_s, "node_heartbeat_s": HEARTBEAT_S,
                          "command_timeout_s": 5, "max_grace_s": MAX_GRACE_S,
                          "node_fence_margin_s": FENCE_MARGIN_S})
        with cluster:
            cluster.start()
            client = cluster.client(timeout=30)

            def submit(i: int, gpus: int, cpus: int) -> str:
                job_id = f"{run}-{i:03d}"
                client.call("submit", {"id": job_id, "job": {
                    "name": job_id, "user": user, "gpus": gpus, "cpus": cpus,
                    "command": ["sh", "-c", f'echo "$TRELLIS_NODE $TRELLIS_RESTART_COUNT" '
                                            f'>> {marks}/$TRELLIS_JOB_ID; exec sleep 3600']}})
                return job_id

            # The two-node jobs first (four cores: two nodes of two), then the rest.
            ids = [submit(i, 2, 4) for i in range(args.multi)]
            ids += [submit(i, 1, 0) for i in range(args.multi, args.jobs)]

            def jobs() -> dict[str, dict[str, Any]]:
                return {j["id"]: j for j in client.call("jobs")["jobs"] if j["id"] in ids}

            wait("every job running", lambda: sum(
                j["state"] == "running" for j in jobs().values()) == len(ids), 300, 0.5)
            placed = jobs()
            multi_nodes = [placed[j]["nodes"] for j in ids[:args.multi]]
            assert all(len(n) == 2 for n in multi_nodes), multi_nodes
            victim = multi_nodes[0][0]
            index = names.index(victim) + 1
            affected = sorted(j for j, v in placed.items() if victim in v["nodes"])
            print(f"{len(ids)} jobs running ({args.multi} on two nodes); cutting {victim}: "
                  f"{len(affected)} jobs affected", file=sys.stderr, flush=True)

            net.cut(index)
            cut_at = time.monotonic()
            requeued: dict[str, float] = {}
            deadline = cut_at + args.node_lost_s + 120
            during_cut = 0
            gone_s: float | None = None

            def look() -> None:
                """What really runs now: jobs with two runs alive, the cut node's parts."""
                nonlocal during_cut, gone_s
                runs = runs_by_job(run)
                during_cut = max(during_cut, sum(
                    1 for seen in runs.values() if len({r for r, _ in seen}) > 1))
                if any(("0", victim) in runs.get(j, set()) for j in affected):
                    gone_s = None
                elif gone_s is None:
                    gone_s = time.monotonic() - cut_at

            while len(requeued) < len(affected) and time.monotonic() < deadline:
                now_jobs = jobs()
                now = time.monotonic()
                for job_id in affected:
                    j = now_jobs.get(job_id)
                    if (job_id not in requeued and j is not None and j["state"] == "running"
                            and j["restarts"] >= 1 and victim not in j["nodes"]):
                        requeued[job_id] = now - cut_at
                look()
                time.sleep(0.1)
            look()
            status = {n["name"]: n["status"] for n in client.call("nodes")["nodes"]}
            print(f"{len(requeued)}/{len(affected)} requeued and running elsewhere; "
                  f"{victim} is {status[victim]}; its parts gone {gone_s} s after the cut; "
                  f"jobs running twice at once during the cut: {during_cut}",
                  file=sys.stderr, flush=True)

            net.heal(index)
            wait(f"{victim} to reconnect", lambda: {
                n["name"]: n["status"] for n in client.call("nodes")["nodes"]}[victim]
                == "ready", 120, 0.5)
            # Reconciled: the master told the node what it no longer runs; give the stops
            # their grace (stop_grace_s 3 s) and look at what really runs.
            reconnected = time.monotonic()

            def placed() -> dict[str, list[str]]:
                return {j: v["nodes"] for j, v in jobs().items()}

            with contextlib.suppress(TimeoutError):
                wait("no part running twice", lambda: twice(run, placed()) == 0, 30, 0.5)
            settle_s = time.monotonic() - reconnected
            parts_twice = twice(run, placed())
            final = jobs()
            lost = sum(1 for j in ids if final.get(j, {}).get("state") != "running")
            restarts = {j: final[j]["restarts"] for j in affected if j in final}

            def fenced_count() -> int:
                """Parts the cut node said it stopped on its own (in its hello after the
                link came back), as the master journalled them."""
                return sum(1 for e in client.call("events", {"tail": 2000})["events"]
                           if e["kind"] == "part_fenced" and e["node"] == victim)

            with contextlib.suppress(TimeoutError):
                wait("the node's stopped parts journalled",
                     lambda: fenced_count() >= len(affected), 15, 0.5)
            fenced = fenced_count()
    p99 = nearest_rank(list(requeued.values()), 0.99) if requeued else math.inf
    missing = len(affected) - len(requeued)
    result = {
        "requeue_s_p99": round(p99, 2),
        "requeue_s_max": round(max(requeued.values(), default=math.inf), 2),
        "node_lost_s": args.node_lost_s,
        "node_heartbeat_s": HEARTBEAT_S,
        "jobs": len(ids),
        "multi_node_jobs": args.multi,
        "affected": len(affected),
        "not_requeued": missing,
        "lost_jobs": lost,
        "parts_twice": parts_twice,
        "parts_twice_during_cut": during_cut,
        "cut_parts_gone_s": None if gone_s is None else round(gone_s, 2),
        "fenced": fenced,
        "settle_s": round(settle_s, 1),
        "restarts": sorted(set(restarts.values())),
        "seconds": round(time.monotonic() - started, 1),
    }
    result["targets_met"] = (p99 <= args.node_lost_s + TARGET_MARGIN_S and missing == 0
                             and lost == 0 and parts_twice == 0 and during_cut == 0)
    print(json.dumps(result))
    return 0 if result["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
