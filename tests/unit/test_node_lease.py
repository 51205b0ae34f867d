"""The node lease: a node cut off from every master stops the parts the master would requeue
elsewhere, before the master does.

The pure decision (shared/nodelease.py), the configuration it refuses (shared/config.py),
the node's half on real job parts with a test clock (noded/selffence.py, noded/jobs.py), what
the agent renews it with (noded/agent.py), and the master's half through its feature with
stand-in node sessions (masterd/features/selffence.py, tests/unit/master_fakes.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from masterd.api.metrics import FailureCollector
from masterd.main import MasterDaemon
from masterd.service.master import Master
from noded.agent import NodeAgent
from noded.cgroups import detect_cgroups
from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
from noded.jobs import JobRunner
from noded.selffence import LEASE_FILE, SelfFence
from shared.config import ConfigError, MasterConfig, load_config
from shared.messages import Hello, HelloAck, JobExited, JobReport, PrepareJob, StartJob
from shared.model import Job, JobKind, JobSpec, JobState, NodeAllocation, StopRules
from shared.nodelease import (
    LeasedPart,
    LeaseTerms,
    due,
    fence_after,
    fence_reason,
    lease_margin,
    lease_problem,
    next_due,
)
from shared.protocol import encode_frame
from shared.schema import decode, encode
from tests.unit.helpers import inventory
from tests.unit.master_fakes import Clock, FakeSession, make_master, started, until

TERMS = LeaseTerms(node_lost_s=300.0, margin_s=20.0, max_grace_s=120.0)


def part(job_id: str, requeue: bool = True, grace: float = 10.0) -> LeasedPart:
    return LeasedPart(job_id=job_id, restarts=0, requeue_if_lost=requeue, grace_s=grace)


# -- the decision ------------------------------------------------------------------------------


def test_a_requeueable_part_is_stopped_its_grace_and_the_margin_before_node_lost_s() -> None:
    short, long_, kept = part("short", grace=10), part("long", grace=100), part("kept", False)
    assert fence_after(short, TERMS) == 270.0  # 300 - 20 - 10: dead 20 s before the requeue
    assert fence_after(long_, TERMS) == 180.0
    assert fence_after(kept, TERMS) is None  # --no-requeue: nothing replaces it, it runs on
    # A grace over max_grace_s (launched before a reload lowered it) is capped, as a stop is.
    assert fence_after(part("huge", grace=3000), TERMS) == 160.0
    parts = [short, long_, kept]
    assert due(parts, TERMS, heard=1000.0, now=1179.9) == []
    assert due(parts, TERMS, heard=1000.0, now=1180.0) == [long_]
    assert due(parts, TERMS, heard=1000.0, now=1270.0) == [short, long_]
    assert next_due(parts, TERMS, heard=1000.0) == 1180.0
    assert next_due([kept], TERMS, heard=1000.0) is None
    # Without terms (no master ever heard) or without node loss, nothing is ever stopped.
    assert due(parts, None, heard=None, now=1e9) == [] and next_due(parts, None, None) is None
    off = LeaseTerms(node_lost_s=0.0, margin_s=20.0, max_grace_s=120.0)
    assert due(parts, off, heard=0.0, now=1e9) == [] and next_due(parts, off, 0.0) is None
    assert fence_reason("n1", 270.4, short, TERMS) == (
        "stopped by node n1: no contact with any master for 270 s, and the master requeues "
        "its jobs elsewhere after 300 s (grace 10 s, margin 20 s)")


def test_the_margin_and_the_configuration_it_refuses() -> None:
    assert lease_margin(node_heartbeat_s=10.0, node_fence_margin_s=5.0) == 20.0
    assert lease_problem(300, 120, 10, 5, 30) is None  # the defaults: 170 s needed
    assert lease_problem(170, 120, 10, 5, 30) is None
    assert lease_problem(0, 3600, 10, 5, 30) is None  # no node loss: nothing to keep
    assert lease_problem(169, 120, 10, 5, 30) == (
        "node_lost_s (169) is too short for a node cut off from every master to stop its "
        "requeueable jobs before they are requeued elsewhere: it must be at least node_grace_s "
        "(30) + max_grace_s (120) + 1.5 × node_heartbeat_s (10) + node_fence_margin_s (5) = "
        "170 (or 0: nodes are never declared lost)")
    defaults = MasterConfig()
    assert (defaults.node_lost_s, defaults.max_grace_s, defaults.node_fence_margin_s) == (
        300.0, 120.0, 5.0)
    with pytest.raises(ConfigError, match=r"node_lost_s \(300\) is too short .* = 330 "):
        load_config(MasterConfig, None, "master", max_grace_s=280)


def test_a_reload_that_breaks_the_lease_is_refused_and_the_running_config_kept(
        tmp_path: Path) -> None:
    path = tmp_path / "master.toml"
    path.write_text(f'[master]\nstate_dir = "{tmp_path}"\nmax_grace_s = 60\n')
    daemon = MasterDaemon(load_config(MasterConfig, str(path), "master"), str(path), {})
    path.write_text(f'[master]\nstate_dir = "{tmp_path}"\nmax_grace_s = 290\n')
    assert daemon.reload() is False
    assert daemon.config.max_grace_s == 60
    path.write_text(f'[master]\nstate_dir = "{tmp_path}"\nmax_grace_s = 90\n')
    assert daemon.reload() is True and daemon.config.max_grace_s == 90


# -- the node's half, on real job parts --------------------------------------------------------

SPEC = JobSpec(name="t", command=("sleep", "60"), user="root", kind=JobKind.TRAINING, gpus=1,
               cpus=1)


class Tick:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def runner(tmp_path: Path):  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.skip("runs job parts as root")
    state = tmp_path / "state"
    state.mkdir()
    parent = f"trellis-test-lease-{os.getpid()}"
    cgroups = detect_cgroups(parent, prefer="affinity", state_dir=state / "cgroups")
    gpus = EmulatedGpuBackend(EmulatedGpuConfig(count=2, uuid_seed="n1",
                                                progress_dir=str(state / "gpu-progress")))
    runner = JobRunner("n1", state, cgroups, gpus, allow_root_jobs=True, numa_of={0: 0})
    yield runner
    for p in list(runner.parts.values()):
        if p.state == "running":
            runner._signal(p, 9)


def launch(runner: JobRunner, job_id: str, gpu: int, requeue_if_lost: bool) -> None:
    runner.prepare(PrepareJob(job_id=job_id, spec=SPEC, grace_s=1.0,
                              requeue_if_lost=requeue_if_lost,
                              allocation=NodeAllocation(node="n1", gpus=(gpu,), cpus=(0,))))
    runner.start(StartJob(job_id=job_id, master_addr="127.0.0.1", master_port=1))


async def test_a_silent_node_stops_its_requeueable_part_and_keeps_the_other(
        runner: JobRunner, tmp_path: Path) -> None:
    exits: list[tuple[str, int | None, str]] = []

    async def on_exited(p: Any) -> None:
        exits.append((p.job_id, p.signal, p.reason))

    runner.on_exited = on_exited
    tick = Tick()
    fence = SelfFence("n1", runner, tmp_path / "state", clock=tick)
    launch(runner, "again", 0, requeue_if_lost=True)
    launch(runner, "once", 1, requeue_if_lost=False)
    await until("the jobs' processes", lambda: all(
        (runner.parts[j].dir / "child.json").exists() for j in ("again", "once")), 15)
    assert fence.check() == []  # no master heard yet: no terms, nothing stopped
    fence.learn(LeaseTerms(node_lost_s=30.0, margin_s=4.0, max_grace_s=5.0))
    tick.now += 24.9  # 30 - 4 - its grace of 1 s: due at 25 s of silence
    assert fence.check() == []
    fence.heard()  # a frame from the master: the lease is renewed
    tick.now += 24.9
    assert fence.check() == []
    tick.now += 0.1
    assert fence.check() == ["again"]
    await until("the requeueable part stopped", lambda: runner.parts["again"].state == "exited",
                15)
    assert runner.parts["once"].state == "running"  # --no-requeue: left running
    [(job_id, sig, reason)] = exits
    assert (job_id, sig) == ("again", 15)
    assert reason.startswith("stopped by node n1: no contact with any master for 25 s")
    report = runner.parts["again"].report()
    assert report.fenced and report.state == "exited" and report.reason == reason
    assert not runner.parts["once"].report().fenced
    assert fence.check() == []  # once only
    # Recorded in the part's directory and the lease file: a restarted noded still knows.
    assert json.loads((runner.parts["again"].dir / "fenced.json").read_text()) == {
        "reason": reason}
    runner.parts.clear()
    runner.adopt()
    assert runner.parts["again"].report().fenced and runner.parts["again"].fenced == reason
    saved = json.loads((tmp_path / "state" / LEASE_FILE).read_text())
    assert saved["terms"] == {"node_lost_s": 30.0, "margin_s": 4.0, "max_grace_s": 5.0}


async def test_a_restarted_node_counts_the_silence_from_its_last_contact(
        tmp_path: Path) -> None:
    class NoParts:
        def leased_parts(self) -> list[LeasedPart]:
            return [part("j", grace=1.0)]

        def fence(self, job_id: str, grace_s: float, reason: str) -> bool:
            stopped.append((job_id, grace_s))
            return True

    stopped: list[tuple[str, float]] = []
    wall = [1_700_000_000.0]
    tick = Tick()
    fence = SelfFence("n1", NoParts(), tmp_path, clock=tick,  # type: ignore[arg-type]
                      wall=lambda: wall[0])
    fence.learn(LeaseTerms(node_lost_s=30.0, margin_s=4.0, max_grace_s=5.0))
    # noded goes down 10 s later and starts again 12 s after that, still cut off.
    wall[0] += 22.0
    again = SelfFence("n1", NoParts(), tmp_path, clock=Tick(),  # type: ignore[arg-type]
                      wall=lambda: wall[0])
    assert again.terms == fence.terms and again.silent_s() == pytest.approx(22.0)
    assert again.check() == []
    again.clock = lambda: 5000.0 + 3.0  # 25 s of silence in all: due
    assert again.check() == ["j"] and stopped == [("j", 1.0)]
    # An unreadable file is said, and nothing is stopped until a master is heard.
    (tmp_path / LEASE_FILE).write_text("{nope")
    assert SelfFence("n1", NoParts(), tmp_path).terms is None  # type: ignore[arg-type]


# -- what renews it: the agent -----------------------------------------------------------------


class FakeWs:
    """The agent's WebSocket: hands out queued messages, records pongs."""

    def __init__(self, messages: list[aiohttp.WSMessage]) -> None:
        self.messages = messages
        self.pongs: list[bytes] = []
        self.closed = False

    async def receive(self) -> aiohttp.WSMessage:
        if not self.messages:
            return aiohttp.WSMessage(aiohttp.WSMsgType.CLOSED, None, None)
        return self.messages.pop(0)

    async def pong(self, data: bytes) -> None:
        self.pongs.append(data)

    def exception(self) -> None:
        return None


