"""Liquid's scheduling core: distances, best fit, the grouping GA, batch windows, GPU sharing,
pre-scheduling and the fractional accounting they rest on."""

from __future__ import annotations

from dataclasses import replace

import pytest

from masterd.core.cluster import AllocationError, ClusterState
from masterd.core.liquid.demand import GPU_MEM, GPU_UTIL, NET, POST_S, POST_SINCE, demand_of
from masterd.core.liquid.ga import GaSettings, grouping_ga, plan_fitness
from masterd.core.liquid.network import Distances
from masterd.core.liquid.nodes import Load
from masterd.core.liquid.passes import LiquidPass
from masterd.core.liquid.score import ScoreWeights
from masterd.core.liquid.sharing import SharingRule
from masterd.core.policies import make_policy
from masterd.core.policies.liquid import LiquidPolicy
from masterd.core.scheduler import SchedulingCore
from shared.model import Job, JobKind, JobSpec, JobState, NodeAllocation, Placement
from sim.cluster import NodeGroup, build_node


def node(name: str, gpus: int = 2, rack: str = "r1", domain: str = "d1", cores: int = 8):
    inv = build_node(name, NodeGroup(count=1, gpus_per_node=gpus, gpu_model="T4",
                                     gpu_memory_mib=16384, cpu_cores=cores, sockets=1))
    return replace(inv, rack=rack, domain=domain)


def spec(name: str, gpus: int, cpus: int = 2, milli: int | None = None,
         kind: JobKind = JobKind.TRAINING) -> JobSpec:
    return JobSpec(name=name, command=("true",), user="nobody", gpus=gpus, cpus=cpus,
                   gpu_milli=milli, kind=kind, gpu_model="T4")


def core_with(policy, nodes) -> SchedulingCore:
    core = SchedulingCore(policy)
    for n in nodes:
        core.node_up(n)
    return core


def submit(core: SchedulingCore, job_id: str, s: JobSpec, t: float = 0.0,
           notes: dict[str, float] | None = None) -> Job:
    job = Job(id=job_id, spec=s, submit_time=t)
    job.annotations.update(notes or {})
    core.submit(job)
    return job


def run_all(core: SchedulingCore, decisions, now: float) -> None:
    for d in decisions:
        for n in d.placement.nodes:
            core.node_started(d.job_id, n, now)


def test_distances_follow_rack_and_domain() -> None:
    d = Distances()
    a, b, c, e = node("a"), node("b"), node("c", rack="r2"), node("e", domain="d2")
    assert (d.between(a, a), d.between(a, b), d.between(a, c), d.between(a, e)) == (
        0.0, 1.0, 4.0, 40.0)


def test_best_fit_keeps_a_job_and_its_parameter_server_together() -> None:
    core = core_with(LiquidPolicy(batch=False), [node("n1"), node("n2"), node("n3")])
    submit(core, "j", spec("j", 2))
    [start] = core.schedule(0.0)
    assert [a.node for a in start.placement.allocations] == ["n1"]
    assert start.placement.gpu_count == 2


def test_best_fit_stays_in_one_rack_when_it_must_span_nodes() -> None:
    nodes = [node("a1", rack="A"), node("b1", rack="B"), node("a2", rack="A"),
             node("b2", rack="B")]
    core = core_with(LiquidPolicy(batch=False), nodes)
    submit(core, "big", spec("big", 4))
    [start] = core.schedule(0.0)
    assert {a.node for a in start.placement.allocations} in ({"a1", "a2"}, {"b1", "b2"})


def test_bandwidth_hungry_jobs_avoid_crossing_domains() -> None:
    nodes = [node("x1", domain="X"), node("y1", domain="Y", gpus=4), node("x2", domain="X")]
    core = core_with(LiquidPolicy(batch=False), nodes)
    submit(core, "vgg", spec("vgg", 3), notes={NET: 500.0})
    [start] = core.schedule(0.0)
    assert {a.node for a in start.placement.allocations} == {"x1", "x2"}


