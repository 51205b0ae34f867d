"""Submit-RPC throughput and latency against a bare aiohttp msgpack echo, same run, loopback.

    python bench/rpc.py [--seconds 5] [--concurrency 32] [--store sqlite|postgresql]

``--store postgresql`` keeps the master's journal in a private PostgreSQL server this bench
starts (demo/pgserver.py; fsync and synchronous_commit on, as in production), the master
electing itself leader of it (docs/high-availability.md); the default is the SQLite file.

Starts a real trellis-masterd (journal on disk, synchronous=FULL) with one real node daemon
that is drained, so submissions are journalled and queued but nothing is launched; and, as the
baseline, a bare aiohttp server (uvloop) that decodes the same msgpack body and echoes it. Both
are separate processes; the load generator (this process) drives each with the same closed-loop
clients. Last line: JSON with submit_rps, echo_rps, ratio, p50_ms, p99_ms (of submit).

It also says where each phase's CPU went (``cpu_us_per_request``: user+system time of the
client, which is this process, and of the servers: the echo, or the master and its journal
writer), how much of the machine sat idle (``idle_pct``, of all cores) and how much the
hypervisor gave to other guests (``steal_pct``), summed over the phase's slices: the ratio
alone cannot tell a slower master from a pipeline that waits, or from a noisy neighbour.
``jobs_per_transaction`` is the group commit's batch: a transaction's fixed cost (its fsync,
the writer's wake-up) is shared by that many submissions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.cluster import LocalCluster, default_job_user, free_port  # noqa: E402
from demo.harness import exit_on_signals, run, scratch_dir  # noqa: E402
from shared.protocol import encode_rpc_request, unpack  # noqa: E402

MSGPACK = {"Content-Type": "application/msgpack"}
ECHO_SERVER = textwrap.dedent("""
    import asyncio, sys, msgpack, uvloop
    from aiohttp import web
    async def rpc(request):
        body = msgpack.unpackb(await request.read(), raw=False)
        return web.Response(body=msgpack.packb({"v": 1, "id": body.get("id"), "result": body}),
                            content_type="application/msgpack")
    app = web.Application()
    app.router.add_post("/v1/rpc", rpc)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
""")


async def drive(url: str, bodies: list[bytes], seconds: float, concurrency: int,
                check: bool) -> tuple[int, list[float], int]:
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    counter = iter(range(10**9))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                body = bodies[next(counter) % len(bodies)]
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers=MSGPACK) as r:
                    data = await r.read()
                latencies.append(time.perf_counter() - t0)
                if check and (r.status != 200 or "result" not in unpack(data)):
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), latencies, errors


def submit_bodies(n: int, user: str) -> list[bytes]:
    return [
        encode_rpc_request("submit", {"job": {
            "name": f"bench-{i}", "command": ["python3", "train.py", "--epochs", "3"],
            "user": user, "gpus": 1 + i % 4, "cpus": 2, "tenant": "bench", "qos": "normal",
        }}, i)
        for i in range(n)
    ]


class CpuMeter:
    """CPU seconds of named processes and the machine's idle, stolen and total CPU ticks,
    summed per phase over its slices."""

    _MACHINE = ("idle", "steal", "total")

    def __init__(self, procs: dict[str, psutil.Process]) -> None:
        self.procs = procs
        self.sums: dict[str, dict[str, float]] = {}  # phase -> counter -> seconds

    def _read(self, procs: tuple[str, ...]) -> dict[str, float]:
        counters = {}
        for name in procs:
            times = self.procs[name].cpu_times()
            counters[name] = times.user + times.system
        machine = psutil.cpu_times()
        counters["idle"] = machine.idle
        # Steal: time the hypervisor gave this VM's cores to someone else (a noisy neighbour).
        counters["steal"] = getattr(machine, "steal", 0.0)
        # Idle and steal against all ticks, on the kernel's one clock; Linux counts a guest's
        # time in user and nice as well, so it is taken out once here.
        counters["total"] = (sum(machine) - getattr(machine, "guest", 0.0)
                             - getattr(machine, "guest_nice", 0.0))
        return counters

    @contextlib.contextmanager
    def phase(self, name: str, *procs: str) -> Iterator[None]:
        before = self._read(procs)
        yield
        after = self._read(procs)
        sums = self.sums.setdefault(name, {})
        for counter, value in after.items():
            sums[counter] = sums.get(counter, 0.0) + value - before[counter]

    def report(self, requests: dict[str, int]
               ) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
        """CPU us per request by phase and process (None for a phase without requests);
        the idle and stolen shares of the machine by phase, in percent."""
        per_request: dict[str, Any] = {}
        idle: dict[str, float] = {}
        steal: dict[str, float] = {}
        for phase, sums in self.sums.items():
            count = requests[phase]
            per_request[phase] = {
                proc: round(sec / count * 1e6, 1) if count else None
                for proc, sec in sums.items() if proc not in self._MACHINE}
            total = sums["total"] or 1.0
            idle[phase] = round(100 * sums["idle"] / total, 1)
            steal[phase] = round(100 * sums["steal"] / total, 1)
        return per_request, idle, steal


def journal_transactions(base_url: str) -> float:
    """The master's count of committed journal transactions (its /metrics)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "trellis_journal_transactions_total":
                return float(sample.value)
    raise RuntimeError("the master's /metrics has no trellis_journal_transactions_total")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Echo:
    """The baseline server: ECHO_SERVER in its own process."""

    url: str
    proc: subprocess.Popen[bytes]

    def wait(self, timeout_s: float = 10.0) -> None:
        """Return once it answers a request (it starts alongside the master)."""
        body = encode_rpc_request("ping", {}, 0)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                request = urllib.request.Request(self.url, data=body, headers=MSGPACK)
                urllib.request.urlopen(request, timeout=30).read()
                return
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the echo server did not start at {self.url}") from None
                time.sleep(0.05)


