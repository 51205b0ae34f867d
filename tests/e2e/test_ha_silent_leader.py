"""A silent leader, with a node: the cluster works again within ``lease_s + 10 s``, and the old
leader, once back, starts nothing.

Two real masters on a private PostgreSQL server and one node daemon given both URLs. The
leader goes silent while a job runs:

- frozen: SIGSTOP of its process group (masterd and its journal writer). Its kernel still
  accepts connections, so only bounded dials and heartbeats get the node away from it;
- cut off (root): it runs in a network namespace of its own whose traffic is all dropped at
  the bridge (demo/netlab.py), so nobody is told, packets just stop.

A job submitted after the silence, through the failover client, runs on the node within the
bound; the job that ran before is reconciled by the new leader, not started again. The old
leader, resumed (or its link restored, after it has been started again as systemd would), is
never dialled by the node again and starts nothing: a submission that waited in its
accept queue through the freeze is refused and never runs.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from control.client import RpcError, Unreachable
from control.failover import FailoverClient
from demo.cluster import default_job_user
from demo.hacluster import HaCluster
from demo.netlab import NetLab
from demo.pgserver import PgServer, PgUnavailable
from tests.conftest import needs_root

USER = default_job_user()
ELECTION = {"lease_s": 4.0, "renew_deadline_s": 3.0, "retry_s": 0.5}
BOUND_S = ELECTION["lease_s"] + 10.0
NODE = {"master_heartbeat_s": 1.0, "master_connect_timeout_s": 1.0}


def spec(name: str, starts: Path, seconds: float) -> dict:
    command = f'echo "$$" >> {starts}/$TRELLIS_JOB_ID; exec sleep {seconds}'
    return {"name": name, "command": ["sh", "-c", command], "user": USER, "gpus": 1}


def wait(what: str, check, timeout: float, cluster: HaCluster) -> float:  # type: ignore[no-untyped-def]
    """Seconds until ``check()`` holds; fails naming ``what`` (with the logs) past ``timeout``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            logs = "\n".join(f"--- {name}\n{cluster.log(name)[-2500:]}"
                             for name in ("master0", "master1", cluster.node_name(1)))
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{logs}")
        time.sleep(0.05)
    return time.monotonic() - started


def starts_of(starts: Path, job_id: str) -> int:
    try:
        return len((starts / job_id).read_text().split())
    except FileNotFoundError:
        return 0


def node_dials(cluster: HaCluster, master: int) -> int:
    """How often the node has joined ``master`` (its log's ``connected url=`` lines)."""
    text = (cluster.root / f"{cluster.node_name(1)}.log").read_text(errors="replace")
    return text.count(f"connected url={cluster.master_url(master)}/v1/node ")


def job_state(client: FailoverClient, job_id: str) -> str:
    return client.call("job", {"id": job_id})["job"]["state"]


@pytest.fixture
def starts(shared_dir: Path) -> Path:
    path = shared_dir / "starts"
    path.mkdir()
    os.chmod(path, 0o777)
    return path


