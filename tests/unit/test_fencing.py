"""Fencing to the node: epochs and incarnations, judged by the master and enforced by noded.

The pure rules (masterd/core/fencing.py), the node's persisted epoch and its command checks
(noded/fencing.py, noded/agent.py), the node's incarnation rules on real job parts
(noded/jobs.py), and the master's side through its fencing feature with stand-in node
sessions (tests/unit/master_fakes.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from masterd.api.nodeguard import check_event
from masterd.core.fencing import Verdict, judge_part, missing_resources, placed_on_missing
from masterd.core.timelimits import grace_for
from masterd.service.master import Master
from noded.agent import NodeAgent, StaleMaster
from noded.cgroups import detect_cgroups
from noded.fencing import EPOCH_FILE, EpochFence
from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
from noded.jobs import JobRefused, JobRunner
from shared.messages import (
    NODE_COMMANDS,
    Hello,
    JobExited,
    JobReport,
    JobStarted,
    PrepareJob,
    StalePart,
    StartJob,
)
from shared.model import JobKind, JobSpec, JobState, NodeAllocation, Placement, StopRules
from shared.protocol import ProtocolError, encode_frame, error_body
from shared.schema import encode
from tests.unit.helpers import inventory, job, writer_sleep
from tests.unit.master_fakes import Clock, FakeSession, exited, make_master, started, until

# -- the pure rules ------------------------------------------------------------------------


def placed(job_id: str, node: str = "n1", restarts: int = 0, state: JobState = JobState.RUNNING,
           gpus: tuple[int, ...] = (0,), cpus: tuple[int, ...] = (0,)):  # type: ignore[no-untyped-def]
    j = job(job_id)
    j.state, j.restarts = state, restarts
    j.placement = Placement((NodeAllocation(node=node, gpus=gpus, cpus=cpus),))
    j.node_states = {node: "running"}
    return j


def test_the_master_owns_one_incarnation_on_the_nodes_it_placed() -> None:
    j = placed("train", restarts=2)
    assert judge_part(j, "train", "n1", 2).mine
    stale = judge_part(j, "train", "n1", 1)
    assert stale.verdict is Verdict.STALE
    assert stale.reason == ("part train#1 on node n1 is stale: job train was requeued and is "
                            "incarnation 2 now")
    assert judge_part(j, "train", "n1", 3).verdict is Verdict.FOREIGN  # never made
    elsewhere = judge_part(j, "train", "n2", 2)
    assert elsewhere.verdict is Verdict.FOREIGN and "never placed it" in elsewhere.reason
    unknown = judge_part(None, "ghost", "n1", 0)
    assert unknown.verdict is Verdict.FOREIGN and "no job the master knows" in unknown.reason
    for state in (JobState.QUEUED, JobState.FAILED, JobState.CANCELLED, JobState.NODE_LOST):
        ended = judge_part(placed("train", state=state), "train", "n1", 0)
        assert ended.verdict is Verdict.ENDED and state.value in ended.reason


def test_missing_resources_name_what_is_gone_in_one_sentence() -> None:
    small = inventory("n1", gpus=2, cpus=4)
    alloc = NodeAllocation(node="n1", gpus=(1, 2, 3), cpus=(0, 1))
    assert missing_resources(small, alloc) == ("GPUs 2, 3 of node n1 no longer exist (the node "
                                               "returned with 2 GPUs and 4 cores)")
    assert missing_resources(small, NodeAllocation(node="n1", gpus=(3,), cpus=())) == (
        "GPU 3 of node n1 no longer exists (the node returned with 2 GPUs and 4 cores)")
    cores = NodeAllocation(node="n1", gpus=(0,), cpus=(2, 3, 4, 5, 6, 9))
    assert missing_resources(small, cores) == ("cores 4-6, 9 of node n1 no longer exist (the "
                                               "node returned with 2 GPUs and 4 cores)")
    assert missing_resources(small, NodeAllocation(node="n1", gpus=(0, 1), cpus=(3,))) is None
    jobs = [placed("fits", gpus=(0,)), placed("gone", gpus=(1, 3)),
            placed("queued", gpus=(3,), state=JobState.QUEUED),
            placed("other", node="n2", gpus=(7,))]
    assert [(j.id, "GPU 3" in why) for j, why in placed_on_missing(jobs, small)] == [
        ("gone", True)]


# -- the node's epoch -------------------------------------------------------------------------


def test_the_node_keeps_the_newest_epoch_across_restarts(tmp_path: Path) -> None:
    fence = EpochFence(tmp_path)
    assert fence.epoch == 0
    fence.admit(3, "prepare_job")
    assert json.loads((tmp_path / EPOCH_FILE).read_text())["epoch"] == 3
    assert fence.learn(2) is False and fence.epoch == 3  # never goes back
    again = EpochFence(tmp_path)  # noded restarted
    assert again.epoch == 3
    with pytest.raises(JobRefused) as refused:
        again.admit(2, "stop_job")
    assert refused.value.code == "stale_epoch"
    assert refused.value.message == ("stop_job from master epoch 2 refused: this node has seen "
                                     "epoch 3, so a newer master leads")
    again.admit(3, "stop_job")  # the same master goes on
    again.admit(4, "stop_job")
    assert EpochFence(tmp_path).epoch == 4


def test_an_unreadable_epoch_file_is_said_and_an_unwritable_one_refuses(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / EPOCH_FILE).write_text("{not json")
    with caplog.at_level(logging.ERROR, logger="trellis.node.fencing"):
        assert EpochFence(tmp_path).epoch == 0
    assert "unreadable" in caplog.text
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    fence = EpochFence(blocked)
    blocked.chmod(0o500)
    try:
        if os.access(blocked, os.W_OK):  # root ignores the mode: a file where the dir is
            fence = EpochFence(tmp_path / EPOCH_FILE)
        with pytest.raises(JobRefused) as refused:
            fence.admit(7, "start_job")
        assert refused.value.code == "epoch_not_recorded"
        assert fence.epoch == 0  # not obeyed: a restart would forget it
    finally:
        blocked.chmod(0o700)


# -- the node's command channel ---------------------------------------------------------------

SPEC = JobSpec(name="t", command=("sleep", "60"), user="root", kind=JobKind.TRAINING, gpus=1,
               cpus=1)
ALLOC = NodeAllocation(node="n1", gpus=(0,), cpus=(0,))
# One valid body of every command a master sends; a new command must be added here, so the
# test below shows that it too is refused from an older epoch.
BODIES: dict[str, dict[str, Any]] = {
    "prepare_job": encode(PrepareJob(job_id="j", spec=SPEC, allocation=ALLOC)),
    "start_job": {"job_id": "j", "master_addr": "127.0.0.1", "master_port": 29500},
    "stop_job": {"job_id": "j"},
    "forget_job": {"job_id": "j"},
    "signal_job": {"job_id": "j", "signal": "SIGUSR1"},
    "read_log": {"job_id": "j"},
    "reset_gpu": {"index": 0},
    "list_parts": {},
    "relay_open": {"stream": 1, "job_id": "j", "kind": "pty", "window": 1 << 20},
}


class RecordingRunner:
    """Stands in for JobRunner: records what reaches it (nothing must, from an old epoch)."""

    def __init__(self) -> None:
        self.on_exited: Any = None
        self.on_stale: Any = None
        self.parts: dict[str, Any] = {}
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kw: Any) -> Any:
            self.calls.append(name)
            return {"port": 0} if name == "prepare" else {"pid": 1} if name == "start" else False
        return record


def agent_for(tmp_path: Path) -> tuple[NodeAgent, RecordingRunner, list[dict[str, Any]]]:
    runner = RecordingRunner()
    agent = NodeAgent("http://127.0.0.1:1", lambda: None, runner, None,  # type: ignore[arg-type]
                      fence=EpochFence(tmp_path))
    sent: list[dict[str, Any]] = []

    async def put(type_: str, body: dict[str, Any], id_: int | None = None) -> None:
        sent.append({"type": type_, "id": id_, "body": body})

    agent._put = put  # type: ignore[method-assign]
    return agent, runner, sent


def test_every_command_carries_an_epoch() -> None:
    assert set(BODIES) == set(NODE_COMMANDS)
    for name, schema in NODE_COMMANDS.items():
        assert "epoch" in {f.name for f in dataclasses.fields(schema)}, name


@pytest.mark.parametrize("command", sorted(NODE_COMMANDS))
async def test_a_command_from_an_older_epoch_is_refused(tmp_path: Path, command: str) -> None:
    agent, runner, sent = agent_for(tmp_path)
    agent.fence.learn(5)
    await agent._dispatch(encode_frame(command, 8, {**BODIES[command], "epoch": 4}))
    await asyncio.sleep(0)  # a read_log answers from a task of its own
    assert runner.calls == []
    assert sent == [{"type": "error", "id": 8, "body": error_body(
        "stale_epoch", f"{command} from master epoch 4 refused: this node has seen epoch 5, "
        "so a newer master leads")}]


async def test_a_newer_epoch_is_learnt_before_the_command_runs(tmp_path: Path) -> None:
    agent, runner, sent = agent_for(tmp_path)
    await agent._dispatch(encode_frame("stop_job", 2, {"job_id": "j", "epoch": 6}))
    assert runner.calls == ["stop"] and sent[0]["type"] == "ack"
    assert EpochFence(tmp_path).epoch == 6
    # The hello's ack names the master's epoch; a refusal of the hello for a stale epoch
    # sends the node to its next master.
    agent._hello_id = 11
    await agent._dispatch(encode_frame("ack", 11, {"epoch": 9}))
    assert agent.fence.epoch == 9 and EpochFence(tmp_path).epoch == 9
    with pytest.raises(StaleMaster):
        await agent._dispatch(encode_frame("error", 11, error_body("stale_epoch", "older")))


# -- the node's incarnations, on real job parts -------------------------------------------------


@pytest.fixture
def runner(tmp_path: Path):  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.skip("runs a job part as root")
    state = tmp_path / "state"
    state.mkdir()
    parent = f"trellis-test-fence-{os.getpid()}"
    cgroups = detect_cgroups(parent, prefer="affinity", state_dir=state / "cgroups")
    gpus = EmulatedGpuBackend(EmulatedGpuConfig(count=2, uuid_seed="n1",
                                                progress_dir=str(state / "gpu-progress")))
    runner = JobRunner("n1", state, cgroups, gpus, allow_root_jobs=True, numa_of={0: 0})
    yield runner
    for part in list(runner.parts.values()):
        if part.state == "running":
            runner._signal(part, 9)


def prepare(restarts: int, spec: JobSpec = SPEC) -> PrepareJob:
    # The master sends the grace it computed from the spec (masterd.core.timelimits).
    grace = spec.stop.grace_s
    return PrepareJob(job_id="j", spec=spec, allocation=ALLOC, restarts=restarts,
                      grace_s=10.0 if grace is None else grace)


async def test_a_newer_incarnation_stops_the_older_part_first(runner: JobRunner) -> None:
    stale: list[StalePart] = []
    exits: list[tuple[int, int | None]] = []
    runner.on_stale = stale.append

    async def on_exited(part: Any) -> None:
        exits.append((part.restarts, part.signal))

    runner.on_exited = on_exited
    runner.prepare(prepare(0, dataclasses.replace(SPEC, stop=StopRules(grace_s=1.0))))
    with pytest.raises(JobRefused) as refused:
        runner.start(StartJob(job_id="j", master_addr="127.0.0.1", master_port=1, restarts=1))
    assert refused.value.code == "stale_incarnation"
    runner.start(StartJob(job_id="j", master_addr="127.0.0.1", master_port=1, restarts=0))
    assert runner.reports()[0] == JobReport(job_id="j", state="running",
                                            pid=runner.parts["j"].shim_pid, restarts=0,
                                            gpus=ALLOC.gpus)
    await until("the job's process", lambda: (runner.parts["j"].dir / "child.json").exists(), 15)
    assert runner.send_signal("j", "SIGCONT", restarts=1) is False  # not that incarnation
    assert runner.send_signal("j", "SIGCONT", restarts=0) is True
    with pytest.raises(JobRefused) as refused:
        runner.prepare(prepare(1))
    assert refused.value.code == "stale_part_stopping"
    assert refused.value.message == ("job j incarnation 1 cannot be prepared on node n1 yet: "
                                     "its incarnation 0 still runs here and is being stopped")
    assert [(s.restarts, s.newer, s.state) for s in stale] == [(0, 1, "running")]
    with pytest.raises(JobRefused):  # asked again while it stops: refused, reported once
        runner.prepare(prepare(1))
    assert len(stale) == 1
    await until("the stale part to exit", lambda: runner.parts["j"].state == "exited", 15)
    assert exits == [(0, 15)]
    runner.prepare(prepare(1))  # its exit is reported once more, and it makes room
    assert runner.parts["j"].restarts == 1 and runner.parts["j"].state == "prepared"
    await until("the exit reported again", lambda: len(exits) == 2)
    with pytest.raises(JobRefused) as refused:  # never an older one over a newer one
        runner.prepare(prepare(0))
    assert refused.value.code == "stale_incarnation"
    runner.stop("j", 0.0, "stop of incarnation 0", restarts=0)  # older: left alone
    assert "j" in runner.parts
    runner.stop("j", 0.0, "stop of incarnation 1", restarts=1)
    assert "j" not in runner.parts


async def test_a_prepared_older_part_is_dropped_for_a_newer_one(runner: JobRunner) -> None:
    stale: list[StalePart] = []
    runner.on_stale = stale.append
    runner.prepare(prepare(0))
    runner.prepare(prepare(2))
    assert runner.parts["j"].restarts == 2
    assert [(s.restarts, s.newer, s.state) for s in stale] == [(0, 2, "prepared")]
    # What a restarted noded re-adopts keeps its incarnation.
    runner.parts.clear()
    runner.adopt()
    assert runner.parts["j"].restarts == 2 and runner.reports()[0].restarts == 2


# -- the master's side ---------------------------------------------------------------------------

GPU_NODES = {"n1": (4, 8), "n2": (4, 8)}


def gpu_spec(name: str, gpus: int = 1, cpus: int = 1) -> JobSpec:
    return JobSpec(name=name, command=("true",), user="nobody", kind=JobKind.TRAINING,
                   gpus=gpus, cpus=cpus)


async def launch(master: Master, sessions: dict[str, FakeSession], job_id: str,
                 gpus: int = 1, cpus: int = 1) -> str:
    await master.submit(gpu_spec(job_id, gpus, cpus), job_id)
    await until(f"{job_id} placed", lambda: master.core.jobs[job_id].placement is not None)
    node = master.core.jobs[job_id].placement.nodes[0]  # type: ignore[union-attr]
    await until(f"{job_id} launched", lambda: any(
        c.job_id == job_id for c in sessions[node].commands("start_job")))
    await started(master, node, job_id)
    return node


def events_of(master: Master, job_id: str | None = None) -> list[tuple[str | None, str, dict]]:
    return [(e.node, e.kind, e.detail) for e in master.store.events(job_id)]


async def settle(master: Master) -> None:
    await master.journal.call(writer_sleep, 0.0)  # every write issued before it is done


async def test_commands_carry_the_epoch_and_the_incarnation(tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), GPU_NODES, command_timeout_s=5)
    try:
        assert master.leadership.epoch == 1  # the first start of a SQLite master
        node = await launch(master, sessions, "a")
        prepare_cmd = sessions[node].commands("prepare_job")[0]
        start_cmd = sessions[node].commands("start_job")[0]
        assert (prepare_cmd.epoch, prepare_cmd.restarts) == (1, 0)
        assert (start_cmd.epoch, start_cmd.restarts) == (1, 0)
        await master.cancel("a")
        await until("stop sent", lambda: sessions[node].commands("stop_job"))
        stop = sessions[node].commands("stop_job")[0]
        assert (stop.epoch, stop.restarts) == (1, 0)
    finally:
        await master.close()
    again, _ = make_master(tmp_path, Clock(), GPU_NODES)  # restarted: the next epoch
    try:
        assert again.leadership.epoch == 2
        assert [e.detail["epoch"] for e in again.store.events(None) if e.kind == "epoch"] == [1, 2]
    finally:
        await again.close()


async def test_a_node_that_saw_a_newer_epoch_is_refused_once_journalled(tmp_path: Path) -> None:
    master, _ = make_master(tmp_path, Clock(), {})
    try:
        hello = Hello(inventory=inventory("n9", gpus=1, cpus=2), epoch=4)
        for _ in range(3):  # the node redials: refused each time, journalled once
            with pytest.raises(ProtocolError) as refused:
                master.check_hello(hello)
        assert refused.value.code == "stale_epoch"
        assert refused.value.message.startswith(
            "node n9 has seen master epoch 4, newer than this master's 1: another master leads")
        await until("journalled", lambda: [k for _, k, _ in events_of(master)
                                           if k == "node_refused"])
        master.check_hello(dataclasses.replace(hello, epoch=1))  # no newer than ours: fine
        await settle(master)
        assert [k for _, k, _ in events_of(master)].count("node_refused") == 1
    finally:
        await master.close()


async def test_a_returning_node_has_its_stale_part_stopped_and_reported(
        tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, GPU_NODES)
    try:
        node = await launch(master, sessions, "train")
        other = "n2" if node == "n1" else "n1"
        job = master.core.jobs["train"]
        # What a requeue after the node's loss leaves (masterd's node-loss feature): the job
        # is incarnation 1 now, running on the other node.
        master.core.cluster.release("train")
        job.restarts = 1
        job.placement = Placement((NodeAllocation(node=other, gpus=(0,), cpus=(0,)),))
        job.node_states = {other: "running"}
        master.core.cluster.allocate("train", job.placement)
        # The lost node returns still running incarnation 0.
        master.node_disconnected(sessions[node])  # type: ignore[arg-type]
        returning = FakeSession(node)
        await master.node_hello(returning, Hello(  # type: ignore[arg-type]
            inventory=inventory(node, gpus=4, cpus=8, numa=1),
            jobs=(JobReport(job_id="train", state="running", pid=77, restarts=0),), epoch=1))
        await until("the stale part stopped", lambda: returning.commands("stop_job"))
        stop = returning.commands("stop_job")[0]
        assert (stop.job_id, stop.restarts, stop.epoch) == ("train", 0, 1)
        assert stop.grace_s == grace_for(job.spec, master.config.stop_grace_s,
                                         master.config.max_grace_s)
        assert "is stale: job train was requeued and is incarnation 1 now" in stop.reason
        # Its exit is reported and journalled, and changes nothing of incarnation 1.
        body = JobExited(job_id="train", signal=15, restarts=0)
        check_event(master.core, node, body)  # a stale incarnation's exit is let through
        await master.node_event(node, "job_exited", body)
        await until("forgotten", lambda: returning.commands("forget_job"))
        assert returning.commands("forget_job")[0].restarts == 0
        assert job.state is JobState.RUNNING and job.node_states == {other: "running"}
        kinds = [(n, k, d.get("restarts")) for n, k, d in events_of(master, "train")]
        assert (node, "stale_part", 0) in kinds and (node, "stale_part_exited", 0) in kinds
        # The current incarnation's exit from the node it runs on still ends the job.
        await master.node_event(other, "job_exited",
                                JobExited(job_id="train", exit_code=0, restarts=1))
        assert job.state is JobState.FINISHED
    finally:
        await master.close()


async def test_parts_the_master_never_placed_there_are_stopped(tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), GPU_NODES)
    try:
        node = await launch(master, sessions, "mine")
        other = "n2" if node == "n1" else "n1"
        # Same incarnation, wrong node: the guard refuses the event ...
        with pytest.raises(ProtocolError):
            check_event(master.core, other, JobStarted(job_id="mine", pid=5))
        # ... and a hello reporting it (and a job nobody knows) gets both stopped there.
        master.node_disconnected(sessions[other])  # type: ignore[arg-type]
        session = FakeSession(other)
        await master.node_hello(session, Hello(  # type: ignore[arg-type]
            inventory=inventory(other, gpus=4, cpus=8, numa=1),
            jobs=(JobReport(job_id="mine", state="running", pid=5),
                  JobReport(job_id="ghost", state="prepared"))))
        await until("both stopped", lambda: len(session.commands("stop_job")) == 2)
        assert sorted(c.job_id for c in session.commands("stop_job")) == ["ghost", "mine"]
        assert master.core.jobs["mine"].state is JobState.RUNNING
        assert sessions[node].commands("stop_job") == []
        strays = [(n, d["reason"]) for n, k, d in events_of(master, "mine") if k == "stray_part"]
        assert strays == [(other, f"part mine#0 runs on node {other}, where the master never "
                           "placed it")]
        # A node stopping an older part on its own says so: journalled.
        await master.node_event(other, "stale_part", StalePart(
            job_id="mine", restarts=0, newer=1, state="running", reason="newer asked"))
        await until("journalled", lambda: any(
            k == "stale_part" and d["by"] == "node" for _, k, d in events_of(master, "mine")))
    finally:
        await master.close()


async def test_a_node_returning_with_fewer_gpus_requeues_the_jobs_on_them(tmp_path: Path
                                                                          ) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"n1": (4, 8)})
    try:
        await launch(master, sessions, "keeps", gpus=1)
        await launch(master, sessions, "wide", gpus=3)
        wide = master.core.jobs["wide"]
        assert wide.placement.allocations[0].gpus == (1, 2, 3)  # type: ignore[union-attr]
        master.node_disconnected(sessions["n1"])  # type: ignore[arg-type]
        session = FakeSession("n1")
        reports = (JobReport(job_id="keeps", state="running", pid=1),
                   JobReport(job_id="wide", state="running", pid=2))
        await master.node_hello(session, Hello(  # type: ignore[arg-type]
            inventory=inventory("n1", gpus=2, cpus=8, numa=1), jobs=reports, epoch=1))
        await until("wide stopped", lambda: session.commands("stop_job"))
        assert {c.job_id for c in session.commands("stop_job")} == {"wide"}
        # The failure rules of a lost node or GPU: requeued (restart 1), not failed.
        assert wide.stopping and wide.end_as == "queued"
        view = master.core.cluster.node("n1")
        assert view is not None and len(view.inventory.gpus) == 2  # replaced
        clock.now += 1
        await exited(master, "n1", "wide", None, 15)
        assert wide.state is JobState.QUEUED and wide.restarts == 1
        assert wide.reason.startswith("GPUs 2, 3 of node n1 no longer exist (the node "
                                      "returned with 2 GPUs and 8 cores); requeued")
        assert master.core.jobs["keeps"].state is JobState.RUNNING
        view = master.core.cluster.node("n1")
        assert view is not None and view.free_gpus == frozenset({1})  # not 2, 3
        assert any(k == "resources_gone" for _, k, _ in events_of(master, "wide"))
    finally:
        await master.close()


async def test_a_node_returning_with_fewer_cores_never_frees_the_missing_ones(
        tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"n1": (2, 8)})
    try:
        await launch(master, sessions, "pinned", gpus=1, cpus=6)
        cpus = master.core.jobs["pinned"].placement.allocations[0].cpus  # type: ignore[union-attr]
        master.node_disconnected(sessions["n1"])  # type: ignore[arg-type]
        session = FakeSession("n1")
        await master.node_hello(session, Hello(  # type: ignore[arg-type]
            inventory=inventory("n1", gpus=2, cpus=4, numa=1),
            jobs=(JobReport(job_id="pinned", state="running", pid=1),)))
        await until("stopped", lambda: session.commands("stop_job"))
        clock.now += 1
        await exited(master, "n1", "pinned", 0)
        job = master.core.jobs["pinned"]
        assert job.state is JobState.QUEUED and "no longer exist" in job.reason
        assert max(cpus) >= 4
        view = master.core.cluster.node("n1")
        assert view is not None and view.free_cpus == frozenset(range(4))
    finally:
        await master.close()
