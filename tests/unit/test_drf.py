"""Dominant resource fairness among tenants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masterd.core.cluster import ClusterState
from masterd.core.policies import make_policy
from masterd.core.policies.drf import DrfPolicy
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Start
from shared.model import Job, JobState
from tests.unit.arrays_fixtures import cpu_node, gpu_node, job, make_core, run_pass


def _state(*nodes) -> ClusterState:  # type: ignore[no-untyped-def]
    state = ClusterState()
    for inv in nodes:
        state.upsert_node(inv)
    return state


def _tenants(decisions: list, queue: list[Job]) -> list[str]:  # type: ignore[type-arg]
    by_id = {j.id: j for j in queue}
    return [by_id[d.job_id].spec.tenant for d in decisions]


def test_two_tenants_alternate_by_dominant_share() -> None:
    # 8 GPUs, 32 cores. alice: 1 GPU + 1 core (dominant share 1/8 per job, GPUs);
    # bob: 4 cores (dominant share 4/32 = 1/8 per job, cores). Alice submitted everything
    # first, so FIFO would serve her alone.
    state = _state(gpu_node("n", gpus=8, cores=32))
    queue = [job(gpus=1, cpus=1, tenant="alice", submit=i) for i in range(8)]
    queue += [job(cpus=4, tenant="bob", submit=10 + i) for i in range(8)]
    decisions = DrfPolicy().decide(state.snapshot({}), queue, 100.0)
    assert _tenants(decisions, queue) == ["alice", "bob"] * 6 + ["alice", "alice"]
    fifo = FifoPolicy().decide(state.snapshot({}), queue, 100.0)
    assert _tenants(fifo, queue)[:8] == ["alice"] * 8
    # Within a tenant, the oldest job goes first.
    alice = {j.id for j in queue[:8]}
    assert [d.job_id for d in decisions if d.job_id in alice] == [j.id for j in queue[:8]]


def test_weights_scale_the_shares() -> None:
    state = _state(cpu_node("c", cores=12))
    queue = [job(cpus=1, tenant="a", submit=i) for i in range(12)]
    queue += [job(cpus=1, tenant="b", submit=20 + i) for i in range(12)]
    decisions = DrfPolicy(weights={"a": 2}).decide(state.snapshot({}), queue, 0.0)
    tenants = _tenants(decisions, queue)
    assert tenants.count("a") == 8 and tenants.count("b") == 4


def test_running_jobs_count_towards_a_tenant_share() -> None:
    core = make_core(DrfPolicy(), [cpu_node("c", cores=8)])
    core.submit(job(cpus=4, tenant="a", job_id="a-running"))
    run_pass(core, 0.0)
    for i in range(4):
        core.submit(job(cpus=1, tenant="a", submit=1 + i))
        core.submit(job(cpus=1, tenant="b", submit=1 + i))
    applied = run_pass(core, 10.0)
    assert [core.jobs[d.job_id].spec.tenant for d in applied] == ["b"] * 4


def test_a_tenant_whose_oldest_job_does_not_fit_runs_its_next_fitting_job() -> None:
    state = _state(cpu_node("c", cores=4))
    big = job(cpus=8, tenant="a", submit=0)
    small = job(cpus=2, tenant="a", submit=1)
    other = job(cpus=2, tenant="b", submit=2)
    decisions = DrfPolicy().decide(state.snapshot({}), [big, small, other], 0.0)
    assert {d.job_id for d in decisions} == {small.id, other.id}


def test_capacity_without_gpus_or_memory_still_orders() -> None:
    state = _state(cpu_node("c", cores=4, memory_mib=0))
    queue = [job(cpus=1, tenant="x"), job(cpus=1, tenant="y")]
    assert len(DrfPolicy().decide(state.snapshot({}), queue, 0.0)) == 2
    assert DrfPolicy().decide(_state().snapshot({}), queue, 0.0) == []


@pytest.mark.parametrize("weight", [0, -1, True, "2"])
def test_bad_weights_are_rejected(weight: object) -> None:
    with pytest.raises(ValueError, match="drf weight of tenant 'a'"):
        DrfPolicy(weights={"a": weight})  # type: ignore[dict-item]


def test_registered_as_drf() -> None:
    policy = make_policy("drf")
    assert isinstance(policy, DrfPolicy) and policy.name == "drf"


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 4), st.integers(1, 6)),
        max_size=25,
    ),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.floats(0.1, 10), max_size=3),
)
def test_drf_never_gives_a_unit_twice_and_every_start_applies(
    jobs: list[tuple[str, int, int]], weights: dict[str, float]
) -> None:
    core = make_core(DrfPolicy(weights=weights),
                     [gpu_node("g1", gpus=4, cores=8), gpu_node("g2", gpus=4, cores=8),
                      cpu_node("c", cores=8)])
    for i, (tenant, gpus, cpus) in enumerate(jobs):
        core.submit(job(gpus=gpus, cpus=cpus, tenant=tenant, submit=float(i)))
    decisions = core.policy.decide(core.snapshot(), core.queue(), 0.0)
    seen: set[tuple[str, str, int]] = set()
    for d in decisions:
        assert isinstance(d, Start)
        for alloc in d.placement.allocations:
            for kind, units in (("gpu", alloc.gpus), ("cpu", alloc.cpus)):
                for unit in units:
                    assert (alloc.node, kind, unit) not in seen
                    seen.add((alloc.node, kind, unit))
    applied = core.schedule(0.0)
    assert applied == decisions
    # Work conservation: no queued job fits what is left.
    left = DrfPolicy().decide(core.snapshot(), core.queue(), 0.0)
    assert left == []
    assert all(j.state is JobState.STARTING for j in core.running().values())
