"""A leader cut off from its PostgreSQL journal writes nothing once it has lost the lock.

The leader runs in a network namespace and reaches the database over a veth pair; a client
in the same namespace submits to it without pause. The test takes the link down: the
leader stops scheduling when its lease cannot be renewed, the standby (outside the namespace)
ends the silent leader's session once the lease has expired and takes over, and the link
comes back. Then no row the cut-off leader wrote was committed after the takeover
(PostgreSQL's commit timestamps), every submission it acknowledged is in the journal, and it
has exited to start again as a standby.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from control.client import MasterClient, RpcError, Unreachable
from demo.cluster import TREE, free_port
from demo.pgserver import PgServer, PgUnavailable
from masterd.journal.pgstore import PgStore
from tests.conftest import needs_root
from tests.pgfixtures import Leadership
from tests.unit.helpers import inventory

pytestmark = needs_root

CLIENT = textwrap.dedent("""
    import sys, time
    from control.client import MasterClient
    url, out, stop = sys.argv[1], sys.argv[2], sys.argv[3]
    client = MasterClient(url, timeout=5)
    spec = {"name": "z", "command": ["true"], "user": "nobody", "gpus": 1}
    n = 0
    with open(out, "a") as f:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                open(stop).close()
                break
            except OSError:
                pass
            n += 1
            try:
                client.call("submit", {"job": spec, "id": f"zombie-{n}"})
                f.write(f"zombie-{n}\\n")
                f.flush()
            except Exception as exc:
                print(f"zombie-{n}: {exc}", file=sys.stderr, flush=True)
                time.sleep(0.05)
""")


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


@pytest.fixture
def veth() -> Iterator[tuple[str, str, str, str]]:
    """(namespace, host interface, host address, namespace address)."""
    tag = uuid.uuid4().hex[:8]
    a, b = random.randint(100, 199), random.randrange(0, 64) * 4
    ns, host_if, ns_if = f"trellis-test-{tag}", f"th{tag}h", f"th{tag}n"
    host_ip, ns_ip = f"169.254.{a}.{b + 1}", f"169.254.{a}.{b + 2}"
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, host_if, host_ip, ns_ip
    finally:
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", host_if, check=False)


def _config(root: Path, name: str, port: int, store: str) -> Path:
    path = root / f"{name}.toml"
    path.write_text(
        f'[master]\nlisten_port = {port}\nstate_dir = "{root / name}"\nstore = "{store}"\n'
        "lease_s = 4.0\nrenew_deadline_s = 3.0\nretry_s = 0.5\nallow_root_jobs = false\n")
    return path


def _leads(port: int) -> bool:
    try:
        MasterClient(f"http://127.0.0.1:{port}", timeout=1).call("ping")
        return True
    except (RpcError, Unreachable):
        return False


def _wait(what: str, check, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_cut_off_leader_writes_nothing_after_losing_the_lock(
        veth: tuple[str, str, str, str], tmp_path: Path) -> None:
    ns, host_if, host_ip, _ = veth
    try:
        server = PgServer(listen=("127.0.0.1", host_ip))
        server.start()
    except PgUnavailable as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")
    procs: list[subprocess.Popen[bytes]] = []
    root = tmp_path
    env = {**os.environ, "PYTHONPATH": str(TREE)}
    try:
        db = server.create_database()
        name = psycopg.conninfo.conninfo_to_dict(db)["dbname"]
        # A node the journal knows (not connected), so submissions are satisfiable.
        seeding = Leadership(db)
        PgStore(db, seeding.epoch).save_node(inventory("trellis-test-n1"), False, 0.0)
        seeding.close()
        port_a, port_b = free_port(), free_port()
        cut_off = _config(root, "a", port_a, server.url(name, host=host_ip))
        standby = _config(root, "b", port_b, db)

        def start(argv: list[str], log: str) -> subprocess.Popen[bytes]:
            out = open(root / log, "wb")  # noqa: SIM115  (the child keeps it)
            proc = subprocess.Popen(argv, cwd=TREE, env=env, stdout=out, stderr=out,
                                    stdin=subprocess.DEVNULL)
            procs.append(proc)
            return proc

        in_ns = ["ip", "netns", "exec", ns, sys.executable]
        leader = start([*in_ns, "-m", "masterd.main", "-c", str(cut_off)], "a.log")
        with psycopg.connect(db, autocommit=True) as conn:
            _wait("the namespaced master to lead", lambda: conn.execute(
                "SELECT url FROM trellis_lease").fetchone()[0] == f"http://127.0.0.1:{port_a}",
                  30)
        start([sys.executable, "-m", "masterd.main", "-c", str(standby)], "b.log")
        (root / "client.py").write_text(CLIENT)
        acked_file, stop_file = root / "acked", root / "stop"
        start([*in_ns, str(root / "client.py"), f"http://127.0.0.1:{port_a}", str(acked_file),
               str(stop_file)], "client.log")
        # As long as the client itself keeps submitting (its 120 s): 60 s ran out beside
        # a CPU hog and a chaos soak, with the client still starting up.
        _wait("submissions to be acknowledged", lambda: acked_file.exists() and
              len(acked_file.read_text().split()) >= 50, 120)

        sh("ip", "link", "set", host_if, "down")
        _wait("the standby to lead", lambda: _leads(port_b), 30)
        time.sleep(1.0)
        sh("ip", "link", "set", host_if, "up")
        # The cut-off leader gave up (renew deadline) and exits to start again as standby.
        assert leader.wait(30) == 75, (root / "a.log").read_text()[-3000:]
        stop_file.touch()
        time.sleep(1.0)

        acked = set(acked_file.read_text().split())
        with psycopg.connect(db, autocommit=True) as conn:
            epoch, taken_at = conn.execute(
                "SELECT epoch, taken_at FROM trellis_lease").fetchone()
            late = conn.execute(
                "SELECT count(*) FROM jobs WHERE id LIKE 'zombie-%%' AND "
                "pg_xact_commit_timestamp(xmin) >= %s", (taken_at,)).fetchone()[0]
            late_events = conn.execute(
                "SELECT count(*) FROM events WHERE job_id LIKE 'zombie-%%' AND "
                "pg_xact_commit_timestamp(xmin) >= %s", (taken_at,)).fetchone()[0]
            stored = {r[0] for r in conn.execute(
                "SELECT id FROM jobs WHERE id LIKE 'zombie-%%'")}
        assert epoch == 3  # the seeding, the cut-off leader, the standby
        assert late == 0 and late_events == 0, "the cut-off leader wrote after the takeover"
        assert acked <= stored, f"acknowledged but not stored: {sorted(acked - stored)[:5]}"
        assert "leadership lost" in (root / "a.log").read_text()
        assert "leadership taken epoch=3" in (root / "b.log").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.stop()