@contextlib.contextmanager
def echo_server(wrapper: Sequence[str] = (), **popen: Any) -> Iterator[Echo]:
    """Start the echo (under ``wrapper``, e.g. valgrind); it is stopped on the way out."""
    port = free_port()
    proc = subprocess.Popen([*wrapper, sys.executable, "-c", ECHO_SERVER, str(port)], **popen)
    try:
        yield Echo(f"http://127.0.0.1:{port}/v1/rpc", proc)
    finally:
        proc.terminate()
        proc.wait()


@dataclass
class Measured:
    echo_n: int
    sub_n: int
    errors: int
    latencies: list[float]
    transactions: float  # journal transactions committed during the submit slices
    cpu: dict[str, Any]
    idle: dict[str, float]
    steal: dict[str, float]


def measure(cluster: LocalCluster, echo: Echo, args: argparse.Namespace) -> Measured:
    """Alternating slices of the echo and of submit; the figures and the CPU meter."""
    cluster.client().call("drain", {"node": cluster.node_name(1)})
    assert cluster.master is not None and cluster.master.proc is not None
    master = psutil.Process(cluster.master.proc.pid)
    writers = [child for child in master.children()
               if "masterd.journal.writer" in " ".join(child.cmdline())]
    procs = {"client": psutil.Process(), "echo": psutil.Process(echo.proc.pid),
             "master": master}
    if writers:
        procs["writer"] = writers[0]
    meter = CpuMeter(procs)
    bodies = submit_bodies(2000, default_job_user())
    echo.wait()
    # Warm both, then measure each in turn.
    run(drive(echo.url, bodies, 0.5, args.concurrency, False))
    # Alternate short slices of each so a neighbour's load burst hits both alike.
    echo_n = sub_n = errors = 0
    transactions = 0.0
    lat: list[float] = []
    slices = max(1, int(args.seconds))
    for _ in range(slices):
        with meter.phase("echo", "client", "echo"):
            n, _, _ = run(drive(echo.url, bodies, args.seconds / slices, args.concurrency,
                                False))
        echo_n += n
        before = journal_transactions(cluster.url)
        with meter.phase("submit", "client", *(p for p in ("master", "writer") if p in procs)):
            n, part, errs = run(drive(cluster.url + "/v1/rpc", bodies, args.seconds / slices,
                                      args.concurrency, True))
        transactions += journal_transactions(cluster.url) - before
        sub_n += n
        lat += part
        errors += errs
    cpu, idle, steal = meter.report({"echo": echo_n, "submit": sub_n})
    return Measured(echo_n, sub_n, errors, lat, transactions, cpu, idle, steal)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite",
                   help="where the master keeps its journal")
    args = p.parse_args()

    with exit_on_signals(), scratch_dir("trellis-bench-") as root, \
            contextlib.ExitStack() as stack:
        cluster: LocalCluster
        store_url = ""
        if args.store == "postgresql":
            from demo.hacluster import HaCluster
            from demo.pgserver import PgServer

            store_url = stack.enter_context(PgServer.started()).create_database()
            cluster = HaCluster(root, nodes=1, gpus_per_node=8, prefix="trellis-bench",
                                cgroup_mode="affinity", store=store_url, masters=1)
        else:
            cluster = LocalCluster(root, nodes=1, gpus_per_node=8, prefix="trellis-bench",
                                   cgroup_mode="affinity")
        with cluster, echo_server() as echo:
            cluster.start()
            m = measure(cluster, echo, args)
        # Counted in the journal itself (the jobs RPC lists 10,000 by default, at most
        # 100,000): every acknowledged submission must be there.
        count = "SELECT COUNT(*) FROM jobs WHERE state='queued'"
        if store_url:
            import psycopg

            with psycopg.connect(store_url) as conn:
                queued = conn.execute(count).fetchone()[0]
        else:
            with contextlib.closing(sqlite3.connect(root / "master" / "master.db")) as db:
                queued = db.execute(count).fetchone()[0]
    sub_n, echo_n, lat, errors = m.sub_n, m.echo_n, m.latencies, m.errors
    submit_rps = sub_n / args.seconds
    echo_rps = echo_n / args.seconds
    result = {
        "submit_rps": round(submit_rps, 1),
        "echo_rps": round(echo_rps, 1),
        "ratio": round(submit_rps / echo_rps, 3),
        "p50_ms": round(percentile(lat, 0.50) * 1000, 2),
        "p99_ms": round(percentile(lat, 0.99) * 1000, 2),
        "errors": errors,
        "jobs_journalled": queued,
        "concurrency": args.concurrency,
        "store": args.store,
        # Group commit: how many submissions shared each of the writer's transactions.
        "jobs_per_transaction": round(sub_n / m.transactions, 2) if m.transactions else None,
        "cpu_us_per_request": m.cpu,
        "idle_pct": m.idle,
        "steal_pct": m.steal,
    }
    print(f"submit: {sub_n} requests, echo: {echo_n} requests, {queued} jobs journalled",
          file=sys.stderr)
    print(json.dumps(result))
    # Requests the bench timed include only answered ones: each must be journalled.
    return 0 if errors == 0 and queued >= sub_n else 1


if __name__ == "__main__":
    sys.exit(main())
