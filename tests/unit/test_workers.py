"""masterd.runtime.workers: CPU-heavy calls run in worker processes, off the event loop.

The functions the workers run are defined at the top of this module: a spawned worker
imports them by name.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from masterd.runtime.workers import (
    RemoteTraceback,
    WorkerBusy,
    WorkerClosed,
    WorkerDied,
    WorkerError,
    WorkerPool,
)

REPO = Path(__file__).resolve().parents[2]


def square(x: int) -> int:
    return x * x


def fail_with(message: str) -> None:
    raise ValueError(message)


class TwoArgumentError(Exception):
    """Pickles, but cannot be rebuilt: its __init__ needs two arguments."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} failed with {code}")


def fail_unpicklably() -> None:
    raise TwoArgumentError("fit", 7)


def return_a_lock() -> object:
    return threading.Lock()


def exit_interpreter() -> None:
    sys.exit(3)


def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def busy(seconds: float) -> int:
    """Pure-Python CPU work: holds the worker's GIL and a core the whole time."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def thread_niceness() -> list[int]:
    return [os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")]


def live_children() -> set[int]:
    """This process's descendants that are not zombies, without multiprocessing's resource
    tracker (one per process, started by the first spawn; it exits with its parent)."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                pids.add(child.pid)  # an unreaped worker counts as left behind
            elif "resource_tracker" not in " ".join(child.cmdline()):
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def wait_until(predicate: object, timeout_s: float = 5.0) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    async with WorkerPool(processes=1, max_queued=1) as p:
        yield p


async def test_results_and_exceptions_cross_the_process_boundary(pool: WorkerPool) -> None:
    assert await pool.run(square, 12) == 144

    with pytest.raises(ValueError, match="bad history") as raised:
        await pool.run(fail_with, "bad history")
    assert isinstance(raised.value.__cause__, RemoteTraceback)
    assert "fail_with" in str(raised.value.__cause__)

    # An exception that cannot be rebuilt still arrives with its type name and message.
    with pytest.raises(WorkerError, match="TwoArgumentError: fit failed with 7"):
        await pool.run(fail_unpicklably)
    # SystemExit must not unwind the master.
    with pytest.raises(WorkerError, match="SystemExit: 3"):
        await pool.run(exit_interpreter)

    with pytest.raises(TypeError, match="cannot send it to a worker process"):
        await pool.run(lambda: 1)
    with pytest.raises(TypeError, match=r"the result \(lock\) could not be pickled"):
        await pool.run(return_a_lock)

    assert await pool.run(square, 3) == 9  # the same worker carried on throughout
    stats = pool.stats()
    assert (stats.completed, stats.failed, stats.died, stats.processes_started) == (2, 4, 0, 1)


async def test_worker_is_spawned_and_every_thread_runs_at_lower_priority(
        pool: WorkerPool) -> None:
    [pid] = pool.pids()
    assert "spawn_main" in " ".join(psutil.Process(pid).cmdline())
    niceness = await pool.run(thread_niceness)
    assert len(niceness) >= 2  # the main thread and the master watcher
    assert set(niceness) == {min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)}


async def test_a_worker_that_is_not_ready_in_time_fails_start_and_is_reaped() -> None:
    before = live_children()
    pool = WorkerPool(start_timeout_s=0.001)
    with pytest.raises(WorkerError, match=r"did not start \(pid [0-9]+ not ready after"):
        await pool.start()
    assert live_children() <= before
    with pytest.raises(WorkerClosed):
        await pool.run(square, 2)


async def test_a_full_queue_refuses_instead_of_growing(pool: WorkerPool) -> None:
    running = asyncio.ensure_future(pool.run(time.sleep, 30))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(pool.run(square, 2))
    await asyncio.sleep(0)
    assert (pool.stats().running, pool.stats().queued) == (1, 1)

    with pytest.raises(WorkerBusy, match="skip this round"):
        await pool.run(square, 3)
    assert pool.stats().refused == 1

    await pool.close()
    for task in (running, queued):
        with pytest.raises(WorkerClosed):
            await task


async def test_close_during_a_long_call_is_quick_and_leaves_no_process() -> None:
    before = live_children()
    pool = WorkerPool(processes=2, max_queued=2)
    await pool.start()
    pids = pool.pids()
    long_calls = [asyncio.ensure_future(pool.run(busy, 30.0)) for _ in range(2)]
    waiting = asyncio.ensure_future(pool.run(square, 4))
    await asyncio.sleep(0.3)

    started = time.monotonic()
    await pool.close()
    assert time.monotonic() - started < 2.0

    for task in [*long_calls, waiting]:
        with pytest.raises(WorkerClosed):
            await task
    assert all(gone(pid) for pid in pids)
    assert live_children() <= before
    with pytest.raises(WorkerClosed):
        await pool.run(square, 5)


async def test_cancelling_a_call_stops_its_work(pool: WorkerPool) -> None:
    [first] = pool.pids()
    running = asyncio.ensure_future(pool.run(busy, 30.0))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(pool.run(square, 6))
    await asyncio.sleep(0.2)

    queued.cancel()  # a queued call just leaves the queue
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert pool.stats().queued == 0

    with pytest.raises(TimeoutError):  # wait_for cancels the running call
        await asyncio.wait_for(running, 0.2)
    assert await wait_until(lambda: gone(first))
    assert await pool.run(square, 7) == 49
    assert pool.pids() != [first]
    assert pool.stats().cancelled == 2


async def test_a_worker_that_dies_fails_its_call_and_is_replaced(pool: WorkerPool) -> None:
    [first] = pool.pids()
    with pytest.raises(WorkerDied, match=r"segfault: killed by SIGSEGV") as died:
        await pool.run(segfault)
    assert (died.value.pid, died.value.exitcode) == (first, -signal.SIGSEGV)
    assert died.value.name.endswith("test_workers.segfault")

    assert await pool.run(square, 8) == 64
    [second] = pool.pids()
    assert second != first

    with pytest.raises(WorkerDied, match="exited with code 5"):
        await pool.run(os._exit, 5)
    assert await pool.run(square, 9) == 81
    assert pool.stats().died == 2


async def test_the_loop_stays_responsive_while_a_worker_computes(pool: WorkerPool) -> None:
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    assert await pool.run(busy, 2.0) > 0
    done = True
    await ticking
    assert len(gaps) > 200
    assert max(gaps) < 0.2


MASTER = """
import asyncio, time
from masterd.runtime.workers import WorkerPool

async def main():
    async with WorkerPool() as pool:
        call = asyncio.ensure_future(pool.run(time.sleep, 60))
        await asyncio.sleep(0.2)
        print(pool.pids()[0], flush=True)
        await call

if __name__ == "__main__":
    asyncio.run(main())
"""


def test_workers_exit_when_the_master_is_killed() -> None:
    with subprocess.Popen([sys.executable, "-c", MASTER], cwd=REPO, stdout=subprocess.PIPE,
                          text=True) as master:
        try:
            assert master.stdout is not None
            readable, _, _ = select.select([master.stdout], [], [], 30)
            assert readable, "the master never reported its worker"
            worker = int(master.stdout.readline())
            assert not gone(worker)
            master.send_signal(signal.SIGKILL)
            master.wait(10)
            deadline = time.monotonic() + 5
            while not gone(worker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert gone(worker)
        finally:
            if master.poll() is None:
                master.kill()