def test_the_batch_ga_finds_what_greedy_best_fit_misses() -> None:
    # Best fit packs the first workers onto the fuller ratio (x1) and must then cross domains
    # for the third; planning the job as a whole puts it on y1 alone.
    nodes = [node("x1", domain="X"), node("y1", domain="Y", gpus=4)]
    greedy = core_with(LiquidPolicy(batch=False), nodes)
    submit(greedy, "vgg", spec("vgg", 3), notes={NET: 500.0})
    [start] = greedy.schedule(0.0)
    assert {a.node for a in start.placement.allocations} == {"x1", "y1"}
    batch = core_with(LiquidPolicy(batch_window_s=0.0), nodes)
    submit(batch, "vgg", spec("vgg", 3), notes={NET: 500.0})
    [start] = batch.schedule(0.0)
    assert [a.node for a in start.placement.allocations] == ["y1"]


def test_workers_pack_onto_busy_nodes() -> None:
    core = core_with(LiquidPolicy(batch=False), [node("n1", gpus=4), node("n2", gpus=4)])
    submit(core, "a", spec("a", 1))
    run_all(core, core.schedule(0.0), 0.0)
    submit(core, "b", spec("b", 1))
    [start] = core.schedule(1.0)
    assert start.placement.nodes == ("n1",)  # next to a, n2 stays whole


def test_batch_waits_for_its_window_and_wakes_the_driver() -> None:
    policy = LiquidPolicy(batch_window_s=15.0)
    core = core_with(policy, [node(f"n{i}") for i in range(4)])
    submit(core, "a", spec("a", 2), t=0.0)
    submit(core, "b", spec("b", 2), t=5.0)
    assert core.schedule(5.0) == []
    assert core.wake_at == 15.0
    assert "batch window" in core.jobs["a"].reason
    decisions = core.schedule(15.0)
    assert sorted(d.job_id for d in decisions) == ["a", "b"]
    assert policy.last.batches == 1 and policy.last.batch_jobs == 2
    # A job arriving after the window opens the next one.
    submit(core, "c", spec("c", 2), t=16.0)
    assert core.schedule(16.0) == []
    assert core.wake_at == 31.0


def _batch_pass(seed: str):
    nodes = [node(f"n{i}", rack="A" if i < 4 else "B") for i in range(8)]
    core = core_with(LiquidPolicy(), nodes)
    jobs = [Job(id=f"j{i}", spec=spec(f"j{i}", g), submit_time=0.0)
            for i, g in enumerate((3, 2, 3, 4))]
    state = LiquidPass(core.snapshot(), 0.0, ScoreWeights(), 100.0, SharingRule(), False)
    demands = [demand_of(j, 100.0, None) for j in jobs]
    cands = [state.candidates(j) for j in jobs]
    return grouping_ga(demands, cands, state.caps, Load(), ScoreWeights(),
                       GaSettings(max_evaluations=600), seed)


def test_grouping_ga_is_seeded_and_places_every_task() -> None:
    first, again = _batch_pass("s1"), _batch_pass("s1")
    assert first is not None and again is not None
    assert first.placed == again.placed and first.fitness == again.fitness
    for placed, gpus in zip(first.placed, (3, 2, 3, 4), strict=True):
        assert len(placed) == gpus + 1  # workers and the PS
    assert first.evaluations <= 600


def _three_jobs_of_three():
    """Three three-GPU jobs on six nodes: their demands, candidates and the pass's state."""
    nodes = [node(f"n{i}") for i in range(6)]
    core = core_with(LiquidPolicy(), nodes)
    jobs = [Job(id=f"j{i}", spec=spec(f"j{i}", 3), submit_time=0.0) for i in range(3)]
    state = LiquidPass(core.snapshot(), 0.0, ScoreWeights(), 100.0, SharingRule(), False)
    demands = [demand_of(j, 100.0, None) for j in jobs]
    cands = [state.candidates(j) for j in jobs]
    return demands, cands, state


def test_ga_never_returns_worse_than_the_plans_it_starts_from() -> None:
    demands, cands, state = _three_jobs_of_three()
    # A deliberately poor seed: every task on a different node where possible.
    names = [c.name for c in cands[0]]
    poor = [{t.index: names[(k + t.index) % 6] for t in d.tasks} for k, d in enumerate(demands)]
    start = grouping_ga(demands, cands, state.caps, Load(), ScoreWeights(),
                        GaSettings(max_evaluations=1), "s", seeds=[poor])
    best = grouping_ga(demands, cands, state.caps, Load(), ScoreWeights(),
                       GaSettings(max_evaluations=2000), "s", seeds=[poor])
    assert start is not None and best is not None
    poor_fitness = plan_fitness(demands, state.caps, Load(), ScoreWeights(), poor)
    assert poor_fitness < start.fitness <= best.fitness
    assert best.fitness == plan_fitness(demands, state.caps, Load(), ScoreWeights(),
                                        best.placed)


