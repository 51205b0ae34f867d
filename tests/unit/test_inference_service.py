"""The master's inference driver: replica jobs, retirement, preemption, back-off, restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from masterd.core.scheduler import JobError
from masterd.features.inference import (
    RegisterServiceParams,
    ReportLoadParams,
    ServiceParams,
)
from shared.messages import MEM_BANDWIDTH_REPORT_EVERY_S, MemBandwidth
from shared.model import JobKind, JobSpec, JobState
from tests.unit.master_fakes import Clock, exited, make_master, started, until

SVC = RegisterServiceParams(service="resnet", command=("serve", "--model", "resnet50"),
                            user="nobody", bs_gpu=10, cpu_batch=4, cpu_cores=1,
                            cpu_mbw_gbps=1.0, port=9000, env={"MODEL": "r50"})
INFERENCE = {"sustain_s": 0.0}


def replica_jobs(master: Any) -> dict[str, Any]:
    return {j.id: j for j in master.core.jobs.values() if j.spec.kind is JobKind.INFERENCE}


async def test_a_replica_is_a_real_job_and_place_is_cached(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 4)}, inference=INFERENCE)
    try:
        reply = await master.features.inference.register_service(SVC)
        [ep] = reply["endpoints"]
        assert reply["mode"] == "cpu" and ep["kind"] == "cpu" and not ep["ready"]
        job = master.core.jobs[ep["job"]]
        # Allocated at once: the next pass must see the core taken.
        assert master.core.cluster.node("g1").free_cpus == frozenset(range(4)) - set(ep["cpus"])
        await until("the launch", lambda: sessions["g1"].commands("start_job"))
        [prepare] = sessions["g1"].commands("prepare_job")
        assert prepare.spec.kind is JobKind.INFERENCE and prepare.spec.command == SVC.command
        env = prepare.spec.env
        assert env["TRELLIS_SERVICE"] == "resnet" and env["TRELLIS_REPLICA_KIND"] == "cpu"
        assert env["TRELLIS_BATCH"] == "4" and env["MODEL"] == "r50"
        assert env["TRELLIS_SERVICE_PORT"] == str(ep["port"])
        assert prepare.allocation.cpus == tuple(ep["cpus"]) and prepare.cores is None
        # Journalled like any job.
        stored = {j.id: j for j in master.store.load_jobs()}
        assert stored[job.id].spec.kind is JobKind.INFERENCE

        await started(master, "g1", job.id)
        first = await master.features.inference.place(ServiceParams("resnet"))
        assert first["endpoints"][0]["ready"] and first["version"] > reply["version"]
        again = await master.features.inference.place(ServiceParams("resnet"))
        assert again is first  # the cached reply, not a rebuild
    finally:
        await master.close()


async def test_high_load_moves_to_gpus_and_retires_the_cpu_replica(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 4)}, inference=INFERENCE)
    try:
        await master.features.inference.register_service(SVC)
        [cpu_job] = replica_jobs(master)
        await until("the launch", lambda: sessions["g1"].commands("start_job"))
        await started(master, "g1", cpu_job)
        clock.now += 1
        reply = await master.features.inference.report_load(ReportLoadParams("resnet", load=12.0))
        assert reply["mode"] == "gpu"
        assert sorted(e["gpu"] for e in reply["endpoints"]) == [0, 1]
        await until("the CPU replica to be stopped", lambda: any(
            s.job_id == cpu_job for s in sessions["g1"].commands("stop_job")))
        await exited(master, "g1", cpu_job, None, 15)
        assert master.core.jobs[cpu_job].state is JobState.CANCELLED
        gpu_jobs = [j for j in replica_jobs(master).values() if j.spec.gpus == 1]
        assert len(gpu_jobs) == 2 and all(j.state is JobState.STARTING for j in gpu_jobs)
        with pytest.raises(JobError) as err:
            await master.features.inference.report_load(ReportLoadParams("resnet", qps=-1.0))
        assert err.value.code == "invalid_params" and "qps" in str(err.value)
    finally:
        await master.close()


async def test_inference_preempts_the_newest_training_job_which_requeues_at_the_head(
    tmp_path: Path,
) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 4)}, inference=INFERENCE)
    try:
        older = await master.submit(JobSpec(name="older", command=("t",), user="nobody",
                                            gpus=1, cpus=1))
        clock.now += 1
        newer = await master.submit(JobSpec(name="newer", command=("t",), user="nobody",
                                            gpus=1, cpus=1))
        await until("both trainers launched",
                    lambda: len(sessions["g1"].commands("start_job")) == 2)
        for job in (older, newer):
            await started(master, "g1", job.id)
        gpu_only = RegisterServiceParams(service="bert", command=("serve",), user="nobody",
                                         bs_gpu=8)
        await master.features.inference.register_service(gpu_only)
        assert newer.reason.startswith("preempted: inference service bert")
        assert older.state is JobState.RUNNING
        await until("the victim stopped", lambda: any(
            s.job_id == newer.id for s in sessions["g1"].commands("stop_job")))
        await exited(master, "g1", newer.id, None, 15)
        # The freed GPU went to the replica in the same pass, before the policy ran.
        assert newer.state is JobState.QUEUED and newer.requeue_priority >= 1
        [replica] = await until("the replica", lambda: [
            j for j in replica_jobs(master).values()
            if j.spec.env.get("TRELLIS_SERVICE") == "bert"])
        assert not master._pass_pending
        assert replica.placement is not None and replica.placement.gpu_count == 1
        assert [j.id for j in master.core.queue()] == [newer.id]
        events = master.store.events(newer.id)
        assert any(e.kind == "preempted" for e in events)
    finally:
        await master.close()


async def test_a_refused_replica_backs_off_instead_of_relaunching_every_pass(
    tmp_path: Path,
) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 4)}, inference=INFERENCE)
    sessions["g1"].refuse_prepare = True
    try:
        await master.features.inference.register_service(SVC)
        await until("a refused prepare", lambda: sessions["g1"].commands("prepare_job"))
        [job] = replica_jobs(master).values()
        await until("the replica cancelled", lambda: job.state is JobState.CANCELLED)
        for _ in range(5):  # passes come and go; no new launch inside the back-off
            master.request_pass()
            await until("a pass", lambda: not master._pass_pending)
        assert len(sessions["g1"].commands("prepare_job")) == 1
        place = await master.features.inference.place(ServiceParams("resnet"))
        assert len(place["endpoints"]) == 1 and not place["endpoints"][0]["ready"]
        clock.now += 2  # past the first back-off (1 s)
        master.request_pass()
        await until("a second attempt",
                    lambda: len(sessions["g1"].commands("prepare_job")) == 2)
        # A refused replica is cancelled, never left in the queue for the policy to start.
        await until("both attempts cancelled", lambda: all(
            j.state is JobState.CANCELLED for j in replica_jobs(master).values()))
        assert len(replica_jobs(master)) == 2 and list(master.core.queue()) == []
    finally:
        await master.close()


async def test_a_restarted_master_keeps_services_and_adopts_replicas(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 4)}, inference=INFERENCE)
    await master.features.inference.register_service(SVC)
    [job_id] = replica_jobs(master)
    await until("the launch", lambda: sessions["g1"].commands("start_job"))
    await started(master, "g1", job_id)
    before = await master.features.inference.place(ServiceParams("resnet"))
    await master.close()

    clock.now += 10
    again, sessions = make_master(tmp_path, clock, {"g1": (2, 4)}, inference=INFERENCE)
    try:
        listed = (await again.features.inference.services(None))["services"]  # type: ignore[arg-type]
        assert [s["service"] for s in listed] == ["resnet"]
        after = await again.features.inference.place(ServiceParams("resnet"))
        assert [e["job"] for e in after["endpoints"]] == [job_id]
        assert after["version"] > before["version"]
        again.features.inference.plan()
        assert list(replica_jobs(again)) == [job_id]  # adopted, not relaunched
        # Replicas launched from now on are numbered past the adopted one.
        await again.features.inference.report_load(ReportLoadParams("resnet", load=3.9))
        ids = sorted(e["replica"] for e in
                     (await again.features.inference.place(ServiceParams("resnet")))["endpoints"])
        assert ids == ["resnet-cpu-1", "resnet-cpu-2"]
    finally:
        await again.close()


async def test_unknown_services_and_deregistration(tmp_path: Path) -> None:
    clock = Clock()
    master, _sessions = make_master(tmp_path, clock, {"g1": (2, 4)}, inference=INFERENCE)
    try:
        for call in (master.features.inference.place(ServiceParams("nope")),
                     master.features.inference.deregister_service(ServiceParams("nope")),
                     master.features.inference.report_load(ReportLoadParams("nope", load=1.0))):
            with pytest.raises(JobError) as err:
                await call
            assert err.value.code == "unknown_service" and "'nope'" in str(err.value)
        await master.features.inference.register_service(SVC)
        [job_id] = replica_jobs(master)
        gone = await master.features.inference.deregister_service(ServiceParams("resnet"))
        assert gone["retired"] == ["resnet-cpu-1"]
        await until("the replica cancelled",
                    lambda: master.core.jobs[job_id].reason == "cancelled")
        assert (await master.features.inference.services(None))["services"] == []  # type: ignore[arg-type]
        assert master.store.db.execute("SELECT COUNT(*) FROM inference_services").fetchone()[0] \
            == 0
    finally:
        await master.close()


async def test_measured_memory_bandwidth_steers_cpu_replicas(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 4), "g2": (2, 4)},
                                   inference=INFERENCE)
    inference = master.features.inference
    try:
        # g1 measures 9.5 of its 10 GB/s: too little room for a 1 GB/s replica. g2 has not
        # reported, so it gets the configured figure (unmeasured, g1 would win on its name).
        await master.node_event("g1", "mem_bandwidth",
                                MemBandwidth(used_gbps=9.5, limit_gbps=10.0, window_s=1.0))
        assert inference.measured_headroom() == {"g1": 0.5}
        reply = await inference.register_service(SVC)
        [ep] = reply["endpoints"]
        assert ep["kind"] == "cpu" and ep["node"] == "g2"
        await until("the launch", lambda: sessions["g2"].commands("start_job"))
        await started(master, "g2", ep["job"])
        # A measurement taken while the replica ran counts its own use, which the placer
        # subtracts itself: it is added back. One taken too soon after its start is not.
        await master.node_event("g2", "mem_bandwidth",
                                MemBandwidth(used_gbps=6.0, limit_gbps=10.0, window_s=5.0))
        assert inference.measured_headroom()["g2"] == 4.0
        clock.now += 10
        await master.node_event("g2", "mem_bandwidth",
                                MemBandwidth(used_gbps=6.0, limit_gbps=10.0, window_s=5.0))
        assert inference.measured_headroom()["g2"] == 5.0
        # A node that stopped reporting falls back to the configured figure.
        clock.now += 4 * MEM_BANDWIDTH_REPORT_EVERY_S + 1
        assert inference.measured_headroom() == {}
    finally:
        await master.close()


async def a_pass(master: Any) -> None:
    before = master.passes
    master.request_pass()
    await until("a pass", lambda: master.passes > before)


async def test_a_replica_its_account_cannot_take_backs_off_like_a_refused_one(
    tmp_path: Path,
) -> None:
    """The launch is refused before any job exists (the quota permit): it counts as a failed
    replica and waits out the back-off, not one more refusal at every pass."""
    from dataclasses import replace

    clock = Clock()
    accounts = [{"name": "serving", "users": ["nobody"], "quota": {"cpus": 0},
                 "borrowing_limit": {"cpus": 0}}]
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 4)}, inference=INFERENCE,
                                   accounts=accounts)
    tries: list[str] = []
    start_placed = master.core.start_placed

    def counting(job: Any) -> None:
        tries.append(job.id)
        start_placed(job)

    master.core.start_placed = counting  # type: ignore[method-assign]
    try:
        await master.features.inference.register_service(replace(SVC, tenant="serving"))
        assert len(tries) == 1 and not replica_jobs(master)
        for _ in range(5):  # passes come and go; no new attempt inside the back-off
            await a_pass(master)
        assert len(tries) == 1
        clock.now += 2  # past the first back-off (1 s)
        master.request_pass()
        await until("a second attempt", lambda: len(tries) == 2)
        assert not replica_jobs(master) and not sessions["g1"].commands("prepare_job")
    finally:
        await master.close()
