"""masterd.api.rpc.job_view with and without the per-job WireCache gives the same view, and
the cache never hands back parts of a spec or placement the job no longer holds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from masterd.api.rpc import job_view
from masterd.journal.wire import NO_PLACEMENT_VIEW, WireCache
from shared.model import Job, JobKind, JobSpec, JobState, NodeAllocation, Placement, QosClass

SPEC = JobSpec(name="train", command=("python", "x.py", "--lr", "3"), user="nobody",
               kind=JobKind.TRAINING, tenant="vision", qos=QosClass.PRIOR, gpus=3, cpus=6,
               memory_mib=2048, env={"A": "1"})
FIRST = Placement((NodeAllocation("n1", (0, 1), (2, 3, 4, 5), 1024),
                   NodeAllocation("n2", (7,), (0, 1), 1024)))
SECOND = Placement((NodeAllocation("n3", (4, 5, 6), (8, 9, 10, 11, 12, 13), 2048),))


def reference(job: Job) -> dict[str, Any]:
    """The view as job_view built it before the cache, written out independently."""
    spec = job.spec
    stop = spec.stop
    placement = job.placement
    return {
        "id": job.id, "name": spec.name, "state": job.state.value, "kind": spec.kind.value,
        "tenant": spec.tenant, "user": spec.user, "qos": spec.qos.value, "gpus": spec.gpus,
        "cpus": spec.cpus, "memory_mib": spec.memory_mib, "command": list(spec.command),
        "image": spec.launch.image, "time_limit_s": spec.time_limit_s,
        "warning": None if stop.warning is None else
        f"{'B:' if stop.warning.batch_only else ''}{stop.warning.signal[3:]}"
        f"@{stop.warning.seconds}",
        "grace_s": stop.grace_s, "requeue": stop.requeue,
        "submit_time": job.submit_time, "start_time": job.start_time,
        "end_time": job.end_time, "queued_s": job.queued_seconds,
        "exit_code": job.exit_code, "signal": job.signal, "reason": job.reason,
        "attempts": job.attempts, "restarts": job.restarts, "wait": job.wait,
        "held": job.held,
        "priority": spec.priority, "after": ",".join(
            ":".join((d.type, *d.jobs)) for d in spec.after),
        "constraint": "&".join(spec.selector.features),
        "exclude": list(spec.selector.exclude),
        "nodelist": list(spec.selector.only),
        "partition": ",".join(spec.selector.partitions),
        "reservation": spec.selector.reservation,
        "priority_class": spec.priority_class,
        "array": {"id": spec.array.id, "index": spec.array.index} if spec.array else None,
        "nodes": [a.node for a in placement.allocations] if placement else [],
        "placement": [
            {"node": a.node, "gpus": list(a.gpus), "cpus": list(a.cpus),
             "memory_mib": a.memory_mib} for a in placement.allocations
        ] if placement else [],
        "time_limit_at": job.start_time + spec.time_limit_s
        if job.start_time is not None and spec.time_limit_s is not None
        and not job.state.terminal else None,
    }


def check(job: Job, wire: WireCache) -> dict[str, Any]:
    plain = job_view(job)
    for _ in range(2):  # a miss, then a hit
        cached = job_view(job, wire)
        assert cached == plain
        assert list(cached) == list(plain)
    assert plain == reference(job)
    return plain


def test_queued_job() -> None:
    job = Job(id="j1", spec=SPEC, submit_time=5.0, reason="waiting for 3 GPUs")
    view = check(job, WireCache())
    assert view["nodes"] == [] and view["placement"] == [] and view["state"] == "queued"


def test_placed_job_and_a_new_placement() -> None:
    wire = WireCache()
    job = Job(id="j1", spec=SPEC, submit_time=5.0)
    check(job, wire)
    job.state, job.placement, job.start_time, job.attempts = (
        JobState.RUNNING, FIRST, 9.0, 1)
    view = check(job, wire)
    assert view["nodes"] == ["n1", "n2"] and view["queued_s"] == 4.0

    # Retried elsewhere: a different placement object, which the view must show.
    job.state, job.placement, job.attempts = JobState.STARTING, SECOND, 2
    view = check(job, wire)
    assert view["nodes"] == ["n3"] and view["placement"][0]["gpus"] == [4, 5, 6]

    job.state, job.placement, job.start_time = JobState.QUEUED, None, None
    view = check(job, wire)
    assert view["nodes"] == [] and view["placement"] == []

    job.placement = FIRST  # back to an object cached before: still right
    assert check(job, wire)["nodes"] == ["n1", "n2"]


def test_a_new_spec_object_is_shown() -> None:
    wire = WireCache()
    job = Job(id="j1", spec=SPEC, submit_time=0.0)
    check(job, wire)
    job.spec = replace(SPEC, gpus=5, command=("other",))
    view = check(job, wire)
    assert view["gpus"] == 5 and view["command"] == ["other"]


def test_views_are_separate_dicts() -> None:
    wire = WireCache()
    job = Job(id="j1", spec=SPEC, submit_time=0.0, placement=FIRST, state=JobState.RUNNING)
    first = job_view(job, wire)
    first["state"] = "tampered"
    first["nodes"] = []
    second = job_view(job, wire)
    assert second["state"] == "running" and second["nodes"] == ["n1", "n2"]
    assert NO_PLACEMENT_VIEW == {"nodes": [], "placement": []}


def test_jobs_with_the_same_parts_do_not_share_ids() -> None:
    wire = WireCache()
    one = Job(id="one", spec=SPEC, submit_time=0.0, placement=FIRST)
    two = Job(id="two", spec=replace(SPEC, name="other"), submit_time=1.0, placement=SECOND)
    assert job_view(one, wire)["name"] == "train"
    assert job_view(two, wire)["name"] == "other"
    assert job_view(two, wire)["nodes"] == ["n3"]
    assert job_view(one, wire)["nodes"] == ["n1", "n2"]


@pytest.mark.parametrize("part", ["spec_view", "placement_view"])
def test_forget_drops_the_view_parts(part: str) -> None:
    wire = WireCache()
    job = Job(id="j1", spec=SPEC, submit_time=0.0, placement=FIRST)
    get = getattr(wire, part)
    kept = get(job)
    assert get(job) is kept  # cached by identity of the spec/placement
    wire.forget(job.id)
    again = get(job)
    assert again is not kept and again == kept
    wire.forget("never-seen")  # harmless


def test_no_placement_view_is_the_shared_empty_part() -> None:
    wire = WireCache()
    job = Job(id="j1", spec=SPEC, submit_time=0.0)
    assert wire.placement_view(job) is NO_PLACEMENT_VIEW


def test_a_time_limited_job_shows_its_limit_warning_grace_and_deadline() -> None:
    from shared.model import StopRules, WarnSignal

    spec = replace(SPEC, time_limit_s=3600, stop=StopRules(
        grace_s=5.0, warning=WarnSignal("SIGUSR1", 120, batch_only=True), requeue=False))
    job = Job(id="j1", spec=spec, submit_time=5.0)
    view = check(job, WireCache())
    assert (view["time_limit_s"], view["warning"], view["grace_s"], view["requeue"],
            view["time_limit_at"]) == (3600, "B:USR1@120", 5.0, False, None)
    job.state, job.placement, job.start_time = JobState.RUNNING, FIRST, 100.0
    assert check(job, WireCache())["time_limit_at"] == 3700.0
    job.state, job.end_time = JobState.TIMEOUT, 3700.0
    assert check(job, WireCache())["time_limit_at"] is None
