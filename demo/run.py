"""``python -m demo.run``: a four-node demo cluster running a small mixed workload.

Starts trellis-masterd and four trellis-noded processes (four emulated GPUs each) on this
machine, submits training jobs of 1, 2, 4 and 8 GPUs and CPU jobs whose processes really run,
prints every state change as it happens and ends with a summary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from control.client import MasterClient
from demo.cluster import TRAINER, LocalCluster, default_job_user
from demo.harness import exit_on_signals, scratch_dir


def workload(user: str) -> list[dict]:
    def train(name: str, gpus: int, iters: int, qos: str = "normal") -> dict:
        return {"name": name, "kind": "training", "gpus": gpus, "cpus": 1, "user": user,
                "qos": qos, "tenant": "vision" if gpus < 4 else "nlp",
                "command": ["python3", TRAINER, "--iterations", str(iters), "--load-ms", "5",
                            "--gpu-ms", "20"]}

    def cpu(name: str, seconds: float) -> dict:
        return {"name": name, "kind": "cpu", "gpus": 0, "cpus": 1, "user": user,
                "tenant": "etl", "command": ["sh", "-c", f"sleep {seconds}; echo etl done"]}

    return [
        train("resnet-1gpu", 1, 60, "prior"), train("bert-2gpu", 2, 80),
        train("gpt-8gpu", 8, 100), train("vit-4gpu", 4, 80, "urgent"),
        cpu("etl-a", 2), train("lstm-1gpu", 1, 40), train("t5-8gpu", 8, 60),
        cpu("etl-b", 3), train("yolo-2gpu", 2, 50), train("wide-16gpu", 16, 40),
        train("seq2seq-4gpu", 4, 60), cpu("etl-c", 1),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo", description=__doc__)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--keep", action="store_true", help="keep the state directory")
    p.add_argument("--timeout", type=float, default=110.0)
    p.add_argument("--prefix", default="trellis-demo",
                   help="names the nodes, their cgroups and the state directory")
    args = p.parse_args(argv)
    # SIGTERM or Ctrl-C: the cluster's jobs, cgroups and state directory go all the same.
    with exit_on_signals(), scratch_dir(f"{args.prefix}-", keep=args.keep) as root:
        try:
            with LocalCluster(root, nodes=args.nodes, gpus_per_node=args.gpus,
                              prefix=args.prefix) as cluster:
                return run_workload(cluster, args.timeout)
        finally:
            if args.keep:
                print(f"state and logs kept in {root}")


def run_workload(cluster: LocalCluster, timeout: float) -> int:
    """Start the cluster, run the workload to the end or ``timeout`` and print the summary;
    0 when every job finished."""
    user = default_job_user()
    mode = "real cgroups" if os.geteuid() == 0 else "CPU affinity (not root)"
    print(f"Starting a demo cluster in {cluster.root}: 1 master, {cluster.nodes} nodes x "
          f"{cluster.gpus_per_node} emulated GPUs, pinning with {mode}, jobs run as {user}")
    started = time.monotonic()
    cluster.start()
    client = cluster.client()
    ids = [client.call("submit", {"job": spec})["job"]["id"] for spec in workload(user)]
    print(f"Submitted {len(ids)} jobs")
    follow(client, ids, started, timeout)
    jobs = {j["id"]: j for j in client.call("jobs")["jobs"]}
    done = [jobs[i] for i in ids if jobs[i]["state"] == "finished"]
    waits = [j["queued_s"] for j in done if j["queued_s"] is not None]
    jcts = [j["end_time"] - j["submit_time"] for j in done]
    print("\nSummary")
    print(f"  jobs finished:            {len(done)}/{len(ids)}")
    if done:
        print(f"  mean queueing delay:      {statistics.mean(waits):.1f} s")
        print(f"  mean job completion time: {statistics.mean(jcts):.1f} s")
    print(f"  wall time:                {time.monotonic() - started:.1f} s")
    return 0 if len(done) == len(ids) else 1


def follow(client: MasterClient, ids: list[str], started: float, timeout: float) -> None:
    """Print every state change of the jobs ``ids`` until all have ended or time is up."""
    seen: dict[str, str] = {}
    while time.monotonic() - started < timeout:
        jobs = {j["id"]: j for j in client.call("jobs")["jobs"]}
        for job_id in ids:
            j = jobs[job_id]
            if seen.get(job_id) != j["state"]:
                seen[job_id] = j["state"]
                where = f" on {','.join(j['nodes'])}" if j["nodes"] else ""
                extra = f" exit={j['exit_code']}" if j["state"] in ("finished", "failed") \
                    else ""
                print(f"{time.monotonic() - started:6.1f}s  {job_id:<18} "
                      f"{j['state']:<9} gpus={j['gpus']}{where}{extra}", flush=True)
        if all(jobs[i]["state"] in ("finished", "failed", "cancelled") for i in ids):
            return
        time.sleep(0.2)

if __name__ == "__main__":
    sys.exit(main())
