"""Interactive jobs end to end (docs/interactive.md): ``trellisctl run`` and ``run --pty``
driven through a pseudo-terminal of the test's own, ``trellisctl port-forward`` to a TCP
server the job runs, with real master and node daemons (authenticated: the client token is a
user's), real jobs under their shims and cgroups.

One cluster for the module (terminal_grace_s = 4 s, so a dropped client ends its job soon).

Every wait here is for a condition (a job's state, a line trellisctl prints, a port, a
process) with a deadline of WAIT_S: long, since on a loaded machine every step is slow, and
a condition met ends the wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import psutil
import pytest

from control.client import RpcError
from control.relayclient import RelayRefused, open_stream
from demo.cluster import LocalCluster, default_job_user
from demo.harness import scratch_dir
from demo.terminal import DEADLINE_S, Terminal
from shared.protocol import decode_frame, encode_frame
from tests.unit.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
USER = default_job_user()
GRACE_S = 4.0
WAIT_S = DEADLINE_S  # the deadline of every wait for a condition
T = TypeVar("T")


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[LocalCluster, Path]]:
    with scratch_dir("trellis-test-", mode=0o777) as root:
        prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
        cluster = LocalCluster(root / prefix, prefix=prefix, nodes=1, gpus_per_node=1,
                               auth=True, extra_master={"terminal_grace_s": GRACE_S,
                                                         "clients_may_submit": True})
        with cluster:
            cluster.start()
            shutil.copy(Path(__file__).with_name("relay_server.py"), root / "server.py")
            yield cluster, root


def ctl_env(cluster: LocalCluster, role: str = "client") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRELLIS_")}
    # Written once: token_file() rewrites the file, and a trellisctl started a moment ago
    # (slow to start on a loaded machine) may be reading it just then and find it empty.
    token = cluster.root / f"{role}.own.token"
    if not token.exists():
        token = cluster.token_file(role)
    env["TRELLIS_TOKEN_FILE"] = str(token)
    env["TERM"] = "xterm"
    return env


def ctl_argv(cluster: LocalCluster, *args: str) -> list[str]:
    return [sys.executable, "-m", "control.cli", "--master", cluster.url, *args]


def ctl(cluster: LocalCluster, *args: str, role: str = "client",
        timeout: float = WAIT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ctl_argv(cluster, *args), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=ctl_env(cluster, role),
                          stdin=subprocess.DEVNULL)


def admin(cluster: LocalCluster) -> Any:
    """The cluster's admin client, patient with a master slowed by a loaded machine."""
    return cluster.client(timeout=WAIT_S)


def job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    try:
        return admin(cluster).call("job", {"id": job_id})["job"]
    except RpcError as exc:
        if exc.code == "unknown_job":  # not submitted yet
            return {"state": "", "wait": "", "reason": ""}
        raise


def terminal(cluster: LocalCluster, *args: str) -> Terminal:
    """trellisctl on a pseudo-terminal of the test's: its controlling terminal."""
    return Terminal(ctl_argv(cluster, *args), ctl_env(cluster), ROOT)


def run_args(job_id: str, *more: str) -> tuple[str, ...]:
    return ("run", "--id", job_id, "--user", USER, "--cpus", "1", *more)


def read_until(pipe: Any, token: bytes, timeout: float = WAIT_S) -> bytes:
    """What a subprocess's stdout or stderr pipe gave, read as it comes, up to and with
    ``token`` (and whatever came along with it); fails after ``timeout`` s or at its end."""
    fd = pipe.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while token not in data:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {token!r} within {timeout:g} s; got {data[-2000:]!r}")
        more = os.read(fd, 65536)
        if not more:
            raise AssertionError(f"the output ended before {token!r}: {data[-2000:]!r}")
        data += more
    return data


