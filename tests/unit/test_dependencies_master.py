"""The dependencies feature in a real in-process master (fake node sessions): gates closed at
submission and opened when the named jobs end, cancellation with the reason naming the
dependency (and its cascade), refusals of unknown ids and cycles, arrays, forgotten jobs
resolved through the journal, and the restore."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from masterd.core.scheduler import JobError
from masterd.journal.store import Store
from masterd.service.bulk import BatchRefused
from masterd.service.master import Master
from shared.dependency import parse_dependency
from shared.model import ArrayTask, JobKind, JobSpec, JobState
from tests.unit.master_fakes import Clock, FakeSession, exited, make_master, started, until

NODE = {"n1": (0, 16)}


def spec(name: str, after: str = "", array: ArrayTask | None = None) -> JobSpec:
    return JobSpec(name=name, command=("true",), user="nobody", kind=JobKind.CPU, gpus=0,
                   cpus=1, after=parse_dependency(after) if after else (), array=array)


async def run(master: Master, sessions: dict[str, FakeSession], clock: Clock, job_id: str,
              code: int = 0) -> None:
    await until(f"{job_id} launched", lambda: any(
        c.job_id == job_id for c in sessions["n1"].commands("start_job")))
    await started(master, "n1", job_id)
    clock.now += 1
    await exited(master, "n1", job_id, code)


def launched(sessions: dict[str, FakeSession]) -> list[str]:
    return [c.job_id for c in sessions["n1"].commands("start_job")]


def events(master: Master, job_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.detail for e in master.store.events(job_id) if e.kind == kind]


async def settle(master: Master) -> None:
    """Let background tasks (journal writes, cancellations, passes) run."""
    for _ in range(20):
        await asyncio.sleep(0.01)


def test_a_pipeline_runs_in_order_and_a_failure_cancels_the_rest(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        master, sessions = make_master(tmp_path, clock, NODE)
        try:
            await master.submit(spec("prep"), "prep")
            await master.submit(spec("train", "afterok:prep"), "train")
            await master.submit(spec("eval", "afterok:train"), "eval")
            train = master.core.jobs["train"]
            assert train.wait == "dependency"
            # (prep started while train's submission was being journalled.)
            assert train.reason in ("waits for afterok:prep (queued)",
                                    "waits for afterok:prep (starting)")
            await run(master, sessions, clock, "prep")
            await until("train launched", lambda: "train" in launched(sessions))
            assert "eval" not in launched(sessions)
            await run(master, sessions, clock, "train")
            await run(master, sessions, clock, "eval")
            assert launched(sessions) == ["prep", "train", "eval"]
            assert [d["status"] for d in events(master, "train", "dependency")] == [
                "waiting", "satisfied"]

            # The same pipeline again, its first step failing: the rest are cancelled, each
            # with the reason naming its own dependency.
            await master.submit(spec("prep"), "prep2")
            await master.submit(spec("train", "afterok:prep2"), "train2")
            await master.submit(spec("eval", "afterok:train2"), "eval2")
            await run(master, sessions, clock, "prep2", code=1)
            await until("eval2 cancelled",
                        lambda: master.core.jobs["eval2"].state is JobState.CANCELLED)
            train2, eval2 = master.core.jobs["train2"], master.core.jobs["eval2"]
            assert train2.state is JobState.CANCELLED
            assert train2.reason == ("dependency afterok:prep2 can never be satisfied: prep2 "
                                     "failed")
            assert eval2.reason == ("dependency afterok:train2 can never be satisfied: train2 "
                                    "was cancelled")
            assert "train2" not in launched(sessions)
            assert events(master, "train2", "dependency")[-1]["status"] == "never"
        finally:
            await master.close()

    asyncio.run(scenario())


def test_afterany_afternotok_and_several_terms(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        master, sessions = make_master(tmp_path, clock, NODE)
        try:
            await master.submit(spec("a"), "a")
            await master.submit(spec("b"), "b")
            await master.submit(spec("any", "afterany:a"), "any")
            await master.submit(spec("notok", "afternotok:a"), "notok")
            await master.submit(spec("both", "afterok:b,afternotok:a"), "both")
            await run(master, sessions, clock, "a", code=3)
            await until("any launched", lambda: "any" in launched(sessions))
            await until("notok launched", lambda: "notok" in launched(sessions))
            both = master.core.jobs["both"]
            assert both.reason == "waits for afterok:b (running)" or \
                both.reason.startswith("waits for afterok:b")
            await run(master, sessions, clock, "b")
            await until("both launched", lambda: "both" in launched(sessions))
        finally:
            await master.close()

    asyncio.run(scenario())


def test_unknown_ids_cycles_and_self_references_are_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        master, _ = make_master(tmp_path, clock, NODE)
        try:
            with pytest.raises(JobError) as refused:
                await master.submit(spec("x", "afterok:ghost"), "x")
            assert refused.value.code == "unknown_dependency"
            assert "ghost is neither a job nor an array" in str(refused.value)
            assert "x" not in master.core.jobs
            with pytest.raises(JobError, match="cannot depend on itself"):
                await master.submit(spec("x", "afterok:x"), "x")
            # A cycle inside one batch with chosen ids: refused whole, every member named.
            with pytest.raises(BatchRefused) as batch:
                await master.submit_many(
                    [spec("a", "afterok:c"), spec("b", "afterok:a"), spec("c", "afterok:b"),
                     spec("d")], ["a", "b", "c", "d"])
            refused_at = {r.index: r for r in batch.value.refusals}
            assert set(refused_at) == {0, 1, 2}
            assert all(r.code == "dependency_cycle" for r in refused_at.values())
            assert "a -> c -> b -> a" in refused_at[0].message
            assert not {"a", "b", "c", "d"} & set(master.core.jobs)
            # Forward references inside a batch without a cycle are fine.
            jobs = await master.submit_many([spec("late", "afterok:early"), spec("early")],
                                            ["late", "early"])
            assert [j.id for j in jobs] == ["late", "early"]
            assert master.core.jobs["late"].wait == "dependency"
        finally:
            await master.close()

    asyncio.run(scenario())


def test_arrays_afterok_and_aftercorr(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        master, sessions = make_master(tmp_path, clock, NODE)
        try:
            # Tasks the master names take the first task's id as their array's.
            first = await master.submit_many(
                [spec(f"sweep_{i}", array=ArrayTask("sweep", i)) for i in range(3)])
            array_id = first[0].id
            assert {j.spec.array.id for j in first} == {array_id}  # type: ignore[union-attr]
            assert [j.spec.array.index for j in first] == [0, 1, 2]  # type: ignore[union-attr]
            stored = master.store.load_job(first[2].id)  # journalled under that id too
            assert stored is not None and stored.spec.array == ArrayTask(array_id, 2)
            # A second array given ids, each task waiting for its own index of the first.
            second = await master.submit_many(
                [spec(f"post_{i}", f"aftercorr:{array_id}", ArrayTask("post", i))
                 for i in range(3)], [f"post_{i}" for i in range(3)])
            whole = await master.submit(spec("report", f"afterok:{array_id}"), "report")
            assert whole.reason == f"waits for afterok:{array_id} (array: 0 of 3 tasks ended)"
            await run(master, sessions, clock, first[1].id)
            await until("post_1 launched", lambda: "post_1" in launched(sessions))
            assert "post_0" not in launched(sessions)
            assert whole.reason == f"waits for afterok:{array_id} (array: 1 of 3 tasks ended)"
            await run(master, sessions, clock, first[0].id)
            await run(master, sessions, clock, first[2].id, code=1)
            await until("report cancelled", lambda: whole.state is JobState.CANCELLED)
            assert whole.reason == (f"dependency afterok:{array_id} can never be satisfied: "
                                    f"its task {first[2].id} failed")
            await until("post_2 cancelled",
                        lambda: master.core.jobs["post_2"].state is JobState.CANCELLED)
            assert second[0].id == "post_0"
            # aftercorr from a job that is no array task, and to a missing index: refused.
            with pytest.raises(JobError, match="not an array task"):
                await master.submit(spec("lone", f"aftercorr:{array_id}"), "lone")
            with pytest.raises(JobError, match="no task of index 7"):
                await master.submit(spec("p7", f"aftercorr:{array_id}", ArrayTask("p7a", 7)),
                                    "p7")
            # An array id given again is refused.
            with pytest.raises(BatchRefused, match="taken by an existing array"):
                await master.submit_many([spec("post_9", array=ArrayTask("post", 9))],
                                         ["post_9"])
        finally:
            await master.close()

    asyncio.run(scenario())


def test_forgotten_jobs_resolve_through_the_journal(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = Clock()
        master, sessions = make_master(tmp_path, clock, NODE, finished_jobs_in_memory=0)
        try:
            await master.submit(spec("old-ok"), "old-ok")
            await master.submit(spec("old-bad"), "old-bad")
            await run(master, sessions, clock, "old-ok")
            await run(master, sessions, clock, "old-bad", code=2)
            await until("both forgotten", lambda: not {"old-ok", "old-bad"} & set(
                master.core.jobs))
            # Gone from memory and from the feature's remembered outcomes: the journal says.
            master.features.dependencies.outcomes.clear()
            ok = await master.submit(spec("n1", "afterok:old-ok"), "n1")
            assert ok.wait == ""
            bad = await master.submit(spec("n2", "afterok:old-bad"), "n2")
            await until("n2 cancelled", lambda: bad.state is JobState.CANCELLED)
            assert bad.reason.endswith("old-bad failed")
        finally:
            await master.close()

    asyncio.run(scenario())


def test_restore_closes_gates_again_and_settles_what_changed(tmp_path: Path) -> None:
    async def first_run() -> None:
        clock = Clock()
        master, sessions = make_master(tmp_path, clock, NODE)
        try:
            await master.submit(spec("a"), "a")
            await master.submit(spec("b"), "b")
            await master.submit(spec("wait-a", "afterok:a"), "wait-a")
            await master.submit(spec("wait-b", "afterok:b"), "wait-b")
            await master.submit(spec("wait-c", "afterok:wait-b"), "wait-c")
            await master.submit(spec("x"), "x")
            await master.submit(spec("wait-x", "afterok:x"), "wait-x")
            await until("a, b and x launched",
                        lambda: {"a", "b", "x"} <= set(launched(sessions)))
            await started(master, "n1", "a")
            await settle(master)
        finally:
            await master.close()
        # While the master is down, its journal learns that b failed and x finished (as a
        # master killed between journalling their ends and acting on them leaves it).
        store = Store(tmp_path / "master.db")
        for job_id, state, code in (("b", JobState.FAILED, 1), ("x", JobState.FINISHED, 0)):
            ended = store.load_job(job_id)
            assert ended is not None
            ended.state, ended.exit_code, ended.end_time = state, code, clock.now
            ended.node_states = {}
            store.update_jobs([ended], [])
        store.close()

    asyncio.run(first_run())

    async def second_run() -> None:
        clock = Clock()
        master, sessions = make_master(tmp_path, clock, NODE)
        try:
            wait_a = master.core.jobs["wait-a"]
            assert (wait_a.wait, wait_a.reason) == ("dependency",
                                                    "waits for afterok:a (running)")
            assert "wait-a" not in [j.id for j in master.core.queue()]
            await until("wait-b cancelled",
                        lambda: master.core.jobs["wait-b"].state is JobState.CANCELLED)
            await until("wait-c cancelled",
                        lambda: master.core.jobs["wait-c"].state is JobState.CANCELLED)
            # x finished while the master was down: wait-x goes, journalled as satisfied.
            await until("wait-x launched", lambda: "wait-x" in launched(sessions))
            assert [d["status"] for d in events(master, "wait-x", "dependency")] == [
                "waiting", "satisfied"]
            await exited(master, "n1", "a", 0)
            await until("wait-a launched", lambda: "wait-a" in launched(sessions))
        finally:
            await master.close()

    asyncio.run(second_run())
