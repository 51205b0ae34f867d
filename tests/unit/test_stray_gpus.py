"""GPUs held by a part the master does not own (an older incarnation the node still runs, a
job the master forgot) are not free to the master until the node reports that part's exit.

The node refuses such GPUs to anyone (``gpus_busy``). Before these holds, a master that
thought them free placed a job there three times in a tenth of a second and failed it "after
3 failed starts" (the chaos soak, seed 30): the refusal was the master's stale view, not the
job's failure. Now a hello's stray parts hold their GPUs, and a ``gpus_busy`` refusal makes
the master ask the node what runs there (``list_parts``), hold what it finds, and requeue the
job without counting the refusal against it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from masterd.core.cluster import ClusterState
from masterd.service.master import Master
from masterd.service.sessions import CommandFailed
from shared.messages import Hello, JobExited, JobReport
from shared.model import JobSpec, JobState, NodeAllocation, Placement
from tests.unit.helpers import inventory
from tests.unit.master_fakes import Clock, FakeSession, make_master, started, until


async def a_pass_ran(master: Master) -> None:
    """Wait for a scheduling pass that begins after now: a placement is decided (and the job
    leaves the queue) inside it, so what it did not do it will not do later."""
    before = master.passes
    master.request_pass()
    await until("a scheduling pass", lambda: master.passes > before)


def one_gpu(name: str = "train") -> JobSpec:
    return JobSpec(name=name, command=("train",), user="nobody", gpus=1, cpus=1, max_nodes=1)


def test_a_held_gpu_is_free_only_once_its_stray_and_every_job_on_it_are_gone() -> None:
    cluster = ClusterState()
    cluster.upsert_node(inventory("n1", gpus=2, cpus=4, numa=1))
    cluster.allocate("mine", Placement((NodeAllocation("n1", gpus=(1,), cpus=(0,)),)))
    # The stray holds GPU 0 (free) and GPU 1 (which a job of the master's holds too).
    assert cluster.hold("n1", "ghost", 3, (0, 1, 7)) == {0, 1}  # 7: no such GPU there
    assert cluster.node("n1").free_gpus == frozenset()  # type: ignore[union-attr]
    cluster.release("mine")  # GPU 1 stays held by the stray
    assert cluster.node("n1").free_gpus == frozenset()  # type: ignore[union-attr]
    # An inventory update keeps the hold.
    cluster.upsert_node(inventory("n1", gpus=2, cpus=4, numa=1))
    assert cluster.node("n1").free_gpus == frozenset()  # type: ignore[union-attr]
    assert not cluster.unhold("n1", "ghost", 2)  # another incarnation: not the one held
    assert cluster.unhold("n1", "ghost", 3)
    assert cluster.node("n1").free_gpus == {0, 1}  # type: ignore[union-attr]
    assert not cluster.unhold("n1", "ghost", 3)


class ListingSession(FakeSession):
    """A node that runs a stray part on GPU 0 the master does not know of: it refuses
    prepares on that GPU (as noded does) and lists the stray when asked."""

    def __init__(self, name: str, stray: JobReport) -> None:
        super().__init__(name)
        self.stray: JobReport | None = stray

    async def request(self, type_: str, body: Any) -> dict[str, Any]:
        if type_ == "prepare_job" and self.stray is not None:
            gpus = set(body["allocation"]["gpus"]) if isinstance(body, dict) else set(
                body.allocation.gpus)
            if gpus & set(self.stray.gpus):
                self.sent.append((type_, body))
                raise CommandFailed(self.name, type_, "gpus_busy",
                                    f"GPUs {sorted(gpus)} are in use on {self.name}")
        if type_ == "list_parts":
            self.sent.append((type_, body))
            return {"jobs": [] if self.stray is None else [{
                "job_id": self.stray.job_id, "state": self.stray.state,
                "restarts": self.stray.restarts, "gpus": list(self.stray.gpus)}]}
        return await super().request(type_, body)


async def stray_exits(master: Master, node: ListingSession) -> None:
    stray = node.stray
    assert stray is not None
    node.stray = None
    await master.node_event(node.name, "job_exited", JobExited(
        job_id=stray.job_id, exit_code=None, signal=15, restarts=stray.restarts))


async def test_a_gpus_busy_refusal_is_reconciled_and_not_counted(tmp_path: Path) -> None:
    master, _ = make_master(tmp_path, Clock(), {"n1": (1, 4)}, max_start_failures=1)
    node = ListingSession("n1", JobReport(job_id="ghost", state="running", restarts=2,
                                          gpus=(0,)))
    master.sessions["n1"] = node  # type: ignore[assignment]
    try:
        job = await master.submit(one_gpu())
        # Refused once, then the master asked what holds GPU 0, held it and stopped the
        # stray; the job waits in the queue, not failed (max_start_failures is 1).
        # (The stray's stop may go out before the refused start is settled: wait for both.)
        await until("the stray stopped and the job queued again", lambda: node.commands(
            "stop_job") and job.state is JobState.QUEUED)
        assert node.commands("list_parts")
        stop = node.commands("stop_job")[0]
        assert (stop.job_id, stop.restarts) == ("ghost", 2)
        assert job.state is JobState.QUEUED and job.start_failures == 0
        assert "start failed" in job.reason
        await a_pass_ran(master)  # one that could place it: not on a held GPU
        assert job.state is JobState.QUEUED and len(node.commands("prepare_job")) == 1
        assert master.core.cluster.holds("n1") == {("ghost", 2): {0}}
        # The stray's exit frees GPU 0, and the job runs there.
        await stray_exits(master, node)
        await until("the job placed again", lambda: len(node.commands("prepare_job")) == 2)
        await until("the job starting", lambda: job.state is JobState.STARTING
                    or job.state is JobState.RUNNING)
        assert job.start_failures == 0
    finally:
        await master.close()


async def test_a_gpus_busy_refusal_nothing_explains_counts_as_before(tmp_path: Path) -> None:
    master, _ = make_master(tmp_path, Clock(), {"n1": (1, 4)}, max_start_failures=1)
    node = ListingSession("n1", JobReport(job_id="ghost", state="running", gpus=(0,)))
    # The node lists nothing: the refusal stays unexplained, and counts.
    node.request_list = node.request  # type: ignore[method-assign]

    async def no_list(type_: str, body: Any) -> dict[str, Any]:
        if type_ == "list_parts":
            raise CommandFailed("n1", type_, "unknown_type", "unknown command 'list_parts'")
        return await node.request_list(type_, body)

    node.request = no_list  # type: ignore[method-assign]
    master.sessions["n1"] = node  # type: ignore[assignment]
    try:
        job = await master.submit(one_gpu())
        await until("the job failed", lambda: job.state.terminal)
        assert job.state is JobState.FAILED
        assert "gave up after 1 failed starts" in job.reason
    finally:
        await master.close()


async def test_a_hello_reporting_a_stray_holds_its_gpus_until_it_exits(tmp_path: Path) -> None:
    master, _ = make_master(tmp_path, Clock(), {})
    node = ListingSession("n1", JobReport(job_id="ghost", state="running", restarts=1,
                                          gpus=(0,)))
    try:
        await master.node_hello(node, Hello(  # type: ignore[arg-type]
            inventory=inventory("n1", gpus=2, cpus=4, numa=1), jobs=(node.stray,)))
        assert master.core.cluster.node("n1").free_gpus == {1}  # type: ignore[union-attr]
        one = await master.submit(one_gpu())
        await until("the one-GPU job placed", lambda: one.placement is not None)
        two = await master.submit(JobSpec(name="two", command=("train",), user="nobody",
                                          gpus=1, cpus=1, max_nodes=1))
        await a_pass_ran(master)  # one that could place it: GPU 0 is not free
        assert one.placement.allocations[0].gpus == (1,)  # type: ignore[union-attr]
        assert two.state is JobState.QUEUED and not node.commands("list_parts")
        assert [c.job_id for c in node.commands("stop_job")] == ["ghost"]
        # Said hello again (a reconnect): the holds are what this hello reports.
        await until("the one-GPU job started", lambda: node.commands("start_job"))
        await started(master, "n1", one.id)
        await master.node_hello(node, Hello(  # type: ignore[arg-type]
            inventory=inventory("n1", gpus=2, cpus=4, numa=1), jobs=(
                node.stray, JobReport(job_id=one.id, state="running", gpus=(1,)))))
        assert master.core.cluster.holds("n1") == {("ghost", 1): {0}}
        assert master.core.cluster.node("n1").free_gpus == set()  # type: ignore[union-attr]
        assert two.state is JobState.QUEUED
        # The stray's exit frees GPU 0: the waiting job takes it.
        await stray_exits(master, node)
        assert master.core.cluster.holds("n1") == {}
        await until("the second job placed", lambda: two.placement is not None)
        assert two.placement.allocations[0].gpus == (0,)  # type: ignore[union-attr]
    finally:
        await master.close()


async def test_a_node_lists_its_parts_with_the_gpus_each_holds(tmp_path: Path) -> None:
    from noded.agent import NodeAgent
    from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
    from noded.jobs import JobPart
    from shared.messages import PartList, PrepareJob
    from shared.protocol import encode_frame
    from shared.schema import decode
    from tests.unit.agent_fakes import SentFrames

    prepare = PrepareJob(job_id="train-1", spec=one_gpu(), restarts=4,
                         allocation=NodeAllocation("n1", gpus=(2, 3), cpus=(0,)))
    part = JobPart("train-1", prepare, tmp_path)

    class Runner:
        on_exited: Any = None
        parts = {"train-1": part}

        def reports(self) -> list[JobReport]:
            return [p.report() for p in self.parts.values()]

    backend = EmulatedGpuBackend(EmulatedGpuConfig(count=4, uuid_seed="stray"))
    try:
        agent = NodeAgent("http://127.0.0.1:1", lambda: None, Runner(), backend)  # type: ignore[arg-type]
        ws = SentFrames()
        agent.ws = ws  # type: ignore[assignment]
        await agent._dispatch(encode_frame("list_parts", 7, {"epoch": 0}))
        reply = ws.replies()[7]
        assert reply["type"] == "ack"
        [listed] = decode(PartList, reply["body"]).jobs
        assert (listed.job_id, listed.state, listed.restarts, listed.gpus) == (
            "train-1", "prepared", 4, (2, 3))
    finally:
        backend.close()


def test_jobs_on_a_node_come_from_its_own_index_in_the_order_they_took_it() -> None:
    cluster = ClusterState()
    for name in ("n1", "n2"):
        cluster.upsert_node(inventory(name, gpus=2, cpus=4, numa=1))
    cluster.allocate("a", Placement((NodeAllocation("n1", gpus=(0,)),)))
    cluster.allocate("wide", Placement((NodeAllocation("n1", gpus=(1,)),
                                        NodeAllocation("n2", gpus=(0,)))))
    cluster.allocate("b", Placement((NodeAllocation("n2", gpus=(1,)),)))
    assert cluster.jobs_on("n1") == ["a", "wide"] and cluster.jobs_on("n2") == ["wide", "b"]
    cluster.release("wide")
    assert cluster.jobs_on("n1") == ["a"] and cluster.jobs_on("n2") == ["b"]
    # A node's inventory update keeps what its jobs hold (from the index, not a scan).
    cluster.upsert_node(inventory("n2", gpus=2, cpus=4, numa=1))
    assert cluster.node("n2").free_gpus == {0}  # type: ignore[union-attr]
    cluster.release("b")
    assert cluster.jobs_on("n2") == [] and cluster.jobs_on("n9") == []


def test_nodes_back_from_down_are_offered_in_the_clusters_order() -> None:
    """A node returning takes its place among the schedulable ones again, as a policy sees
    them (a storm of returns is not O(nodes) each)."""
    cluster = ClusterState()
    for name in ("a", "b", "c", "d"):
        cluster.upsert_node(inventory(name, gpus=1, cpus=2, numa=1))
    for name in ("c", "a", "b"):
        cluster.set_schedulable(name, False)
    cluster.set_schedulable("b", True)
    cluster.set_schedulable("a", True)
    assert list(cluster.snapshot({}).schedulable) == ["a", "b", "d"]
    cluster.set_schedulable("c", True)
    snap = cluster.snapshot({})
    assert list(snap.schedulable) == ["a", "b", "c", "d"] == list(snap.nodes)


async def test_a_part_of_the_masters_own_on_gpus_its_ledger_has_free_is_held(
        tmp_path: Path) -> None:
    """A restored journal gave one GPU to two jobs: the claim of the one that runs failed,
    and the ledger counted its GPU free. The node's refusal is explained by that part, not
    counted against the next job, and the GPU stays out of placements until the part ends."""
    master, _ = make_master(tmp_path, Clock(), {"n1": (1, 4)}, max_start_failures=1)
    node = ListingSession("n1", JobReport(job_id="x", state="running"))  # set below
    master.sessions["n1"] = node  # type: ignore[assignment]
    try:
        node.stray = None
        first = await master.submit(one_gpu("first"))
        await until("the first job started", lambda: node.commands("start_job"))
        await started(master, "n1", first.id)
        master.core.cluster.release(first.id)  # the ledger's divergence
        node.stray = JobReport(job_id=first.id, state="running", gpus=(0,))
        second = await master.submit(one_gpu("second"))
        await until("the refusal reconciled", lambda: node.commands("list_parts"))
        await until("the second job queued", lambda: second.state is JobState.QUEUED
                    and "start failed" in second.reason)
        assert second.start_failures == 0
        await a_pass_ran(master)
        assert second.state is JobState.QUEUED
        assert len(node.commands("prepare_job")) == 2  # not placed again on the held GPU
        node.stray = None
        await master.node_event("n1", "job_exited", JobExited(
            job_id=first.id, exit_code=0, restarts=0))
        await until("the second job placed again",
                    lambda: len(node.commands("prepare_job")) == 3)
    finally:
        await master.close()
