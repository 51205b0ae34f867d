"""The master's half of SODA's CPU allocator: N_start at launch, cores_changed, history."""

from __future__ import annotations

from pathlib import Path

import pytest

from masterd.core.scheduler import JobError
from masterd.journal.cores import load_history, remember_cores
from masterd.journal.store import Store
from shared.messages import CoresChanged
from shared.model import JobSpec, JobState
from tests.unit.master_fakes import Clock, make_master, started, until


def spec(name: str = "r50", cpus: int = 6, **kw: object) -> JobSpec:
    return JobSpec(name=name, command=("train",), user="nobody", gpus=1, cpus=cpus,
                   model_family="cv", **kw)  # type: ignore[arg-type]


def test_history_keeps_the_largest_count_and_survives_reopening(tmp_path: Path) -> None:
    store = Store(tmp_path / "master.db")
    assert load_history(store) == {}
    assert remember_cores(store, "alice", "cv", 3, 1.0) == 3
    assert remember_cores(store, "alice", "cv", 2, 2.0) == 3  # the largest wins (§V-B1)
    assert remember_cores(store, "alice", "nlp", 5, 3.0) == 5
    with pytest.raises(ValueError):
        remember_cores(store, "alice", "cv", 0, 4.0)
    store.close()
    again = Store(tmp_path / "master.db")
    assert load_history(again) == {("alice", "cv"): 3, ("alice", "nlp"): 5}
    again.close()


async def test_launch_carries_n_start_and_tuning_frees_cores(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 8)}, adaptive_cpus=True)
    try:
        job = await master.submit(spec())
        await until("the launch", lambda: sessions["g1"].commands("start_job"))
        [prepare] = sessions["g1"].commands("prepare_job")
        # spec.cpus is the budget held; N_start is the CV default, 3, inside it.
        assert len(prepare.allocation.cpus) == 6
        plan = prepare.cores
        assert plan is not None and plan.n_start == 3 and plan.launch_cores == 3
        assert plan.warm is False
        await started(master, "g1", job.id)
        held = prepare.allocation.cpus
        # A probe: the tuner keeps four cores, runs on two.
        await master.features.adaptive.cores_changed("g1", CoresChanged(
            job_id=job.id, cpus=held[:4], pinned=held[:2], step=1, utilisation=80.0,
            measured_cores=6))
        assert master.core.cluster.node("g1").free_cpus == frozenset(range(8)) - set(held[:4])
        # Converged on two: the rest is free, and the count is history.
        await master.features.adaptive.cores_changed("g1", CoresChanged(
            job_id=job.id, cpus=held[:2], pinned=held[:2], step=2, utilisation=79.0,
            measured_cores=2, converged=True))
        assert job.placement is not None and job.placement.allocations[0].cpus == held[:2]
        assert master.features.adaptive.history == {("nobody", "cv"): 2}
        assert load_history(master.store) == {("nobody", "cv"): 2}
        kinds = [e.kind for e in master.store.events(job.id)]
        assert kinds.count("cores_changed") == 2 and "cores_start" in kinds
        stored = {j.id: j for j in master.store.load_jobs()}[job.id]
        assert stored.placement is not None and stored.placement.allocations[0].cpus == held[:2]

        # The owner's next CV job starts warm from that history.
        second = await master.submit(spec("r101"))
        await until("the second launch", lambda: len(sessions["g1"].commands("start_job")) == 2)
        plan2 = sessions["g1"].commands("prepare_job")[1].cores
        assert plan2 is not None and plan2.n_start == 2 and plan2.warm is True
        assert second.state is JobState.STARTING
    finally:
        await master.close()