async def test_the_agent_learns_the_terms_and_every_frame_renews_the_lease() -> None:
    class Runner:
        on_exited: Any = None
        on_stale: Any = None
        parts: dict[str, Any] = {}

        def leased_parts(self) -> list[LeasedPart]:
            return []

    tick = Tick()
    lease = SelfFence("n1", Runner(), None, clock=tick)  # type: ignore[arg-type]
    agent = NodeAgent("http://127.0.0.1:1", lambda: None, Runner(), None,  # type: ignore[arg-type]
                      lease=lease)
    agent._hello_id = 3
    ack = encode(HelloAck(epoch=2, lease=TERMS))
    ping = aiohttp.WSMessage(aiohttp.WSMsgType.PING, b"p", None)
    pong = aiohttp.WSMessage(aiohttp.WSMsgType.PONG, b"", None)
    # Before the ack, frames (a standby's, say) renew nothing.
    ws = FakeWs([ping])
    await agent._receive(ws, asyncio.Event())  # type: ignore[arg-type]
    assert ws.pongs == [b"p"] and lease.heard_at is None and lease.terms is None
    ws = FakeWs([aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, encode_frame("ack", 3, ack),
                                   None)])
    await agent._receive(ws, asyncio.Event())  # type: ignore[arg-type]
    assert lease.terms == TERMS and lease.heard_at == 5000.0 and agent.fence.epoch == 2
    tick.now += 7.0
    ws = FakeWs([pong])  # the answer to the agent's own heartbeat ping
    await agent._receive(ws, asyncio.Event())  # type: ignore[arg-type]
    assert lease.heard_at == 5007.0
    tick.now += 3.0
    ws = FakeWs([ping])  # the master's ping, answered
    await agent._receive(ws, asyncio.Event())  # type: ignore[arg-type]
    assert lease.heard_at == 5010.0 and ws.pongs == [b"p"]
    # The heartbeat giving up (an error made here, not a frame of the master) renews nothing.
    tick.now += 9.0
    ws = FakeWs([aiohttp.WSMessage(aiohttp.WSMsgType.ERROR, aiohttp.ServerTimeoutError("x"),
                                   None)])
    await agent._receive(ws, asyncio.Event())  # type: ignore[arg-type]
    assert lease.heard_at == 5010.0
    # A master without node loss: no terms, nothing will be stopped.
    agent._acked = False
    await agent._dispatch(encode_frame("ack", 3, {"epoch": 2}))
    assert lease.terms is None


