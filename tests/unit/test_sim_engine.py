"""The event loop drives SchedulingCore exactly: hand-checked JCTs, determinism, preemption,
node failure and the same-instant rules."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from masterd.core.cluster import ClusterSnapshot
from masterd.core.placement import FreePool, pack
from masterd.core.policies import make_policy
from masterd.core.policy import Decision, Preempt, Start
from shared.model import Job, JobKind, JobSpec, QosClass, StopRules
from sim.cluster import NodeGroup, build_cluster
from sim.engine import FailureConfig, Outage, SimConfig, SimulationError, simulate
from sim.metrics import summarise
from sim.truth import TruthConfig, TruthParams
from sim.workloads.base import SimJob, Workload
from sim.workloads.genie import GenieOptions, generate

EXACT = SimConfig(seed=1, truth=TruthConfig(noise_sigma=0.0, interference=False))


def one_node(gpus: int = 1, cores: int = 4) -> list:
    return build_cluster([NodeGroup(count=1, gpus_per_node=gpus, cpu_cores=cores, sockets=1,
                                    gpus_per_switch=max(gpus, 1), prefix="n")])


def known_job(name: str, submit: float, duration: float, gpus: int = 1,
              qos: QosClass = QosClass.NORMAL) -> SimJob:
    spec = JobSpec(name=name, command=("x",), user="u", gpus=gpus, cpus=1, qos=qos)
    return SimJob(name, spec, submit, TruthParams(known_duration=duration, known_gpus=gpus))


def test_two_jobs_one_gpu_fifo_exact_jcts() -> None:
    # A runs 0 -> 100; B arrives at 10, waits for the only GPU, runs 100 -> 150.
    workload = Workload("tiny", [known_job("a", 0.0, 100.0), known_job("b", 10.0, 50.0)],
                        one_node())
    result = simulate(workload, make_policy("fifo"), EXACT)
    by_id = {r.id: r for r in result.records}
    a, b = by_id["a"], by_id["b"]
    assert (a.first_start, a.end, a.jct, a.queue_delay) == (0.0, 100.0, 100.0, 0.0)
    assert (b.first_start, b.end, b.jct, b.queue_delay) == (100.0, 150.0, 140.0, 90.0)
    assert result.end_time == 150.0
    summary = summarise(result)
    assert summary["makespan_s"] == 150.0
    assert summary["avg_jct_s"] == 120.0
    # GPU held 0..150 of a 150 s window: the only GPU was always active.
    assert summary["gpu_active_rate"] == 1.0


def test_model_driven_job_duration_follows_eq4() -> None:
    # generic profile: sPR(64) = 5 + 2·95/64·64 − 95/64²·64² = 100 samples/s exactly,
    # so Lat = 64·1000/100 + ν(20 s) = 660 s on one GPU.
    spec = JobSpec(name="m", command=("x",), user="u", gpus=1, cpus=1, batch=64,
                   iterations=1000)
    job = SimJob("m", spec, 0.0, TruthParams(batch=64, iterations=1000))
    result = simulate(Workload("m", [job], one_node()), make_policy("fifo"), EXACT)
    (record,) = result.records
    assert record.end == 660.0
    assert record.lat11 == 660.0


def test_same_seed_same_results_to_the_last_digit() -> None:
    def run(seed: int) -> tuple:
        workload = generate(GenieOptions(density=10, hours=6, seed=seed))
        result = simulate(workload, make_policy("fifo"), SimConfig(seed=seed))
        return (
            [dataclasses.astuple(r) for r in result.records],
            result.usage,
            [dataclasses.astuple(s) for s in result.samples],
            summarise(result),
        )

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first[0] != other[0]


def test_queue_is_driven_only_at_event_instants() -> None:
    # Three jobs arriving at one instant form one batch: one pass starts all of them.
    jobs = [known_job(f"j{i}", 5.0, 10.0) for i in range(3)]
    result = simulate(Workload("same", jobs, one_node(gpus=4)), make_policy("fifo"), EXACT)
    assert {r.first_start for r in result.records} == {5.0}
    # One pass at t=5 (arrivals), one at t=15 (the exits): no pass without an event.
    assert result.passes == 2


class PreemptOnce:
    """Test policy: FIFO, but when job "big" waits, preempt the running "small" once."""

    name = "preempt-once"

    def __init__(self) -> None:
        self.fired = False

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job],
               now: float) -> list[Decision]:
        pool = FreePool(snapshot)
        decisions: list[Decision] = []
        # "big" first: the core puts a preempted job back at the head of the queue.
        for job in sorted(queue, key=lambda j: j.id != "big"):
            placement = pack(job.spec, pool)
            if placement is None:
                if job.id == "big" and "small" in snapshot.running and not self.fired:
                    self.fired = True
                    decisions.append(Preempt("small", "make room"))
                break
            pool.take(placement)
            decisions.append(Start(job.id, placement))
        return decisions


@pytest.mark.parametrize("keep_progress, small_end", [(False, 160.0), (True, 130.0)])
def test_preempted_job_is_requeued_and_restarted(keep_progress: bool, small_end: float) -> None:
    # small starts at 0 (60 s of work); big arrives at 30 needing the GPU; small is stopped at
    # 30 and re-queued at the head, so it restarts when big ends at 100: from scratch (ends
    # 160) or, keeping progress, with 30 s left (ends 130).
    jobs = [known_job("small", 0.0, 60.0), known_job("big", 30.0, 70.0)]
    config = dataclasses.replace(EXACT, preempt_keeps_progress=keep_progress)
    result = simulate(Workload("p", jobs, one_node()), PreemptOnce(), config)
    by_id = {r.id: r for r in result.records}
    assert by_id["big"].first_start == 30.0 and by_id["big"].end == 100.0
    small = by_id["small"]
    assert small.preemptions == 1 and small.attempts == 2
    assert small.end == small_end
    assert small.run_time == 30.0 + (small_end - 100.0)
    assert summarise(result)["preemptions"] == 1


def test_node_failure_requeues_jobs() -> None:
    jobs = [known_job("long", 0.0, 10 * 3600.0)]
    config = dataclasses.replace(
        EXACT, failures=FailureConfig(mtbf_hours=2.0, repair_hours=1.0), max_retries=50
    )
    # The arrival horizon bounds failures; a late second job extends it.
    jobs.append(known_job("late", 20 * 3600.0, 1.0))
    result = simulate(Workload("f", jobs, one_node()), make_policy("fifo"), config)
    record = next(r for r in result.records if r.id == "long")
    assert record.retries >= 1
    assert record.state == "finished"
    # Every failure costs the progress made since the last (re)start.
    assert record.end is not None and record.end > 10 * 3600.0
    assert record.run_time > 10 * 3600.0  # work lost to failures was run again
    assert any(s.nodes_down for s in result.samples)


def test_outage_of_one_node_takes_a_multi_node_job_down_and_it_reruns() -> None:
    # Two 1-GPU nodes; "wide" needs both. Node n-0001 dies at 30 for 20 s: wide's part there
    # is lost, the core stops its other part, the job is requeued at 30; it can only
    # restart when the node is back at 50 and runs its 100 s again: ends at 150.
    nodes = build_cluster([NodeGroup(count=2, gpus_per_node=1, cpu_cores=2, sockets=1,
                                     gpus_per_switch=1, prefix="n")])
    jobs = [known_job("wide", 0.0, 100.0, gpus=2)]
    config = dataclasses.replace(EXACT, outages=(Outage("n-0001", 30.0, 20.0),))
    result = simulate(Workload("o", jobs, nodes), make_policy("fifo"), config)
    (record,) = result.records
    assert record.retries == 1 and record.attempts == 2
    assert record.state == "finished" and record.end == 150.0
    assert record.run_time == 30.0 + 100.0
    assert record.queue_delay == 20.0


def test_failures_exhaust_retries() -> None:
    jobs = [known_job("long", 0.0, 100 * 3600.0), known_job("late", 200 * 3600.0, 1.0)]
    config = dataclasses.replace(
        EXACT, failures=FailureConfig(mtbf_hours=5.0, repair_hours=1.0), max_retries=0
    )
    result = simulate(Workload("f", jobs, one_node()), make_policy("fifo"), config)
    record = next(r for r in result.records if r.id == "long")
    # The master's rule (masterd/core/failures.py): max_requeues reached, it ends node_lost.
    assert record.state == "node_lost" and record.retries == 0
    assert record.reason.startswith("node n-0000 lost")
    assert "not requeued again: it was requeued 0 time(s), max_requeues is 0" in record.reason
    assert summarise(result)["node_lost"] == 1


def test_a_failure_requeues_by_the_masters_rules_keeping_the_place() -> None:
    """One 1-GPU node fails at 30 for 20 s. "first" (submitted at 0) is requeued, ahead of
    "second" (submitted at 10); "once" asked for no requeue and ends node_lost; the core's
    own job counts the restart."""
    nodes = build_cluster([NodeGroup(count=2, gpus_per_node=1, cpu_cores=2, sockets=1,
                                     gpus_per_switch=1, prefix="n")])
    once_spec = JobSpec(name="once", command=("x",), user="u", gpus=1, cpus=1,
                        stop=StopRules(requeue=False))
    jobs = [known_job("first", 0.0, 100.0),
            SimJob("once", once_spec, 1.0, TruthParams(known_duration=100.0, known_gpus=1)),
            known_job("second", 10.0, 10.0)]
    config = dataclasses.replace(EXACT, outages=(Outage("n-0000", 30.0, 20.0),
                                                 Outage("n-0001", 30.0, 20.0)))
    from sim.engine import Simulator

    sim = Simulator(Workload("r", jobs, nodes), make_policy("fifo"), config)
    result = sim.run()
    by_id = {r.id: r for r in result.records}
    first, once, second = by_id["first"], by_id["once"], by_id["second"]
    assert first.retries == 1 and first.attempts == 2 and first.state == "finished"
    assert sim.core.jobs["first"].restarts == 1
    # Both nodes are back at 50: "first" keeps its place ahead of "second" (FIFO).
    assert first.end == 150.0 and second.first_start == 50.0 and second.end == 60.0
    assert once.state == "node_lost" and once.end == 30.0
    assert once.reason == ("node n-0001 lost (it failed); the job may not be "
                           "requeued (--no-requeue)")
    # requeue_default = false: the plain jobs end node_lost too.
    config = dataclasses.replace(config, requeue_default=False)
    result = simulate(Workload("r", jobs, nodes), make_policy("fifo"), config)
    assert {r.id: r.state for r in result.records} == {
        "first": "node_lost", "once": "node_lost", "second": "finished"}


def test_job_that_can_never_fit_is_rejected_not_left_queued() -> None:
    jobs = [known_job("huge", 0.0, 10.0, gpus=2), known_job("ok", 1.0, 10.0)]
    result = simulate(Workload("r", jobs, one_node()), make_policy("fifo"), EXACT)
    by_id = {r.id: r for r in result.records}
    assert by_id["huge"].state == "rejected"
    assert "2 GPUs" in by_id["huge"].reason
    assert by_id["ok"].end == 11.0


class NeverSettles:
    name = "never-settles"

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job],
               now: float) -> list[Decision]:
        return [Preempt(j, "again") for j in snapshot.running] + [
            Start(job.id, p) for job in queue[:1]
            if (p := pack(job.spec, FreePool(snapshot))) is not None
        ]


def test_policy_that_never_settles_is_reported() -> None:
    # From t=5 every pass stops the running job and starts the waiting one, forever.
    config = dataclasses.replace(EXACT, max_passes_per_instant=50)
    jobs = [known_job("a", 0.0, 10.0), known_job("b", 5.0, 10.0)]
    workload = Workload("loop", jobs, one_node(gpus=2))
    with pytest.raises(SimulationError, match="passes at t=5"):
        simulate(workload, NeverSettles(), config)


def test_cpu_job_and_inference_kinds_run() -> None:
    cpu = JobSpec(name="c", command=("x",), user="u", kind=JobKind.CPU, gpus=0, cpus=2)
    jobs = [SimJob("c", cpu, 0.0, TruthParams(known_duration=40.0, known_gpus=0))]
    result = simulate(Workload("c", jobs, one_node()), make_policy("fifo"), EXACT)
    assert result.records[0].end == 40.0


class SpecRecorder:
    """FIFO that remembers the iteration counts it was shown."""

    name = "spec-recorder"

    def __init__(self) -> None:
        self.seen: dict[str, int | None] = {}
        self.fifo = make_policy("fifo")

    def decide(self, snapshot: ClusterSnapshot, queue: Sequence[Job],
               now: float) -> list[Decision]:
        for job in queue:
            self.seen[job.id] = job.spec.iterations
        return self.fifo.decide(snapshot, queue, now)


def test_prediction_error_changes_what_the_policy_sees_not_the_truth() -> None:
    workload = generate(GenieOptions(density=10, hours=3, seed=2))
    exact, noisy = SpecRecorder(), SpecRecorder()
    base = simulate(workload, exact, SimConfig(seed=2))
    erred = simulate(workload, noisy, SimConfig(seed=2, prediction_error=0.3))
    declared = {j.id: j.spec.iterations for j in workload.jobs}
    assert exact.seen == declared
    assert noisy.seen != declared and noisy.seen.keys() == declared.keys()
    ratios = [noisy.seen[k] / declared[k] for k in declared]
    assert min(ratios) > 0.2 and max(ratios) < 5
    # FIFO does not read iterations, and the truth uses the real ones: same replay.
    assert [r.end for r in base.records] == [r.end for r in erred.records]


def test_the_base_engine_runs_a_pass_when_the_policy_asks_for_one() -> None:
    """A policy's wake_at (Liquid's batch window closing) runs a pass in every replay, as
    the master's timer does: a lone job waits for the window, not for another event."""
    from masterd.core.policies.liquid import LiquidPolicy

    # A multi-task job (two GPUs: two workers and a parameter server) is batched; alone,
    # nothing but the window's close can start it.
    workload = Workload("window", [known_job("a", 0.0, 100.0, gpus=2)], one_node(gpus=4))
    result = simulate(workload, LiquidPolicy(batch_window_s=15.0), EXACT)
    [a] = result.records
    assert a.first_start == 15.0 and a.end == 115.0
