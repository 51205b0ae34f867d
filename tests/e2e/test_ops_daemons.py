"""The daemons as systemd runs them: notify socket, watchdog, journald, SIGHUP, SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from control.client import MasterClient, RpcError, Unreachable
from demo.cluster import LocalCluster, default_job_user

USER = default_job_user()
JOB = {"name": "sleeper", "command": ["sleep", "300"], "user": USER, "gpus": 1, "cpus": 1}


class NotifySocket:
    """What systemd listens on: a datagram socket collecting every notification."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []

    def wait_for(self, fragment: str, timeout: float = 20.0, after: int = 0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            for _, m in self.messages[after:]:
                if fragment in m:
                    return m
            if time.monotonic() > deadline:
                raise AssertionError(f"no {fragment!r} in {[m for _, m in self.messages]}")
            with contextlib.suppress(TimeoutError):
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))

    def drain(self) -> None:
        """Collect what has arrived so far."""
        self.sock.setblocking(False)
        try:
            while True:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
        except BlockingIOError:
            pass
        finally:
            self.sock.settimeout(0.2)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    n = NotifySocket(tmp_path / "notify.sock")
    yield n
    n.close()


@pytest.fixture
def cluster_root(shared_dir: Path) -> Path:
    return shared_dir / f"trellis-test-{os.getpid()}-{time.monotonic_ns() % 10**6}"


