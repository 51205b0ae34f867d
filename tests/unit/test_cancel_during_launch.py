"""A cancel acknowledged while a job's launch is in flight is honoured by every later step of
the launch: a failed prepare or start ends the job cancelled (it is never requeued and run
elsewhere), a prepare that succeeds after the cancel is never followed by a start, and a
part whose start crossed the cancel is stopped again when the node reports it running.

The nodes are scripted sessions whose commands wait until the test answers them, so each
race is played in a fixed order (the soak, bench/chaos.py, plays them at random)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from masterd.core.policies import make_policy
from masterd.core.scheduler import SchedulingCore
from masterd.service.master import Master
from masterd.service.sessions import CommandFailed
from shared.messages import NODE_COMMANDS, Hello
from shared.model import Job, JobSpec, JobState
from shared.schema import decode
from tests.unit.helpers import inventory
from tests.unit.master_fakes import Clock, exited, make_master, started, until

NODES = {"g1": (4, 8), "g2": (4, 8)}


def spec(name: str = "train") -> JobSpec:
    return JobSpec(name=name, command=("train",), user="nobody", gpus=4, cpus=1,
                   max_nodes=1)


class HeldSession:
    """A node whose commands of the held kinds wait until the test answers them."""

    def __init__(self, name: str, held: set[str]) -> None:
        self.name = name
        self.held = held
        self.sent: list[tuple[str, Any]] = []
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.silent_s = 0.0

    async def request(self, type_: str, body: Any, timeout_s: float = 5.0) -> dict[str, Any]:
        if isinstance(body, dict):
            body = decode(NODE_COMMANDS[type_], body)
        self.sent.append((type_, body))
        if type_ in self.held:
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self.waiting[type_] = future
            return await future
        if type_ == "prepare_job":
            return {"port": 29500}
        if type_ == "start_job":
            return {"pid": 4242}
        return {}

    def answer(self, type_: str, result: dict[str, Any] | BaseException) -> None:
        future = self.waiting.pop(type_)
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    def commands(self, type_: str) -> list[Any]:
        return [body for t, body in self.sent if t == type_]


def held_master(tmp_path: Path, held: set[str]) -> tuple[Master, dict[str, HeldSession]]:
    master, fakes = make_master(tmp_path, Clock(), NODES)
    sessions = {name: HeldSession(name, held) for name in fakes}
    master.sessions.update(sessions)  # type: ignore[arg-type]
    return master, sessions


def kinds(master: Master, job_id: str) -> list[str]:
    return [e.kind for e in master.store.events(job_id, 0, 10_000)]


def queued_reasons(master: Master, job_id: str) -> list[str]:
    """Why the job went back to the queue, each time."""
    return [e.detail.get("reason", "") for e in master.store.events(job_id, 0, 10_000)
            if e.kind == "queued"]


async def placed_on(master: Master, sessions: dict[str, HeldSession], job: Job,
                    command: str) -> HeldSession:
    """The node the job was placed on, once ``command`` is waiting there."""
    return await until(f"{command} of {job.id} in flight", lambda: next(
        (s for s in sessions.values() if command in s.waiting), None))


@pytest.mark.parametrize("failure", [
    CommandFailed("g1", "prepare_job", "timeout", "no answer within 5 s"),
    CommandFailed("g1", "prepare_job", "node_unreachable", "the node is not connected"),
    CommandFailed("g1", "prepare_job", "cgroup_failed", "the node refused"),
], ids=["timeout", "closed", "error"])
async def test_a_job_cancelled_while_its_prepare_is_in_flight_ends_cancelled_when_it_fails(
        tmp_path: Path, failure: CommandFailed) -> None:
    master, sessions = held_master(tmp_path, {"prepare_job"})
    try:
        job = await master.submit(spec())
        node = await placed_on(master, sessions, job, "prepare_job")
        await master.cancel(job.id)  # acknowledged while the prepare waits
        assert job.state is JobState.STARTING and job.reason == "cancelled"
        node.answer("prepare_job", failure)
        await until("the job ended", lambda: job.state.terminal)
        assert job.state is JobState.CANCELLED and job.reason == "cancelled"
        assert job.restarts == 0 and job.start_failures == 0
        # Nothing was ever started, here or anywhere else, and it is not placed again.
        await asyncio.sleep(0.05)
        assert not any(s.commands("start_job") for s in sessions.values())
        assert [len(s.commands("prepare_job")) for s in sessions.values()].count(1) == 1
        assert "placed" not in kinds(master, job.id)[kinds(master, job.id).index(
            "cancel_requested"):]
        assert kinds(master, job.id)[-1] == "cancelled"
        assert master.core.cluster.allocation(job.id) is None  # its GPUs are free
    finally:
        await master.close()


async def test_a_prepare_that_succeeds_after_the_cancel_is_never_started(
        tmp_path: Path) -> None:
    master, sessions = held_master(tmp_path, {"prepare_job"})
    try:
        job = await master.submit(spec())
        node = await placed_on(master, sessions, job, "prepare_job")
        await master.cancel(job.id)
        node.answer("prepare_job", {"port": 29500})
        await until("the job ended", lambda: job.state.terminal)
        assert job.state is JobState.CANCELLED
        assert not node.commands("start_job")
        # The prepared part was dropped on its node.
        assert node.commands("stop_job")
    finally:
        await master.close()


async def test_a_failed_start_after_the_cancel_ends_the_job_cancelled(
        tmp_path: Path) -> None:
    master, sessions = held_master(tmp_path, {"start_job"})
    try:
        job = await master.submit(spec())
        node = await placed_on(master, sessions, job, "start_job")
        cancel = asyncio.ensure_future(master.cancel(job.id))
        await until("the cancel journalled", lambda: "cancel_requested" in kinds(master, job.id))
        node.answer("start_job", CommandFailed(node.name, "start_job", "timeout",
                                               "no answer within 5 s"))
        await asyncio.wait_for(cancel, 5)
        await until("the job ended", lambda: job.state.terminal)
        assert job.state is JobState.CANCELLED and job.restarts == 0
        await asyncio.sleep(0.05)
        assert sum(len(s.commands("prepare_job")) for s in sessions.values()) == 1
    finally:
        await master.close()


async def test_a_part_whose_start_crossed_the_cancel_is_stopped_again(
        tmp_path: Path) -> None:
    master, sessions = held_master(tmp_path, {"start_job"})
    try:
        job = await master.submit(spec())
        node = await placed_on(master, sessions, job, "start_job")
        cancel = asyncio.ensure_future(master.cancel(job.id))
        # The cancel's stop reached the node before its start did (it dropped nothing).
        stops = len(await until("the cancel's stop", lambda: node.commands("stop_job")))
        node.answer("start_job", {"pid": 4242})
        await asyncio.wait_for(cancel, 5)
        await started(master, node.name, job.id)
        await until("a stop after the start", lambda: len(node.commands("stop_job")) > stops)
        assert job.stopping and job.end_as == JobState.CANCELLED.value
    finally:
        await master.close()


def test_the_core_ends_a_stopped_job_whose_launch_failed_as_it_was_asked_to_end() -> None:
    core = SchedulingCore(make_policy("fifo"))
    core.node_up(inventory("g1", gpus=4, cpus=8, numa=1))
    core.node_up(inventory("g2", gpus=4, cpus=8, numa=1))
    cancelled = Job(id="c", spec=spec("c"), submit_time=0.0)
    requeued = Job(id="r", spec=spec("r"), submit_time=0.0)
    core.submit(cancelled)
    core.submit(requeued)
    assert {d.job_id for d in core.schedule(1.0)} == {"c", "r"}
    core.stop("c", JobState.CANCELLED, "cancelled", 2.0)
    core.requeue("r", "node g1 lost", 2.0)
    done = core.start_failed("c", "prepare_job failed (timeout)", 3.0)
    assert done is not None and done.state is JobState.CANCELLED
    assert cancelled.end_time == 3.0 and cancelled.start_failures == 0
    again = core.start_failed("r", "prepare_job failed (timeout)", 3.0)
    assert again is not None and again.state is JobState.QUEUED
    assert requeued.restarts == 1 and requeued.end_as == ""
    assert core.cluster.allocation("c") is None
    assert [j.id for j in core.queue()] == ["r"]


async def test_a_cancel_during_a_start_in_flight_is_acknowledged_once_the_start_settled(
        tmp_path: Path) -> None:
    """The start may reach its node after the cancel was processed: the cancel answers only
    once the launch has settled, so that nothing starts after its acknowledgement."""
    master, sessions = held_master(tmp_path, {"start_job"})
    try:
        job = await master.submit(spec())
        node = await placed_on(master, sessions, job, "start_job")
        [start] = node.commands("start_job")
        # The start carries the moment the master stops waiting for it, before its timeout.
        assert start.expires_at is not None
        assert master.clock() < start.expires_at < master.clock() + \
            master.config.command_timeout_s
        cancel = asyncio.ensure_future(master.cancel(job.id))
        await until("the cancel journalled", lambda: "cancel_requested" in kinds(master, job.id))
        await asyncio.sleep(0.05)
        assert not cancel.done()  # the start is still in flight
        node.answer("start_job", CommandFailed(node.name, "start_job", "expired", "too late"))
        await asyncio.wait_for(cancel, 5)
        await until("the job ended", lambda: job.state.terminal)
        assert job.state is JobState.CANCELLED
    finally:
        await master.close()


async def test_a_node_refuses_a_start_it_reads_after_the_masters_deadline() -> None:
    """noded judges StartJob.expires_at in the master's time, by the clock offset its last
    hello ack measured; before any ack it cannot judge and takes the command."""
    import time

    from noded.agent import NodeAgent
    from shared.protocol import encode_frame
    from shared.schema import encode
    from tests.unit.agent_fakes import SentFrames

    class Runner:
        on_exited: Any = None
        parts: dict[str, Any] = {}
        started: list[str] = []

        def start(self, cmd: Any) -> dict[str, Any]:
            self.started.append(cmd.job_id)
            return {"pid": 1}

        async def until_forked(self, job_id: str, timeout_s: float = 10.0) -> None:
            pass

    from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig

    backend = EmulatedGpuBackend(EmulatedGpuConfig(count=1, uuid_seed="deadline"))
    runner = Runner()
    try:
        agent = NodeAgent("http://127.0.0.1:1", lambda: None, runner, backend)  # type: ignore[arg-type]
        ws = SentFrames()
        agent.ws = ws  # type: ignore[assignment]
        agent._job_started = lambda *a, **k: asyncio.sleep(0)  # type: ignore[method-assign]
        # The master's clock runs 100 s ahead of this node's.
        agent._hello_acked({"epoch": 0, "time": time.time() + 100})
        master_now = time.time() + 100

        def start(id_: int, job: str, expires_at: float) -> bytes:
            return encode_frame("start_job", id_, encode(StartJob(
                job_id=job, master_addr="127.0.0.1", master_port=1, expires_at=expires_at)))

        from shared.messages import StartJob

        await agent._dispatch(start(2, "late", master_now - 1))  # the master gave up on it
        await agent._dispatch(start(4, "in-time", master_now + 4))
        replies = ws.replies()
        assert replies[2]["type"] == "error" and replies[2]["body"]["code"] == "expired"
        assert replies[4]["type"] == "ack"
        assert runner.started == ["in-time"]
    finally:
        backend.close()


async def test_a_cancelled_job_whose_node_is_then_lost_ends_cancelled(tmp_path: Path) -> None:
    """Node loss requeues a job, unless its cancel came first: the cancel stands."""
    master, fakes = make_master(tmp_path, Clock(), NODES)
    try:
        job = await master.submit(spec())
        await until("the launch", lambda: any(s.commands("start_job") for s in fakes.values()))
        [node] = job.placement.nodes  # type: ignore[union-attr]
        await started(master, node, job.id)
        await master.cancel(job.id)  # its stop cannot reach the node: it is cut off
        master.node_disconnected(fakes[node])  # type: ignore[arg-type]
        master.clock.now += 300  # type: ignore[attr-defined]
        await master.features.nodeloss.lose(node)
        await until("the job ended", lambda: job.state.terminal)
        assert job.state is JobState.CANCELLED and job.restarts == 0
        assert "requeued" not in kinds(master, job.id)
    finally:
        await master.close()


async def test_a_restarted_master_ends_a_job_cancelled_during_its_launch_cancelled(
        tmp_path: Path) -> None:
    """A failover between the cancel and the launch's end: the next master reads the
    journalled cancel, and the launch it finds half done (a part prepared) ends the job
    cancelled instead of requeueing it."""
    from shared.messages import Hello, JobReport

    clock = Clock()
    master, sessions = held_master(tmp_path, {"prepare_job"})
    try:
        job = await master.submit(spec())
        node = await placed_on(master, sessions, job, "prepare_job")
        await master.cancel(job.id)
    finally:
        await master.close()  # dies with the prepare unanswered
    again, fakes = make_master(tmp_path, clock, {})
    try:
        restored = again.core.jobs[job.id]
        assert restored.state is JobState.STARTING and restored.end_as == "cancelled"
        fakes[node.name] = sessions[node.name]  # type: ignore[assignment]
        again.sessions[node.name] = sessions[node.name]  # type: ignore[assignment]
        await again.node_hello(sessions[node.name], Hello(  # type: ignore[arg-type]
            inventory=inventory(node.name, gpus=4, cpus=8, numa=1),
            jobs=(JobReport(job_id=job.id, state="prepared"),)))
        await until("the job ended", lambda: restored.state.terminal)
        assert restored.state is JobState.CANCELLED and restored.restarts == 0
        await asyncio.sleep(0.05)
        assert not again.core.queue()
    finally:
        await again.close()


async def test_an_unanswered_start_keeps_the_job_off_other_nodes_until_its_part_is_gone(
        tmp_path: Path) -> None:
    """Found by the soak: a start whose answer was lost (the connection closed) had been
    carried out, and the job requeued as a refused start ran on a second node beside it.
    Now it is requeued as after a node loss: once its part is known to have exited."""
    from shared.messages import Hello, JobReport

    master, sessions = held_master(tmp_path, {"start_job"})
    try:
        job = await master.submit(spec())
        node = await placed_on(master, sessions, job, "start_job")
        node.answer("start_job", CommandFailed(node.name, "start_job", "node_unreachable",
                                               "connection closed", unknown_outcome=True))
        await until("the requeue asked", lambda: "requeue_requested" in kinds(master, job.id))
        master.node_disconnected(node)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        # Still holding its placement: nothing else was prepared anywhere.
        assert job.state is JobState.STARTING and job.end_as == JobState.QUEUED.value
        assert sum(len(s.commands("prepare_job")) for s in sessions.values()) == 1
        # The node comes back: its part did start, and it reports it.
        node.held = set()
        master.sessions[node.name] = node  # type: ignore[assignment]
        await master.node_hello(node, Hello(  # type: ignore[arg-type]
            inventory=inventory(node.name, gpus=4, cpus=8, numa=1),
            jobs=(JobReport(job_id=job.id, state="running", pid=4242, restarts=0),)))
        await until("the stop of the part that ran", lambda: node.commands("stop_job"))
        assert job.state is not JobState.QUEUED  # not before its part exited
        await exited(master, node.name, job.id, code=None, signal=15)
        await until("the relaunch", lambda: job.restarts == 1
                    and sum(len(s.commands("prepare_job")) for s in sessions.values()) == 2)
    finally:
        await master.close()


def launches() -> list[asyncio.Task[object]]:
    """The master's launches running now (each a Master._launch task)."""
    return [t for t in asyncio.all_tasks()
            if getattr(t.get_coro(), "__qualname__", "") == "Master._launch"]


