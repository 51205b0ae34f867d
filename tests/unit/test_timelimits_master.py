"""Time limits in a real in-process master (stand-in node sessions): the default limit is
written into the spec that is journalled and sent to the nodes, also when the client's map
was kept as the wire form; every stop carries the job's grace, capped; EASY's reservation
is readable from the feature context's policy view."""

from __future__ import annotations

from pathlib import Path

from masterd.core.policies.fifo import FifoPolicy
from masterd.service.master import Master
from shared.model import JobSpec, JobState, StopRules
from shared.schema import decode, encode
from tests.unit.master_fakes import Clock, make_master, started, until


def spec(name: str, **kw: object) -> JobSpec:
    fields: dict[str, object] = {"gpus": 1, "cpus": 1, **kw}
    return JobSpec(name=name, command=("train",), user="nobody", **fields)  # type: ignore[arg-type]


async def test_the_default_limit_is_journalled_and_sent(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 8)}, default_time_limit_s=600)
    try:
        plain = spec("plain")
        # As the submit RPC does: the client's map is offered as the spec's wire form.
        job = await master.submit(plain, wire_spec=encode(plain))
        own = await master.submit(spec("own", time_limit_s=60))
        assert job.spec.time_limit_s == 600 and own.spec.time_limit_s == 60
        await until("both launches", lambda: len(sessions["g1"].commands("prepare_job")) == 2)
        sent = {p.job_id: p.spec.time_limit_s for p in sessions["g1"].commands("prepare_job")}
        assert sent == {job.id: 600, own.id: 60}
        stored = {j.id: j.spec.time_limit_s for j in master.store.load_jobs()}
        assert stored == {job.id: 600, own.id: 60}
    finally:
        await master.close()
    # A later change of the default does not touch journalled jobs.
    again = Master(decode(type(master.config), {"state_dir": str(tmp_path),
                                                 "default_time_limit_s": 60}, "master"),
                   clock=clock)
    try:
        again.restore()
        assert again.core.jobs[job.id].spec.time_limit_s == 600
    finally:
        await again.close()


async def test_every_stop_carries_the_jobs_grace_capped(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (4, 8)}, stop_grace_s=10,
                                   max_grace_s=5)
    try:
        jobs = [await master.submit(spec("own", stop=StopRules(grace_s=2.0))),
                await master.submit(spec("big", stop=StopRules(grace_s=100.0))),
                await master.submit(spec("none")),
                await master.submit(spec("zero", stop=StopRules(grace_s=0.0)))]
        await until("four launches", lambda: len(sessions["g1"].commands("start_job")) == 4)
        for job in jobs:
            await started(master, "g1", job.id)
            await master.cancel(job.id)
        await until("four stops", lambda: len(sessions["g1"].commands("stop_job")) == 4)
        graces = {s.job_id: s.grace_s for s in sessions["g1"].commands("stop_job")}
        assert graces == {jobs[0].id: 2.0, jobs[1].id: 5.0, jobs[2].id: 5.0, jobs[3].id: 0.0}
    finally:
        await master.close()


async def test_a_timeout_stop_goes_through_the_master(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 8)}, stop_grace_s=3)
    try:
        job = await master.submit(spec("t", time_limit_s=30))
        await until("the launch", lambda: sessions["g1"].commands("start_job"))
        await started(master, "g1", job.id)
        assert job.state is JobState.RUNNING
        timelimits = master.features.timelimits
        assert timelimits.schedule.armed(job.id).stop_at == job.start_time + 30
        clock.now += 30
        timelimits._fire()
        await until("the stop", lambda: sessions["g1"].commands("stop_job"))
        [stop] = sessions["g1"].commands("stop_job")
        assert (stop.grace_s, stop.reason) == (3.0, "time limit 0:00:30 reached")
        assert job.end_as == "timeout"
        kinds = [e.kind for e in master.store.events(job.id)]
        assert "stop_requested" in kinds
    finally:
        await master.close()


async def test_easy_reservation_is_visible_to_features(tmp_path: Path) -> None:
    clock = Clock()
    master, sessions = make_master(tmp_path, clock, {"g1": (2, 8)},
                                   policy_options={"backfill": "easy"})
    try:
        running = await master.submit(spec("first", time_limit_s=100))
        await until("the launch", lambda: sessions["g1"].commands("start_job"))
        await started(master, "g1", running.id)
        head = await master.submit(spec("head", gpus=2))
        await master.submit(spec("long", time_limit_s=1000))
        short = await master.submit(spec("short", time_limit_s=50))
        await until("the short job's launch",
                    lambda: len(sessions["g1"].commands("start_job")) == 2)
        policy = master.context.core.policy
        assert isinstance(policy, FifoPolicy)
        reservation = policy.reservation
        assert reservation is not None and reservation.job_id == head.id
        assert reservation.start == running.start_time + 100 and reservation.nodes == ("g1",)
        assert short.state is JobState.STARTING and "long" in {
            master.core.jobs[j].spec.name for j in reservation.held}
    finally:
        await master.close()
