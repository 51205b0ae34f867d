"""A job's output end to end (``trellisctl logs``, the SDK's iterators): real master and node
daemons, real jobs under their shims, the CLI as a subprocess.

Read while the job runs, after noded was killed and restarted under it, followed with ``-f``
to the job's end, and after it ended (moved to the node's logs directory); a multi-node job's
parts by node; a real job past a small log cap keeps running and its log is removed after the
retention; bad input gets one sentence; a client may not read another user's job.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from control.aclient import AsyncMasterClient
from control.client import MasterClient, RpcError
from demo.cluster import LocalCluster, default_job_user
from shared.auth import Secret

ROOT = Path(__file__).resolve().parents[2]
USER = default_job_user()
OTHER_USER = "daemon"  # a second Unix user every test machine has
T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def ctl(cluster: LocalCluster, *args: str, token: Path | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRELLIS_")}
    if token is not None:
        env["TRELLIS_TOKEN_FILE"] = str(token)
    return subprocess.run([sys.executable, "-m", "control.cli", "--master", cluster.url, *args],
                          capture_output=True, timeout=timeout, cwd=ROOT, env=env)


def submit(client: MasterClient, job_id: str, script: str, **kw: Any) -> str:
    job = {"name": job_id, "command": ["sh", "-c", script], "user": USER, "kind": "cpu",
           "cpus": 1, **kw}
    return client.call("submit", {"id": job_id, "job": job})["job"]["id"]


def state(client: MasterClient, job_id: str) -> str:
    return client.call("job", {"id": job_id})["job"]["state"]


def output(client: MasterClient, job_id: str, **kw: Any) -> bytes:
    return b"".join(c.data for c in client.logs(job_id, **kw))


def test_output_while_running_across_a_noded_restart_followed_and_after_the_end(
        make_cluster, shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=1, node_grace_s=30)
    client = cluster.client(timeout=30)
    node = cluster.node_name(1)
    stop = shared_dir / "stop"
    script = (f"for i in $(seq 1 5); do echo line $i; done; echo oops >&2; "
              f"while [ ! -e {stop} ]; do sleep 0.1; done; echo bye")
    job = submit(client, "talker", script)
    wait_for("the first lines", lambda: output(client, job).count(b"\n") >= 6)
    assert state(client, job) == "running"
    # While it runs: the whole output (stdout and stderr), and a tail, through the CLI.
    whole = ctl(cluster, "logs", job)
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout == b"line 1\nline 2\nline 3\nline 4\nline 5\noops\n"
    tail = ctl(cluster, "logs", job, "--tail", "2")
    assert tail.returncode == 0 and tail.stdout == b"line 5\noops\n"
    assert ctl(cluster, "logs", job, "--tail", "0").stdout == b""

    # noded killed and restarted under the running job: the output is still there.
    cluster.node_daemons[node].stop(signal.SIGKILL)
    with pytest.raises(RpcError) as err:
        client.call("logs", {"id": job})
    assert err.value.code == "node_unreachable"
    assert f"on node {node}, which is not connected" in err.value.message
    cluster.node_daemons[node].start(cluster._env())
    cluster.wait_nodes(1)
    assert output(client, job, tail=1) == b"oops\n"

    # -f from the start: the output so far, then the rest, and it ends with the job.
    follow = subprocess.Popen(
        [sys.executable, "-m", "control.cli", "--master", cluster.url, "logs", "-f", job],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        time.sleep(0.5)
        assert follow.poll() is None  # still following a running job
        stop.touch()
        out, errs = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, errs
    assert out == b"line 1\nline 2\nline 3\nline 4\nline 5\noops\nbye\n"
    assert state(client, job) == "finished"

    # After the end: the node moved the log out of the job's state, and it reads the same,
    # through both SDK clients too.
    wait_for("the node to forget the job", lambda: not (cluster.root / node / "jobs" / job)
             .exists())
    assert (cluster.root / node / "logs" / f"{job}.log").exists()
    assert output(client, job) == out
    chunks = list(client.logs(job, follow=True))
    assert chunks and {c.node for c in chunks} == {node} and chunks[0].offset == 0

    async def read_async() -> bytes:
        async with AsyncMasterClient(cluster.url, timeout=30) as master:
            return b"".join([c.data async for c in master.logs(job, tail=1)])

    assert asyncio.run(read_async()) == b"bye\n"
    reply = client.call("logs", {"id": job})
    assert reply["done"] and reply["parts"][0]["done"] and reply["nodes"] == [node]


def test_a_multi_node_jobs_parts_are_read_by_node(make_cluster, shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, gpus_per_node=2)
    client = cluster.client(timeout=30)
    n1, n2 = cluster.node_name(1), cluster.node_name(2)
    job = submit(client, "wide", 'for i in 1 2 3; do echo "rank $RANK line $i"; done',
                 kind="training", gpus=4, cpus=1)
    wait_for("the job to end", lambda: state(client, job) in ("finished", "failed"))
    assert state(client, job) == "finished"
    placed = [a["node"] for a in client.call("job", {"id": job})["job"]["placement"]]
    assert sorted(placed) == [n1, n2]
    both = ctl(cluster, "logs", job)
    assert both.returncode == 0, both.stderr
    lines = both.stdout.decode().splitlines()
    assert sorted(lines) == sorted(f"[{node}] rank {rank} line {i}"
                                   for rank, node in enumerate(placed) for i in (1, 2, 3))
    # Each node's lines in their order.
    assert [x for x in lines if x.startswith(f"[{placed[1]}]")] == [
        f"[{placed[1]}] rank 1 line {i}" for i in (1, 2, 3)]
    one = ctl(cluster, "logs", job, "--node", placed[1])
    assert one.stdout == b"rank 1 line 1\nrank 1 line 2\nrank 1 line 3\n"
    chunks = list(client.logs(job, node=placed[0], tail=1))
    assert [(c.node, c.data) for c in chunks] == [(placed[0], b"rank 0 line 3\n")]
    wrong = ctl(cluster, "logs", job, "--node", "elsewhere")
    assert wrong.returncode == 1
    assert b"did not run on node elsewhere" in wrong.stderr

    # Followed while both parts run: a line one part writes while the other is silent comes
    # through at once (the master waits on both nodes for growth), and -f ends with the job.
    stop = shared_dir / "stop"
    live = submit(client, "wide-live", f'echo "rank $RANK up"; while [ ! -e {stop}-$RANK ]; '
                  f'do sleep 0.1; done; echo "rank $RANK down"', kind="training", gpus=4)
    wait_for("both parts to run", lambda: output(client, live).count(b" up") == 2)
    ranks = [a["node"] for a in client.call("job", {"id": live})["job"]["placement"]]
    follow = subprocess.Popen(
        [sys.executable, "-m", "control.cli", "--master", cluster.url, "logs", "-f", live],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    lines: queue.Queue[bytes] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in follow.stdout], daemon=True)
    reader.start()
    try:
        seen = {lines.get(timeout=30) for _ in range(2)}
        assert seen == {f"[{n}] rank {r} up\n".encode() for r, n in enumerate(ranks)}
        (shared_dir / "stop-1").touch()
        started = time.monotonic()
        assert lines.get(timeout=30) == f"[{ranks[1]}] rank 1 down\n".encode()
        assert time.monotonic() - started < 8  # not held back by the silent part's wait
        assert follow.poll() is None  # rank 0 still runs
        (shared_dir / "stop-0").touch()
        assert lines.get(timeout=30) == f"[{ranks[0]}] rank 0 down\n".encode()
        assert follow.wait(timeout=60) == 0
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()


def test_a_job_past_the_cap_runs_on_and_its_log_goes_after_the_retention(
        make_cluster, shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(
        nodes=1, gpus_per_node=1,
        node_sections={"jobs": {"log_max_mb": 0.0625, "log_retention_h": 0.003}})
    client = cluster.client(timeout=30)
    node = cluster.node_name(1)
    alive = shared_dir / "alive"
    # 200 KB of output against a 64 KiB cap, then proof the job was not stopped.
    script = (f"i=0; while [ $i -lt 2000 ]; do echo $i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
              f"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; "
              f"echo done > {alive}; exit 0")
    job = submit(client, "chatty", script)
    wait_for("the job to end", lambda: state(client, job) in ("finished", "failed"))
    assert state(client, job) == "finished" and alive.read_text() == "done\n"
    log = ctl(cluster, "logs", job)
    assert log.returncode == 0, log.stderr
    assert log.stdout.startswith(b"0-xxx")
    assert len(log.stdout) < 64 * 1024 + 300
    assert log.stdout.endswith(b"this job's output reached the node's log cap of 0.0625 MiB "
                               b"(log_max_mb); the rest is dropped, the job keeps running\n")
    # Kept ~11 s after the end, then swept: one sentence says so.
    kept = cluster.root / node / "logs" / f"{job}.log"
    wait_for("the log to be swept", lambda: not kept.exists(), timeout=60)
    gone = ctl(cluster, "logs", job)
    assert gone.returncode == 1
    assert gone.stderr.decode().strip() == (
        f"trellisctl: no_output: node {node} has no output of job {job}: the job never ran "
        "here, or its log was removed after the node's log_retention_h")


def test_bad_input_gets_one_sentence(make_cluster) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=1)
    client = cluster.client(timeout=30)
    node = cluster.node_name(1)
    missing = ctl(cluster, "logs", "no-such-job")
    assert missing.returncode == 1
    assert missing.stderr == b"trellisctl: unknown_job: job 'no-such-job' does not exist\n"
    negative = ctl(cluster, "logs", "no-such-job", "--tail", "-3")
    assert negative.returncode == 2
    assert negative.stderr == b"trellisctl: --tail must be 0 or more lines, got -3\n"
    with pytest.raises(RpcError) as err:
        client.call("logs", {"id": "x", "tail": -1})
    assert err.value.code == "invalid_params" and "params.tail" in err.value.message
    with pytest.raises(ValueError):
        client.logs("x", tail=-1)
    # A job that never ran: its node is drained, so it waits in the queue.
    client.call("drain", {"node": node})
    queued = submit(client, "waits", "echo never")
    never = ctl(cluster, "logs", queued, "-f")
    assert never.returncode == 1
    assert never.stderr == (f"trellisctl: not_started: job {queued} has not started; it has "
                            "no output yet\n").encode()
    client.call("cancel", {"id": queued})
    with pytest.raises(RpcError) as err:
        client.call("logs", {"id": queued})
    assert err.value.code == "not_started" and "without ever starting" in err.value.message
    client.call("undrain", {"node": node})
    # A job whose node is gone: one sentence naming the node.
    ran = submit(client, "ran", "echo hello; sleep 300")
    wait_for("its output", lambda: output(client, ran) == b"hello\n")
    cluster.node_daemons[node].stop()
    gone = ctl(cluster, "logs", ran)
    assert gone.returncode == 1
    assert gone.stderr.decode().startswith(
        f"trellisctl: node_unreachable: job {ran}'s output is on node {node}, which is not "
        "connected to the master (")
    assert gone.stderr.count(b"\n") == 1


def test_a_stopping_master_does_not_wait_out_its_followers(make_cluster) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=1)
    client = cluster.client(timeout=30)
    job = submit(client, "quiet", "echo hi; exec sleep 300")
    wait_for("its output", lambda: output(client, job) == b"hi\n")
    follow = subprocess.Popen(
        [sys.executable, "-m", "control.cli", "--master", cluster.url, "logs", "-f", job],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert follow.stdout is not None and follow.stdout.readline() == b"hi\n"
        # The follow now waits on the master for more (up to 10 s a call); SIGTERM ends the
        # master's wait at once instead of its drain waiting for it.
        assert cluster.master is not None
        started = time.monotonic()
        cluster.master.stop(signal.SIGTERM, timeout=30)
        assert time.monotonic() - started < 8
        _, errs = follow.communicate(timeout=60)
        assert follow.returncode == 3, errs
        assert errs.count(b"\n") == 1 and (b"shutting down" in errs or b"cannot reach" in errs)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()


def test_a_client_reads_only_its_own_users_jobs(shared_dir: Path) -> None:
    root = shared_dir / "secured"
    root.mkdir()
    cluster = LocalCluster(root, nodes=1, gpus_per_node=1,
                           prefix=f"trellis-test-{os.urandom(3).hex()}", auth=True,
                           extra_master={"clients_may_submit": True})
    try:
        cluster.start()
        admin = cluster.client(timeout=30)
        mine = MasterClient(cluster.url, timeout=30, token=Secret(cluster.tokens["client"]))
        own = submit(mine, "own", "echo my output")
        admin.call("submit", {"id": "theirs", "job": {
            "name": "theirs", "command": ["sh", "-c", "echo secret"], "user": OTHER_USER,
            "kind": "cpu", "cpus": 1}})
        wait_for("both jobs to end", lambda: all(
            state(admin, j) in ("finished", "failed") for j in (own, "theirs")))
        assert output(mine, own) == b"my output\n"
        assert output(admin, "theirs") == b"secret\n"
        with pytest.raises(RpcError) as err:
            list(mine.logs("theirs"))
        assert err.value.code == "forbidden"
        assert err.value.message == (f"job theirs belongs to user {OTHER_USER!r}; client "
                                     f"{USER!r} may read the output of its own jobs only")
        refused = ctl(cluster, "logs", "theirs", token=cluster.token_file("client"))
        assert refused.returncode == 1 and b"forbidden" in refused.stderr
        assert refused.stdout == b""
        # The same for showing it; listing leaves it out.
        with pytest.raises(RpcError) as err:
            mine.call("job", {"id": "theirs"})
        assert err.value.code == "forbidden" and "may see its own jobs only" in \
            err.value.message
        assert [j["id"] for j in mine.call("jobs")["jobs"]] == [own]
        assert {j["id"] for j in admin.call("jobs")["jobs"]} == {own, "theirs"}
        # HTTP 403 on the wire.
        import urllib.error
        import urllib.request

        from shared.protocol import encode_rpc_request
        request = urllib.request.Request(
            cluster.url + "/v1/rpc", data=encode_rpc_request("logs", {"id": "theirs"}, 1),
            headers={"Authorization": f"Bearer {cluster.tokens['client']}",
                     "Content-Type": "application/msgpack"})
        with pytest.raises(urllib.error.HTTPError) as http:
            urllib.request.urlopen(request, timeout=30)
        assert http.value.code == 403
    finally:
        cluster.close()