# -- terminals ------------------------------------------------------------------------------------
def test_pty_shell_types_resizes_and_exits_with_its_code(env: tuple[LocalCluster, Path]
                                                         ) -> None:
    cluster, _ = env
    with terminal(cluster, *run_args("tty-shell", "--gpus", "1", "--pty", "--", "sh")) as term:
        term.expect(b"$ ")
        # Raw mode here: what the job's terminal echoes is all that shows.
        assert not termios.tcgetattr(term.master)[3] & termios.ECHO
        term.type(b"echo $((6*7)) $(id -un) gpus=$CUDA_VISIBLE_DEVICES; tty; "
                  b"cat /proc/self/cgroup; echo END$((1+1))\r")
        shown = term.expect(b"END2\r\n")
        assert b"42 " + USER.encode() + b" gpus=0" in shown
        assert b"/dev/pts/" in shown
        assert b"tty-shell" in shown.split(b"cat /proc/self/cgroup")[-1]  # its own cgroups
        # A window size change reaches the job's terminal (SIGWINCH here, TIOCSWINSZ there).
        term.resize(41, 101)
        wait_for(what="the new size on the job's terminal", predicate=lambda: (
            term.type(b"stty size\r"), b"41 101" in term.expect(b"$ "))[-1], timeout=WAIT_S)
        term.type(b"exit 7\r")
        assert term.wait() == 7
        # The terminal is as it was before trellisctl made it raw.
        assert termios.tcgetattr(term.master)[3] == term.before[3]
    view = job(cluster, "tty-shell")
    assert (view["state"], view["exit_code"]) == ("failed", 7)


def test_pty_without_a_terminal_is_refused_before_submitting(
        env: tuple[LocalCluster, Path]) -> None:
    cluster, _ = env
    before = len(admin(cluster).call("jobs")["jobs"])
    proc = ctl(cluster, *run_args("no-tty", "--pty", "--", "sh"))
    assert proc.returncode == 2, proc.stderr
    assert "--pty needs a terminal, and standard input is not one" in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert len(admin(cluster).call("jobs")["jobs"]) == before  # no job was created


def test_a_client_gone_ends_the_job_after_the_grace_unless_one_attaches(
        env: tuple[LocalCluster, Path]) -> None:
    cluster, _ = env
    with terminal(cluster, *run_args("dropped", "--pty", "--", "sh")) as dropped, \
            terminal(cluster, *run_args("stopped", "--pty", "--", "sh")) as stopped:
        dropped.expect(b"$ ")
        stopped.expect(b"$ ")
        # One client at a time on a terminal.
        busy = ctl(cluster, "attach", "dropped")
        assert busy.returncode == 2 and "attach needs a terminal" in busy.stderr
        with terminal(cluster, "attach", "dropped") as second:
            assert second.wait() == 1
            assert b"busy: job dropped's terminal is attached to another client" in second.seen
        os.killpg(dropped.proc.pid, signal.SIGKILL)  # the connection drops, no goodbye
        stopped.proc.send_signal(signal.SIGTERM)  # trellisctl is told to go
        stopped_at = time.monotonic()
        assert dropped.wait() == -signal.SIGKILL
        assert stopped.wait() == 128 + signal.SIGTERM
        # SIGTERM is a way out too: the terminal is as it was before.
        assert termios.tcgetattr(stopped.master)[3] == stopped.before[3]
        # Within the grace, a client attaches again: the session goes on.
        with terminal(cluster, "attach", "dropped") as again:
            wait_for(what="attach to go raw", timeout=WAIT_S, predicate=lambda: not
                     termios.tcgetattr(again.master)[3] & termios.ECHO)
            again.type(b"echo again$((1+1))\r")
            again.expect(b"again2")
            os.killpg(again.proc.pid, signal.SIGKILL)
            again.proc.wait(WAIT_S)
            dropped_at = time.monotonic()
    for job_id, gone in (("dropped", dropped_at), ("stopped", stopped_at)):
        view = wait_for(what=f"{job_id} cancelled", predicate=lambda job_id=job_id: (
            (v := job(cluster, job_id))["state"] != "running" and v), timeout=WAIT_S)
        assert time.monotonic() - gone >= GRACE_S - 0.5
        assert view["state"] == "cancelled"
        assert "terminal_grace_s" in view["reason"]
    # Attaching to a job that is no longer running: one sentence.
    with terminal(cluster, "attach", "dropped") as late:
        assert late.wait() == 1
        assert b"job dropped is cancelled, not running" in late.seen