# -- the master's half -------------------------------------------------------------------------

NODES = {"g1": (4, 8), "g2": (4, 8)}


def spec(name: str, **kw: Any) -> JobSpec:
    return JobSpec(name=name, command=("train",), user="nobody", gpus=4, cpus=1, max_nodes=1,
                   **kw)


async def running(master: Master, sessions: dict[str, FakeSession], job_id: str) -> str:
    job = master.core.jobs[job_id]
    await until(f"{job_id} launched", lambda: job.placement is not None and any(
        s.job_id == job_id for s in sessions[job.placement.nodes[0]].commands("start_job")))
    assert job.placement is not None
    node = job.placement.nodes[0]
    await started(master, node, job_id)
    return node


def prepared(sessions: dict[str, FakeSession], node: str, job_id: str) -> PrepareJob:
    return [c for c in sessions[node].commands("prepare_job") if c.job_id == job_id][-1]


def kinds(master: Master, job_id: str | None = None) -> list[tuple[str | None, str]]:
    return [(e.node, e.kind) for e in master.store.events(job_id, 0, 10_000)]


async def test_the_master_gives_its_terms_and_says_which_parts_it_would_requeue(
        tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), NODES, max_requeues=1, stop_grace_s=7,
                                   max_grace_s=60)
    try:
        ack = decode(HelloAck, master.hello_ack())
        # (and its clock, against which a node judges a command's deadline)
        assert ack == HelloAck(epoch=master.leadership.epoch, lease=LeaseTerms(
            node_lost_s=300.0, margin_s=20.0, max_grace_s=60.0), time=master.clock())
        again = await master.submit(spec("again", stop=StopRules(grace_s=90)))
        node = await running(master, sessions, again.id)
        cmd = prepared(sessions, node, again.id)
        assert cmd.requeue_if_lost is True and cmd.grace_s == 60.0  # capped by max_grace_s
        once = await master.submit(spec("once", stop=StopRules(requeue=False)))
        node = await running(master, sessions, once.id)
        cmd = prepared(sessions, node, once.id)
        assert cmd.requeue_if_lost is False and cmd.grace_s == 7.0
        # A job that used up max_requeues would end node_lost: its part is left running too.
        assert master.features.leases.requeue_if_lost(again) is True
        again.restarts = 1
        assert master.features.leases.requeue_if_lost(again) is False
    finally:
        await master.close()
    off, _ = make_master(tmp_path / "off", Clock(), NODES, node_lost_s=0)
    try:
        assert decode(HelloAck, off.hello_ack()).lease is None
        assert off.features.leases.requeue_if_lost(Job(id="x", spec=spec("x"),
                                                       submit_time=0.0)) is False
    finally:
        await off.close()


