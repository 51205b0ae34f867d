"""Sustained load on one real master: 1,000 client connections and 100 emulated nodes.

    python bench/load.py [--seconds 60] [--clients 1000] [--rate 1.0] [--nodes 100]
                         [--events 10] [--step-seconds 12] [--max-steps 6] [--job-s 1.0]
                         [--services 4]

Phase 1 offers ``clients × rate`` requests/s (1,000/s by default) for ``--seconds``: every
client holds its own keep-alive connection and sends one request per 1/rate seconds, cycling
submit → jobs (list, limit 20, state running) → place (one of ``--services`` inference
services registered at setup; a reply listing no endpoint yet counts as a success).
Meanwhile ``--nodes`` emulated nodes speak the node protocol over WebSockets: hello with a fake
inventory (4 GPUs, 8 cores), then ``gpu_util`` events at ``--events``/s each; they also carry
out the master's commands (ack prepare/start, report the job started, exited ``--job-s`` later;
inference replicas keep running, as services do), so submissions really churn through the
scheduler, the journal and the node channel.

Every step runs against a fresh master. Phase 2 raises the offered rate by 1.5× per step
(``--step-seconds`` each) until p99 passes 100 ms; ``capacity_rps`` is the highest
completed rate of a step with p99 ≤ 100 ms and no errors. If phase 1 already misses the
target, the steps go down by 1.5× instead until one meets it, so capacity_rps is then the
highest passing rate below the target load. ``capacity_limited_by_steps`` says the search ran
out of ``--max-steps`` before it crossed the target (every step up passed, or every step down
failed): capacity_rps is then only a lower bound (or None, capacity below the lowest rate).

Latency is measured from each request's *scheduled* send time, so a stalled master cannot hide
behind clients that fell behind. Load generators run in separate processes from the master
(``--procs`` for clients, one for the nodes); on a 2-core machine they compete with it, which
the figures include. Last line: JSON with requests, errors, p99_ms, events_per_s,
capacity_rps and the per-step detail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.harness import exit_on_signals, scratch_dir  # noqa: E402
from shared.model import CpuCore, GpuInfo, NodeInventory  # noqa: E402
from shared.protocol import encode_frame, encode_rpc_request  # noqa: E402
from shared.schema import encode  # noqa: E402

P99_TARGET_MS = 100.0
WARMUP_S = 3.0


# -- client worker ----------------------------------------------------------------------------


async def run_clients(url: str, first: int, count: int, rate: float, seconds: float,
                      tag: str, services: int) -> dict[str, Any]:
    user = default_job_user()
    latencies: list[float] = []
    by_kind: dict[str, list[float]] = {"submit": [], "list": [], "place": []}
    errors: dict[str, int] = {}
    # Time for every client to open its connection first (see warm-up below).
    start = time.perf_counter() + WARMUP_S
    end = start + seconds
    period = 1.0 / rate

    async def client(index: int) -> None:
        connector = aiohttp.TCPConnector(limit=1, force_close=False)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            # Warm-up: open the keep-alive connection before the clock starts, so a step
            # measures requests rather than 1,000 TCP handshakes in its first second.
            try:
                async with session.post(url, data=encode_rpc_request("ping", {}, 0)) as r:
                    await r.read()
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass  # the measured requests will report it
            # Spread the clients evenly over the period so load is smooth, not bursts, and
            # start each at a different point of the cycle so short steps still mix all kinds.
            due = start + period * random.random()
            k = index % 3
            while due < end:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                kind = k % 3
                name = ("submit", "list", "place")[kind]
                if kind == 0:
                    job_id = f"{tag}-{index}-{k}"
                    body = encode_rpc_request("submit", {"id": job_id, "job": {
                        "name": "load", "command": ["true"], "user": user, "kind": "cpu",
                        "cpus": 1}}, k)
                elif kind == 1:
                    body = encode_rpc_request("jobs", {"limit": 20, "state": "running"}, k)
                else:
                    body = encode_rpc_request(
                        "place", {"service": service_name((index + k) % services)}, k)
                try:
                    async with session.post(url, data=body) as r:
                        reply = msgpack.unpackb(await r.read())
                    if r.status != 200 or "error" in reply:
                        code = reply.get("error", {}).get("code", str(r.status))
                        errors[code] = errors.get(code, 0) + 1
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    err = type(exc).__name__
                    errors[err] = errors.get(err, 0) + 1
                latencies.append(time.perf_counter() - due)
                by_kind[name].append(latencies[-1])
                k += 1
                due += period

    await asyncio.gather(*(client(first + i) for i in range(count)))
    return {"latencies": latencies, "errors": errors, "by_kind": by_kind}


def service_name(i: int) -> str:
    return f"bench-svc{i}"


def register_services(cluster: LocalCluster, count: int) -> None:
    """Inference services for ``place``: the master plans a replica for each at low load."""
    client = cluster.client(timeout=30)
    for i in range(count):
        client.call("register_service", {
            "service": service_name(i), "command": ["true"], "user": default_job_user(),
            "bs_gpu": 10, "cpu_batch": 4, "cpu_cores": 1, "cpu_mbw_gbps": 1.0,
            "port": 9000 + 100 * i})


# -- emulated nodes ---------------------------------------------------------------------------


def fake_inventory(name: str) -> dict[str, Any]:
    return encode(NodeInventory(
        name=name, hostname=name, address="127.0.0.1", memory_mib=65536,
        gpus=tuple(GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model="A100-SXM4-40GB",
                           memory_mib=40960) for i in range(4)),
        cpus=tuple(CpuCore(id=i) for i in range(8))))


async def run_nodes(url: str, count: int, events_per_s: float, seconds: float,
                    job_s: float) -> dict[str, Any]:
    acked = 0
    errors: dict[str, int] = {}
    commands = 0
    start = time.perf_counter() + WARMUP_S
    end = start + seconds

    async def node(index: int) -> None:
        nonlocal acked, commands
        name = f"bench-n{index:03d}"
        ids = iter(range(1, 10**9, 2))
        async with aiohttp.ClientSession() as session, session.ws_connect(
                url, max_msg_size=1 << 20, heartbeat=None) as ws:
            await ws.send_bytes(encode_frame("hello", next(ids), {"inventory":
                                                                   fake_inventory(name)}))

            pending: set[asyncio.Future[None]] = set()
            replicas: set[str] = set()  # inference replicas run until stopped
            util_ids: set[int] = set()  # gpu_util frames awaiting their ack

            async def later(delay: float, type_: str, body: dict) -> None:
                await asyncio.sleep(delay)
                if not ws.closed:
                    await ws.send_bytes(encode_frame(type_, next(ids), body))

            async def reader() -> None:
                nonlocal acked, commands
                async for msg in ws:
                    frame = msgpack.unpackb(msg.data)
                    type_ = frame["type"]
                    if type_ == "ack":
                        if frame["id"] in util_ids:
                            util_ids.discard(frame["id"])
                            acked += 1
                        continue
                    if type_ == "error":
                        code = frame["body"].get("code", "error")
                        errors[code] = errors.get(code, 0) + 1
                        continue
                    commands += 1
                    body = frame["body"]
                    reply: dict[str, Any] = {}
                    if type_ == "prepare_job":
                        reply = {"port": 29500}
                        if body["spec"].get("kind") == "inference":
                            replicas.add(body["job_id"])
                    elif type_ == "start_job":
                        reply = {"pid": 4242}
                        pending.add(asyncio.ensure_future(later(
                            0, "job_started", {"job_id": body["job_id"], "pid": 4242})))
                        if body["job_id"] not in replicas:
                            pending.add(asyncio.ensure_future(later(
                                job_s, "job_exited", {"job_id": body["job_id"],
                                                      "exit_code": 0})))
                    elif type_ == "stop_job":
                        pending.add(asyncio.ensure_future(later(0, "job_exited", {
                            "job_id": body["job_id"], "exit_code": None, "signal": 15})))
                    await ws.send_bytes(encode_frame("ack", frame["id"], reply))

            read = asyncio.ensure_future(reader())
            period = 1.0 / events_per_s
            due = start + period * random.random()
            k = 0
            while due < end:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                pct = float((k * 37 + index) % 100)
                band = "idle" if pct < 5 else "low" if pct < 30 else "medium" if pct < 70 \
                    else "high"
                util_id = next(ids)
                util_ids.add(util_id)
                await ws.send_bytes(encode_frame("gpu_util", util_id, {
                    "index": k % 4, "utilization_pct": pct, "band": band}))
                k += 1
                due += period
            await asyncio.sleep(1.0)  # let the last acks arrive
            read.cancel()

    results = await asyncio.gather(*(node(i) for i in range(count)), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    for exc in failures:
        errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
    return {"acked": acked, "errors": errors, "commands": commands, "seconds": seconds}


def worker_main(args: argparse.Namespace) -> int:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.worker == "clients":
        out = asyncio.run(run_clients(args.url + "/v1/rpc", args.first, args.count, args.rate,
                                      args.seconds, args.tag, args.services))
    else:
        url = args.url.replace("http://", "ws://") + "/v1/node"
        out = asyncio.run(run_nodes(url, args.count, args.events, args.seconds, args.job_s))
    Path(args.out).write_text(json.dumps(out))
    return 0


# -- driver -----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spawn(argv: list[str], out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *argv, "--out", str(out)], cwd=ROOT,
                            text=True)


def collect(proc: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    if proc.wait() != 0:
        raise RuntimeError(f"load generator failed with status {proc.returncode}")
    return json.loads(out.read_text())


def run_step(url: str, args: argparse.Namespace, rate: float, seconds: float, tag: str,
             with_nodes: bool, scratch: Path) -> dict[str, Any]:
    per = -(-args.clients // args.procs)
    procs: list[tuple[subprocess.Popen[str], Path]] = []
    node_proc = None
    try:
        for p in range(args.procs):
            count = min(per, args.clients - p * per)
            if count <= 0:
                break
            out = scratch / f"{tag}-clients-{p}.json"
            procs.append((spawn(["--worker", "clients", "--url", url, "--first", str(p * per),
                                 "--count", str(count), "--rate", str(rate), "--seconds",
                                 str(seconds), "--tag", tag, "--services",
                                 str(args.services)], out), out))
        if with_nodes:
            out = scratch / f"{tag}-nodes.json"
            node_proc = (spawn(["--worker", "nodes", "--url", url, "--count", str(args.nodes),
                                "--events", str(args.events), "--seconds", str(seconds),
                                "--job-s", str(args.job_s)], out), out)
        step = client_figures([collect(proc, out) for proc, out in procs], args.clients * rate,
                              seconds)
        if node_proc is not None:
            nodes = collect(*node_proc)
            step["events_per_s"] = round(nodes["acked"] / seconds, 1)
            step["node_errors"] = nodes["errors"]
            step["node_commands"] = nodes["commands"]
        return step
    finally:
        # Interrupted, or a generator failed: the others would load a master that is gone.
        for proc, _ in [*procs, *([node_proc] if node_proc else [])]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def client_figures(results: list[dict[str, Any]], offered: float,
                   seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    kinds: dict[str, list[float]] = {}
    for data in results:
        latencies += data["latencies"]
        for kind, values in data["by_kind"].items():
            kinds.setdefault(kind, []).extend(values)
        for k, v in data["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "offered_rps": round(offered, 1),
        "requests": len(latencies),
        "achieved_rps": round(len(latencies) / seconds, 1),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "p99_ms_by_kind": {k: round(percentile(v, 0.99) * 1000, 2) for k, v in kinds.items()
                           if v},
    }


def passes(step: dict[str, Any]) -> bool:
    return step["p99_ms"] <= P99_TARGET_MS and not step["errors"]


def capacity_rps(steps: list[dict[str, Any]]) -> float | None:
    """The highest rate achieved by a passing step; None when none passed."""
    return max((s["achieved_rps"] for s in steps if passes(s)), default=None)


def limited_by_steps(steps: list[dict[str, Any]]) -> bool:
    """True when the search ran out of steps before it crossed the target: going up, every
    step passed (capacity is at least capacity_rps); going down, none did (capacity is below
    the lowest rate tried). The search stops at the first step whose verdict differs from
    the target step's, so that is exactly when the last verdict is still the first's."""
    return passes(steps[-1]) == passes(steps[0])


def measured(args: argparse.Namespace, root: Path, rate: float, seconds: float,
             tag: str) -> dict[str, Any]:
    """One step against a fresh master, so no step inherits another's backlog."""
    with LocalCluster(root / tag, nodes=0, prefix="trellis-bench-load", extra_master={
            "max_connections_per_ip": 4 * (args.clients + args.nodes), "node_grace_s": 30,
            "command_timeout_s": 30}) as cluster:
        cluster.start_master()
        register_services(cluster, args.services)
        step = run_step(cluster.url, args, rate, seconds, tag, True, root)
        jobs = cluster.client(timeout=120).call("jobs", {"limit": 100_000})["jobs"]
        step["jobs_submitted"] = len(jobs)
        step["jobs_finished"] = sum(1 for j in jobs if j["state"] == "finished")
        step["master_alive"] = cluster.master is not None and cluster.master.running
    return step


