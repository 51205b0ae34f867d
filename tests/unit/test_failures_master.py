"""Node loss and GPU faults in a real in-process master (its journal a real SQLite file, its
nodes stand-in sessions): what is requeued or ended, in which order, what is journalled, and
what a restarted master still knows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from masterd.api.rpc import Rpc
from masterd.service.master import Master
from shared.messages import GpuHealth, Hello, JobReport
from shared.model import Job, JobSpec, JobState, StopRules
from shared.protocol import ProtocolError
from tests.unit.helpers import inventory
from tests.unit.master_fakes import Clock, FakeSession, exited, make_master, started, until

NODES = {"g1": (4, 8), "g2": (4, 8)}


def spec(name: str, gpus: int = 1, **kw: object) -> JobSpec:
    return JobSpec(name=name, command=("train",), user="nobody", gpus=gpus, cpus=1,
                   **kw)  # type: ignore[arg-type]


async def running(master: Master, sessions: dict[str, FakeSession], job_id: str) -> list[str]:
    """Wait for the job's launch and report every part started; its nodes."""
    job = master.core.jobs[job_id]
    await until(f"{job_id} launched", lambda: job.placement is not None and all(
        any(s.job_id == job_id for s in sessions[n].commands("start_job"))
        for n in job.placement.nodes))
    assert job.placement is not None
    nodes = list(job.placement.nodes)
    for node in nodes:
        await started(master, node, job_id)
    assert job.state is JobState.RUNNING
    return nodes


def kinds(master: Master, job_id: str | None = None) -> list[str]:
    return [e.kind for e in master.store.events(job_id, 0, 10_000)]


def disconnect(master: Master, sessions: dict[str, FakeSession], node: str) -> None:
    master.node_disconnected(sessions[node])  # type: ignore[arg-type]


async def test_a_lost_nodes_job_is_requeued_and_runs_elsewhere_with_its_restart(
        tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), NODES)
    try:
        job = await master.submit(spec("train", gpus=4, max_nodes=1))
        [node] = await running(master, sessions, job.id)
        other = "g2" if node == "g1" else "g1"
        disconnect(master, sessions, node)
        master.clock.now += 300  # type: ignore[attr-defined]
        await master.features.nodeloss.lose(node)
        assert master.node_status(node) == "down"
        # Requeued at once (its only part was on the lost node), then placed on the other.
        assert job.restarts == 1
        await until("the relaunch", lambda: sessions[other].commands("prepare_job"))
        [prepare] = sessions[other].commands("prepare_job")
        assert prepare.job_id == job.id and prepare.restarts == 1
        events = kinds(master, job.id)
        assert events[-4:] == ["requeue_requested", "part_lost", "requeued", "placed"]
        node_rows = [e for e in master.store.events(None, 0, 10_000) if e.kind == "node_down"]
        assert node_rows and node_rows[0].node == node
        assert node_rows[0].detail["jobs"] == [job.id]
        assert node_rows[0].detail["silent_s"] == pytest.approx(300, abs=1)
        requeued = [e for e in master.store.events(job.id, 0, 10_000) if e.kind == "requeued"]
        assert requeued[0].detail == {"reason": f"node {node} lost (no contact for 300 s); "
                                                "requeued (restart 1 of at most 5)",
                                      "restarts": 1}
        # No stop was sent to the lost node (it cannot answer).
        assert not sessions[node].commands("stop_job")
    finally:
        await master.close()


async def test_the_healthy_parts_are_stopped_before_the_job_is_requeued(tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), NODES)
    try:
        job = await master.submit(spec("wide", gpus=8))
        assert sorted(await running(master, sessions, job.id)) == ["g1", "g2"]
        disconnect(master, sessions, "g1")
        await master.features.nodeloss.lose("g1")
        # Its part on g2 is told to stop; until it exited the job holds g2's GPUs.
        await until("the stop on g2", lambda: sessions["g2"].commands("stop_job"))
        assert job.state is JobState.RUNNING and job.stopping and job.end_as == "queued"
        assert job.node_states == {"g1": "exited", "g2": "running"}
        assert master.core.cluster.jobs_on("g2") == [job.id]
        await exited(master, "g2", job.id, None, 15)
        assert job.state is JobState.QUEUED and job.restarts == 1
        assert master.core.cluster.jobs_on("g2") == []
    finally:
        await master.close()