async def test_a_part_its_node_stopped_requeues_the_job_as_a_node_loss_would(
        tmp_path: Path) -> None:
    """A master outage shorter than node_lost_s but longer than the lease: the node stopped
    the part; when it says hello again the master requeues the job (not a failure)."""
    master, sessions = make_master(tmp_path, Clock(), NODES)
    try:
        job = await master.submit(spec("train"))
        node = await running(master, sessions, job.id)
        master.node_disconnected(sessions[node])  # type: ignore[arg-type]
        reason = ("stopped by node g1: no contact with any master for 270 s, and the master "
                  "requeues its jobs elsewhere after 300 s (grace 10 s, margin 20 s)")
        returning = FakeSession(node)
        await master.node_hello(returning, Hello(  # type: ignore[arg-type]
            inventory=inventory(node, gpus=4, cpus=8, numa=1), epoch=1, jobs=(JobReport(
                job_id=job.id, state="exited", signal=15, restarts=0, fenced=True,
                reason=reason),)))
        sessions[node] = returning
        await until("requeued", lambda: job.restarts == 1)
        assert "requeued (restart 1 of at most 5)" in job.reason and reason in job.reason
        await until("forgotten on its node", lambda: returning.commands("forget_job"))
        assert returning.commands("forget_job")[0].restarts == 0
        await until("running again", lambda: job.state is JobState.STARTING)
        events = kinds(master, job.id)
        assert (node, "part_fenced") in events and (node, "part_lost") in events
        assert (None, "requeue_requested") in events and (None, "requeued") in events
        assert not any(k == "failed" for _, k in events)
        fenced = [e for e in master.store.events(job.id, 0, 1000) if e.kind == "part_fenced"]
        assert fenced[0].detail == {"restarts": 0, "reason": reason, "exit_code": None,
                                    "signal": 15, "part": "mine"}
        assert (master.features.leases.requeued, master.features.leases.fenced) == (1, 1)
        metrics = {(s.name, s.labels.get("cause")): s.value
                   for family in FailureCollector(master).collect() for s in family.samples}
        assert metrics[("trellis_parts_fenced_total", None)] == 1
        assert metrics[("trellis_jobs_requeued_total", "node_fenced")] == 1
        assert metrics[("trellis_jobs_requeued_total", "node_lost")] == 0
    finally:
        await master.close()


