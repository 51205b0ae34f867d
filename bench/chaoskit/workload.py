"""The users: what people do all day, at random moments, each through its own credential.

Every operation goes into the history with the outcome its user saw. Jobs run the soak's
evidence job (bench/chaoskit/job.py); each submission carries what the checker needs to
judge it later (its id, account, GPUs, dependencies and the exit code it will exit with).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.chaoskit.history import History, Op, now
from control.client import RpcError, Unreachable

log = logging.getLogger("chaos.workload")

ACTIONS = {"single": 30, "array": 8, "multinode": 8, "chain": 9, "time_limit": 7,
           "hold": 8, "cancel": 18, "failing": 5, "pty": 5, "container": 5}
MAX_LIVE = 12  # a user with this many unfinished jobs only cancels and waits


@dataclass
class User:
    name: str
    account: str
    call: Callable[[str, dict[str, Any]], Any]  # a failover client's call, this user's token
    rng: random.Random
    live: dict[str, float] = field(default_factory=dict)  # job id -> when submitted


@dataclass
class Workload:
    history: History
    job_command: Callable[[float, int, bool], list[str]]  # seconds, exit code, pty -> argv
    # Blocking: (user, job id, argv, the code to type) -> (its exit code, ready seen, error).
    run_pty: Callable[[User, str, list[str], int], tuple[int | None, bool, str]]
    # (seconds, exit code) -> a container job's spec fields (image, mounts, command), or
    # None when the machine has no podman.
    container_job: Callable[[float, int], dict[str, Any] | None] = lambda _s, _c: None
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    pending: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, user: User, until: float) -> None:
        names, weights = zip(*ACTIONS.items(), strict=True)
        while now() < until:
            action = user.rng.choices(names, weights)[0]
            if len(user.live) >= MAX_LIVE and action != "cancel":
                await self._forget_ended(user)
                action = "cancel" if user.live and user.rng.random() < 0.3 else "wait"
            if action != "wait":
                try:
                    await getattr(self, action)(user)
                except Exception:  # the workload must go on; the history says what failed
                    log.exception("user %s: %s failed", user.name, action)
            await asyncio.sleep(user.rng.uniform(0.2, 1.2))
        await asyncio.gather(*self.pending, return_exceptions=True)

    # -- calls -------------------------------------------------------------------------
    async def _call(self, user: User, kind: str, method: str, params: dict[str, Any],
                    args: dict[str, Any]) -> tuple[str, Any]:
        invoked = now()
        try:
            result = await asyncio.to_thread(user.call, method, params)
            outcome, error = "ok", ""
        except RpcError as exc:
            result, outcome, error = None, "fail", str(exc)  # "code: the master's sentence"
        except (Unreachable, TimeoutError, OSError) as exc:
            result, outcome, error = None, "info", f"{type(exc).__name__}: {exc}"
        self.history.record(Op(user.name, kind, invoked, now(), outcome, args,
                               _small(result), error))
        return outcome, result

    def _job(self, user: User, *, gpus: int, seconds: float, code: int = 0,
             nodes: int | None = None, after: list[tuple[str, str]] | None = None,
             time_limit_s: int | None = None, warning: bool = False,
             array: tuple[str, int] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        job_id = (f"{array[0]}_{array[1]}" if array else
                  f"{user.name}-{next(self.ids)}")
        spec: dict[str, Any] = {
            "name": job_id, "command": self.job_command(seconds, code, False),
            "user": user.name, "tenant": user.account, "cpus": 1,
            "kind": "training" if gpus else "cpu", "gpus": gpus, "memory_mib": 256,
        }
        if nodes:
            spec["max_nodes"] = nodes
        if after:
            spec["after"] = [{"type": t, "jobs": [j]} for t, j in after]
        if time_limit_s:
            spec["time_limit_s"] = time_limit_s
        if warning:
            spec["stop"] = {"warning": {"signal": "SIGUSR1", "seconds": 1}}
        if array:
            spec["array"] = {"id": array[0], "index": array[1]}
        meta = {"id": job_id, "account": user.account, "gpus": gpus,
                "after": after or [], "expect_code": code, "seconds": seconds}
        return spec, meta

    async def _submit(self, user: User, jobs: list[tuple[dict[str, Any], dict[str, Any]]]
                      ) -> list[str]:
        metas = [meta for _, meta in jobs]
        if len(jobs) == 1:
            outcome, _ = await self._call(user, "submit", "submit",
                                          {"job": jobs[0][0], "id": metas[0]["id"]},
                                          {"jobs": metas})
        else:
            outcome, _ = await self._call(user, "submit", "submit_many",
                                          {"jobs": [s for s, _ in jobs],
                                           "ids": [m["id"] for m in metas]}, {"jobs": metas})
        ids = [m["id"] for m in metas]
        if outcome != "fail":  # an unanswered one may have been taken: it may be cancelled
            for job_id in ids:
                user.live[job_id] = now()
            if user.rng.random() < 0.2:  # cancel one at a random early moment: being placed,
                self._later(self._cancel_after(user, user.rng.choice(ids),  # started, ...
                                               user.rng.uniform(0, 2.5)))
        return ids if outcome == "ok" else []

    def _later(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _cancel_after(self, user: User, job_id: str, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._call(user, "cancel", "cancel", {"id": job_id}, {"id": job_id})

    async def _forget_ended(self, user: User) -> None:
        outcome, result = await self._call(user, "list", "jobs", {"state": "active"}, {})
        if outcome != "ok":
            return
        queued_outcome, queued = await self._call(user, "list", "jobs", {"state": "queued"}, {})
        if queued_outcome != "ok":
            return
        alive = {j["id"] for j in result["jobs"]} | {j["id"] for j in queued["jobs"]}
        for job_id in list(user.live):
            if job_id not in alive and now() - user.live[job_id] > 5:
                del user.live[job_id]

    # -- actions -----------------------------------------------------------------------
    async def single(self, user: User) -> None:
        gpus = user.rng.choice((0, 1, 1, 2))
        await self._submit(user, [self._job(user, gpus=gpus,
                                            seconds=user.rng.uniform(1, 12))])

    async def failing(self, user: User) -> None:
        await self._submit(user, [self._job(user, gpus=1, seconds=user.rng.uniform(0.5, 5),
                                            code=user.rng.choice((1, 3, 42)))])

    async def array(self, user: User) -> None:
        base = f"{user.name}-a{next(self.ids)}"
        await self._submit(user, [self._job(user, gpus=1, seconds=user.rng.uniform(1, 6),
                                            array=(base, i))
                                  for i in range(user.rng.randint(3, 5))])

    async def multinode(self, user: User) -> None:
        # More GPUs than a node has: it must span two.
        await self._submit(user, [self._job(user, gpus=6, nodes=2,
                                            seconds=user.rng.uniform(3, 10))])

    async def chain(self, user: User) -> None:
        first = self._job(user, gpus=1, seconds=user.rng.uniform(1, 5),
                          code=0 if user.rng.random() < 0.8 else 2)
        [a] = await self._submit(user, [first]) or [None]
        if a is None:
            return
        second = self._job(user, gpus=1, seconds=user.rng.uniform(1, 4),
                           after=[("afterok", a)])
        [b] = await self._submit(user, [second]) or [None]
        if b is None:
            return
        await self._submit(user, [self._job(user, gpus=0, seconds=1,
                                            after=[("afterany", b)])])

    async def time_limit(self, user: User) -> None:
        # It outlives its limit: warned a second before, stopped at the limit.
        await self._submit(user, [self._job(user, gpus=1, seconds=30, time_limit_s=3,
                                            warning=True)])

    async def hold(self, user: User) -> None:
        [job_id] = await self._submit(user, [self._job(user, gpus=1, seconds=2)]) or [None]
        if job_id is None:
            return
        await self._call(user, "hold", "hold", {"id": job_id}, {"id": job_id})
        await self._call(user, "update", "update", {"id": job_id, "priority": -1},
                         {"id": job_id})
        await asyncio.sleep(user.rng.uniform(0.5, 4))
        await self._call(user, "release", "release", {"id": job_id}, {"id": job_id})

    async def cancel(self, user: User) -> None:
        if not user.live:
            return
        job_id = user.rng.choice(sorted(user.live))
        await self._call(user, "cancel", "cancel", {"id": job_id}, {"id": job_id})

    async def container(self, user: User) -> None:
        seconds, code = user.rng.uniform(1, 8), user.rng.choice((0, 0, 0, 5))
        fields = self.container_job(seconds, code)
        if fields is None:
            return await self.single(user)
        spec, meta = self._job(user, gpus=1, seconds=seconds, code=code)
        spec.update(fields)
        meta["image"] = True
        await self._submit(user, [(spec, meta)])
        return None

    async def pty(self, user: User) -> None:
        job_id = f"{user.name}-t{next(self.ids)}"
        code = user.rng.choice((0, 7))
        invoked = now()
        rc, ready, error = await asyncio.to_thread(
            self.run_pty, user, job_id, self.job_command(120, 0, True), code)
        meta = {"id": job_id, "account": user.account, "gpus": 1, "after": [],
                "expect_code": code, "pty": True}
        self.history.record(Op(user.name, "pty", invoked, now(), "ok" if ready else "info",
                               {"jobs": [meta], "typed": code}, {"rc": rc}, error))
        if ready:
            user.live[job_id] = invoked


def _small(result: Any) -> dict[str, Any]:
    """What of an answer the history keeps: enough to read, not every job view."""
    if not isinstance(result, dict):
        return {}
    if "job" in result and isinstance(result["job"], dict):
        job = result["job"]
        return {"state": job.get("state"), "restarts": job.get("restarts")}
    if "jobs" in result:
        return {"count": len(result["jobs"])}
    return {}