async def test_bogus_core_reports_change_nothing(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 8)}, adaptive_cpus=True)
    try:
        job = await master.submit(spec(cpus=4))
        await until("the launch", lambda: sessions["g1"].commands("start_job"))
        await started(master, "g1", job.id)
        free = master.core.cluster.node("g1").free_cpus
        held = job.placement.allocations[0].cpus  # type: ignore[union-attr]
        outside = min(free)
        # Cores it never held (even free ones: the budget was given at launch), an unknown
        # job, a node it does not run on: all refused.
        for node, event in (
            ("g1", CoresChanged(job_id=job.id, cpus=(*held, outside), pinned=held, step=1)),
            ("g1", CoresChanged(job_id="ghost", cpus=held, pinned=held, step=1)),
            ("g9", CoresChanged(job_id=job.id, cpus=held[:1], pinned=held[:1], step=1)),
        ):
            await master.features.adaptive.cores_changed(node, event)
        assert master.core.cluster.node("g1").free_cpus == free
        assert master.features.adaptive.history == {}
    finally:
        await master.close()


async def test_allocator_settings_are_checked_at_submission(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (4, 16)}, adaptive_cpus=False)
    try:
        with pytest.raises(JobError) as err:
            await master.submit(spec(env={"TRELLIS_ADAPTIVE_CPUS": "maybe"}))
        assert err.value.code == "invalid_job" and "TRELLIS_ADAPTIVE_CPUS" in str(err.value)
        with pytest.raises(JobError):
            await master.submit(spec(env={"TRELLIS_PIPELINED_INPUT": "perhaps"}))
        # Off for the cluster, on for this job; and a one-core job has nothing to tune.
        await master.submit(spec("on", env={"TRELLIS_ADAPTIVE_CPUS": "1"}))
        await master.submit(spec("off"))
        await master.submit(spec("one", cpus=1, env={"TRELLIS_ADAPTIVE_CPUS": "yes"}))
        await until("three launches", lambda: len(sessions["g1"].commands("start_job")) == 3)
        plans = {p.job_id.rsplit("-", 1)[0]: p.cores
                 for p in sessions["g1"].commands("prepare_job")}
        assert plans["on"] is not None and plans["off"] is None and plans["one"] is None
    finally:
        await master.close()


async def test_a_job_gets_more_cores_than_asked_from_spare_ones(tmp_path: Path) -> None:
    """§V-B/§VI-D: with a per-GPU ceiling the request is not the ceiling; the extra cores
    come from spare cores of the node, a reserve kept for its other free GPU."""
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 8)}, adaptive_cpus=True,
                                   adaptive_max_cores_per_gpu=6)
    try:
        job = await master.submit(spec(cpus=1))
        await until("the launch", lambda: sessions["g1"].commands("start_job"))
        [prepare] = sessions["g1"].commands("prepare_job")
        # Asked 1; 7 free, 4 of them (8 cores / 2 GPUs) kept for the other free GPU: 3 more.
        held = prepare.allocation.cpus
        assert len(held) == 4
        assert master.core.cluster.node("g1").free_cpus == frozenset(range(8)) - set(held)
        plan = prepare.cores
        assert plan is not None and plan.n_start == 3  # CV's N_start fits the widened budget
        stored = {j.id: j for j in master.store.load_jobs()}[job.id]
        assert stored.placement is not None and stored.placement.allocations[0].cpus == held
        starts = await until("the cores_start event", lambda: [
            e for e in master.store.events(job.id) if e.kind == "cores_start"])
        assert starts[0].detail["asked"] == 1 and starts[0].detail["max_cores"] == 4
        # The tuner hands back what it does not need, down to fewer than the widened budget.
        await started(master, "g1", job.id)
        await master.features.adaptive.cores_changed("g1", CoresChanged(
            job_id=job.id, cpus=held[:2], pinned=held[:2], step=1, utilisation=80.0,
            measured_cores=2, converged=True))
        assert master.core.cluster.node("g1").free_cpus == frozenset(range(8)) - set(held[:2])
    finally:
        await master.close()


async def test_without_a_ceiling_the_request_is_the_budget(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (1, 8)}, adaptive_cpus=True)
    try:
        await master.submit(spec(cpus=1))
        await until("the launch", lambda: sessions["g1"].commands("start_job"))
        [prepare] = sessions["g1"].commands("prepare_job")
        assert len(prepare.allocation.cpus) == 1 and prepare.cores is None
    finally:
        await master.close()
