"""The master's bounded job table: ended jobs beyond finished_jobs_in_memory are forgotten
(oldest-ended first) and live on in the journal; RPCs, node events and restarts cope."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from aiohttp.test_utils import TestServer

from masterd.api.app import make_app
from masterd.api.nodeguard import check_event
from masterd.api.rpc import Rpc
from masterd.core.arrays.resize import DemandRecord
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.scheduler import JobError, SchedulingCore
from masterd.features.arrays.demand import DemandLog
from masterd.features.inference import RegisterServiceParams
from masterd.journal.store import Store
from masterd.service.jobmetrics import JobMetrics
from masterd.service.master import Master
from masterd.service.sessions import CommandFailed, NodeSession
from shared.messages import CoresChanged, Hello, JobExited, JobMetric, JobStarted
from shared.model import JobKind, JobSpec, JobState
from shared.protocol import ProtocolError, encode_frame
from shared.schema import encode
from tests.unit.helpers import inventory, job
from tests.unit.master_fakes import Clock, FakeSession, exited, make_master, started, until

NODE = {"n1": (0, 16)}  # one CPU node: sixteen 1-core jobs run side by side


def spec(name: str, cpus: int = 1) -> JobSpec:
    return JobSpec(name=name, command=("true",), user="nobody", kind=JobKind.CPU, gpus=0,
                   cpus=cpus)


async def submit(master: Master, job_id: str, cpus: int = 1) -> str:
    await master.submit(spec("t", cpus), job_id)
    return job_id


async def run(master: Master, sessions: dict[str, FakeSession], clock: Clock, job_id: str,
              code: int = 0, end: bool = True) -> None:
    """Launch ``job_id`` (already submitted) on n1 and, with ``end``, let it exit."""
    await until(f"{job_id} launched", lambda: any(
        c.job_id == job_id for c in sessions["n1"].commands("start_job")))
    await started(master, "n1", job_id)
    if end:
        clock.now += 1
        await exited(master, "n1", job_id, code)


def ended_in_memory(master: Master) -> list[str]:
    return [j.id for j in master.core.jobs.values() if j.state.terminal]


def per_job_state(master: Master, job_id: str) -> list[str]:
    """Where the master still keeps something for ``job_id`` besides core.jobs."""
    wire = master.journal.wire
    places = {
        "wire.specs": job_id in wire._specs, "wire.placements": job_id in wire._placements,
        "wire.spec_views": job_id in wire._spec_views,
        "wire.placement_views": job_id in wire._placement_views,
        "job_metrics": job_id in master.job_metrics._values or job_id in master.job_metrics._last,
        "ended record": job_id in master._ended,
        "inference.live": job_id in master.features.inference.live,
    }
    return [name for name, held in places.items() if held]


# -- the core ----------------------------------------------------------------------------------
def test_core_forgets_only_ended_jobs() -> None:
    core = SchedulingCore(FifoPolicy())
    core.node_up(inventory("a", gpus=2, cpus=4))
    core.submit(job("run", gpus=1))
    core.submit(job("wait", gpus=4, t=1))  # never fits while "run" holds a GPU
    core.schedule(1)
    core.node_started("run", "a", 2)
    for job_id in ("run", "wait"):
        with pytest.raises(JobError, match="only an ended job can be forgotten") as err:
            core.forget(job_id)
        assert err.value.code == "job_active"
    with pytest.raises(JobError, match="not in memory"):
        core.forget("nope")
    core.node_exited("run", "a", 0, None, 3)
    forgotten = core.forget("run")
    assert forgotten.state is JobState.FINISHED and "run" not in core.jobs
    assert [j.id for j in core.queue()] == ["wait"]  # the other indexes are untouched
    core.cancel("wait", 4)
    core.forget("wait")
    assert core.jobs == {} and list(core.queue()) == [] and core.running() == {}
    core.submit(job("again", gpus=1, t=5))  # the core itself no longer knows the ids
    assert [d.job_id for d in core.schedule(6)] == ["again"]


# -- eviction ----------------------------------------------------------------------------------
async def test_ended_jobs_beyond_the_cap_go_oldest_ended_first(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, NODE, finished_jobs_in_memory=2)
    try:
        for job_id in ("a", "b", "c", "d", "keep"):
            await submit(master, job_id)
        waiting = await submit(master, "big", cpus=16)  # waits while anything runs
        for job_id in ("a", "b", "c", "d", "keep"):
            await run(master, sessions, clock, job_id, end=False)
        # Ended in another order than submitted: c, a, d, b.
        for job_id in ("c", "a"):
            clock.now += 1
            await exited(master, "n1", job_id)
        assert sorted(ended_in_memory(master)) == ["a", "c"]
        clock.now += 1
        await exited(master, "n1", "d", 3)  # a failure counts like a finish
        assert sorted(ended_in_memory(master)) == ["a", "d"]  # c ended first: forgotten
        clock.now += 1
        await exited(master, "n1", "b")
        assert sorted(ended_in_memory(master)) == ["b", "d"]
        assert master.core.jobs["keep"].state is JobState.RUNNING
        assert master.core.jobs[waiting].state is JobState.QUEUED
        for gone in ("a", "c"):
            assert per_job_state(master, gone) == [], gone
        # The journal still has every row.
        stored = {j.id: j.state for j in master.store.load_jobs()}
        assert stored["c"] is JobState.FINISHED and stored["d"] is JobState.FAILED
    finally:
        await master.close()


async def test_cap_zero_forgets_every_job_as_it_ends(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, NODE, finished_jobs_in_memory=0)
    try:
        await submit(master, "q")
        await submit(master, "r")
        await run(master, sessions, clock, "q")
        assert "q" not in master.core.jobs and per_job_state(master, "q") == []
        await run(master, sessions, clock, "r", end=False)
        await master.cancel("r")
        await exited(master, "n1", "r", None, 15)
        assert master.core.jobs == {}
        # A job cancelled while queued goes as well.
        await submit(master, "hog", cpus=16)  # takes the whole node ...
        await submit(master, "queued", cpus=16)  # ... so this one waits behind it
        assert master.core.jobs["queued"].state is JobState.QUEUED
        reply = await Rpc(master).call("cancel", {"id": "queued"})  # ends, forgotten at once
        assert reply["job"]["state"] == "cancelled"
        assert "queued" not in master.core.jobs and per_job_state(master, "queued") == []
        assert master.store.load_job("queued").state is JobState.CANCELLED  # type: ignore[union-attr]
    finally:
        await master.close()


async def test_memory_stays_bounded_over_three_times_the_cap(tmp_path: Path) -> None:
    clock = Clock()
    cap = 5
    master, sessions = make_master(tmp_path, clock, NODE, finished_jobs_in_memory=cap)
    rpc = Rpc(master)
    try:
        largest = most_ended = 0
        for i in range(3 * cap):
            job_id = await submit(master, f"j{i}")
            await run(master, sessions, clock, job_id, end=False)
            # What an operator does to a job: look at it, list jobs, report metrics.
            await rpc.call("job", {"id": job_id})
            await rpc.call("jobs", {})
            master.job_metrics.on_event("n1", JobMetric(job_id=job_id, name="loss", value=1.0,
                                                        last=1.0, count=1),
                                        master.core.jobs[job_id])
            largest = max(largest, len(master.core.jobs))
            clock.now += 1
            await exited(master, "n1", job_id)
            await rpc.call("jobs", {})  # views of the ended jobs get cached again
            largest = max(largest, len(master.core.jobs))
            most_ended = max(most_ended, len(ended_in_memory(master)))
        assert most_ended == cap and largest == cap + 1  # the cap plus the one running
        assert len(master.core.jobs) == cap and len(master._ended) == cap
        assert len(master.job_metrics) <= cap
        assert len(master.journal.wire) <= cap
        assert len((await rpc.call("jobs", {}))["jobs"]) == cap
        assert len(master.store.load_jobs()) == 3 * cap
        for i in range(2 * cap):  # the forgotten ones left nothing behind
            assert per_job_state(master, f"j{i}") == [], i
    finally:
        await master.close()


# -- restarts ----------------------------------------------------------------------------------
def test_store_restores_active_jobs_and_the_newest_ended(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.db")
    states = {1: JobState.FINISHED, 2: JobState.QUEUED, 3: JobState.FAILED,
              4: JobState.RUNNING, 5: JobState.CANCELLED, 6: JobState.FINISHED,
              7: JobState.STARTING, 8: JobState.FAILED}
    for seq, state in states.items():
        j = job(f"s{seq}", t=float(seq))
        j.state = state
        store.insert_jobs([(seq, j)])
    assert [j.id for j in store.restore_jobs(2)] == ["s2", "s4", "s6", "s7", "s8"]
    assert [j.id for j in store.restore_jobs(3)] == ["s2", "s4", "s5", "s6", "s7", "s8"]
    assert [j.id for j in store.restore_jobs(0)] == ["s2", "s4", "s7"]
    assert len(store.restore_jobs(100)) == 8
    assert store.load_job("s1").state is JobState.FINISHED  # type: ignore[union-attr]
    assert store.load_job("nope") is None
    assert store.next_seq() == 9
    assert sorted(j.id for j in store.ended_jobs(5.0)) == ["s5", "s6", "s8"]
    store.close()


async def test_a_restart_loads_active_jobs_and_the_newest_ended(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, NODE, finished_jobs_in_memory=100)
    for i in range(6):
        await submit(master, f"e{i}")
        await run(master, sessions, clock, f"e{i}")
    await submit(master, "running")
    await run(master, sessions, clock, "running", end=False)
    await submit(master, "queued", cpus=16)
    await master.close()

    clock.now += 10
    again, _ = make_master(tmp_path, clock, NODE, finished_jobs_in_memory=2)
    try:
        assert sorted(again.core.jobs) == ["e4", "e5", "queued", "running"]
        assert list(again._ended) == ["e4", "e5"]  # oldest-ended first
        assert [j.id for j in again.core.queue()] == ["queued"]
        assert again.core.jobs["running"].state is JobState.RUNNING
        # Forgotten in memory, still answered from the journal.
        shown = await Rpc(again).call("job", {"id": "e0"})
        assert shown["job"]["state"] == "finished"
    finally:
        await again.close()


# -- RPCs about a forgotten job ----------------------------------------------------------------
async def test_rpcs_about_a_forgotten_job(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, NODE, finished_jobs_in_memory=1)
    rpc = Rpc(master)
    try:
        await submit(master, "old")
        await run(master, sessions, clock, "old")
        before = await rpc.call("job", {"id": "old"})  # still in memory
        assert before["events"][0]["kind"] == "submitted"
        assert before["events"][-1]["kind"] == "finished"
        with pytest.raises(ProtocolError) as in_memory:
            await rpc.call("cancel", {"id": "old"})
        await submit(master, "new")
        await run(master, sessions, clock, "new")
        assert "old" not in master.core.jobs

        # show: the same view and events, read from the journal.
        assert await rpc.call("job", {"id": "old"}) == before
        assert "old" not in master.journal.wire._spec_views  # not cached back
        # cancel: the same refusal as for an ended job in memory.
        with pytest.raises(ProtocolError) as forgotten:
            await rpc.call("cancel", {"id": "old"})
        assert forgotten.value.code == in_memory.value.code == "job_finished"
        assert forgotten.value.message == in_memory.value.message == \
            "job old already ended (finished)"
        # jobs lists what is in memory.
        assert [j["id"] for j in (await rpc.call("jobs", {}))["jobs"]] == ["new"]
        # An unknown id is still unknown.
        with pytest.raises(ProtocolError) as unknown:
            await rpc.call("job", {"id": "never"})
        assert unknown.value.code == "unknown_job"

        # The id stays taken: refused clearly, nothing written, nothing lost.
        events = master.store.events("old")
        with pytest.raises(ProtocolError) as dup:
            await rpc.call("submit", {"id": "old", "job": {
                "name": "x", "command": ["true"], "user": "nobody", "kind": "cpu", "gpus": 0,
                "cpus": 1}})
        assert dup.value.code == "duplicate_job"
        assert "'old' already exists" in dup.value.message
        assert "UNIQUE" not in dup.value.message
        assert "old" not in master.core.jobs and master.journal.wire._specs.get("old") is None
        assert master.store.events("old") == events
        assert master.store.load_job("old").spec.name == "t"  # type: ignore[union-attr]
        # The master goes on accepting work.
        await submit(master, "after")
        await run(master, sessions, clock, "after")
        assert master.store.load_job("after").state is JobState.FINISHED  # type: ignore[union-attr]
    finally:
        await master.close()


# -- late node events --------------------------------------------------------------------------
async def test_late_events_about_a_forgotten_job_are_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, NODE, finished_jobs_in_memory=0)
    try:
        await submit(master, "gone")
        await run(master, sessions, clock, "gone")
        assert "gone" not in master.core.jobs
        events = master.store.events("gone")
        late: list[tuple[str, Any]] = [
            ("job_started", JobStarted(job_id="gone", pid=7)),
            ("job_exited", JobExited(job_id="gone", exit_code=0)),
            ("job_metric", JobMetric(job_id="gone", name="loss", value=1.0, last=1.0,
                                     count=1)),
            ("cores_changed", CoresChanged(job_id="gone", cpus=(0,), pinned=(0,), step=1)),
        ]
        with caplog.at_level(logging.INFO, logger="trellis.master"):
            for type_, body in late:
                check_event(master.core, "n1", body)  # let through, not refused
                await master.node_event("n1", type_, body)
        assert any("gone" in r.getMessage() and "not in memory" in r.getMessage()
                   for r in caplog.records)
        assert master.store.events("gone") == events  # nothing recorded for it
        await until("forget_job sent", lambda: any(
            c.job_id == "gone" for c in sessions["n1"].commands("forget_job")))
        assert per_job_state(master, "gone") == [] and "gone" not in master.core.jobs
        # The node's session goes on working.
        await submit(master, "next")
        await run(master, sessions, clock, "next")
        assert master.store.load_job("next").state is JobState.FINISHED  # type: ignore[union-attr]
    finally:
        await master.close()


async def test_a_node_session_survives_late_events_for_a_forgotten_job(tmp_path: Path) -> None:
    """Through the real node endpoint: the node reconnects after a partition and reports a
    job the master has long forgotten; every frame is acknowledged, none refused."""
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, NODE, finished_jobs_in_memory=0)
    server = TestServer(make_app(master))
    await server.start_server()
    try:
        await submit(master, "gone")
        await run(master, sessions, clock, "gone")
        del master.sessions["n1"]  # partitioned: the fake session is gone
        hello = Hello(inventory=inventory("n1", gpus=0, cpus=16, numa=1))
        frames = [
            encode_frame("hello", 1, encode(hello)),
            encode_frame("job_exited", 2, encode(JobExited(job_id="gone", exit_code=0))),
            encode_frame("job_started", 3, encode(JobStarted(job_id="gone", pid=9))),
            encode_frame("job_exited", 4, encode(JobExited(job_id="gone", signal=9))),
        ]
        answers: dict[int, str] = {}
        commands: list[str] = []
        async with aiohttp.ClientSession() as http, \
                http.ws_connect(server.make_url("/v1/node")) as ws:
            for frame in frames:
                await ws.send_bytes(frame)
            async with asyncio.timeout(5):
                while len(answers) < len(frames) or "forget_job" not in commands:
                    msg = await ws.receive()
                    assert msg.type == aiohttp.WSMsgType.BINARY, msg
                    data = msgpack.unpackb(msg.data)
                    if data["type"] in ("ack", "error"):
                        answers[data["id"]] = data["type"]
                    else:  # a command from the master: acknowledge it like a node
                        commands.append(data["type"])
                        await ws.send_bytes(encode_frame("ack", data["id"], {}))
            assert answers == {1: "ack", 2: "ack", 3: "ack", 4: "ack"}
            assert isinstance(master.sessions["n1"], NodeSession)
            assert master.node_status("n1") == "ready"
    finally:
        await server.close()
        await master.close()


# -- per-job state elsewhere -------------------------------------------------------------------
async def test_a_forgotten_failed_replica_still_backs_off(tmp_path: Path) -> None:
    """A replica that dies at once is forgotten (cap 0) before the placer's next plan
    looks at it: the failure must still count, or the replica is relaunched every pass."""
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 4)}, finished_jobs_in_memory=0,
                                   inference={"sustain_s": 0.0})
    try:
        await master.features.inference.register_service(RegisterServiceParams(
            service="svc", command=("serve",), user="nobody", bs_gpu=10, cpu_batch=4,
            cpu_cores=1, cpu_mbw_gbps=1.0))
        await until("the launch", lambda: sessions["g1"].commands("start_job"))
        [replica] = master.core.jobs
        await started(master, "g1", replica)
        await exited(master, "g1", replica, 1)  # dies at once: a failed replica
        assert replica not in master.core.jobs
        for _ in range(5):  # inside the back-off: no relaunch, though the job is gone
            master.request_pass()
            await until("a pass", lambda: not master._pass_pending)
        assert len(sessions["g1"].commands("prepare_job")) == 1
        assert master.features.inference.live == set()
        clock.now += 2  # past the first back-off (1 s)
        master.request_pass()
        await until("a second attempt",
                    lambda: len(sessions["g1"].commands("prepare_job")) == 2)
    finally:
        await master.close()


def test_job_metrics_forget_drops_a_jobs_values() -> None:
    clock = Clock()
    metrics = JobMetrics(clock, min_interval_s=10.0, max_jobs=2)
    jobs = {}
    for job_id in ("a", "b", "c"):
        j = job(job_id, gpus=0)
        j.state, j.node_states = JobState.RUNNING, {"n1": "running"}
        jobs[job_id] = j
        assert metrics.on_event("n1", JobMetric(job_id=job_id, name="loss", value=1.0,
                                                last=1.0, count=1), j)
    assert len(metrics) == 2 and metrics.of("a") == {}  # the oldest went past max_jobs
    assert set(metrics._last) == {"b", "c"}
    metrics.forget("b")
    assert metrics.of("b") == {} and set(metrics._last) == {"c"}
    # Rate limiting is per job, node and name, and starts over for a forgotten job.
    assert not metrics.on_event("n1", JobMetric(job_id="c", name="loss", value=2.0, last=2.0,
                                                count=1), jobs["c"])
    assert metrics.on_event("n1", JobMetric(job_id="b", name="loss", value=2.0, last=2.0,
                                            count=1), jobs["b"])


def test_demand_log_sums_per_bucket_and_keeps_only_the_window() -> None:
    day = 86_400.0
    log = DemandLog(window_s=day)
    assert log.bucket_s == pytest.approx(day / 1024)
    t0 = 100 * day
    for i in range(1000):  # a thousand jobs inside one bucket
        log.add(DemandRecord(end_time=t0 + i * 0.01, array_kind="small", gpu_model="A100",
                             gpu_seconds=2.0, core_seconds=1.0))
    log.add(DemandRecord(end_time=t0 + 5, array_kind="large", gpu_model="A100",
                         gpu_seconds=8.0, core_seconds=4.0))
    assert len(log) == 2 and log.jobs(t0) == 1001
    small = next(r for r in log.records(t0) if r.array_kind == "small")
    assert small.gpu_seconds == pytest.approx(2000.0) and small.end_time == t0 + 9.99
    # A day and more later, the old buckets fall out of the window.
    log.add(DemandRecord(end_time=t0 + day + 3600, array_kind="cpu", gpu_model=None,
                         gpu_seconds=0.0, core_seconds=7.0))
    assert [r.array_kind for r in log.records(0.0)] == ["cpu"] and log.jobs(0.0) == 1
    with pytest.raises(ValueError, match="positive"):
        DemandLog(0)


async def test_array_demand_outlives_forgotten_jobs_and_restarts(tmp_path: Path) -> None:
    clock = Clock()
    options = {"policy": "soda-arrays", "array_resize_interval_s": 0,
               "finished_jobs_in_memory": 0, "policy_options": {"borrowing": True}}
    master, sessions = make_master(tmp_path, clock, NODE, **options)
    try:
        for i in range(3):
            await submit(master, f"c{i}", cpus=2)
            await run(master, sessions, clock, f"c{i}", end=False)
            clock.now += 10
            await exited(master, "n1", f"c{i}")
        assert master.core.jobs == {}
        [record] = master.features.arrays.history(clock.now - 3600)
        assert record.array_kind == "cpu" and record.core_seconds == pytest.approx(60.0)
        assert (await master.features.arrays.resize_now())["jobs"] == 3
    finally:
        await master.close()

    clock.now += 60
    again, _ = make_master(tmp_path, clock, NODE, **options)
    try:
        assert again.core.jobs == {}
        [record] = again.features.arrays.history(clock.now - 3600)
        assert record.core_seconds == pytest.approx(60.0)  # read back from the journal
        clock.now += 8 * 86_400  # past the 7-day window
        assert again.features.arrays.history(clock.now - 7 * 86_400) == []
    finally:
        await again.close()


# -- a refusal on the last allowed attempt -----------------------------------------------------
class RefusingUser(FakeSession):
    async def request(self, type_: str, body: Any) -> dict[str, Any]:
        if type_ == "prepare_job":
            self.sent.append((type_, body))
            raise CommandFailed(self.name, type_, "user_refused", "no such user here")
        return await super().request(type_, body)


async def test_a_permanent_refusal_on_the_last_attempt_is_recorded(tmp_path: Path) -> None:
    """The core fails a job on its last allowed start; the master must record that, not
    try to cancel the already-failed job (which raised, and left it unrecorded)."""
    clock = Clock()
    master, _ = make_master(tmp_path, clock, NODE, max_start_failures=1,
                            finished_jobs_in_memory=0)
    master.sessions["n1"] = RefusingUser("n1")  # type: ignore[assignment]
    try:
        await submit(master, "refused")
        await until("the job recorded as failed", lambda: (
            (j := master.store.load_job("refused")) is not None
            and j.state is JobState.FAILED))
        stored = master.store.load_job("refused")
        assert stored is not None and stored.reason.startswith("refused by the node")
        assert "refused" not in master.core.jobs  # counted as ended, so forgotten
    finally:
        await master.close()
