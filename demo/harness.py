"""What every harness that drives a local cluster needs to leave the machine as it found it.

The benchmarks, the demo and the end-to-end tests start daemons, job processes (which outlive
their node daemon by design), cgroups and a scratch directory. Their ``finally`` blocks remove
them, but only if they run: by default SIGTERM ends Python without running any, and SIGINT's
KeyboardInterrupt can tear through an event loop half-way.

- ``exit_on_signals()`` turns SIGTERM and SIGINT into ``Interrupted`` (exit status 128 +
  signal number), so the clean-ups run, and restores the previous handlers afterwards.
- ``run(coro)`` is ``asyncio.run`` for such a program: a signal cancels the main task, as
  asyncio's own Ctrl-C handling does, so its clean-up can still await what it must.
- ``shielded()`` holds a signal back while a clean-up is under way.
- ``scratch_dir()``, ``kill_jobs()`` and ``remove_cgroups()`` are the clean-ups themselves;
  ``sweep_stale_cgroups()`` removes what a run killed outright (SIGKILL, a lost machine)
  could not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from noded.cgroups import detect_cgroups
from noded.cgroups.mounts import DEFAULT_ROOT, find_mounts
from noded.usage.setup import sweep_usage

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(SystemExit):
    """A stop signal arrived. A SystemExit, so that ``except Exception`` clean-up code does not
    swallow it and an uncaught one exits quietly with the shell's status for the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


@dataclass
class _SignalState:
    signum: int | None = None  # the first stop signal received
    raised: bool = False  # Interrupted has been raised for it
    deferred: bool = False  # it arrived inside shielded(): raise when the shield ends
    shield: int = 0  # depth of nested shielded() blocks
    task: asyncio.Task[Any] | None = None  # run()'s main task while it runs


_state = _SignalState()


def _raise_pending() -> None:
    if _state.signum is not None and not _state.raised:
        _state.raised = True
        raise Interrupted(_state.signum)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _state.signum is not None:
        return  # already stopping: a second Ctrl-C must not cut the clean-up short
    _state.signum = signum
    if _state.shield:
        _state.deferred = True
        return
    task = _state.task
    if task is not None and not task.done():
        task.cancel()
        # Signal handlers run between bytecodes; the loop may be asleep in select() and
        # would not look at the cancelled task before its next timer.
        task.get_loop().call_soon_threadsafe(lambda: None)
        return
    _raise_pending()


@contextlib.contextmanager
def exit_on_signals(signals: Sequence[signal.Signals] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, ``signals`` raise ``Interrupted`` (or cancel ``run()``'s main task).
    A signal this process was started with ignored stays ignored (a background job of a
    non-interactive shell ignores SIGINT; nohup'd runs expect to outlive their terminal)."""
    global _state
    _state = _SignalState()
    previous = {sig: signal.signal(sig, _on_signal) for sig in signals
                if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
        _raise_pending()  # a signal the block's last clean-up held back
    except Interrupted as exc:
        print(f"{Path(sys.argv[0]).name}: stopped by {signal.Signals(exc.signum).name}",
              file=sys.stderr)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state = _SignalState()


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Hold a stop signal back until the block ends: a clean-up cut short leaks what it did
    not reach. Use one block per clean-up: the held signal is raised when it ends."""
    _state.shield += 1
    try:
        yield
    finally:
        _state.shield -= 1
    if not _state.shield and _state.deferred:
        _state.deferred = False
        _raise_pending()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``; under ``exit_on_signals()`` a stop signal cancels ``main``, whose
    ``finally`` blocks run (and may await), then ``Interrupted`` is raised."""

    async def watched() -> T:
        _state.task = asyncio.current_task()
        try:
            return await main
        finally:
            _state.task = None

    try:
        return asyncio.run(watched())
    finally:
        _raise_pending()


@contextlib.contextmanager
def scratch_dir(prefix: str, mode: int = 0o755, keep: bool = False) -> Iterator[Path]:
    """A new temporary directory, removed on the way out unless ``keep``. ``mode``: job users
    (nobody, as root) must reach what the jobs use under it; mkdtemp makes it 0700."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        os.chmod(root, mode)
        yield root
    finally:
        if not keep:
            with shielded():
                shutil.rmtree(root, ignore_errors=True)


def kill_jobs(state_dir: Path) -> None:
    """SIGKILL every job a node's state directory records: the job's process group and its
    shim. Jobs outlive their node daemon by design, so nothing else ends them."""
    jobs = state_dir / "jobs"
    if not jobs.is_dir():
        return
    for jobdir in jobs.iterdir():
        # child.json: the job's pid, which is its process group; shim.json: the shim's pid.
        for name, kill in (("child.json", os.killpg), ("shim.json", os.kill)):
            with contextlib.suppress(OSError, ValueError, KeyError):
                kill(int(json.loads((jobdir / name).read_text())["pid"]), signal.SIGKILL)


def remove_cgroups(parent: str, state_dir: Path) -> None:
    """Empty and remove every job group under ``parent``, then ``parent`` itself (the node whose
    state is in ``state_dir``). Best effort: a clean-up must not fail the run it ends."""
    with contextlib.suppress(Exception):
        groups = detect_cgroups(parent, state_dir=state_dir / "cgroups")
        for job in groups.list_jobs():
            with contextlib.suppress(Exception):
                groups.signal_all(job, signal.SIGKILL)
                _wait_until(lambda job=job: not groups.pids(job), 1.0)
                groups.remove(job)
        groups.remove_parent()


def sweep_stale_cgroups(prefix: str, min_age_s: float = 600.0,
                        root: Path = DEFAULT_ROOT) -> list[Path]:
    """Remove the cgroups named ``prefix*`` on every hierarchy under ``root`` that no process
    is in any more and that are at least ``min_age_s`` old: what a run killed outright left.
    One that holds a process, or was made a moment ago, may belong to a run still going
    (another session's) and stays. Returns what was removed."""
    mounts = find_mounts(root)
    points = {*mounts.v1.values(), *mounts.v1_others, *([mounts.v2] if mounts.v2 else [])}
    removed: list[Path] = []
    for point in sorted(points):
        with contextlib.suppress(OSError):
            for top in sorted(point.glob(f"{prefix}*")):
                if (top.is_dir() and time.time() - top.stat().st_ctime >= min_age_s
                        and not _holds_processes(top)):
                    removed += _remove_tree(top)
    return removed


def _holds_processes(group: Path) -> bool:
    for procs in group.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            if procs.read_text().strip():
                return True
    return False


def _remove_tree(group: Path) -> list[Path]:
    """rmdir a cgroup's tree, deepest first (a cgroup's control files go with it)."""
    dirs = sorted((d for d in group.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
    removed = []
    for d in [*dirs, group]:
        with contextlib.suppress(OSError):
            d.rmdir()
            removed.append(d)
    return removed


def _wait_until(done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)


def sweep_node(parent: str, state_dir: Path) -> None:
    """Everything a node (daemon or in-process runner) leaves behind: its jobs, then its
    cgroups."""
    with shielded():
        kill_jobs(state_dir)
        remove_cgroups(parent, state_dir)
        sweep_usage(parent)


def live_environs() -> list[dict[str, str]]:
    """The environment of every live (not zombie) process this user may read: how a test or
    a benchmark finds which job parts really run, whatever the daemons say."""
    import psutil

    found = []
    for proc in psutil.process_iter(["environ", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.info["environ"]:
            found.append(proc.info["environ"])
    return found
