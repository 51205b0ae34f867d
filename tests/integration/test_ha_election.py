"""Leader election and fencing on a real PostgreSQL server (masterd.journal.lease,
masterd.service.leader): the database refuses writes from an older epoch, a takeover waits
for the old leader's writes that passed the fence (and ends one that never finishes), and a
leader that stops renewing (SIGSTOP: its sessions stay open, like a host cut off) is replaced
once its lease expires, then stops itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from control.client import MasterClient, RpcError, Unreachable
from demo.cluster import TREE, free_port
from masterd.journal import lease
from masterd.journal.pgstore import PgStore, connect
from masterd.journal.store import Fenced
from tests.pgfixtures import Leadership
from tests.unit.helpers import inventory, job


def test_a_write_from_an_older_epoch_is_refused(pg_url: str) -> None:
    first = Leadership(pg_url)
    old = PgStore(pg_url, first.epoch)
    old.insert_jobs([(1, job("before"))])
    first.close()  # the old leader's lock connection dies; its writer's does not
    second = Leadership(pg_url)
    assert second.epoch == first.epoch + 1
    with pytest.raises(Fenced, match="fenced"):
        old.insert_jobs([(2, job("zombie"))])
    with pytest.raises(Fenced):  # any table: the trigger is on all of them
        old.save_node(inventory("a"), False, 1.0)
    new = PgStore(pg_url, second.epoch)
    new.insert_jobs([(2, job("after"))])
    assert [j.id for j in new.load_jobs()] == ["before", "after"]
    # A connection that names no epoch writes nothing either.
    with psycopg.connect(pg_url, autocommit=True) as raw, pytest.raises(psycopg.Error,
                                                                           match="fenced"):
        raw.execute("DELETE FROM jobs")
    second.close()


def test_takeover_waits_for_a_write_that_passed_the_fence_and_ends_a_stuck_one(
        pg_url: str) -> None:
    first = Leadership(pg_url)
    PgStore(pg_url, first.epoch).close()  # the schema
    writer = connect(pg_url, "trellis-test-writer")
    writer.execute(f"SET trellis.epoch = {first.epoch}")
    writer.execute("BEGIN")
    writer.execute("INSERT INTO meta (key, value) VALUES ('stuck', 'x')")  # passes the fence
    first.close()
    contender = connect(pg_url, "trellis-test-contender")
    assert lease.try_lock(contender)
    started = time.monotonic()
    won = lease.take_over(contender, "second", "http://second", lock_timeout_s=0.5)
    assert won.epoch == first.epoch + 1
    assert time.monotonic() - started >= 0.5  # it waited for the open transaction first
    with pytest.raises(psycopg.Error):  # that transaction was ended, not committed
        writer.execute("COMMIT")
    assert contender.execute("SELECT count(*) FROM meta WHERE key = 'stuck'").fetchone()[0] == 0
    contender.close()


def _master(root: Path, port: int, store: str, name: str) -> subprocess.Popen[bytes]:
    cfg = root / f"{name}.toml"
    cfg.write_text(
        f'[master]\nlisten_port = {port}\nstate_dir = "{root / name}"\nstore = "{store}"\n'
        "lease_s = 3.0\nrenew_deadline_s = 2.0\nretry_s = 0.5\n")
    log = open(root / f"{name}.log", "wb")  # noqa: SIM115  (the child keeps it)
    return subprocess.Popen([sys.executable, "-m", "masterd.main", "-c", str(cfg)], cwd=TREE,
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def _leads(port: int) -> bool:
    try:
        MasterClient(f"http://127.0.0.1:{port}", timeout=1).call("ping")
        return True
    except (RpcError, Unreachable):
        return False


def _wait(what: str, check, timeout: float) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_silent_leader_is_replaced_after_its_lease_and_stops(pg_url: str,
                                                                 tmp_path: Path) -> None:
    root = tmp_path / f"trellis-test-{uuid.uuid4().hex[:6]}"
    root.mkdir()
    ports = [free_port(), free_port()]
    first = _master(root, ports[0], pg_url, "m0")
    procs = [first]
    try:
        _wait("the first master to lead", lambda: _leads(ports[0]), 30)
        procs.append(_master(root, ports[1], pg_url, "m1"))

        def standby_answer() -> str:
            try:
                MasterClient(f"http://127.0.0.1:{ports[1]}", timeout=1).call("ping")
            except (RpcError, Unreachable) as exc:
                return str(exc)
            return "it leads"

        _wait("the second master to stand by, naming the leader",
              lambda: standby_answer().startswith(f"not_leader: this master is a standby; "
                                                  f"the leader is at http://127.0.0.1:{ports[0]}"),
              30)
        first.send_signal(signal.SIGSTOP)  # its sessions stay open and keep the lock
        took = _wait("the standby to lead", lambda: _leads(ports[1]), 20)
        # lease_s (3 s) after the last renewal, plus a retry and the restore.
        assert 2.0 <= took <= 3.0 + 0.5 + 5.0, took
        first.send_signal(signal.SIGCONT)
        # Woken, the old leader finds its deadline long past: it stops, to restart as standby.
        assert first.wait(20) == 75
        assert "leadership lost" in (root / "m0.log").read_text()
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT epoch FROM trellis_lease").fetchone()[0] == 2
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


def test_a_leader_whose_lock_connection_fails_stops_at_once(pg_url: str,
                                                             tmp_path: Path) -> None:
    """The lock's session ends (a database restart, an operator's pg_terminate_backend):
    the leader's next renewal fails and it stops scheduling and exits, without waiting for
    its renew deadline."""
    root = tmp_path / f"trellis-test-{uuid.uuid4().hex[:6]}"
    root.mkdir()
    port = free_port()
    proc = _master(root, port, pg_url, "m0")
    try:
        _wait("the master to lead", lambda: _leads(port), 30)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            ended = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM "
                "pg_stat_activity WHERE application_name = 'trellis-master-lock'").fetchone()[0]
        assert ended == 1
        assert proc.wait(20) == 75
        # It went on the failed renewal, not on the renew deadline.
        log = (root / "m0.log").read_text()
        assert "leadership lost" in log and "database connection failed" in log, log[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