def test_without_a_cap_the_ga_stops_by_liquids_rule_alone() -> None:
    demands, cands, state = _three_jobs_of_three()
    capped = grouping_ga(demands, cands, state.caps, Load(), ScoreWeights(),
                         GaSettings(max_evaluations=50), "s")
    free = grouping_ga(demands, cands, state.caps, Load(), ScoreWeights(),
                       GaSettings(max_evaluations=0), "s")
    assert capped is not None and free is not None
    assert capped.capped and capped.evaluations == 50
    # Liquid's rule: 30 + n generations without improvement (n = 12 tasks) end it.
    assert not free.capped and free.generations >= 30 + 12 and free.evaluations > 50
    assert free.fitness >= capped.fitness
    with pytest.raises(ValueError, match="max_evaluations"):
        GaSettings(max_evaluations=-1)


def test_fractional_jobs_share_a_gpu_under_liquids_rule() -> None:
    core = core_with(LiquidPolicy(), [node("n1", gpus=2)])
    submit(core, "a", spec("a", 1, cpus=1, milli=400))
    submit(core, "b", spec("b", 1, cpus=1, milli=500))
    submit(core, "c", spec("c", 1, cpus=1, milli=500))  # 0.4+0.5+0.5 >= 1.3: not with a, b
    decisions = core.schedule(0.0)
    gpus = {d.job_id: d.placement.allocations[0].gpus for d in decisions}
    assert gpus["a"] == gpus["b"] and gpus["c"] != gpus["a"]
    assert all(d.placement.allocations[0].shared for d in decisions)
    view = core.cluster.node("n1")
    assert view is not None and dict(view.shared_gpus) == {gpus["a"][0]: 2, gpus["c"][0]: 1}
    assert view.free_gpus == frozenset()
    # A whole-GPU job never joins a shared GPU.
    submit(core, "whole", spec("whole", 1, cpus=1))
    assert core.schedule(1.0) == []


def test_sharing_respects_predicted_memory() -> None:
    core = core_with(LiquidPolicy(), [node("n1", gpus=2)])
    submit(core, "a", spec("a", 1, cpus=1, milli=300), notes={GPU_MEM: 12000.0})
    submit(core, "b", spec("b", 1, cpus=1, milli=300), notes={GPU_MEM: 8000.0})
    decisions = core.schedule(0.0)
    assert len({d.placement.allocations[0].gpus for d in decisions}) == 2
    # Predictions win over the request: a job that asked for 900 but uses 20% shares.
    core2 = core_with(LiquidPolicy(), [node("n1", gpus=1)])
    submit(core2, "a", spec("a", 1, cpus=1, milli=900), notes={GPU_UTIL: 0.2, GPU_MEM: 2000.0})
    submit(core2, "b", spec("b", 1, cpus=1, milli=900), notes={GPU_UTIL: 0.3, GPU_MEM: 2000.0})
    assert len(core2.schedule(0.0)) == 2


def test_shared_gpus_return_free_when_the_last_sharer_leaves() -> None:
    core = core_with(LiquidPolicy(), [node("n1", gpus=1)])
    submit(core, "a", spec("a", 1, cpus=1, milli=300))
    submit(core, "b", spec("b", 1, cpus=1, milli=300))
    decisions = core.schedule(0.0)
    run_all(core, decisions, 0.0)
    core.node_exited("a", "n1", 0, None, 1.0)
    view = core.cluster.node("n1")
    assert view is not None and dict(view.shared_gpus) == {0: 1} and not view.free_gpus
    core.node_exited("b", "n1", 0, None, 2.0)
    view = core.cluster.node("n1")
    assert view is not None and not view.shared_gpus and view.free_gpus == frozenset({0})


