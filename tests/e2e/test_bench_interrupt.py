"""SIGTERM or Ctrl-C to a benchmark or the demo while its jobs run: it stops them (their process
groups and shims), removes its cgroups and its scratch directory, then exits non-zero.

As root the jobs run in real cgroups, which must be gone afterwards too; as another user they
are pinned with CPU affinity and only the processes and the directory are left to check.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from demo.cluster import TREE
from noded.cgroups import find_mounts

TMP = Path(tempfile.gettempdir())


@dataclass(frozen=True)
class Marks:
    """How to recognise what a run started, besides processes naming its directory."""

    cgroup_prefix: str  # its cgroup parents' names start so
    env_key: str  # its jobs' environment has this variable...
    env_prefix: str  # ...starting so


@dataclass
class Run:
    argv: list[str]
    scratch_prefix: str  # its temporary directory's name starts so
    marks: Callable[[Path], Marks | None]  # from its directory; None before it starts a job


def contention_run() -> Run:
    """bench/contention.py: jobs through an in-process JobRunner and their shims."""

    def marks(root: Path) -> Marks | None:
        jobs = sorted((root / "state" / "jobs").glob("bench-*"))
        if not jobs:
            return None
        tag = jobs[0].name.split("-")[1]  # job ids are bench-TAG-LANE
        return Marks(f"trellis-test-bench-{tag}", "TRELLIS_JOB_ID", f"bench-{tag}-")

    return Run([sys.executable, str(TREE / "bench" / "contention.py"), "--trials", "200",
                "--lanes", "2"], "trellis-test-bench-", marks)


def demo_run() -> Run:
    """python -m demo.run: a master and node daemons (LocalCluster), jobs under their shims."""
    prefix = f"trellis-test-demo-{uuid.uuid4().hex[:6]}"
    return Run([sys.executable, "-m", "demo.run", "--nodes", "2", "--gpus", "8", "--prefix",
                prefix], f"{prefix}-", lambda root: Marks(prefix, "TRELLIS_NODE", prefix))


def scratch_of(parent: int, prefix: str) -> Path | None:
    """The run's temporary directory, named on the command line of a process it started."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(parent).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                for arg in child.cmdline():
                    path = Path(arg)
                    if path.is_relative_to(TMP) and path != TMP:
                        top = TMP / path.relative_to(TMP).parts[0]
                        if top.name.startswith(prefix):
                            return top
    return None


def is_job(env: dict[str, str] | None, marks: Marks | None) -> bool:
    return marks is not None and (env or {}).get(marks.env_key, "").startswith(marks.env_prefix)


def live_processes(root: Path, marks: Marks | None) -> list[psutil.Process]:
    """The run's processes: daemons and shims name its directory, jobs carry its marks."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue  # gone, but for its parent's wait
        if any(str(root) in arg for arg in info["cmdline"] or ()) or \
                is_job(info["environ"], marks):
            found.append(proc)
    return found


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def jobs_running(root: Path, marks: Marks | None) -> bool:
    return any(is_job(p.info["environ"], marks) for p in live_processes(root, marks))


def cgroups(prefix: str) -> list[Path]:
    mounts = find_mounts()
    hierarchies = [*mounts.v1.values(), *([mounts.v2] if mounts.v2 else [])]
    return [group for h in hierarchies for group in h.glob(f"{prefix}*")]


def wait_until(what: str, check: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def sweep(root: Path, marks: Marks | None) -> None:
    """The test's own clean-up, for when the run under test failed at its own."""
    for proc in live_processes(root, marks):
        with contextlib.suppress(psutil.Error):
            proc.kill()
    time.sleep(0.2)
    for group in cgroups(marks.cgroup_prefix) if marks else []:
        # Deepest first: a cgroup directory goes only once it has no child groups.
        for path in sorted([group, *group.rglob("*")], key=lambda p: len(p.parts),
                           reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir()
    shutil.rmtree(root, ignore_errors=True)


def heed_stop_signals() -> None:
    """A run keeps a stop signal ignored if it starts so, as pytest would under a
    non-interactive shell's ``&``; the test must be able to send them."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


@contextlib.contextmanager
def launched(run: Run, stderr: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """Start the run and yield it with its directory; whatever the test's outcome, leave
    nothing of it behind."""
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(run.argv, cwd=TREE, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True, preexec_fn=heed_stop_signals)
    root: Path | None = None
    marks: Marks | None = None
    try:
        wait_until("its scratch directory", lambda: scratch_of(proc.pid, run.scratch_prefix),
                   30)
        root = scratch_of(proc.pid, run.scratch_prefix)
        assert root is not None
        wait_until("its jobs to run", lambda: jobs_running(root, run.marks(root)), 40)
        marks = run.marks(root)
        yield proc, root
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if root is not None:
            if marks is None and root.exists():
                marks = run.marks(root)
            sweep(root, marks)


@pytest.mark.parametrize(("make_run", "sig"), [
    (contention_run, signal.SIGTERM),
    (demo_run, signal.SIGINT),
], ids=["contention-sigterm", "demo-sigint"])
def test_a_stop_signal_leaves_no_job_cgroup_or_directory(
        make_run: Callable[[], Run], sig: signal.Signals, tmp_path: Path) -> None:
    run = make_run()
    with launched(run, tmp_path / "stderr") as (proc, root):
        marks = run.marks(root)
        assert marks is not None
        started = live_processes(root, marks)
        if os.geteuid() == 0:
            assert cgroups(marks.cgroup_prefix), f"no cgroup {marks.cgroup_prefix}* while " \
                                                 "its jobs run"

        proc.send_signal(sig)
        proc.wait(timeout=40)

        err = (tmp_path / "stderr").read_text(errors="replace")
        assert proc.returncode == 128 + sig, err[-3000:]
        assert f"stopped by {sig.name}" in err
        left = [p for p in started if alive(p)]
        assert not left, [" ".join(p.cmdline()) for p in left]
        assert not live_processes(root, marks)
        assert not cgroups(marks.cgroup_prefix)
        assert not root.exists()