def test_a_frozen_leader_is_replaced_for_the_node_and_starts_nothing_when_resumed(
        shared_dir: Path, pg_url: str, starts: Path) -> None:
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    with HaCluster(shared_dir / prefix, prefix=prefix, nodes=1, gpus_per_node=2, store=pg_url,
                   masters=2, election=ELECTION, node_settings=NODE) as cluster:
        cluster.start()
        old = cluster.wait_leader(30)
        client = cluster.client(timeout=60, attempt_timeout=2)
        before = f"{prefix}-before"
        client.call("submit", {"job": spec("before", starts, 600), "id": before})
        wait("the first job to run", lambda: starts_of(starts, before) == 1, 30, cluster)
        dials = node_dials(cluster, old)

        # masterd and its journal writer (a process of its own) both stopped.
        stopped = cluster.freeze_master(old)
        frozen_at = time.monotonic()
        proc = cluster.master_daemons[old].proc
        assert proc is not None and proc.pid in stopped and len(stopped) >= 2, stopped
        # A client that reaches the frozen leader: its request waits in the accept queue.
        zombie = f"{prefix}-zombie"
        outcome: list[object] = []

        def submit_to_the_frozen_one() -> None:
            try:
                outcome.append(cluster.master_client(old, timeout=120).call(
                    "submit", {"job": spec("zombie", starts, 1), "id": zombie}))
            except (RpcError, Unreachable) as exc:
                outcome.append(exc)

        late = threading.Thread(target=submit_to_the_frozen_one, daemon=True)
        late.start()
        after = f"{prefix}-after"
        client.call("submit", {"job": spec("after", starts, 600), "id": after})
        wait("the job submitted after the freeze to run",
             lambda: starts_of(starts, after) == 1, BOUND_S, cluster)
        recovery = time.monotonic() - frozen_at
        assert recovery <= BOUND_S, recovery
        new = cluster.wait_leader(10, not_index=old)
        assert job_state(client, before) == "running"  # reconciled from the node's hello
        assert starts_of(starts, before) == 1  # not started again

        cluster.resume_master(old)
        assert proc.wait(30) == 75, cluster.log(f"master{old}")
        late.join(30)
        assert outcome and isinstance(outcome[0], RpcError | Unreachable), outcome
        log = cluster.log(f"master{old}")
        assert "leadership lost" in log
        # It started nothing: the node never joined it again, the zombie submission is not
        # in the journal and never ran, the others ran once.
        assert node_dials(cluster, old) == dials
        with pytest.raises(RpcError, match="unknown_job"):
            client.call("job", {"id": zombie})
        assert starts_of(starts, zombie) == 0
        assert starts_of(starts, before) == 1 and starts_of(starts, after) == 1
        assert cluster.leader() == new


@needs_root
def test_a_cut_off_leader_is_replaced_for_the_node_and_starts_nothing_when_back(
        shared_dir: Path, starts: Path) -> None:
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    with NetLab() as lab:
        here = lab.add("host", own_namespace=False)
        far = lab.add("m0")
        try:
            server = PgServer(listen=("127.0.0.1", here.address))
            server.start()
        except PgUnavailable as exc:
            pytest.skip(f"no PostgreSQL server: {exc}")
        try:
            db = server.create_database()
            name = psycopg.conninfo.conninfo_to_dict(db)["dbname"]
            with HaCluster(shared_dir / prefix, prefix=prefix, nodes=1, gpus_per_node=2,
                           store=db, masters=2, election=ELECTION, node_settings=NODE,
                           master_hosts=[far.address, here.address],
                           master_stores=[server.url(name, host=here.address), db],
                           master_wrappers={0: far.wrapper}, auth=True) as cluster:
                cluster.start()
                assert cluster.wait_leader(30) == 0  # the one in the namespace
                client = cluster.client(timeout=60, attempt_timeout=2)
                before = f"{prefix}-before"
                client.call("submit", {"job": spec("before", starts, 600), "id": before})
                wait("the first job to run", lambda: starts_of(starts, before) == 1, 30,
                     cluster)
                dials = node_dials(cluster, 0)

                lab.cut("m0", "drop")
                cut_at = time.monotonic()
                after = f"{prefix}-after"
                client.call("submit", {"job": spec("after", starts, 600), "id": after})
                wait("the job submitted after the cut to run",
                     lambda: starts_of(starts, after) == 1, BOUND_S, cluster)
                assert time.monotonic() - cut_at <= BOUND_S
                assert cluster.wait_leader(10, not_index=0) == 1
                # Cut off from the database, the old leader stops at its renew deadline and
                # exits to be started again as a standby, as systemd would.
                proc = cluster.master_daemons[0].proc
                assert proc is not None and proc.wait(30) == 75, cluster.log("master0")
                cluster.start_again(0)
                lab.restore("m0")
                cluster.wait_standby(0, 30)
                assert job_state(client, before) == "running"
                assert starts_of(starts, before) == 1 and starts_of(starts, after) == 1
                assert node_dials(cluster, 0) == dials
                assert "leadership lost" in cluster.log("master0")
        finally:
            server.stop()