def search(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """The target step, then steps up by 1.5x while they pass (down while they fail)."""
    first = measured(args, root, args.rate, args.seconds, "target")
    first["phase"] = "target"
    steps = [first]
    print(f"target: {json.dumps(first)}", file=sys.stderr)
    rate = args.rate
    going_up = passes(first)
    for i in range(args.max_steps):
        if passes(steps[-1]) != going_up:
            break
        rate = rate * 1.5 if going_up else rate / 1.5
        step = measured(args, root, rate, args.step_seconds, f"step{i + 1}")
        step["phase"] = f"step{i + 1}"
        steps.append(step)
        print(f"step {i + 1}: {json.dumps(step)}", file=sys.stderr)
    return steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--rate", type=float, default=1.0, help="requests/s per client")
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--events", type=float, default=10.0, help="events/s per node")
    p.add_argument("--job-s", type=float, default=1.0, help="how long emulated jobs run")
    p.add_argument("--procs", type=int, default=2, help="client generator processes")
    p.add_argument("--step-seconds", type=float, default=12.0)
    p.add_argument("--services", type=int, default=4, help="inference services for place")
    p.add_argument("--max-steps", type=int, default=6)
    p.add_argument("--worker", choices=("clients", "nodes"), help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--tag", default="s", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker_main(args)

    # One descriptor per connection on both sides of loopback, plus the master's own.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * (args.clients + args.nodes) + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    with exit_on_signals(), scratch_dir("trellis-bench-load-") as root:
        steps = search(args, root)
    first = steps[0]
    result = {
        "requests": first["requests"],
        "errors": first["errors"],
        "p99_ms": first["p99_ms"],
        "p50_ms": first["p50_ms"],
        "events_per_s": first.get("events_per_s"),
        "offered_rps": first["offered_rps"],
        "achieved_rps": first["achieved_rps"],
        "capacity_rps": capacity_rps(steps),
        "capacity_limited_by_steps": limited_by_steps(steps),
        "jobs_submitted": first["jobs_submitted"],
        "jobs_finished": first["jobs_finished"],
        "master_alive": all(s["master_alive"] for s in steps),
        "cpus": os.cpu_count(),
        "rpc_mix": "submit, jobs (list, 20 running), place",
        "steps": steps,
    }
    print(json.dumps(result))
    return 0 if first["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
