"""The placement RPC (``place``) against a bare aiohttp msgpack echo, same run, loopback.

    python -m bench.placement [--seconds 20] [--throughput-seconds 6] [--concurrency 64]
                              [--rate 1000] [--services 100]

Setup: a real trellis-masterd (separate process) with two emulated node daemons; 100
inference services registered through the RPC. While the nodes are open, the first services
get real CPU replicas (one core each, as many as the nodes' cores allow: the replicas are real
processes); the nodes are then drained and the remaining services register with no room, so
their endpoint lists are empty. The baseline is the echo server of ``bench/rpc.py`` (separate
process, uvloop), which decodes the msgpack body and answers it. The load generator is this
process (uvloop), separate from both servers.

(a) Throughput: ``--concurrency`` closed-loop aiohttp clients call ``place`` for the services
    in turn, in alternating one-second slices against the master and the echo (so a
    neighbour's burst hits both alike); rps = replies per second.
(b) Latency: ``place`` offered open-loop at ``--rate`` requests/s for ``--seconds``: each
    request is sent at its scheduled instant whether or not earlier ones were answered.
    Latency is measured from the scheduled instant (so a late sender counts against us, not
    hidden), p50/p99 over all requests; the same schedule is then offered to the echo for
    reference.

Last line: JSON with rps, echo_rps, ratio (rps / echo_rps), p99_ms (from b), and details.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.rpc import drive, echo_server, percentile  # noqa: E402
from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.harness import exit_on_signals, run, scratch_dir  # noqa: E402
from shared.protocol import encode_rpc_request, unpack  # noqa: E402

HEADERS = {"Content-Type": "application/msgpack"}


def place_bodies(services: int) -> list[bytes]:
    return [encode_rpc_request("place", {"service": f"svc-{i:03d}"}, i) for i in range(services)]


def register(cluster: LocalCluster, services: int) -> int:
    """Register the services; returns how many got a replica."""
    client = cluster.client(timeout=30)
    user = default_job_user()
    cores = sum(n["cpus_free"] for n in client.call("nodes")["nodes"])
    for i in range(services):
        if i == cores:  # the nodes are full: close them, the rest register without room
            for n in range(1, cluster.nodes + 1):
                client.call("drain", {"node": cluster.node_name(n)})
        client.call("register_service", {
            "service": f"svc-{i:03d}", "command": ["sleep", "3600"], "user": user,
            "bs_gpu": 32, "cpu_batch": 4, "cpu_cores": 1, "cpu_mbw_gbps": 0.5,
            "port": 20000 + 10 * i,
        })
    deadline = time.monotonic() + 60
    while True:
        listed = client.call("services")["services"]
        ready = sum(s["ready"] for s in listed)
        if ready >= min(cores, services) or time.monotonic() > deadline:
            return ready
        time.sleep(0.2)


async def open_loop(url: str, bodies: list[bytes], rate: float, seconds: float,
                    connections: int) -> tuple[list[float], list[float], int, float]:
    """Send on a fixed schedule over a warm pool of ``connections`` keep-alive connections.

    Returns latencies from the scheduled and from the actual send instants, the error count
    and the worst sender lateness (s). A request due while every connection is busy waits
    for one, and that wait counts: it is measured from the schedule.
    """
    from_schedule: list[float] = []
    from_send: list[float] = []
    errors = 0
    late = 0.0
    count = int(rate * seconds)
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def post(body: bytes) -> bool:
            try:
                async with session.post(url, data=body, headers=HEADERS) as r:
                    data = await r.read()
                    return r.status == 200 and "result" in unpack(data)
            except aiohttp.ClientError:
                return False

        # Open the pool first: connection set-up is not what we measure.
        await asyncio.gather(*(post(bodies[i % len(bodies)]) for i in range(connections)))

        async def one(i: int, due: float, record: bool) -> None:
            nonlocal errors
            sent = time.perf_counter()
            ok = await post(bodies[i % len(bodies)])
            done = time.perf_counter()
            if record:
                errors += not ok
                from_schedule.append(done - due)
                from_send.append(done - sent)

        pending: set[asyncio.Task[None]] = set()
        warm = int(rate)  # one second at the rate before measuring
        start = time.perf_counter() + 0.05
        for i in range(warm + count):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif i >= warm:
                late = max(late, -delay)
            task = asyncio.get_running_loop().create_task(one(i, due, i >= warm))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
    return from_schedule, from_send, errors, late


def ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1000, 2)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0, help="open-loop latency run (b)")
    p.add_argument("--throughput-seconds", type=float, default=6.0, help="closed loop (a)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--services", type=int, default=100)
    args = p.parse_args()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    with exit_on_signals(), scratch_dir("trellis-bench-") as root, \
            LocalCluster(root, nodes=2, gpus_per_node=2, prefix="trellis-bench-place",
                         cgroup_mode="affinity") as cluster, echo_server() as echo:
        cluster.start()
        with_replicas = register(cluster, args.services)
        bodies = place_bodies(args.services)
        master_url = cluster.url + "/v1/rpc"
        echo.wait()
        sample = unpack(run(_one(master_url, bodies[0])))["result"]

        # (a) throughput, warmed, in alternating slices.
        run(drive(echo.url, bodies, 0.5, args.concurrency, False))
        run(drive(master_url, bodies, 0.5, args.concurrency, True))
        place_n = echo_n = errors = 0
        slices = max(1, round(args.throughput_seconds))
        for _ in range(slices):
            n, _, _ = run(drive(echo.url, bodies, args.throughput_seconds / slices,
                                args.concurrency, False))
            echo_n += n
            n, _, errs = run(drive(master_url, bodies, args.throughput_seconds / slices,
                                   args.concurrency, True))
            place_n += n
            errors += errs

        # (b) open-loop latency at a fixed rate, then the same schedule against the echo.
        sched, sent, lat_errors, late = run(
            open_loop(master_url, bodies, args.rate, args.seconds, args.concurrency))
        echo_sched, _, _, _ = run(
            open_loop(echo.url, bodies, args.rate, min(args.seconds, 5.0), args.concurrency))
    rps = place_n / args.throughput_seconds
    echo_rps = echo_n / args.throughput_seconds
    result = {
        "rps": round(rps, 1),
        "echo_rps": round(echo_rps, 1),
        "ratio": round(rps / echo_rps, 3),
        "p99_ms": ms(sched, 0.99),
        "p50_ms": ms(sched, 0.50),
        "p999_ms": ms(sched, 0.999),
        "p99_from_send_ms": ms(sent, 0.99),
        "echo_p99_ms": ms(echo_sched, 0.99),
        "rate": args.rate,
        "latency_requests": len(sched),
        "max_sender_lateness_ms": round(late * 1000, 2),
        "errors": errors + lat_errors,
        "services": args.services,
        "services_with_replicas": with_replicas,
        "reply_bytes_example": len(json.dumps(sample)),
        "concurrency": args.concurrency,
    }
    print(f"place: {place_n} replies, echo: {echo_n}; open loop: {len(sched)} requests at "
          f"{args.rate:g}/s", file=sys.stderr)
    print(json.dumps(result))
    return 0 if result["errors"] == 0 else 1


async def _one(url: str, body: bytes) -> bytes:
    async with aiohttp.ClientSession() as session, \
            session.post(url, data=body, headers=HEADERS) as r:
        return await r.read()


if __name__ == "__main__":
    sys.exit(main())
