"""An in-process master with stand-in node sessions, for driver-level unit tests.

The master, its scheduling core, its journal (a real SQLite file) and its RPC table are the
real ones; only the node WebSocket is replaced by :class:`FakeSession`, which records the
commands it gets and answers them like a node that accepts everything (or refuses prepares).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from masterd.service.master import Master
from masterd.service.sessions import CommandFailed
from shared.config import MasterConfig
from shared.messages import NODE_COMMANDS, JobExited, JobStarted
from shared.schema import decode
from tests.unit.helpers import inventory


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeSession:
    def __init__(self, name: str, refuse_prepare: bool = False) -> None:
        self.name = name
        self.refuse_prepare = refuse_prepare
        self.sent: list[tuple[str, Any]] = []
        self.silent_s = 0.0  # as NodeSession: how long the node was silent when it ended

    async def request(self, type_: str, body: Any) -> dict[str, Any]:
        if isinstance(body, dict):
            # Already in wire form (the master pre-encodes specs): decode it as a node would.
            body = decode(NODE_COMMANDS[type_], body)
        self.sent.append((type_, body))
        if type_ == "prepare_job" and self.refuse_prepare:
            raise CommandFailed(self.name, type_, "cgroup_failed", "refused by the test")
        if type_ == "prepare_job":
            return {"port": 29500}
        if type_ == "start_job":
            return {"pid": 4242}
        return {}

    def commands(self, type_: str) -> list[Any]:
        return [body for t, body in self.sent if t == type_]


def make_master(state: Path, clock: Clock, nodes: dict[str, tuple[int, int]],
                **config: Any) -> tuple[Master, dict[str, FakeSession]]:
    """A master whose ``nodes`` (name -> (gpus, cpus)) are connected through fake sessions."""
    cfg = decode(MasterConfig, {"state_dir": str(state), **config}, "master")
    master = Master(cfg, clock=clock)
    master.restore()
    sessions = {}
    for name, (gpus, cpus) in nodes.items():
        master.core.node_up(master.events.effective_inventory(
            inventory(name, gpus=gpus, cpus=cpus, numa=1)))
        sessions[name] = FakeSession(name)
        master.sessions[name] = sessions[name]  # type: ignore[assignment]
    return master, sessions


async def until(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``probe`` until it returns something true (a deadline, not a wait: generous, so
    the suite holds beside a CPU hog, where a journal write can take seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _incarnation(master: Master, job_id: str) -> int:
    """The restart count a node reports with a part: the one it was prepared for."""
    job = master.core.jobs.get(job_id)
    return job.restarts if job is not None else 0


async def started(master: Master, node: str, job_id: str) -> None:
    await master.node_event(node, "job_started", JobStarted(
        job_id=job_id, pid=4242, restarts=_incarnation(master, job_id)))


async def exited(master: Master, node: str, job_id: str, code: int | None = 0,
                 signal: int | None = None) -> None:
    await master.node_event(node, "job_exited", JobExited(
        job_id=job_id, exit_code=code, signal=signal, restarts=_incarnation(master, job_id)))


def through_rpc(state: Path, body: Callable[..., Awaitable[None]],
                nodes: dict[str, tuple[int, int]], clock: Clock | None = None,
                **config: Any) -> None:
    """Run ``body(master, rpc, sessions)`` against a master of ``nodes`` whose jobs may run as
    any user (alice and bob stand for existing Unix users), closing it afterwards."""
    from masterd.api.rpc import Rpc

    async def go() -> None:
        master, sessions = make_master(state, clock or Clock(), nodes, **config)
        master.check_user = lambda user: None  # type: ignore[method-assign]
        try:
            await body(master, Rpc(master), sessions)
        finally:
            await master.close()

    asyncio.run(go())