async def test_a_no_requeue_job_ends_node_lost_naming_the_node(tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), NODES)
    try:
        job = await master.submit(spec("once", stop=StopRules(requeue=False)))
        [node] = await running(master, sessions, job.id)
        disconnect(master, sessions, node)
        await master.features.nodeloss.lose(node)
        assert job.state is JobState.NODE_LOST and job.restarts == 0
        assert job.reason.startswith(f"node {node} lost") and "--no-requeue" in job.reason
        assert kinds(master, job.id)[-1] == "node_lost"
        assert master.features.nodeloss.ended == 1
    finally:
        await master.close()


async def test_max_requeues_then_node_lost(tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), NODES, max_requeues=1)
    try:
        job = await master.submit(spec("twice", gpus=4, max_nodes=1))
        [first] = await running(master, sessions, job.id)
        disconnect(master, sessions, first)
        await master.features.nodeloss.lose(first)
        assert job.state is JobState.QUEUED and job.restarts == 1
        [second] = await running(master, sessions, job.id)
        assert second != first
        disconnect(master, sessions, second)
        await master.features.nodeloss.lose(second)
        assert job.state is JobState.NODE_LOST and job.restarts == 1
        assert "max_requeues is 1" in job.reason
    finally:
        await master.close()


async def test_a_bad_requeue_value_is_refused_at_submission(tmp_path: Path) -> None:
    master, _ = make_master(tmp_path, Clock(), NODES)
    try:
        rpc = Rpc(master)
        job = {"name": "odd", "command": ["train"], "user": "nobody", "gpus": 1,
               "stop": {"requeue": "later"}}
        with pytest.raises(ProtocolError) as err:
            await rpc.call("submit", {"job": job})
        assert err.value.code == "invalid_params"
        assert err.value.message == "params.job.stop.requeue: must be true or false, got a string"
        assert not master.core.jobs
    finally:
        await master.close()


async def test_a_returning_node_is_no_longer_down(tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), NODES)
    try:
        disconnect(master, sessions, "g1")
        await master.features.nodeloss.lose("g1")
        assert master.node_status("g1") == "down"
        await master.node_hello(FakeSession("g1"), Hello(inventory=inventory(  # type: ignore[arg-type]
            "g1", gpus=4, cpus=8, numa=1)))
        assert master.node_status("g1") == "ready"
        await until("node_returned journalled", lambda: "node_returned" in kinds(master))
    finally:
        await master.close()


async def test_a_restart_in_the_middle_of_a_requeue_loses_nothing(tmp_path: Path) -> None:
    """The master dies after the loss was journalled but before the healthy part exited:
    the next one still knows the node is down, still stops the part, still requeues."""
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, NODES)
    try:
        job = await master.submit(spec("wide", gpus=8))
        await running(master, sessions, job.id)
        disconnect(master, sessions, "g1")
        await master.features.nodeloss.lose("g1")
        await until("the stop on g2", lambda: sessions["g2"].commands("stop_job"))
    finally:
        await master.close()
    again, _ = make_master(tmp_path, clock, {})
    try:
        restored = again.core.jobs[job.id]
        assert restored.state is JobState.RUNNING and restored.stopping
        assert restored.end_as == "queued" and restored.node_states["g1"] == "exited"
        assert again.node_status("g1") == "down"
        # g2 comes back still running the part: the hello's reconciliation stops it.
        g2 = FakeSession("g2")
        await again.node_hello(g2, Hello(  # type: ignore[arg-type]
            inventory=inventory("g2", gpus=4, cpus=8, numa=1),
            jobs=(JobReport(job_id=job.id, state="running", pid=4242),)))
        await until("the stop after the restart", lambda: g2.commands("stop_job"))
        await exited(again, "g2", job.id, None, 15)
        assert restored.state is JobState.QUEUED and restored.restarts == 1
        assert [j.restarts for j in again.store.load_jobs() if j.id == job.id] == [1]
    finally:
        await again.close()