async def test_a_fenced_exit_of_a_job_already_requeued_is_journalled_and_forgotten(
        tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), NODES)
    try:
        job = await master.submit(spec("train"))
        node = await running(master, sessions, job.id)
        master.node_disconnected(sessions[node])  # type: ignore[arg-type]
        await master.features.nodeloss.lose(node)  # declared lost: requeued elsewhere
        assert job.restarts == 1
        returning = FakeSession(node)
        await master.node_hello(returning, Hello(  # type: ignore[arg-type]
            inventory=inventory(node, gpus=4, cpus=8, numa=1), epoch=1, jobs=(JobReport(
                job_id=job.id, state="exited", signal=15, restarts=0, fenced=True,
                reason="stopped by node g1"),)))
        await until("forgotten", lambda: returning.commands("forget_job"))
        events = kinds(master, job.id)
        assert (node, "part_fenced") in events and (node, "stale_part_exited") in events
        assert job.restarts == 1 and master.features.leases.requeued == 0
        # An exit the node reports fenced over a live session is settled the same way.
        await until("placed again", lambda: job.placement is not None)
        other = job.placement.nodes[0]  # type: ignore[union-attr]
        await started(master, other, job.id)
        await master.node_event(other, "job_exited", JobExited(
            job_id=job.id, signal=15, restarts=1, fenced=True, reason="stopped by node g2"))
        await until("requeued again", lambda: job.restarts == 2)
        assert job.state is not JobState.FAILED
    finally:
        await master.close()
