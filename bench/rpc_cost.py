"""Instructions per request: the submit RPC against the bare msgpack echo, same run.

    python bench/rpc_cost.py [--requests 1000] [--concurrency 32]

bench/rpc.py's ratio is the target, but on a small shared machine its run-to-run spread
(several percent) hides a change to the master's per-request work. This bench counts that
work instead: the master (and, as the baseline, the echo server of bench/rpc.py) runs under
valgrind's callgrind with counting switched off, is warmed up, then counts the user-space
instructions it executes while serving ``--requests`` requests from the same closed-loop
clients. The counts repeat to within about 1% whatever else the machine is doing.

What it does not see: kernel time (socket and pipe syscalls, the fsync), the journal
writer's own work (a separate process, not traced) and waiting. Under valgrind the master is
slow, so more requests share each loop turn, journal write and scheduling pass than at full
speed: per-turn costs are understated.

Last line: JSON with echo_ir, ping_ir, submit_ir (instructions per request) and ir_ratio
(echo_ir / submit_ir).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rpc import MSGPACK, echo_server, submit_bodies  # noqa: E402

from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.harness import exit_on_signals, run, scratch_dir  # noqa: E402
from shared.protocol import encode_rpc_request  # noqa: E402

WARMUP = 400


def callgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out}"]


async def serve(url: str, bodies: list[bytes], requests: int, concurrency: int) -> None:
    """``requests`` requests from ``concurrency`` closed-loop clients; every one must be
    answered 200."""
    todo = iter(range(requests))
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency),
            timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def client() -> None:
            for i in todo:
                async with session.post(url, data=bodies[i % len(bodies)],
                                        headers=MSGPACK) as r:
                    body = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url} answered {r.status}: {body[:200]!r}")

        await asyncio.gather(*(client() for _ in range(concurrency)))


def count(pid: int, out: Path, url: str, bodies: list[bytes], requests: int,
          concurrency: int) -> float:
    """Instructions per request of the traced process ``pid`` serving ``url``."""
    run(serve(url, bodies, WARMUP, concurrency))
    before = set(out.parent.glob(out.name + ".*"))
    subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True,
                   capture_output=True)
    run(serve(url, bodies, requests, concurrency))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True,
                   capture_output=True)
    (dump,) = set(out.parent.glob(out.name + ".*")) - before
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1]) / requests
    raise RuntimeError(f"no totals in {dump}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("rpc_cost: valgrind (with callgrind_control) is not installed", file=sys.stderr)
        return 2

    with exit_on_signals(), scratch_dir("trellis-bench-") as root:
        master_out, echo_out = root / "master.cg", root / "echo.cg"
        with LocalCluster(root, nodes=1, gpus_per_node=8, prefix="trellis-bench",
                          cgroup_mode="affinity", master_wrapper=callgrind(master_out),
                          master_start_timeout_s=300) as cluster, \
                echo_server(callgrind(echo_out), stderr=subprocess.DEVNULL) as echo:
            cluster.start()
            cluster.client().call("drain", {"node": cluster.node_name(1)})
            assert cluster.master is not None and cluster.master.proc is not None
            rpc_url = cluster.url + "/v1/rpc"
            bodies = submit_bodies(2000, default_job_user())
            echo.wait(300)
            echo_ir = count(echo.proc.pid, echo_out, echo.url, bodies, args.requests,
                            args.concurrency)
            ping_ir = count(cluster.master.proc.pid, master_out, rpc_url,
                            [encode_rpc_request("ping", {}, 1)], args.requests,
                            args.concurrency)
            submit_ir = count(cluster.master.proc.pid, master_out, rpc_url, bodies,
                              args.requests, args.concurrency)
    print(json.dumps({"echo_ir": round(echo_ir), "ping_ir": round(ping_ir),
                      "submit_ir": round(submit_ir), "ir_ratio": round(echo_ir / submit_ir, 3),
                      "requests": args.requests, "concurrency": args.concurrency}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
