"""The nemesis: random, seeded faults that overlap.

Each fault is a coroutine that breaks something and, for faults with a duration, mends it
after a drawn time; a new fault may start while earlier ones are still in force, so a second
lands while the cluster recovers from the first. A daemon that a fault killed is started
again by the supervisor (as systemd's ``Restart=`` would), not by the fault. Every fault is
recorded in the history (kind ``fault``) when it starts and when it is mended.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bench.chaoskit.history import History, Op, now

log = logging.getLogger("chaos.nemesis")

KINDS = ("kill_leader", "kill_standby", "freeze_leader", "cut_leader", "cut_node",
         "kill_noded", "kill_noded_and_jobs", "pg_restart", "xid_fatal", "xid_app",
         "disk_full", "hostile_rpc")


@dataclass
class Target:
    """What the nemesis acts on: the cluster, as functions the soak provides."""

    leader: Callable[[], int | None]  # index of the leading master, if any
    masters: int
    nodes: list[str]
    kill_master: Callable[[int], None]
    freeze_master: Callable[[int], None]
    thaw_master: Callable[[int], None]
    cut: Callable[[str], None]  # a site name: "m0", "n3"
    restore: Callable[[str], None]
    kill_noded: Callable[[str, bool], None]  # node, with its jobs
    pg_restart: Callable[[], Awaitable[None]]
    xid: Callable[[str, int, int], None]  # node, gpu index, xid
    gpu_reset: Callable[[str, int], Awaitable[None]]
    fill_disk: Callable[[str], None]
    free_disk: Callable[[str], None]
    hostile: Callable[[float], Awaitable[int]]  # seconds -> requests sent
    gpus_per_node: int = 4


@dataclass
class Nemesis:
    target: Target
    history: History
    rng: random.Random
    mean_gap_s: float = 6.0
    injected: Counter[str] = field(default_factory=Counter)
    in_force: set[str] = field(default_factory=set)  # sites cut, masters frozen, ...
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, until: float) -> None:
        """Start faults at random until the wall-clock time ``until``; then wait for every
        fault in force to be mended."""
        loop = asyncio.get_running_loop()
        while now() < until:
            await asyncio.sleep(self.rng.uniform(0.4, 1.6) * self.mean_gap_s)
            if now() >= until:
                break
            kind = self.rng.choice(KINDS)
            task = loop.create_task(self._fault(kind))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _fault(self, kind: str) -> None:
        started = now()
        try:
            detail = await getattr(self, kind)()
        except Exception as exc:  # a fault that could not be made is said, not counted
            log.warning("fault %s not injected: %s", kind, exc)
            self.history.record(Op("nemesis", "fault", started, now(), "fail",
                                   {"fault": kind}, error=str(exc)))
            return
        if detail is None:  # nothing to act on now (e.g. no standby running)
            return
        self.injected[kind] += 1
        self.history.record(Op("nemesis", "fault", started, now(), "ok",
                               {"fault": kind, **detail}))

    def _hold(self, key: str) -> bool:
        """Take ``key`` (a site or master) for a fault with a duration; False if another
        fault holds it already (a cut link cannot be cut twice)."""
        if key in self.in_force:
            return False
        self.in_force.add(key)
        return True

    # -- masters -------------------------------------------------------------------------
    async def kill_leader(self) -> dict[str, object] | None:
        leader = self.target.leader()
        if leader is None:
            return None
        self.target.kill_master(leader)
        return {"master": leader}

    async def kill_standby(self) -> dict[str, object] | None:
        leader = self.target.leader()
        others = [i for i in range(self.target.masters) if i != leader]
        if not others:
            return None
        victim = self.rng.choice(others)
        self.target.kill_master(victim)
        return {"master": victim}

    async def _for_a_while(self, key: str, low: float, high: float,
                           start: Callable[[], object], end: Callable[[], object]
                           ) -> float | None:
        """Break ``key`` with ``start`` for a drawn number of seconds, then mend it with
        ``end`` (also when interrupted); None when another fault holds ``key`` already."""
        if not self._hold(key):
            return None
        seconds = self.rng.uniform(low, high)
        try:
            start()
            await asyncio.sleep(seconds)
        finally:
            end()
            self.in_force.discard(key)
        return round(seconds, 1)

    async def freeze_leader(self) -> dict[str, object] | None:
        leader = self.target.leader()
        if leader is None:
            return None
        seconds = await self._for_a_while(f"m{leader}", 2, 20,
                                          lambda: self.target.freeze_master(leader),
                                          lambda: self.target.thaw_master(leader))
        return None if seconds is None else {"master": leader, "seconds": seconds}

    async def cut_leader(self) -> dict[str, object] | None:
        leader = self.target.leader()
        if leader is None:
            return None
        site = f"m{leader}"
        seconds = await self._for_a_while(site, 3, 20, lambda: self.target.cut(site),
                                          lambda: self.target.restore(site))
        return None if seconds is None else {"master": leader, "seconds": seconds}

    # -- nodes ---------------------------------------------------------------------------
    def _node(self) -> str:
        return self.rng.choice(self.target.nodes)

    async def cut_node(self) -> dict[str, object] | None:
        node = self._node()
        # Sometimes past node_lost_s (its jobs requeued, its lease fencing them), mostly not.
        seconds = await self._for_a_while(node, 3, 35, lambda: self.target.cut(node),
                                          lambda: self.target.restore(node))
        return None if seconds is None else {"node": node, "seconds": seconds}

    async def kill_noded(self) -> dict[str, object] | None:
        node = self._node()
        self.target.kill_noded(node, False)
        return {"node": node}

    async def kill_noded_and_jobs(self) -> dict[str, object] | None:
        node = self._node()
        self.target.kill_noded(node, True)
        return {"node": node}

    async def xid_fatal(self) -> dict[str, object] | None:
        node, gpu = self._node(), self.rng.randrange(self.target.gpus_per_node)
        xid = self.rng.choice((48, 79, 74))
        self.target.xid(node, gpu, xid)
        # An operator returns the GPU a while later (trellisctl gpu reset).
        await asyncio.sleep(self.rng.uniform(3, 15))
        await self.target.gpu_reset(node, gpu)
        return {"node": node, "gpu": gpu, "xid": xid}

    async def xid_app(self) -> dict[str, object] | None:
        node, gpu = self._node(), self.rng.randrange(self.target.gpus_per_node)
        self.target.xid(node, gpu, 13)  # an application's error: nothing to do
        return {"node": node, "gpu": gpu, "xid": 13}

    async def disk_full(self) -> dict[str, object] | None:
        node = self._node()
        seconds = await self._for_a_while(f"disk-{node}", 3, 20,
                                          lambda: self.target.fill_disk(node),
                                          lambda: self.target.free_disk(node))
        return None if seconds is None else {"node": node, "seconds": seconds}

    # -- the journal and the clients ----------------------------------------------------
    async def pg_restart(self) -> dict[str, object] | None:
        if not self._hold("pg"):
            return None
        try:
            await self.target.pg_restart()
        finally:
            self.in_force.discard("pg")
        return {}

    async def hostile_rpc(self) -> dict[str, object] | None:
        sent = await self.target.hostile(self.rng.uniform(0.5, 2.0))
        return {"requests": sent}
