"""sd_notify over real AF_UNIX datagram sockets, path and abstract names."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.sdnotify import Notifier, socket_address


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    yield str(path), sock
    sock.close()


def recv_all(sock: socket.socket, wait: float = 0.05) -> list[str]:
    out = []
    sock.settimeout(wait)
    try:
        while True:
            out.append(sock.recv(4096).decode())
    except TimeoutError:
        pass
    return out


def test_ready_and_status_reach_the_socket(listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    env = {"NOTIFY_SOCKET": path}
    n = Notifier(environ=env)
    assert n.enabled
    assert n.ready("listening on :7400")
    assert sock.recv(4096).decode() == "READY=1\nSTATUS=listening on :7400"
    assert n.status("two\nlines")
    assert sock.recv(4096).decode() == "STATUS=two lines"
    assert not n.status("two\nlines")  # unchanged: not re-sent
    assert n.reloading()
    lines = sock.recv(4096).decode().split("\n")
    assert lines[0] == "RELOADING=1" and lines[1].startswith("MONOTONIC_USEC=")
    assert int(lines[1].split("=")[1]) > 0
    assert n.stopping("draining")
    assert sock.recv(4096).decode() == "STOPPING=1\nSTATUS=draining"
    n.close()


def test_abstract_namespace_socket() -> None:
    name = f"trellis-test-{uuid.uuid4().hex[:8]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2.0)
    try:
        assert socket_address("@" + name) == b"\0" + name.encode()
        n = Notifier(environ={"NOTIFY_SOCKET": "@" + name})
        assert n.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_without_notify_socket_everything_is_a_no_op() -> None:
    n = Notifier(environ={})
    assert not n.enabled
    assert not n.ready("x") and not n.watchdog() and not n.stopping()


def test_variables_are_removed_so_children_cannot_notify(
        listener: tuple[str, socket.socket]) -> None:
    path, _ = listener
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid()),
           "OTHER": "kept"}
    n = Notifier(environ=env)
    assert env == {"OTHER": "kept"}
    assert n.watchdog_s == 1.0
    kept = {"NOTIFY_SOCKET": path}
    Notifier(environ=kept, unset_environment=False)
    assert kept == {"NOTIFY_SOCKET": path}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "3000000"}, 3.0),
        ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "1"}, None),  # someone else's
        ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "x"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert Notifier(environ=dict(env), pid=4242).watchdog_s == expected


def test_send_failure_does_not_raise(tmp_path: Path) -> None:
    n = Notifier(environ={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.ready() is False


async def test_watchdog_loop_pings_at_half_the_interval(
        listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    loop = asyncio.get_running_loop()
    n = Notifier(environ={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    sent: list[float] = []  # the loop's clock at each ping
    ping = n.watchdog

    def timed_ping() -> bool:
        sent.append(loop.time())
        return ping()

    n.watchdog = timed_ping  # type: ignore[method-assign]
    sock.setblocking(False)
    received: list[str] = []

    async def five_pings() -> None:
        while len(received) < 5:
            received.append((await loop.sock_recv(sock, 4096)).decode())

    task = loop.create_task(n.watchdog_loop())
    try:
        await asyncio.wait_for(five_pings(), 10)
    finally:
        task.cancel()
    assert received == ["WATCHDOG=1"] * 5
    gaps = [b - a for a, b in itertools.pairwise(sent[:5])]
    # Half of the 0.2 s interval: the loop never wakes a sleep early, so no gap is shorter.
    assert all(g >= 0.1 - 1e-6 for g in gaps), gaps
    # A late wake-up on a busy machine may stretch one gap, but pinging only once per
    # interval would put the mean at 0.2 s or more: systemd would kill a healthy daemon.
    assert sum(gaps) / len(gaps) < 0.2, gaps


async def test_watchdog_loop_returns_when_no_watchdog(
        listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    await asyncio.wait_for(Notifier(environ={"NOTIFY_SOCKET": path}).watchdog_loop(), 1)
    assert recv_all(sock) == []