async def test_a_job_preempted_while_its_prepare_is_in_flight_is_queued_again_unstarted(
        tmp_path: Path) -> None:
    """Quota reclaim (or SODA's placer) preempts a job its master is still launching: it
    is never started, and it goes back to the queue as a preempted job, not as a failed
    start (three of those in the chaos soak, seed 1, failed it for good)."""
    from masterd.core.policy import Preempt

    master, sessions = held_master(tmp_path, {"prepare_job"})
    record = master._record

    async def slow_record(transition: Any, node: str | None = None) -> None:
        # The journal is slow: a pass runs while the requeue is being written (in the soak
        # it placed the job again before the failed launch had returned).
        if transition.state is JobState.QUEUED:
            master.request_pass()
            await asyncio.sleep(0.05)
        await record(transition, node)

    master._record = slow_record  # type: ignore[method-assign]
    try:
        job = await master.submit(spec())
        node = await placed_on(master, sessions, job, "prepare_job")
        [first_launch] = launches()
        assert master.preempt(Preempt(job.id, "reclaimed: the owner needs its quota"))
        node.answer("prepare_job", {"port": 29500})
        await until("the requeue journalled", lambda: queued_reasons(master, job.id))
        assert not any(s.commands("start_job") for s in sessions.values())
        assert job.start_failures == 0
        assert queued_reasons(master, job.id) == ["preempted: reclaimed: the owner needs its quota"]
        # Placed again at once: the new launch is the master's own, however the old one
        # ended (it once cleared the new one's marker, and a hello from the node then
        # aborted the new launch as if the master had restarted: two parts ran at once).
        await until("the second launch", lambda: sum(
            len(s.commands("prepare_job")) for s in sessions.values()) == 2)
        again = await placed_on(master, sessions, job, "prepare_job")
        await until("the first launch returned", first_launch.done)
        assert job.id in master._launching and job.attempts == 2
        await master.node_hello(again, Hello(  # type: ignore[arg-type]
            inventory=inventory(again.name, gpus=4, cpus=8, numa=1)))
        assert job.state is JobState.STARTING and len(queued_reasons(master, job.id)) == 1
    finally:
        await master.close()


async def test_a_start_refused_because_a_preemption_dropped_the_part_is_no_failure(
        tmp_path: Path) -> None:
    from masterd.core.policy import Preempt

    master, sessions = held_master(tmp_path, {"start_job"})
    try:
        job = await master.submit(spec())
        node = await placed_on(master, sessions, job, "start_job")
        assert master.preempt(Preempt(job.id, "reclaimed: the owner needs its quota"))
        # The preemption's stop reached the prepared part first: the node dropped it.
        node.answer("start_job", CommandFailed(node.name, "start_job", "not_prepared",
                                               f"job {job.id} was not prepared"))
        await until("the job queued again", lambda: job.state is JobState.QUEUED
                    or len(node.commands("prepare_job")) > 1)
        assert job.start_failures == 0
        assert queued_reasons(master, job.id) == ["preempted: reclaimed: the owner needs its quota"]
    finally:
        await master.close()
