"""A burst of submissions to one master that something strikes part-way (a kill, a freeze, a
cut), shared by bench/failover.py's kill and silent modes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
import msgpack

from demo.cluster import default_job_user
from demo.hacluster import HaCluster
from shared.protocol import encode_rpc_request


async def burst(cluster: HaCluster, leader: int, ids: list[str], command: str, clients: int,
                strike_after: int, strike: Callable[[], None]) -> tuple[set[str], float]:
    """Submit ``ids`` to master ``leader`` from ``clients`` concurrent clients; call
    ``strike()`` after ``strike_after`` acknowledgements (or once all are in, if fewer) and
    stop submitting. Returns the acknowledged ids and the strike's monotonic time. Requests
    still in flight get a second to be answered, then are abandoned (not acknowledged)."""
    acked: set[str] = set()
    struck_at = 0.0
    pending = list(reversed(ids))
    url = cluster.master_url(leader) + "/v1/rpc"
    headers = {"Authorization": f"Bearer {cluster.tokens['admin']}"} if cluster.tokens else {}
    user = default_job_user()
    struck = asyncio.Event()

    def strike_now() -> None:
        nonlocal struck_at
        struck_at = time.monotonic()
        strike()
        struck.set()

    async def client() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20),
                                         headers=headers) as session:
            while pending and not struck.is_set():
                job_id = pending.pop()
                job = {"name": job_id, "command": ["sh", "-c", command], "user": user,
                       "gpus": 1}
                body = encode_rpc_request("submit", {"job": job, "id": job_id}, job_id)
                try:
                    async with session.post(url, data=body) as r:
                        reply = msgpack.unpackb(await r.read())
                except (TimeoutError, aiohttp.ClientError, OSError):
                    continue
                if "result" in reply:
                    acked.add(job_id)
                    if len(acked) >= strike_after and not struck.is_set():
                        strike_now()

    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    finished = asyncio.ensure_future(asyncio.wait(tasks))
    await asyncio.wait({finished, asyncio.ensure_future(struck.wait())},
                       return_when=asyncio.FIRST_COMPLETED)
    if not struck.is_set():  # all acknowledged before the threshold: strike now
        strike_now()
    await asyncio.wait(tasks, timeout=1.0)  # what the master answered before it went
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return acked, struck_at
