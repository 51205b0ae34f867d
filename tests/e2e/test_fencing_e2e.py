"""Fencing to the node with real daemons: a returning node's stale part is stopped and
reported, commands from an older master epoch are refused (and the epoch outlives a noded
restart), and a node restarted with fewer GPUs has the job on the missing ones stopped.

Node loss and its requeue are another feature's (masterd's node-loss handling); here the
requeue it journals is written into the stopped master's journal with the store's own code,
which is also what a master restarted in the middle of a requeue finds.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

from demo.cluster import LocalCluster, default_job_user, free_port
from demo.hacluster import HaCluster
from masterd.journal.store import Store
from shared.model import GpuInfo, JobState, NodeInventory
from shared.protocol import decode_frame, encode_frame
from shared.schema import encode
from tests.e2e.cli import ctl
from tests.unit.helpers import wait_for as _wait_for

USER = default_job_user()


# Each probe is an RPC or a process scan: five a second, not a hundred.
wait_for = functools.partial(_wait_for, interval=0.2)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is no running part
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def marker_job(starts: Path, job_id: str, gpus: int, script: str = "exec sleep 300"
               ) -> dict[str, Any]:
    return {"id": job_id, "job": {
        "name": job_id, "user": USER, "gpus": gpus, "cpus": 0,
        "command": ["sh", "-c", f'echo "$$" >> {starts}/$TRELLIS_JOB_ID; {script}']}}


def pids(starts: Path, job_id: str) -> list[int]:
    path = starts / job_id
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def requeue_in_journal(db: Path, job_id: str, why: str) -> None:
    """What the node-loss requeue journals, written with the store's own code into the
    journal of a stopped master: the job queued again as its next incarnation."""
    store = Store(db)
    try:
        job = store.load_job(job_id)
        assert job is not None and job.state is JobState.RUNNING
        job.state, job.restarts, job.reason = JobState.QUEUED, job.restarts + 1, why
        job.placement, job.node_states, job.start_time = None, {}, None
        store.update_jobs([job], [(time.time(), job_id, None, "queued", {"reason": why})])
    finally:
        store.close()


def test_a_returning_node_has_its_stale_part_stopped_and_reported(make_cluster,
                                                                  shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, gpus_per_node=1, node_grace_s=30)
    n1, n2 = cluster.node_name(1), cluster.node_name(2)
    client = cluster.client(timeout=30)
    starts = shared_dir / "starts"
    starts.mkdir()
    os.chmod(starts, 0o777)
    client.call("drain", {"node": n2})
    client.call("submit", marker_job(starts, "train", 1))
    wait_for(lambda: client.call("job", {"id": "train"})["job"]["state"] == "running", 30,
             "train to run")
    assert client.call("job", {"id": "train"})["job"]["nodes"] == [n1]
    old_pid = wait_for(lambda: pids(starts, "train"), 10, "the start marker")[0]
    client.call("undrain", {"node": n2})

    # n1 falls silent (its noded frozen; its job goes on under its shim), and the master
    # restarts having requeued the job as its next incarnation.
    node1 = cluster.node_daemons[n1]
    assert node1.proc is not None
    os.kill(node1.proc.pid, signal.SIGSTOP)
    try:
        cluster.master.stop(signal.SIGTERM)  # type: ignore[union-attr]
        requeue_in_journal(cluster.root / "master" / "master.db", "train",
                           f"node {n1} lost (written by the test)")
        cluster.master.start(cluster._env())  # type: ignore[union-attr]
        cluster.wait_master()
        client = cluster.client(timeout=30)
        wait_for(lambda: client.call("job", {"id": "train"})["job"]["state"] == "running", 30,
                 "train's incarnation 1 to run")
        assert client.call("job", {"id": "train"})["job"]["nodes"] == [n2]
        prepared = json.loads((cluster.root / n2 / "jobs" / "train" / "prepare.json")
                              .read_text())["prepare"]
        assert prepared["restarts"] == 1 and prepared["epoch"] == 2
        assert alive(old_pid)  # incarnation 0 still runs on the silent node
    finally:
        os.kill(node1.proc.pid, signal.SIGCONT)

    # n1 comes back: its hello reports incarnation 0, which the master stops and journals.
    wait_for(lambda: not alive(old_pid), 30, "the stale part on n1 to be stopped")
    wait_for(lambda: not (cluster.root / n1 / "jobs" / "train").exists(), 20,
             "n1 to forget the stale part once its exit was journalled")
    def fence_events() -> dict[tuple[str, str], dict[str, Any]] | None:
        rows = client.call("events", {"job": "train", "limit": 1000})["events"]
        found = {(e["node"], e["kind"]): e["detail"] for e in rows
                 if e["kind"] in ("stale_part", "stale_part_exited")}
        return found if len(found) == 2 else None

    kinds = wait_for(fence_events, 20, "the stale part's events")
    assert kinds[(n1, "stale_part")]["restarts"] == 0
    assert "was requeued and is incarnation 1 now" in kinds[(n1, "stale_part")]["reason"]
    assert kinds[(n1, "stale_part_exited")]["signal"] == signal.SIGTERM
    # Incarnation 1 was never touched: still running on n2, started once there.
    job = client.call("job", {"id": "train"})["job"]
    assert job["state"] == "running" and job["nodes"] == [n2]
    current = [p for p in pids(starts, "train") if p != old_pid]
    assert len(current) == 1 and alive(current[0])
    assert sum(alive(p) for p in pids(starts, "train")) == 1  # never two from now on
    # trellisctl events shows both, one line each.
    code, out, err = ctl(cluster, "events", "--job", "train", json_out=False)
    assert code == 0, err
    lines = [line for line in out.splitlines() if "stale_part" in line]
    assert len(lines) == 2 and all(n1 in line for line in lines), out
    client.call("cancel", {"id": "train"})


def test_a_node_reporting_parts_the_master_never_placed_there_has_them_stopped(
        make_cluster, shared_dir: Path) -> None:
    """A node (the test, on a raw node session) reports the running job of another node and
    a job nobody submitted: both are stopped on it, journalled, and the real job goes on."""
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=1)
    client = cluster.client(timeout=30)
    starts = shared_dir / "starts"
    starts.mkdir()
    os.chmod(starts, 0o777)
    client.call("submit", marker_job(starts, "victim", 1))
    wait_for(lambda: client.call("job", {"id": "victim"})["job"]["state"] == "running", 30,
             "victim to run")
    pid = wait_for(lambda: pids(starts, "victim"), 10, "the start marker")[0]
    rogue = f"{cluster.prefix}-n9"
    inventory = encode(NodeInventory(
        name=rogue, hostname="rogue", address="127.0.0.1", memory_mib=1024,
        gpus=(GpuInfo(index=0, uuid=f"GPU-{rogue}", model="A100-SXM4-40GB",
                      memory_mib=40960),)))

    async def session() -> dict[str, dict[str, Any]]:
        stops: dict[str, dict[str, Any]] = {}
        async with aiohttp.ClientSession() as http, http.ws_connect(
                cluster.url + "/v1/node") as ws:
            await ws.send_bytes(encode_frame("hello", 1, {"inventory": inventory, "jobs": [
                {"job_id": "victim", "state": "running", "pid": 4242, "restarts": 0},
                {"job_id": "ghost", "state": "running", "pid": 4343, "restarts": 3}]}))
            while len(stops) < 2:
                msg = await ws.receive(timeout=20)
                assert msg.type == WSMsgType.BINARY, msg
                frame = decode_frame(msg.data)
                if frame.type == "stop_job":
                    stops[frame.body["job_id"]] = frame.body
                    await ws.send_bytes(encode_frame("ack", frame.id, {}))
        return stops

    stops = asyncio.run(session())
    assert (stops["victim"]["restarts"], stops["victim"]["epoch"]) == (0, 1)
    assert stops["victim"]["reason"] == (f"part victim#0 runs on node {rogue}, where the master "
                                         "never placed it")
    assert stops["ghost"]["restarts"] == 3
    assert "belongs to no job the master knows" in stops["ghost"]["reason"]
    strays = {e["job"]: e for e in client.call("events", {"limit": 1000})["events"]
              if e["kind"] == "stray_part"}
    assert set(strays) == {"victim", "ghost"} and strays["victim"]["node"] == rogue
    assert client.call("job", {"id": "victim"})["job"]["state"] == "running" and alive(pid)
    client.call("cancel", {"id": "victim"})


def test_a_node_that_has_seen_a_newer_epoch_refuses_the_older_master(
        make_cluster) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=1)
    node = cluster.node_name(1)
    client = cluster.client(timeout=30)
    epoch_file = cluster.root / node / "master_epoch"
    wait_for(lambda: epoch_file.exists() and json.loads(epoch_file.read_text())["epoch"] == 1,
             10, "the node to record the master's epoch")

    # As if a newer master (epoch 7) had commanded this node: this one (1) is older.
    cluster.node_daemons[node].stop()
    epoch_file.write_text(json.dumps({"epoch": 7}))
    cluster.node_daemons[node].start(cluster._env())
    expected = f"node {node} has seen master epoch 7, newer than this master's 1"
    refused = wait_for(lambda: [e for e in client.call("events", {"limit": 1000})["events"]
                                if e["kind"] == "node_refused"], 20, "the refusal")
    assert len(refused) == 1 and refused[0]["node"] == node
    assert refused[0]["detail"]["reason"].startswith(expected)
    wait_for(lambda: expected in cluster.log(node), 10, "the node to log the refusal")
    assert expected in cluster.log("master")
    status = {n["name"]: n["status"] for n in client.call("nodes")["nodes"]}
    assert status[node] != "ready"
    assert "Traceback" not in cluster.log(node) + cluster.log("master")

    # The documented way back when the master's journal really was replaced: forget the
    # epoch on the node. It then learns the master's own.
    cluster.node_daemons[node].stop()
    epoch_file.unlink()
    cluster.node_daemons[node].start(cluster._env())
    cluster.wait_nodes(1)
    wait_for(lambda: epoch_file.exists() and json.loads(epoch_file.read_text())["epoch"] == 1,
             10, "the node to record the master's epoch again")


def test_noded_refuses_commands_from_an_older_epoch_and_keeps_it_across_restarts(
        shared_dir: Path) -> None:
    """A scripted master (the test) against a real noded: nothing a product master does can
    send an older epoch to a node that saw a newer one, which is what the node guards."""
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(shared_dir / prefix, nodes=1, gpus_per_node=1, prefix=prefix,
                           port=free_port())
    cluster.root.mkdir(parents=True)
    node = cluster.node_name(1)

    async def scenario() -> None:
        frames: asyncio.Queue[tuple[web.WebSocketResponse, Any]] = asyncio.Queue()

        async def handler(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    await frames.put((ws, decode_frame(msg.data)))
            return ws

        async def next_frame(kind: str | None = None, id_: int | None = None
                             ) -> tuple[web.WebSocketResponse, Any]:
            while True:
                ws, frame = await asyncio.wait_for(frames.get(), 30)
                if (kind is None or frame.type == kind) and (id_ is None or frame.id == id_):
                    return ws, frame

        app = web.Application()
        app.router.add_get("/v1/node", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", cluster.port).start()
        try:
            cluster.start_node(1)
            ws, hello = await next_frame("hello")
            assert hello.body["epoch"] == 0 and hello.body["inventory"]["name"] == node
            await ws.send_bytes(encode_frame("ack", hello.id, {"epoch": 5}))
            for id_, command, body in (
                    (2, "stop_job", {"job_id": "j", "epoch": 4}),
                    (4, "signal_job", {"job_id": "j", "signal": "SIGUSR1", "epoch": 3}),
                    (6, "read_log", {"job_id": "j", "epoch": 0})):
                await ws.send_bytes(encode_frame(command, id_, body))
                _, reply = await next_frame(id_=id_)
                assert reply.type == "error" and reply.body == {
                    "code": "stale_epoch",
                    "message": f"{command} from master epoch {body['epoch']} refused: this "
                               "node has seen epoch 5, so a newer master leads"}
            await ws.send_bytes(encode_frame("stop_job", 8, {"job_id": "j", "epoch": 5}))
            _, reply = await next_frame(id_=8)
            assert reply.type == "ack"
            # A restarted noded still knows epoch 5 and says so in its hello; a master at an
            # older epoch refuses it, and the node goes on looking.
            daemon = cluster.node_daemons[node]
            await asyncio.get_running_loop().run_in_executor(None, daemon.stop)
            daemon.start(cluster._env())
            ws, hello = await next_frame("hello")
            assert hello.body["epoch"] == 5
            await ws.send_bytes(encode_frame("error", hello.id, {
                "code": "stale_epoch", "message": "this master leads at epoch 4"}))
            _, again = await next_frame("hello")  # it redials rather than obeying
            assert again.body["epoch"] == 5
        finally:
            await runner.cleanup()

    try:
        asyncio.run(scenario())
        assert json.loads((cluster.root / node / "master_epoch").read_text())["epoch"] == 5
        assert "this master leads at epoch 4" in cluster.log(node)
        assert "Traceback" not in cluster.log(node)
    finally:
        cluster.close()


def test_a_node_restarted_with_fewer_gpus_has_the_job_on_the_missing_ones_stopped(
        make_cluster, shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=4, node_grace_s=30)
    node = cluster.node_name(1)
    client = cluster.client(timeout=30)
    starts = shared_dir / "starts"
    starts.mkdir()
    os.chmod(starts, 0o777)
    for job_id, gpus in (("keeps", 1), ("wide", 3)):
        client.call("submit", marker_job(starts, job_id, gpus))
        wait_for(lambda j=job_id: client.call("job", {"id": j})["job"]["state"] == "running",
                 30, f"{job_id} to run")
    gpus_of = {j: client.call("job", {"id": j})["job"]["placement"][0]["gpus"]
               for j in ("keeps", "wide")}
    hit = {j for j, gpus in gpus_of.items() if max(gpus) >= 2}
    assert "wide" in hit and len(hit) == 1, gpus_of  # 4 GPUs, 1 + 3: the 3 reach GPU 2
    spared = ({"keeps", "wide"} - hit).pop()
    before = {j: wait_for(lambda j=j: pids(starts, j), 10, "start markers")[0]
              for j in ("keeps", "wide")}

    # noded stops (its jobs go on under their shims) and comes back with two GPUs.
    cluster.node_daemons[node].stop()
    cluster.gpus_per_node = 2
    cluster.start_node(1)
    cluster.wait_nodes(1)

    # Its part can no longer run: the same rules as a lost node's job requeue it (it waits
    # now: three GPUs fit nowhere).
    wait_for(lambda: client.call("job", {"id": "wide"})["job"]["restarts"] == 1, 30,
             "the job on the missing GPUs to be requeued")
    wide = client.call("job", {"id": "wide"})
    assert wide["job"]["state"] == "queued"
    missing = ", ".join(str(g) for g in gpus_of["wide"] if g >= 2)
    assert wide["job"]["reason"].startswith(
        f"GPUs {missing} of node {node} no longer exist (the node returned with 2 GPUs and "
        f"{client.call('nodes')['nodes'][0]['cpus']} cores); requeued (restart 1 of at most")
    assert "resources_gone" in [e["kind"] for e in wide["events"]]
    wait_for(lambda: not alive(before["wide"]), 10, "its process to be gone")
    # The other job goes on, untouched, and the node is what it now says it is.
    assert client.call("job", {"id": spared})["job"]["state"] == "running"
    assert alive(before[spared]) and pids(starts, spared) == [before[spared]]
    view = client.call("nodes")["nodes"][0]
    assert view["gpus"] == 2 and view["gpus_free"] == 1
    client.call("cancel", {"id": spared})
    wait_for(lambda: client.call("job", {"id": spared})["job"]["state"] == "cancelled", 30,
             "the cancel")
    assert client.call("nodes")["nodes"][0]["gpus_free"] == 2  # GPUs 2, 3 never come back


def test_after_a_failover_the_node_obeys_only_the_new_leaders_epoch(
        shared_dir: Path, pg_url: str) -> None:
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    starts = shared_dir / "starts"
    starts.mkdir()
    os.chmod(starts, 0o777)
    with HaCluster(shared_dir / prefix, prefix=prefix, nodes=1, gpus_per_node=1,
                   store=pg_url, masters=2) as cluster:
        cluster.start()
        node = cluster.node_name(1)
        client = cluster.client(timeout=30)
        epoch_file = cluster.root / node / "master_epoch"
        client.call("submit", marker_job(starts, "keeps", 1))
        wait_for(lambda: client.call("job", {"id": "keeps"})["job"]["state"] == "running", 30,
                 "keeps to run")
        pid = wait_for(lambda: pids(starts, "keeps"), 10, "the start marker")[0]
        first = json.loads(epoch_file.read_text())["epoch"]

        leader = cluster.wait_leader()
        cluster.kill_master(leader)
        cluster.wait_leader(timeout=20, not_index=leader)
        # The node follows the new leader and records its epoch; its job is recognised.
        wait_for(lambda: json.loads(epoch_file.read_text())["epoch"] == first + 1, 30,
                 "the node to record the new leader's epoch")
        cluster.wait_nodes(1)
        assert client.call("job", {"id": "keeps"})["job"]["state"] == "running"
        assert pids(starts, "keeps") == [pid] and alive(pid)
        # Nothing was taken for a stale or stray part on the way.
        assert not [e for e in client.call("events", {"limit": 1000})["events"]
                    if e["kind"] in ("stale_part", "stray_part", "node_refused")]
        client.call("cancel", {"id": "keeps"})
        wait_for(lambda: not alive(pid), 30, "the cancel to stop it")
