"""The runtime features get from the master: events, supervised tasks, lazily started
worker processes, and a read-only view of the core."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest

from masterd.core.policies.fifo import FifoPolicy
from masterd.core.scheduler import JobError, SchedulingCore
from masterd.runtime.context import CoreView, Workers
from masterd.runtime.events import AsyncSignal, Check, MasterEvents, Provider, Signal
from masterd.runtime.tasks import TaskSupervisor
from tests.unit.helpers import job


def test_a_failing_subscriber_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    heard: list[str] = []
    signal: Signal[[str]] = Signal("demo")

    def broken(value: str) -> None:
        raise RuntimeError("feature bug")

    signal.subscribe(heard.append)
    signal.subscribe(broken)
    signal.subscribe(lambda value: heard.append(value.upper()))
    with caplog.at_level(logging.ERROR, "trellis.master.events"):
        signal.emit("x")
    assert heard == ["x", "X"]
    assert "event=demo" in caplog.text and "feature bug" in caplog.text


async def test_async_subscribers_run_in_order_and_failures_are_isolated() -> None:
    heard: list[int] = []
    signal: AsyncSignal[[int]] = AsyncSignal("demo")

    async def first(value: int) -> None:
        await asyncio.sleep(0.01)  # a slow first subscriber still goes first
        heard.append(value)

    async def broken(value: int) -> None:
        raise ValueError("no")

    async def last(value: int) -> None:
        heard.append(value + 1)

    for fn in (first, broken, last):
        signal.subscribe(fn)
    await signal.emit(1)
    assert heard == [1, 2]


def test_a_veto_reaches_the_caller() -> None:
    check: Check[[str]] = Check("submitting")
    seen: list[str] = []
    check.subscribe(seen.append)

    def refuse(name: str) -> None:
        if name == "bad":
            raise JobError("invalid_job", "refused by a feature")

    check.subscribe(refuse)
    check("good")
    with pytest.raises(JobError, match="refused by a feature"):
        check("bad")
    assert seen == ["good", "bad"]


def test_a_provider_answers_its_default_until_provided_once() -> None:
    provider: Provider[[int], int] = Provider("double", lambda x: 0)
    assert provider(3) == 0
    provider.provide(lambda x: 2 * x)
    assert provider(3) == 6
    with pytest.raises(RuntimeError, match="already provided"):
        provider.provide(lambda x: x)
    assert MasterEvents().core_plan(job("j"), None) is None  # type: ignore[arg-type]


async def test_periodic_tasks_survive_a_failing_round_and_stop_at_close() -> None:
    tasks = TaskSupervisor()
    rounds: list[int] = []

    def tick() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 2:
            raise RuntimeError("one bad round")

    tasks.every(0.01, tick, "tick")
    deadline = asyncio.get_running_loop().time() + 5
    while len(rounds) < 4:
        assert asyncio.get_running_loop().time() < deadline, "the task stopped after a failure"
        await asyncio.sleep(0.01)
    assert len(tasks) == 1
    await tasks.close()
    assert len(tasks) == 0
    done = len(rounds)
    await asyncio.sleep(0.05)
    assert len(rounds) == done
    late = tasks.spawn(asyncio.sleep(10))  # nothing new starts once closed
    await asyncio.sleep(0)
    assert late.cancelled()
    with pytest.raises(ValueError, match="interval must be positive"):
        tasks.every(0, tick, "never")


def _whoami(tag: str) -> tuple[str, int]:
    return tag, os.getpid()


async def test_worker_processes_start_on_first_use_and_close() -> None:
    workers = Workers()
    try:
        assert workers.pool.pids() == []  # nothing started for a master that never trains
        tag, pid = await workers.run(_whoami, "fit", name="test-fit")
        assert tag == "fit" and pid != os.getpid()
        assert workers.pool.pids() == [pid]
        assert (await workers.run(_whoami, "again"))[1] == pid  # the same worker, reused
    finally:
        await workers.close()
    assert workers.pool.pids() == []


def test_the_core_view_cannot_change_the_core() -> None:
    core = SchedulingCore(FifoPolicy())
    view = CoreView(core)
    core.submit(job("a"))
    assert list(view.jobs) == ["a"] and view.job("a") is core.jobs["a"]
    with pytest.raises(TypeError):
        view.jobs["b"] = job("b")  # type: ignore[index]
    assert [j.id for j in view.queue()] == ["a"]
    assert view.policy_name == "fifo" and isinstance(view.policy, FifoPolicy)
