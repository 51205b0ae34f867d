"""Property tests: SWAF's cached pass equals a brute-force Algorithm 1, and never over-allocates."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masterd.core.cluster import ClusterState
from masterd.core.genie.modeldb import ModelDB
from masterd.core.policies.swaf import SwafPolicy
from masterd.core.policy import Start
from shared.model import JobKind, NodeAllocation, Placement, QosClass
from tests.unit.genie_support import K80, job, node, ref_decide, ref_order

V100 = "Tesla V100"
MODEL_TYPES = [None, "ResNet50", "Inception-v3", "Alexnet", "LSTM", "Seq2seq", "GoogleNet",
               "VGG16"]


@st.composite
def clusters(draw: st.DrawFn) -> ClusterState:
    n = draw(st.integers(1, 5))
    state = ClusterState()
    for i in range(n):
        gpus = draw(st.sampled_from([0, 2, 4, 8]))
        model = draw(st.sampled_from([K80, K80, V100]))
        cpus = draw(st.integers(2, 12))
        state.upsert_node(node(f"n{i}", gpus, model, cpus, memory_mib=draw(
            st.sampled_from([4096, 65536]))))
        if draw(st.booleans()):
            # Something already runs there: a few GPUs and cores are taken.
            view = state.node(f"n{i}")
            assert view is not None
            taken_g = draw(st.integers(0, gpus))
            taken_c = draw(st.integers(0, cpus - 1))
            state.allocate(f"busy-{i}", Placement((NodeAllocation(
                f"n{i}", tuple(sorted(view.free_gpus))[:taken_g],
                tuple(sorted(view.free_cpus))[:taken_c], 0),)))
        if draw(st.integers(0, 6)) == 0:
            state.set_schedulable(f"n{i}", False)
    return state


@st.composite
def jobs(
    draw: st.DrawFn,
    prefix: str,
    count: int,
    max_iterations: int = 50_000,
    max_submit: int = 2000,
    gpu_models: tuple[str | None, ...] = (None, None, K80, V100),
) -> list:
    out = []
    for i in range(count):
        gpus = draw(st.sampled_from([0, 1, 1, 2, 3, 4, 6, 8, 16]))
        kind = JobKind.CPU if gpus == 0 else draw(
            st.sampled_from([JobKind.TRAINING, JobKind.TRAINING, JobKind.INFERENCE]))
        has_work = draw(st.integers(0, 5)) > 0
        out.append(job(
            f"{prefix}{i}",
            model_type=draw(st.sampled_from(MODEL_TYPES)),
            family=draw(st.sampled_from([None, "cnn", "rnn"])),
            params_m=draw(st.sampled_from([None, 5.0, 30.0, 140.0])),
            batch=draw(st.sampled_from([1, 8, 32, 64, 128, 256])) if has_work else None,
            iterations=draw(st.integers(1, max_iterations)) if has_work else None,
            gpus=gpus,
            kind=kind,
            qos=draw(st.sampled_from(list(QosClass))),
            submit=float(draw(st.integers(0, max_submit))),
            cpus=draw(st.integers(0 if gpus else 1, 4)),
            memory_mib=draw(st.sampled_from([0, 0, 1024, 8192])),
            deadline=draw(st.one_of(st.none(), st.floats(0, 5e4))),
            max_nodes=draw(st.sampled_from([None, None, 1, 2])),
            gpu_model=draw(st.sampled_from(gpu_models)) if gpus else None,
            requeue_priority=draw(st.sampled_from([0, 0, 0, 1])),
        ))
    return out


DB = ModelDB.default()


def check_no_double_allocation(state: ClusterState, decisions: list) -> None:
    used: set[tuple[str, str, int]] = set()
    for d in decisions:
        assert isinstance(d, Start)
        for alloc in d.placement.allocations:
            view = state.node(alloc.node)
            assert view is not None and view.schedulable
            for g in alloc.gpus:
                assert g in view.free_gpus, f"GPU {g} on {alloc.node} is not free"
                assert (alloc.node, "gpu", g) not in used, f"GPU {g} on {alloc.node} given twice"
                used.add((alloc.node, "gpu", g))
            for c in alloc.cpus:
                assert c in view.free_cpus, f"core {c} on {alloc.node} is not free"
                assert (alloc.node, "cpu", c) not in used, f"core {c} on {alloc.node} given twice"
                used.add((alloc.node, "cpu", c))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    state=clusters(),
    queue=jobs("j", 12),
    now=st.floats(0, 6e4),
    shape_mode=st.sampled_from(["cap", "exact", "any"]),
    urgent=st.sampled_from(["fastest", "cer"]),
    late=st.sampled_from(["serve", "defer"]),
)
def test_fresh_pass_equals_brute_force(state, queue, now, shape_mode, urgent, late) -> None:
    policy = SwafPolicy(DB, shape_mode=shape_mode, urgent_placement=urgent, late_tasks=late)
    snapshot = state.snapshot({})
    decisions = policy.decide(snapshot, queue, now)
    assert decisions == ref_decide(snapshot, queue, now, DB, policy.settings, late)
    check_no_double_allocation(state, decisions)
    # Every decision is applicable to the real accounting, one after the other.
    for d in decisions:
        state.allocate(d.job_id, d.placement)


@dataclass
class Step:
    finish: list[int]  # indices into the running jobs to finish
    arrive: int  # how many new jobs arrive
    dt: float  # time step (negative now and then: a replay)
    drain: int | None  # toggle schedulability of this node
    grow: int  # 0: nothing, 1: a node joins, 2: a node leaves (its jobs' resources stay held)
    new_gpus: int


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    state=clusters(),
    pending=jobs("p", 40, max_iterations=2_000, max_submit=200),
    steps=st.lists(
        st.builds(
            Step,
            finish=st.lists(st.integers(0, 30), max_size=3),
            arrive=st.integers(0, 4),
            dt=st.one_of(st.floats(0, 400), st.floats(-100, 0), st.just(0.0)),
            drain=st.one_of(st.none(), st.integers(0, 8)),
            grow=st.sampled_from([0, 0, 0, 1, 2]),
            new_gpus=st.sampled_from([2, 4, 8]),
        ),
        min_size=1,
        max_size=12,
    ),
    shape_mode=st.sampled_from(["cap", "exact", "any"]),
    late=st.sampled_from(["serve", "defer"]),
)
def test_cached_pass_equals_from_scratch_over_events(
    state, pending, steps, shape_mode, late
) -> None:
    """One policy object across a run of events gives what a fresh computation gives."""
    cached = SwafPolicy(DB, shape_mode=shape_mode, late_tasks=late)
    queue = pending[:4]
    pending = pending[4:]
    running: list[str] = []
    now = 100.0
    for step in steps:
        for i in step.finish:
            if running:
                state.release(running.pop(i % len(running)))
        if step.grow == 1:
            name = f"late{len(state.node_names)}-{step.new_gpus}"
            state.upsert_node(node(name, step.new_gpus, V100 if step.new_gpus == 2 else K80))
        elif step.grow == 2 and len(state.node_names) > 1:
            state.remove_node(state.node_names[-1])
        if step.drain is not None and state.node_names:
            name = state.node_names[step.drain % len(state.node_names)]
            view = state.node(name)
            assert view is not None
            state.set_schedulable(name, not view.schedulable)
        queue.extend(pending[: step.arrive])
        pending = pending[step.arrive :]
        now = max(0.0, now + step.dt)
        snapshot = state.snapshot({})
        got = cached.decide(snapshot, queue, now)
        expected = ref_decide(snapshot, queue, now, DB, cached.settings, late)
        assert got == expected
        fresh = SwafPolicy(DB, shape_mode=shape_mode, late_tasks=late)
        assert got == fresh.decide(snapshot, queue, now)
        # The cached choices of every waiting job, not only those that started, are current.
        order = [
            (c.job.id, c.candidate.gpu_model, c.candidate.d_node, c.candidate.d_gpn)
            for c in ref_order(snapshot, queue, now, DB, cached.settings, late)
        ]
        assert [
            (c.job_id, c.placement.gpu_model, c.placement.d_node, c.placement.d_gpn)
            for c in cached.waiting_order()
        ] == order
        started = set()
        for d in got:
            state.allocate(d.job_id, d.placement)
            running.append(d.job_id)
            started.add(d.job_id)
        queue = [j for j in queue if j.id not in started]


@settings(max_examples=50, deadline=None)
@given(queue=jobs("o", 15, gpu_models=(None,)), now=st.floats(0, 6e4))
def test_launch_order_is_the_swaf_order_when_everything_fits(queue, now) -> None:
    """On a cluster big enough for all, jobs start exactly in increasing e − l (i.e. w)."""
    state = ClusterState()
    for i in range(32):  # 15 jobs of at most 16 GPUs (two whole nodes each) always fit
        state.upsert_node(node(f"big{i}", 8, K80, cpus=64, memory_mib=1 << 20))
    policy = SwafPolicy(DB)
    snapshot = state.snapshot({})
    decisions = policy.decide(snapshot, queue, now)
    order = [c.job.id for c in ref_order(snapshot, queue, now, DB, policy.settings)]
    gpu_started = [d.job_id for d in decisions if d.job_id in set(order)]
    assert gpu_started == order
    # The premise: everything that has a placement on this cluster at all fits.
    assert {d.job_id for d in decisions} == set(order) | {j.id for j in queue if not j.spec.gpus}
    # ...and each allowance is Eq. 13 of the chosen placement.
    for c in ref_order(snapshot, queue, now, DB, policy.settings):
        choice = policy.explain(c.job.id, now)
        assert choice is not None
        assert choice.latency == c.candidate.latency
        assert choice.waiting_allowance == c.ect - (c.candidate.latency + now)


@settings(max_examples=60, deadline=None)
@given(
    queue=jobs("t", 10, max_iterations=3_000, max_submit=100, gpu_models=(None, K80)),
    times=st.lists(st.floats(0, 8000), min_size=2, max_size=25),
    ordered=st.booleans(),
)
def test_choices_follow_the_clock_on_a_full_cluster(queue, times, ordered) -> None:
    """Nothing can start, so only time moves: every waiting job's choice must track ``now``
    through its ECT thresholds (and back, when time is replayed)."""
    state = ClusterState()
    for i, gpus in enumerate((4, 4, 8)):
        state.upsert_node(node(f"f{i}", gpus, K80, cpus=16))
        view = state.node(f"f{i}")
        assert view is not None
        state.allocate(f"hog-{i}", Placement((NodeAllocation(
            f"f{i}", tuple(sorted(view.free_gpus)), (), 0),)))
    queue = [j for j in queue if j.spec.gpus > 0]
    policy = SwafPolicy(DB)
    snapshot = state.snapshot({})
    for now in sorted(times) if ordered else times:
        assert [d for d in policy.decide(snapshot, queue, now) if d.job_id in
                {j.id for j in queue}] == []
        expected = [
            (c.job.id, c.candidate.d_node, c.candidate.d_gpn, c.key - now)
            for c in ref_order(snapshot, queue, now, DB, policy.settings)
        ]
        got = [
            (c.job_id, c.placement.d_node, c.placement.d_gpn, c.ect - c.latency - now)
            for c in policy.waiting_order()
        ]
        assert got == expected