def test_master_speaks_systemd_and_journald(cluster_root: Path, notify: NotifySocket,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = LocalCluster(cluster_root, nodes=0, prefix="trellis-test-sd")
    cluster_root.mkdir(parents=True)
    log_path = cluster_root / "master.log"
    log_path.touch()
    st = log_path.stat()
    # As systemd would run it: notify socket, watchdog, stderr connected to the journal.
    monkeypatch.setenv("NOTIFY_SOCKET", notify.path)
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    try:
        cluster.start_master()
        ready = notify.wait_for("READY=1")
        # Ready means serving: the port answers at once.
        assert cluster.client(timeout=2).call("ping")["policy"] == "fifo"
        assert "STATUS=serving on 127.0.0.1:" in ready and "queued=0" in ready
        first = notify.messages[0][1]
        assert first.startswith("STATUS=opening the journal")
        # Watchdog pings at half the interval (0.2 s): about five a second.
        notify.drain()
        mark = len(notify.messages)
        time.sleep(1.0)
        notify.drain()
        pings = [m for _, m in notify.messages[mark:] if m == "WATCHDOG=1"]
        assert 3 <= len(pings) <= 8, pings

        # SIGHUP: a run-time key changes; the reload is announced and logged.
        cfg = cluster_root / "master.toml"
        cfg.write_text(cfg.read_text().replace("stop_grace_s = 3", "stop_grace_s = 4.5"))
        mark = len(notify.messages)
        assert cluster.master and cluster.master.proc
        cluster.master.proc.send_signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1", after=mark)
        notify.wait_for("READY=1", after=mark)
        wait_log(cluster, "master", "config_reload key=stop_grace_s change=3.0→4.5")
        # A broken file is refused; the master keeps serving with what it had.
        good = cfg.read_text()
        cfg.write_text(good + "nonsense = [\n")
        cluster.master.proc.send_signal(signal.SIGHUP)
        wait_log(cluster, "master", "config_reload refused")
        assert cluster.client(timeout=2).call("ping")

        cluster.master.proc.send_signal(signal.SIGTERM)
        assert cluster.master.proc.wait(15) == 0
        stopping = notify.wait_for("STOPPING=1")
        assert "draining" in stopping
    finally:
        cluster.close()
    lines = log_path.read_text().splitlines()
    assert lines, "the master wrote nothing"
    for line in lines:
        # journald format: priority, logger, message; no timestamp, one line per event.
        assert re.fullmatch(r"<[2-7]>trellis[\w.]*: \S.*", line), line
    text = "\n".join(lines)
    assert "<3>trellis.master: config_reload refused reason=" in text
    assert "<6>trellis.master: signal=SIGTERM: shutting down" in text
    assert "<6>trellis.master: stopped; journal closed" in text


def wait_log(cluster: LocalCluster, name: str, fragment: str, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while fragment not in (text := (cluster.root / f"{name}.log").read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{fragment!r} not in the {name} log:\n{text[-3000:]}"
        time.sleep(0.1)
    return text


def wait_job(client: MasterClient, job_id: str, states: set[str], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while (job := client.call("job", {"id": job_id})["job"])["state"] not in states:
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def test_node_ready_status_and_stop_leaves_jobs_running(cluster_root: Path,
                                                        notify: NotifySocket,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = LocalCluster(cluster_root, nodes=1, gpus_per_node=2, prefix="trellis-test-sdn")
    try:
        cluster.start_master()
        monkeypatch.setenv("NOTIFY_SOCKET", notify.path)  # for the node only
        cluster.start_node(1)
        cluster.wait_nodes(1)
        name = cluster.node_name(1)
        ready = notify.wait_for("READY=1")
        assert "STATUS=connected to " in ready or "STATUS=dialling " in ready, ready
        notify.wait_for("STATUS=connected to " + cluster.url)
        client = cluster.client()
        job_id = client.call("submit", {"job": JOB})["job"]["id"]
        wait_job(client, job_id, {"running"})
        shim = json.loads((cluster_root / name / "jobs" / job_id / "shim.json").read_text())

        # SIGHUP applies a run-time key on the node too.
        cfg = cluster_root / f"{name}.toml"
        cfg.write_text(cfg.read_text().replace("sample_interval_s = 0.5",
                                               "sample_interval_s = 0.25"))
        daemon = cluster.node_daemons[name]
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGHUP)
        wait_log(cluster, name, "config_reload key=sample_interval_s change=0.5→0.25")

        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(15) == 0
        assert "1 job part(s) keep running" in notify.wait_for("STOPPING=1")
        log = wait_log(cluster, name, "jobs keep running under their shims count=1")
        assert f"job={job_id} keeps running shim_pid={shim['pid']}" in log
        assert psutil.pid_exists(shim["pid"]), "stopping noded killed the job"

        # The next noded re-adopts the job; the master never saw it stop.
        daemon.start(cluster._env())
        wait_log(cluster, name, f"job={job_id} re-adopted")
        cluster.wait_nodes(1)
        assert client.call("job", {"id": job_id})["job"]["state"] == "running"
        client.call("cancel", {"id": job_id})
        assert wait_job(client, job_id, {"cancelled"})["signal"] == signal.SIGTERM
    finally:
        cluster.close()
    # One line per event, key=value, and the node and job named on every line about them.
    for logname in (name, "master"):
        for line in (cluster_root / f"{logname}.log").read_text().splitlines():
            assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR) "
                            r"trellis[\w.]*: \S", line), line
            if logname == name:
                assert f"node={name}" in line, line
            # kernelfs names the job's group by path ("why=job X group"); it is not ours.
            if job_id in line and "trellis.kernelfs:" not in line:
                assert f"job={job_id}" in line, line


def test_sigterm_drains_without_losing_an_acknowledged_submission(
        cluster_root: Path) -> None:
    cluster = LocalCluster(cluster_root, nodes=1, gpus_per_node=2, prefix="trellis-test-drn")
    acked: list[str] = []
    refusals: list[str] = []
    stop = threading.Event()

    def submitter(k: int) -> None:
        client = cluster.client(timeout=5)
        i = 0
        while not stop.is_set():
            job_id = f"d{k}-{i}"
            i += 1
            try:
                client.call("submit", {"job": dict(JOB, command=["true"]), "id": job_id})
            except RpcError as exc:
                refusals.append(exc.code)
                return
            except Unreachable:
                refusals.append("unreachable")
                return
            acked.append(job_id)

    try:
        cluster.start()
        threads = [threading.Thread(target=submitter, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        assert cluster.master and cluster.master.proc
        cluster.master.proc.send_signal(signal.SIGTERM)
        code = cluster.master.proc.wait(20)
        stop.set()
        for t in threads:
            t.join(10)
        assert code == 0, cluster.log("master")
        assert acked, "no submission got through before the drain"
        # The only ways to be turned away: the drain's 503, or the port already closed.
        assert refusals and set(refusals) <= {"shutting_down", "unreachable"}, refusals
        log = cluster.log("master")
        assert "draining inflight_left=0" in log and "stopped; journal closed" in log
        cluster.master.start(cluster._env())
        cluster.wait_master()
        known = {j["id"] for j in cluster.client().call("jobs")["jobs"]}
        assert set(acked) <= known, sorted(set(acked) - known)
    finally:
        stop.set()
        cluster.close()