async def restarted_without_its_node(tmp_path: Path, clock: Clock, last_words: Any = None
                                     ) -> tuple[Job, str, Master, dict[str, FakeSession]]:
    """A one-node job runs; ``last_words(master, node, job)`` is the master's last act; a
    new master restores with only the other node connected."""
    master, sessions = make_master(tmp_path, clock, NODES)
    try:
        job = await master.submit(spec("train", gpus=4, max_nodes=1))
        [node] = await running(master, sessions, job.id)
        if last_words is not None:
            await last_words(master, node, job)
    finally:
        await master.close()
    other = "g2" if node == "g1" else "g1"
    again, fresh = make_master(tmp_path, clock, {other: NODES[other]})
    return job, node, again, fresh


def requeue_reasons(master: Master, job_id: str) -> list[str]:
    return [e.detail["reason"] for e in master.store.events(job_id, 0, 10_000)
            if e.kind == "requeued"]


async def test_a_restart_after_the_node_down_row_settles_the_jobs_at_once(
        tmp_path: Path) -> None:
    from masterd.journal.failures import save_down

    async def journal_down(master: Master, node: str, job: Job) -> None:
        # The master journals the node_down row, then dies before touching the job.
        now = master.clock()
        await master.journal.call(save_down, node, now,
                                  f"node {node} lost (no contact for 20 s)",
                                  (now, None, node, "node_down", {"jobs": [job.id]}))

    clock = Clock()
    job, node, again, fresh = await restarted_without_its_node(tmp_path, clock, journal_down)
    [other] = fresh
    try:
        restored = again.core.jobs[job.id]
        await until("the requeue after the restart",
                    lambda: restored.restarts == 1 and fresh[other].commands("prepare_job"))
        assert again.node_status(node) == "down"
        assert fresh[other].commands("prepare_job")[0].restarts == 1
        # The reason is why the node went down, not the new master's own silence (0 s).
        assert requeue_reasons(again, job.id)[0].startswith(
            f"node {node} lost (no contact for 20 s); requeued")
    finally:
        await again.close()


async def test_a_node_silent_since_a_restart_is_lost_counting_from_the_takeover(
        tmp_path: Path) -> None:
    clock = Clock()
    job, node, again, _ = await restarted_without_its_node(tmp_path, clock)
    try:
        clock.now += 300  # the node never says hello to the new master
        await again.features.nodeloss.lose(node)
        assert requeue_reasons(again, job.id)[0].startswith(
            f"node {node} lost (no contact in the 300 s since this master began leading); "
            "requeued")
    finally:
        await again.close()


# -- GPU faults ----------------------------------------------------------------------------


async def fault(master: Master, node: str, index: int, xid: int | None,
                reason: str = "") -> None:
    await master.node_event(node, "gpu_health", GpuHealth(
        index=index, healthy=False, reason=reason or f"Xid {xid}", xid=xid))


def healthy(master: Master, node: str, index: int) -> bool:
    view = master.core.cluster.node(node)
    assert view is not None
    return next(g.healthy for g in view.inventory.gpus if g.index == index)


async def test_a_fatal_xid_requeues_the_job_and_holds_the_gpu_out(tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), {"g1": (2, 8)})
    try:
        job = await master.submit(spec("train"))
        [node] = await running(master, sessions, job.id)
        assert job.placement is not None
        [gpu] = job.placement.allocations[0].gpus
        await fault(master, node, gpu, 79, "Xid 79 (GPU has fallen off the bus)")
        await until("the stop", lambda: sessions[node].commands("stop_job"))
        assert job.stopping and job.end_as == "queued"
        assert not healthy(master, node, gpu)
        await exited(master, node, job.id, None, 9)
        assert job.restarts == 1 and "GPU" in job.reason and "Xid 79" in job.reason
        # Placed again, on the other GPU.
        await until("the relaunch", lambda: len(sessions[node].commands("prepare_job")) == 2)
        again = sessions[node].commands("prepare_job")[1]
        assert again.restarts == 1 and gpu not in again.allocation.gpus
        row = next(e for e in master.store.events(None, 0, 10_000) if e.kind == "gpu_fault")
        assert row.detail == {"gpu": gpu, "xid": 79, "reason": "Xid 79 (GPU has fallen off "
                              "the bus)", "fatal": True, "jobs": [job.id]}
    finally:
        await master.close()


