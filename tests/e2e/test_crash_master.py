"""kill -9 the master while 1,000 submissions are in flight: nothing acknowledged is lost,
nothing is stored twice, and running jobs are recognised, not restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from pathlib import Path

import aiohttp
import msgpack

from demo.cluster import LocalCluster, default_job_user
from shared.protocol import encode_rpc_request

USER = default_job_user()
SUBMISSIONS = 1000
CLIENTS = 200
KILL_AFTER_ACKS = 250


def job_spec(name: str, command: str) -> dict:
    return {"name": name, "command": ["sh", "-c", command], "user": USER, "gpus": 1}


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


async def burst(cluster: LocalCluster, ids: list[str], marker: str) -> dict[str, str]:
    """Submit every id from CLIENTS concurrent connections; SIGKILL the master once
    KILL_AFTER_ACKS have been acknowledged. Returns id -> acked | refused:CODE | lost."""
    outcome: dict[str, str] = {}
    acked = 0
    killed = False
    queue: asyncio.Queue[str] = asyncio.Queue()
    for job_id in ids:
        queue.put_nowait(job_id)

    async def client() -> None:
        nonlocal acked, killed
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not queue.empty():
                job_id = queue.get_nowait()
                body = encode_rpc_request("submit", {"job": job_spec(job_id, marker),
                                                     "id": job_id}, job_id)
                try:
                    async with session.post(cluster.url + "/v1/rpc", data=body) as r:
                        reply = msgpack.unpackb(await r.read())
                except (TimeoutError, aiohttp.ClientError, OSError):
                    outcome[job_id] = "lost"
                    continue
                if "result" in reply:
                    assert reply["result"]["job"]["id"] == job_id
                    outcome[job_id] = "acked"
                    acked += 1
                    if acked >= KILL_AFTER_ACKS and not killed:
                        killed = True
                        assert cluster.master is not None and cluster.master.proc is not None
                        cluster.master.proc.send_signal(signal.SIGKILL)
                else:
                    outcome[job_id] = f"refused:{reply['error']['code']}"

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    assert killed, "the burst finished before the master was killed"
    return outcome


def stored_ids(cluster: LocalCluster) -> list[str]:
    db = sqlite3.connect(f"file:{cluster.root / 'master' / 'master.db'}?mode=ro", uri=True)
    try:
        return [row[0] for row in db.execute("SELECT id FROM jobs")]
    finally:
        db.close()


def test_kill_9_during_a_submission_burst(make_cluster, shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, gpus_per_node=2)
    client = cluster.client(timeout=30)
    starts = shared_dir / "starts"
    starts.mkdir()
    os.chmod(starts, 0o777)
    marker = f'echo "$$" >> {starts}/$TRELLIS_JOB_ID; exec sleep 300'
    # Four long jobs fill every GPU; the burst queues behind them.
    long_ids = [f"long-{i}" for i in range(4)]
    for job_id in long_ids:
        client.call("submit", {"job": job_spec(job_id, marker), "id": job_id})
    wait_for(lambda: all(j["state"] == "running" for j in client.call("jobs")["jobs"]), 30,
             "the long jobs to run")
    wait_for(lambda: all((starts / j).exists() for j in long_ids), 10, "start markers")
    pids = {j: (starts / j).read_text().split() for j in long_ids}

    ids = [f"burst-{i:04d}" for i in range(SUBMISSIONS)]
    outcome = asyncio.run(burst(cluster, ids, marker))
    acked = {i for i, o in outcome.items() if o == "acked"}
    assert len(outcome) == SUBMISSIONS
    assert all(o in ("acked", "lost") for o in outcome.values()), \
        {o for o in outcome.values() if o not in ("acked", "lost")}
    assert len(acked) >= KILL_AFTER_ACKS

    cluster.restart_master()
    cluster.wait_nodes(2)
    jobs = {j["id"]: j for j in client.call("jobs")["jobs"]}
    missing = acked - set(jobs)
    assert not missing, f"{len(missing)} acknowledged submissions lost, e.g. {sorted(missing)[:5]}"
    # The long jobs are recognised from the nodes' reports: still running, never restarted.
    wait_for(lambda: all(client.call("job", {"id": j})["job"]["state"] == "running"
                         for j in long_ids), 20, "the long jobs to be reconciled")
    for job_id in long_ids:
        assert (starts / job_id).read_text().split() == pids[job_id]
        os.kill(int(pids[job_id][0]), 0)  # the original process is alive

    # Clients retry what they never heard back about: stored ones are reported as duplicates.
    duplicates = 0
    for job_id in sorted(set(ids) - acked):
        try:
            client.call("submit", {"job": job_spec(job_id, marker), "id": job_id})
        except Exception as exc:
            assert getattr(exc, "code", None) == "duplicate_job", exc
            duplicates += 1
    listed = [j["id"] for j in client.call("jobs")["jobs"]]
    assert sorted(listed) == sorted(ids + long_ids)
    stored = stored_ids(cluster)
    assert len(stored) == len(set(stored)) == SUBMISSIONS + len(long_ids)
    queued = sum(1 for j in client.call("jobs", {"state": "queued"})["jobs"])
    assert queued == SUBMISSIONS
    time.sleep(1.0)
    assert sorted(p.name for p in starts.iterdir()) == sorted(long_ids)
    for job_id in long_ids:
        assert len((starts / job_id).read_text().split()) == 1
    print(f"\nacked before kill={len(acked)} lost in flight={SUBMISSIONS - len(acked)} "
          f"of which already stored={duplicates}")