def test_accounting_refuses_sharing_a_gpu_held_whole() -> None:
    state = ClusterState()
    state.upsert_node(node("n1", gpus=1))
    state.allocate("whole", Placement((NodeAllocation("n1", (0,), (), 0),)))
    with pytest.raises(AllocationError, match="held whole"):
        state.allocate("frac", Placement((NodeAllocation("n1", (0,), (), 0, shared=True),)))
    # Re-registering the node keeps the shares of shared allocations.
    state.release("whole")
    state.allocate("f1", Placement((NodeAllocation("n1", (0,), (), 0, shared=True),)))
    state.allocate("f2", Placement((NodeAllocation("n1", (0,), (), 0, shared=True),)))
    state.upsert_node(node("n1", gpus=1))
    view = state.node("n1")
    assert view is not None and dict(view.shared_gpus) == {0: 2} and not view.free_gpus


def test_pre_scheduling_starts_the_next_job_on_a_lent_gpu() -> None:
    core = core_with(LiquidPolicy(), [node("n1", gpus=1)])
    submit(core, "first", spec("first", 1, cpus=1))
    run_all(core, core.schedule(0.0), 0.0)
    submit(core, "next", spec("next", 1, cpus=1))
    assert core.schedule(1.0) == []  # the GPU is busy: no pre-scheduling before the phase
    assert core.enter_post_phase("first")
    assert not core.enter_post_phase("first")  # lent once
    [start] = core.schedule(2.0)
    assert start.job_id == "next" and start.placement.allocations[0].shared
    assert start.placement.allocations[0].gpus == (0,)
    run_all(core, [start], 2.0)
    core.node_exited("first", "n1", 0, None, 3.0)
    assert core.jobs["first"].state is JobState.FINISHED
    view = core.cluster.node("n1")
    assert view is not None and dict(view.shared_gpus) == {0: 1}


def test_pre_scheduling_waits_for_liquids_rule_when_phases_are_predicted() -> None:
    core = core_with(LiquidPolicy(), [node("n1", gpus=1)])
    first = submit(core, "first", spec("first", 1, cpus=1))
    run_all(core, core.schedule(0.0), 0.0)
    first.annotations.update({POST_S: 60.0, POST_SINCE: 100.0})
    core.enter_post_phase("first")
    submit(core, "next", spec("next", 1, cpus=1))
    assert core.schedule(100.0) == []
    assert core.wake_at == pytest.approx(145.0)  # 60 s of post phase - 15 s slack
    assert [d.job_id for d in core.schedule(145.0)] == ["next"]


def test_no_prescheduling_when_disabled() -> None:
    core = core_with(LiquidPolicy(prescheduling=False), [node("n1", gpus=1)])
    submit(core, "first", spec("first", 1, cpus=1))
    run_all(core, core.schedule(0.0), 0.0)
    core.enter_post_phase("first")
    submit(core, "next", spec("next", 1, cpus=1))
    assert core.schedule(1.0) == []


@pytest.mark.parametrize("name", ["random", "even-spread", "least-requested", "buddy-cells"])
def test_baselines_place_every_task_validly(name: str) -> None:
    core = core_with(make_policy(name), [node(f"n{i}") for i in range(4)])
    for i, g in enumerate((3, 2, 1)):
        submit(core, f"j{i}", spec(f"j{i}", g))
    decisions = core.schedule(0.0)
    assert sorted(d.job_id for d in decisions) == ["j0", "j1", "j2"]
    assert sum(d.placement.gpu_count for d in decisions) == 6
    assert not any(a.shared for d in decisions for a in d.placement.allocations)


def test_buddy_cells_take_an_aligned_free_cell() -> None:
    core = core_with(make_policy("buddy-cells"), [node(f"n{i}") for i in range(4)])
    submit(core, "one", spec("one", 1))
    run_all(core, core.schedule(0.0), 0.0)  # n0 half used
    submit(core, "four", spec("four", 4))
    [start] = core.schedule(1.0)
    workers = {a.node for a in start.placement.allocations if a.gpus}
    assert workers == {"n2", "n3"}  # the cell n0+n1 is split, n2+n3 is whole


