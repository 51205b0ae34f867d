"""Real processes for the cgroup tests: sleepers and multithreaded workers, always reaped."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Threads sleep rather than spin: the machine has two cores shared with other test runs.
THREADED = r"""
import os, sys, threading, time
n, own = int(sys.argv[1]), sys.argv[2]
started = threading.Barrier(n + 1)
def worker(i):
    if i == 0 and own != "-":
        os.sched_setaffinity(0, {int(own)})  # pid 0 = this thread only
    started.wait()
    while True:
        time.sleep(0.05)
for i in range(n):
    threading.Thread(target=worker, args=(i,), daemon=True).start()
started.wait()
if len(sys.argv) > 3:
    import subprocess
    subprocess.Popen(["sleep", "60"])
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def spawn_sleeper(**kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], **kwargs)  # type: ignore[call-overload]


def spawn_threaded(
    threads: int,
    own_cpu: int | None = None,
    with_child: bool = False,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen[str]:
    """A process with ``threads`` extra threads (the first optionally pinned by itself to
    ``own_cpu``) and, with ``with_child``, a ``sleep`` child; returns once all are running."""
    args = [sys.executable, "-c", THREADED, str(threads), "-" if own_cpu is None else str(own_cpu)]
    if with_child:
        args.append("child")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"threaded worker failed to start: {line!r}"
    return proc


def thread_cpus(pid: int) -> dict[int, str]:
    """Cpus_allowed_list of every thread of ``pid``."""
    out: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    out[int(task.name)] = line.split(":", 1)[1].strip()
    return out


def children_of(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def procs() -> Iterator[Callable[[subprocess.Popen], subprocess.Popen]]:
    """Register a process (and its children) to be killed and reaped at teardown."""
    started: list[subprocess.Popen] = []
    kids: list[int] = []

    def track(proc: subprocess.Popen) -> subprocess.Popen:
        started.append(proc)
        return proc

    try:
        yield track
    finally:
        for proc in started:
            with contextlib.suppress(FileNotFoundError):
                kids += children_of(proc.pid)
            proc.kill()
            proc.wait(timeout=10)
        for kid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, 9)
