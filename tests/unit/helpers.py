"""Builders for inventories and jobs used across unit tests."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from shared.model import CpuCore, GpuInfo, Job, JobKind, JobSpec, NodeInventory


def inventory(name: str, gpus: int = 8, cpus: int = 16, numa: int = 2, per_switch: int = 2,
              model: str = "A100", memory_mib: int = 256_000) -> NodeInventory:
    gpn = max(1, gpus // numa)
    cpn = max(1, cpus // numa)
    return NodeInventory(
        name=name, hostname=name, address="127.0.0.1",
        gpus=tuple(GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=40960,
                           numa_node=min(i // gpn, numa - 1), pcie_switch=i // per_switch)
                   for i in range(gpus)),
        cpus=tuple(CpuCore(id=c, socket=min(c // cpn, numa - 1),
                           numa_node=min(c // cpn, numa - 1), core=c)
                   for c in range(cpus)),
        memory_mib=memory_mib,
    )


def job(job_id: str, gpus: int = 1, cpus: int = 1, t: float = 0.0, **kw: object) -> Job:
    kind = JobKind.CPU if gpus == 0 else JobKind.TRAINING
    spec = JobSpec(name=job_id, command=("true",), user="nobody", kind=kind, gpus=gpus,
                   cpus=cpus, **kw)  # type: ignore[arg-type]
    return Job(id=job_id, spec=spec, submit_time=t)


def writer_sleep(store: object, seconds: float, started: str | None = None) -> None:
    """A journal call (``journal.call(writer_sleep, s)``) that keeps the writer busy.

    With ``started`` (a file path) it creates that file first, so a test can wait until the
    writer is inside the call (``wait_for(Path(started).exists, ...)``).
    """
    if started is not None:
        Path(started).touch()
    time.sleep(seconds)


def writer_fails(store: object, message: str) -> None:
    """A journal call that fails in the writer with ``message``."""
    raise ValueError(message)


def writer_log_level(store: object) -> int:
    """A journal call: the writer's root log level."""
    return logging.getLogger().level


T = TypeVar("T")

POLL_S = 0.01


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "the condition",
             interval: float = POLL_S) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail naming
    ``what`` once ``timeout`` seconds have passed without it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


async def wait_for_async(predicate: Callable[[], T | Awaitable[T]], timeout: float = 10.0,
                         what: str = "the condition", interval: float = POLL_S) -> T:
    """``wait_for`` on an event loop: polls without blocking it, and ``predicate`` may be a
    coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