def test_buddy_cells_keep_the_parameter_server_inside_the_jobs_cell() -> None:
    core = core_with(make_policy("buddy-cells"), [node(f"n{i}") for i in range(4)])
    submit(core, "one", spec("one", 1))
    run_all(core, core.schedule(0.0), 0.0)  # n0 half used: emptier nodes would draw the PS
    submit(core, "two", spec("two", 2))
    submit(core, "three", spec("three", 3))
    starts = {d.job_id: d.placement for d in core.schedule(1.0)}
    assert set(starts) == {"two", "three"}
    # A cell of one node: the PS (rank 0, the first allocation) is on it, no other node.
    assert len(starts["two"].nodes) == 1
    cell = {a.node for a in starts["three"].allocations if a.gpus}
    assert set(starts["three"].nodes) == cell and len(cell) == 2


def test_even_spread_spreads_and_random_is_seeded() -> None:
    core = core_with(make_policy("even-spread"), [node(f"n{i}") for i in range(4)])
    submit(core, "j", spec("j", 3))
    [start] = core.schedule(0.0)
    assert len({a.node for a in start.placement.allocations}) == 4  # 3 workers + PS apart
    picks = []
    for _ in range(2):
        core = core_with(make_policy("random", seed=7), [node(f"n{i}") for i in range(8)])
        submit(core, "j", spec("j", 3))
        picks.append(core.schedule(0.0)[0].placement)
    assert picks[0] == picks[1]


def test_bad_options_are_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="liquid"):
        LiquidPolicy(batch_window_s=-1)
    with pytest.raises(ValueError, match="crossover"):
        LiquidPolicy(ga={"crossover": 2.0})
    with pytest.raises(ValueError, match="liquid"):
        LiquidPolicy(ga={"bogus": 1})
    with pytest.raises(ValueError, match="gpu_milli"):
        spec("x", 2, milli=500)


def test_the_gas_fitness_is_eq8_over_the_jobs_scores() -> None:
    from masterd.core.liquid.score import job_score

    nodes = [node(f"n{i}", rack="A" if i < 3 else "B", domain="d1" if i < 5 else "d2")
             for i in range(7)]
    core = core_with(LiquidPolicy(), nodes)
    jobs = [Job(id=f"j{i}", spec=spec(f"j{i}", g), submit_time=0.0)
            for i, g in enumerate((3, 2, 1))]
    jobs[0].annotations[NET] = 400.0
    state = LiquidPass(core.snapshot(), 0.0, ScoreWeights(), 100.0, SharingRule(), False)
    demands = [demand_of(j, 100.0, None) for j in jobs]
    names = [c.name for c in state.candidates(jobs[0])]
    plan = [{t.index: names[(3 * k + 2 * t.index) % 7] for t in d.tasks}
            for k, d in enumerate(demands)]
    load = Load()
    for d, where in zip(demands, plan, strict=True):
        for t in d.tasks:
            load.add(where[t.index], t)
    expected = 0.0
    for d, where in zip(demands, plan, strict=True):
        workers: dict[str, int] = {}
        ps = None
        for t in d.tasks:
            if t.role == "ps":
                ps = where[t.index]
            else:
                workers[where[t.index]] = workers.get(where[t.index], 0) + 1
        others = None
        if ps is not None:
            others = {ps: sum(1 for dd, ww in zip(demands, plan, strict=True)
                              for tt in dd.tasks if tt.role == "ps" and ww[tt.index] == ps) - 1}
        expected += job_score(d, workers, ps, state.caps, load.gpus, ScoreWeights(), others)
    used = {n for where in plan for n in where.values()}
    assert plan_fitness(demands, state.caps, Load(), ScoreWeights(), plan) == pytest.approx(
        -(expected + len(used)))


def test_without_sharing_a_fractional_job_holds_a_whole_gpu() -> None:
    core = core_with(LiquidPolicy(sharing=False), [node("n1", gpus=2)])
    submit(core, "a", spec("a", 1, cpus=1, milli=300))
    submit(core, "b", spec("b", 1, cpus=1, milli=300))
    decisions = core.schedule(0.0)
    assert len(decisions) == 2
    assert not any(a.shared for d in decisions for a in d.placement.allocations)
    assert decisions[0].placement.allocations[0].gpus != decisions[1].placement.allocations[0].gpus