async def test_a_non_fatal_xid_leaves_the_job_alone_but_the_gpu_out(tmp_path: Path) -> None:
    master, sessions = make_master(tmp_path, Clock(), {"g1": (2, 8)})
    try:
        job = await master.submit(spec("train"))
        [node] = await running(master, sessions, job.id)
        assert job.placement is not None
        [gpu] = job.placement.allocations[0].gpus
        await fault(master, node, gpu, 63)
        assert not job.stopping and job.state is JobState.RUNNING
        assert not healthy(master, node, gpu)
        assert master.features.gpufaults.of(node, gpu)["fatal"] is False  # type: ignore[index]
    finally:
        await master.close()


async def test_gpu_reset_refusals_and_the_return_to_service(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 8), "g2": (2, 8)})
    rpc = Rpc(master)
    try:
        async def refused(params: dict[str, object], code: str, text: str) -> None:
            with pytest.raises(ProtocolError) as err:
                await rpc.call("gpu_reset", params)
            assert err.value.code == code and text in err.value.message, err.value.message

        await refused({"node": "nope", "index": 0}, "unknown_node", "'nope' is not registered")
        await refused({"node": "g1", "index": 5}, "unknown_gpu",
                      "node g1 has no GPU 5 (its GPUs are 0-1)")
        await refused({"node": "g1", "index": -1}, "invalid_params", "index")
        await refused({"node": "g1", "index": 1}, "gpu_in_service",
                      "GPU 1 of node g1 is in service")
        await fault(master, "g1", 1, 48, "Xid 48 (Double Bit ECC Error)")
        await fault(master, "g2", 0, 79)
        disconnect(master, sessions, "g2")
        await refused({"node": "g2", "index": 0}, "node_unreachable", "node g2 is disconnected")
        assert not sessions["g1"].commands("reset_gpu")
        # Through the SDK's typed call (control/typed.py), which reads the fault it was.
        from control.typed import Calls

        typed = Calls.gpu_reset("g1", 1)
        answer = await rpc.call(typed.method, typed.params)
        assert answer["healthy"] and typed.read(answer)["xid"] == 48
        [reset] = sessions["g1"].commands("reset_gpu")
        assert reset.index == 1 and healthy(master, "g1", 1)
        assert master.features.gpufaults.of("g1", 1) is None
        assert "gpu_reset" in kinds(master)
        await refused({"node": "g1", "index": 1}, "gpu_in_service", "in service")
    finally:
        await master.close()
    # The fault that was not reset outlives the master, whatever the node says at hello.
    again, _ = make_master(tmp_path, clock, {})
    try:
        assert again.features.gpufaults.of("g2", 0) is not None
        await again.node_hello(FakeSession("g2"), Hello(inventory=inventory(  # type: ignore[arg-type]
            "g2", gpus=2, cpus=8, numa=1)))
        assert not healthy(again, "g2", 0) and healthy(again, "g2", 1)
        # The node reporting the GPU healthy (its health check passed) returns it.
        await again.node_event("g2", "gpu_health", GpuHealth(index=0, healthy=True,
                                                             reason="health check passed"))
        assert healthy(again, "g2", 0) and again.features.gpufaults.of("g2", 0) is None
        assert "gpu_returned" in kinds(again)
    finally:
        await again.close()


async def test_silence_counts_from_the_last_data_a_heartbeat_saw(tmp_path: Path) -> None:
    """A session the heartbeat ended had been silent 1.5 heartbeats already: node_lost_s
    counts from then, on the master's real timer."""
    import time as wall

    # node_lost_s as short as the node lease allows: node_grace_s + max_grace_s + 1.5 x
    # node_heartbeat_s + node_fence_margin_s.
    master, sessions = make_master(tmp_path, Clock(), NODES, node_grace_s=0.1,
                                   node_lost_s=0.7, node_heartbeat_s=0.4, max_grace_s=0,
                                   node_fence_margin_s=0)
    try:
        job = await master.submit(spec("train", gpus=4, max_nodes=1))
        [node] = await running(master, sessions, job.id)
        sessions[node].silent_s = 0.6  # as the app sets it: 1.5 x node_heartbeat_s
        began = wall.monotonic()
        disconnect(master, sessions, node)
        await until("the node down", lambda: master.node_status(node) == "down", 5)
        assert wall.monotonic() - began < 0.5  # all but 0.1 s of node_lost_s had passed
        await until("the requeue", lambda: job.restarts == 1)
        assert master.features.nodeloss.silent_since[node] == master.clock() - 0.6
    finally:
        await master.close()
