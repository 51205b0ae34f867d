"""``python -m demo.run``: what Trellis is for, on one machine, in about a minute.

Starts trellis-masterd and four trellis-noded processes (four emulated GPUs each, an
emulated resctrl) on this machine under SODA's multi-array policy with GENIE's SWAF inside the
GPU arrays, then plays five scenes at once, every job a real process:

* GENIE profiles a new model type with real runs and fits its performance model;
* SWAF orders urgent, prior, normal and deadline jobs with that model: the deadline job
  overtakes normal jobs submitted before it;
* CPU jobs start at once in SODA's CPU-job array while every GPU is taken;
* an inference service's load ramps up and down: CPU replicas, a switch to GPUs, a replica
  more (preempting a training job) and fewer, and back to CPU;
* the node's contention eliminator throttles a memory-hungry CPU job (MBA) and restores it.

A timeline tells what the master reports as it happens; a table sums the scenes up at the end.
``--serve`` then leaves the cluster running and prints the ``trellisctl`` commands to try it;
Ctrl-C stops it and cleans up (jobs, cgroups, the state directory). Exit status: 0 when every
scene was shown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

from control.aclient import AsyncMasterClient
from demo import harness
from demo.cluster import TRAINER, TREE, LocalCluster, default_job_user, free_port
from demo.harness import Interrupted, exit_on_signals, scratch_dir
from demo.narrator import Narrator, Timeline
from demo.play import play, record, summary_table
from demo.stage import EMULATE, MODEL_TYPE, Stage
from shared.auth import Secret
from shared.model import is_valid_name

PEAK_MIBPS = 400.0  # the emulated nodes' memory bandwidth peak (contention.peak_bandwidth_mbps)


def demo_cluster(root: Path, args: argparse.Namespace) -> LocalCluster:
    """The demo's cluster: soda-arrays (one node's GPUs in the large-job array, one core per
    node in the CPU-job array) with SWAF ordering both GPU arrays, tokens for every role."""
    options = {
        "borrowing": False,  # each job in its own array, so what runs where is plain to see
        "inner": {"small": "swaf", "large": {"name": "swaf", "shape_mode": "exact"},
                  "cpu": "fifo"},
        "models": {"*": {"large": 1 / args.nodes, "cpu_job_cores": 1}},
    }
    return LocalCluster(
        root, nodes=args.nodes, gpus_per_node=args.gpus, prefix=args.prefix,
        policy="soda-arrays", auth=True,
        extra_master={"policy_options": options, "array_resize_interval_s": 0,
                      "inference": {"sustain_s": 1.0}},
        node_settings={"job_metrics_interval_s": 0.2},
        node_sections={"rdt": {"mode": "emulated"},
                       # Steps of 10 points, so the throttle settles inside the hysteresis
                       # band (70 % of peak) instead of on its lower edge (60 %).
                       "contention": {"peak_bandwidth_mbps": PEAK_MIBPS, "mba_step": 10,
                                      "restore_intervals": 2}},
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus", type=int, default=4, help="emulated GPUs per node")
    p.add_argument("--keep", action="store_true", help="keep the state directory")
    p.add_argument("--timeout", type=float, default=110.0,
                   help="seconds the scenes may take in all")
    p.add_argument("--prefix", default="trellis-demo",
                   help="names the nodes, their cgroups and the state directory")
    p.add_argument("--serve", action="store_true",
                   help="leave the cluster running afterwards, until Ctrl-C")
    p.add_argument("--record", type=Path, metavar="FILE",
                   help="write what the master reported (events, results) to FILE as JSON")
    args = p.parse_args(argv)
    if args.nodes < 2 or args.gpus < 4:
        p.error("the scenes need at least 2 nodes of at least 4 GPUs")
    if not is_valid_name(f"{args.prefix}-n{args.nodes}"):
        p.error(f"--prefix {args.prefix!r}: letters, digits, '-' and '_' only, starting with a "
                f"letter or digit, short enough for node names ({args.prefix}-n1...)")
    if not args.timeout > 0:
        p.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if args.record and not os.access(args.record.parent, os.W_OK):
        p.error(f"--record {args.record}: cannot write in {args.record.parent}")
    serving: list[bool] = []  # set once --serve's cluster is up: Ctrl-C then ends it normally
    try:
        # SIGTERM or Ctrl-C: the cluster's jobs, cgroups and state directory go all the same.
        with exit_on_signals(), scratch_dir(f"{args.prefix}-", keep=args.keep) as root:
            try:
                with demo_cluster(root, args) as cluster:
                    return run_demo(cluster, args, serving)
            finally:
                if args.keep:
                    print(f"state and logs kept in {root}")
    except Interrupted:
        if serving:
            print("demo cluster stopped; its jobs, cgroups and state directory are gone")
            return 0
        raise


def run_demo(cluster: LocalCluster, args: argparse.Namespace, serving: list[bool]) -> int:
    user = default_job_user()
    mode = "real cgroups" if os.geteuid() == 0 else "CPU affinity (not root)"
    print(f"Starting a demo cluster in {cluster.root}: 1 master, {cluster.nodes} nodes x "
          f"{cluster.gpus_per_node} emulated GPUs, policy soda-arrays with SWAF in the GPU "
          f"arrays; pinning with {mode}; jobs run as {user}", flush=True)
    started = time.monotonic()
    cluster.start()
    up = time.monotonic() - started
    print(f"cluster up in {up:.1f} s at {cluster.url}\n", flush=True)
    return harness.run(session(cluster, args, user, up, started, serving))


async def session(cluster: LocalCluster, args: argparse.Namespace, user: str, up: float,
                  started: float, serving: list[bool]) -> int:
    client = AsyncMasterClient(cluster.url, token=Secret(cluster.tokens["admin"]))
    try:
        pools = await client.call("pools")
        sizes = {a["kind"]: a["size"] for a in pools["arrays"]}
        timeline = Timeline()
        narrator = Narrator(client, timeline)
        stage = Stage(client, timeline, narrator, user, TRAINER, cluster.root, sizes,
                      PEAK_MIBPS)
        stop = asyncio.Event()
        telling = asyncio.create_task(narrator.run(stop))
        try:
            results = await play(stage, free_port(), args.timeout)
        finally:
            stop.set()
            await telling
        wall = time.monotonic() - started
        print(f"\nSummary: {sum(r.ok for r in results)}/{len(results)} scenes shown; "
              f"{wall:.1f} s from start to here (cluster up in {up:.1f} s, scenes "
              f"{timeline.now():.1f} s)\n")
        print(summary_table(results))
        if args.record:
            args.record.write_text(json.dumps(record(results, stage, {
                "wall_s": wall, "cluster_up_s": up, "url": cluster.url,
                "root": str(cluster.root), "sizes": sizes, "peak_mibps": PEAK_MIBPS,
            }), indent=1, default=str))
        if args.serve:
            serving.append(True)
            print(try_it(cluster, stage), flush=True)
            await asyncio.Event().wait()  # until Ctrl-C or SIGTERM cancels this
        return 0 if all(r.ok for r in results) else 1
    finally:
        await client.close()


def try_it(cluster: LocalCluster, stage: Stage) -> str:
    """The commands to try against the running cluster, with its URL and credentials."""
    token = cluster.token_file("admin")
    t5 = next((j["id"] for j in stage.narrator.jobs.values() if j["name"] == "t5"), "t5-1")
    bindir = Path(sys.executable).parent
    path = "" if shutil.which("trellisctl") else f"PATH={bindir}:$PATH "
    lines = [
        "",
        "The demo cluster keeps running. In another shell:",
        f"  export {path}TRELLIS_MASTER={cluster.url} TRELLIS_TOKEN_FILE={token}",
        "  trellisctl nodes                # nodes, GPUs and cores in use",
        "  trellisctl pools                # SODA's arrays: sizes, use, queues",
        "  trellisctl jobs                 # every job of the demo",
        f"  trellisctl show {t5:<15} # the deadline job: prediction, SWAF allowance, events",
        "  trellisctl events --follow      # the journal as it grows (Ctrl-C ends it)",
        "  trellisctl profiles             # GENIE's profiling campaign",
        "  trellisctl models               # the model it fitted",
        f"  trellisctl submit --gpus 2 --qos prior --model-type {MODEL_TYPE} --batch 64 "
        f"--iterations 100 --user {stage.user} -- python3 {TRAINER} --emulate {EMULATE} "
        f"--batch 64 --iterations 100",
        "The inference service's endpoints, as a service would ask for them:",
        f"  cd {TREE} && {sys.executable} -c 'from control.client import MasterClient; "
        f"from shared.auth import read_token; print(MasterClient(\"{cluster.url}\", "
        f"token=read_token(\"{token}\")).call(\"place\", {{\"service\": \"resnet-serve\"}}))'",
        "",
        "Stop it with Ctrl-C here: the jobs, cgroups and the state directory are removed.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