# -- run without a terminal -------------------------------------------------------------------
def test_run_streams_output_shows_why_it_waits_and_exits_with_the_code(
        env: tuple[LocalCluster, Path]) -> None:
    cluster, root = env
    gate = root / "gate-run"
    client = admin(cluster)
    client.call("submit", {"id": "first", "job": {
        "name": "first", "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done"],
        "user": USER, "kind": "cpu", "cpus": 1}})
    proc = subprocess.Popen(
        ctl_argv(cluster, *run_args("second", "-d", "afterok:first", "--", "sh", "-c",
                                    "echo out; echo err >&2; exit 3")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=ctl_env(cluster),
        stdin=subprocess.DEVNULL)
    try:
        # trellisctl saw it wait (it polls: on a loaded machine, later than the master says
        # so); then the dependency may end.
        said = read_until(proc.stderr, b"job second waits (dependency)")
        gate.touch()
        out, err = proc.communicate(timeout=WAIT_S)
        err = said + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err
    assert b"out\n" in out and b"err\n" in out  # the job's stdout and stderr, in its log
    assert b"job second waits (dependency)" in err


def test_ctrl_c_cancels_the_job(env: tuple[LocalCluster, Path]) -> None:
    cluster, _ = env
    proc = subprocess.Popen(
        ctl_argv(cluster, *run_args("interrupted", "--", "sh", "-c", "echo started; sleep 600")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=ctl_env(cluster),
        stdin=subprocess.DEVNULL)
    try:
        # It runs, and its output streams: trellisctl is following the job's log.
        assert read_until(proc.stdout, b"\n") == b"started\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(WAIT_S) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: job(cluster, "interrupted")["state"] == "cancelled", WAIT_S,
             "the job cancelled")


# -- ports ----------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def forwarding(cluster: LocalCluster, job_id: str, ports: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(ctl_argv(cluster, "port-forward", job_id, ports),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env=ctl_env(cluster), stdin=subprocess.DEVNULL)
    try:
        try:  # it listens on LOCAL once it says so
            read_until(proc.stdout, b"Forwarding from 127.0.0.1:")
        except AssertionError as exc:
            proc.kill()
            raise AssertionError(f"{exc}; stderr: {proc.communicate(timeout=WAIT_S)[1]!r}"
                                 ) from None
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_server(cluster: LocalCluster, root: Path, job_id: str) -> tuple[int, Path]:
    portfile, countfile = root / f"{job_id}.port", root / f"{job_id}.count"
    admin(cluster).call("submit", {"id": job_id, "job": {
        "name": job_id, "command": ["python3", str(root / "server.py"), str(portfile),
                                    str(countfile)],
        "user": USER, "kind": "cpu", "cpus": 1}})
    port = int(wait_for(lambda: portfile.exists() and portfile.read_text(), WAIT_S,
                        f"the job's server ({job_id})"))
    return port, countfile


def connect(port: int) -> socket.socket:
    """A connection to 127.0.0.1:PORT whose sends and receives fail after WAIT_S."""
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        assert more, f"closed after {len(data)} of {n} bytes"
        data += more
    return data


def test_port_forward_relays_connections_and_refuses_bad_input_cleanly(
        env: tuple[LocalCluster, Path]) -> None:
    cluster, root = env
    remote, _ = start_server(cluster, root, "web")
    local = free_port()

    # Nobody of the job listens there: one sentence, and no local port left taken.
    proc = ctl(cluster, "port-forward", "web", f"{local}:{remote + 1 if remote < 65535 else 1}")
    assert proc.returncode == 1 and "no process of job web listens on TCP port" in proc.stderr
    assert proc.stderr.count("\n") == 1
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", local))  # free again

    # The local port is taken.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", local))
        taken.listen()
        proc = ctl(cluster, "port-forward", "web", f"{local}:{remote}")
    assert proc.returncode == 1 and f"local port {local} is taken" in proc.stderr

    # Bad ports, a job that does not run, a job that is not the caller's.
    proc = ctl(cluster, "port-forward", "web", "http")
    assert proc.returncode == 2 and "LOCAL:REMOTE" in proc.stderr
    # A job that waits for web to finish: queued while web runs.
    admin(cluster).call("submit", {"id": "later", "job": {
        "name": "later", "command": ["true"], "user": USER, "kind": "cpu", "cpus": 1,
        "after": [{"type": "afterok", "jobs": ["web"]}]}})
    proc = ctl(cluster, "port-forward", "later", f"{local}:{remote}")
    assert proc.returncode == 1 and "job later is queued, not running" in proc.stderr
    admin(cluster).call("submit", {"id": "theirs", "job": {
        "name": "theirs", "command": ["sleep", "600"], "user": "daemon", "kind": "cpu",
        "cpus": 1}})
    proc = ctl(cluster, "port-forward", "theirs", f"{local}:{remote}")
    assert proc.returncode == 1 and "forbidden" in proc.stderr, proc.stderr
    admin(cluster).call("cancel", {"id": "theirs"})

    # A port free now: the one above was let go a while ago (long ago on a loaded machine),
    # and a port let go may be taken by anyone.
    local = free_port()
    with forwarding(cluster, "web", f"{local}:{remote}") as forward:
        with connect(local) as one, connect(local) as two:
            one.sendall(b"echo\n")
            two.sendall(b"send 3000000\n")
            payload = os.urandom(200_000)
            one.sendall(payload)
            assert recv_exactly(one, len(payload)) == payload
            assert recv_exactly(two, 3_000_000) == b"x" * 3_000_000
        # The forward ends with its job.
        admin(cluster).call("cancel", {"id": "web"})
        assert forward.wait(WAIT_S) == 1
        assert b"job web is cancelled: the forward ends" in forward.stderr.read()  # type: ignore[union-attr]
    # trellisctl is gone, and so is its listening socket.
    with pytest.raises(ConnectionRefusedError):
        connect(local).close()


def server_process(countfile: Path) -> psutil.Process | None:
    """The job's server (relay_server.py), by the COUNTFILE argument it was given."""
    for proc in psutil.process_iter(["cmdline"]):
        if str(countfile) in (proc.info["cmdline"] or ()):
            return proc
    return None


def asleep(proc: psutil.Process) -> bool:
    """Whether every thread of ``proc`` sleeps: none runs, or waits for a CPU to run on (a
    flood server all asleep is blocked in its send, not merely slowed by a loaded machine)."""
    try:
        for thread in proc.threads():
            stat = Path(f"/proc/{proc.pid}/task/{thread.id}/stat").read_text()
            if stat.rpartition(")")[2].split()[0] != "S":
                return False
    except (OSError, psutil.Error):
        return False
    return True


def test_a_stalled_reader_stops_the_job_not_the_masters_memory(
        env: tuple[LocalCluster, Path]) -> None:
    cluster, root = env
    remote, countfile = start_server(cluster, root, "flood")
    server = wait_for(lambda: server_process(countfile), WAIT_S, "the job's server process")
    local = free_port()
    assert cluster.master is not None and cluster.master.proc is not None
    master = psutil.Process(cluster.master.proc.pid)
    rss_before = master.memory_info().rss

    def sent() -> int:
        return int(countfile.read_text()) if countfile.exists() else 0

    with forwarding(cluster, "flood", f"{local}:{remote}"), connect(local) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(b"flood\n")
        recv_exactly(sock, 1 << 20)  # it flows ...
        # ... and the reader stalls: the job's sends must stop within the windows and
        # socket buffers between, and stay stopped. Stopped: the server is blocked (all its
        # threads asleep) and has sent nothing since the last look.
        last = [-1]

        def stopped() -> bool:
            blocked = asleep(server)
            now, then = sent(), last[0]
            last[0] = now
            return blocked and now == then

        wait_for(stopped, WAIT_S, "the job's sends to stop", interval=0.1)
        stalled = sent()
        assert stalled < 64 << 20, f"{stalled} bytes went out to a reader that stalled"
        growth = master.memory_info().rss - rss_before
        assert growth < 32 << 20, f"the master grew {growth} bytes"
        # Reading again, the flow resumes: the job sends again once the room made here has
        # reached it, hops later.
        recv_exactly(sock, 4 << 20)
        wait_for(lambda: sent() > stalled, WAIT_S, "the job's sends to resume")
    admin(cluster).call("cancel", {"id": "flood"})


def test_the_relay_endpoint_refuses_bad_peers_with_one_sentence(
        env: tuple[LocalCluster, Path]) -> None:
    cluster, _ = env
    url = cluster.url + "/v1/relay"
    token = {"Authorization": f"Bearer {cluster.tokens['client']}"}

    async def first_answer(headers: dict[str, str], frame: bytes) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, \
                http.ws_connect(url, headers=headers) as ws:
            await ws.send_bytes(frame)
            msg = await ws.receive(timeout=WAIT_S)
            return decode_frame(msg.data).body

    async def main() -> None:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await first_answer({}, b"")
        assert refused.value.status == 401
        body = await first_answer(token, b"\xc1 not msgpack")
        assert body["code"] and "msgpack" in body["message"]
        body = await first_answer(token, encode_frame("relay_open", 0, {"job": "x",
                                                                        "kind": "ssh"}))
        assert body["code"] == "invalid_params" and "kind" in body["message"]
        body = await first_answer(token, encode_frame("relay_data", 0, {"stream": 1}))
        assert body["code"] == "invalid_message" and "relay_open" in body["message"]
        with pytest.raises(RelayRefused, match="unknown_job: job 'nope' does not exist"):
            await open_stream(cluster.client(role="client"), "nope", "tcp", port=80)

    asyncio.run(main())
