"""The simulator honours time limits through the core's stop path (a job running past its
limit ends ``timeout`` at start + limit and frees its GPUs then), counts timeouts, marks the
jobs that were at the head of the queue, and shows EASY bounding the head job's wait where
plain backfill lets a stream of small jobs starve it."""

from __future__ import annotations

from dataclasses import replace

from masterd.core.policies import make_policy
from shared.model import JobSpec
from sim.cluster import NodeGroup, build_cluster
from sim.engine import SimConfig, simulate
from sim.metrics import head_waits, summarise
from sim.truth import TruthConfig, TruthParams
from sim.workloads.base import SimJob, Workload

EXACT = SimConfig(seed=1, truth=TruthConfig(noise_sigma=0.0, interference=False))


def node(gpus: int) -> list:
    return build_cluster([NodeGroup(count=1, gpus_per_node=gpus, cpu_cores=16, sockets=1,
                                    gpus_per_switch=gpus, prefix="n")])


def known(name: str, submit: float, duration: float, gpus: int = 1,
          limit: int | None = None) -> SimJob:
    spec = JobSpec(name=name, command=("x",), user="u", gpus=gpus, cpus=1, time_limit_s=limit)
    return SimJob(name, spec, submit, TruthParams(known_duration=duration, known_gpus=gpus))


def test_a_job_past_its_limit_ends_timeout_and_frees_its_gpu_then() -> None:
    workload = Workload("limits", [known("over", 0.0, 500.0, limit=100),
                                   known("next", 10.0, 50.0, limit=60),
                                   known("exact", 20.0, 30.0, limit=30)], node(1))
    result = simulate(workload, make_policy("fifo"), EXACT)
    by_id = {r.id: r for r in result.records}
    over, nxt, exact = by_id["over"], by_id["next"], by_id["exact"]
    assert (over.state, over.end, over.run_time) == ("timeout", 100.0, 100.0)
    assert over.reason == "time limit 0:01:40 reached"
    assert (nxt.state, nxt.first_start, nxt.end) == ("finished", 100.0, 150.0)
    # Ending at the very instant of its limit is finishing (the exit comes first).
    assert (exact.state, exact.first_start, exact.end) == ("finished", 150.0, 180.0)
    summary = summarise(result)
    assert (summary["timeout"], summary["finished"], summary["failed"]) == (1, 2, 0)


def test_no_limit_no_timeout() -> None:
    workload = Workload("free", [known("long", 0.0, 10_000.0)], node(1))
    (record,) = simulate(workload, make_policy("fifo"), EXACT).records
    assert (record.state, record.end) == ("finished", 10_000.0)


def stream(count: int = 200) -> Workload:
    """One 4-GPU node; 1-GPU jobs of 10 s (limit 12 s) every 3 s; a 4-GPU job (30 s, limit
    40 s) arriving at t=1."""
    jobs = [known(f"s{i:04d}", 3.0 * i, 10.0, limit=12) for i in range(count)]
    jobs.insert(1, known("big", 1.0, 30.0, gpus=4, limit=40))
    return Workload("stream", jobs, node(4))


def test_easy_bounds_the_head_wait_where_plain_backfill_starves_it() -> None:
    plain = simulate(stream(), make_policy("fifo", backfill=True), EXACT)
    easy = simulate(stream(), make_policy("fifo", backfill="easy"), EXACT)
    big_plain = next(r for r in plain.records if r.id == "big")
    big_easy = next(r for r in easy.records if r.id == "big")
    # Plain backfill: small jobs keep at least one GPU busy while the stream lasts (597 s);
    # the big job starts only after it.
    assert big_plain.first_start is not None and big_plain.first_start > 590.0
    # EASY: reserved at t=1 for when s0000 ends by its limit (12 s); it ends at 10 and the
    # big job starts then.
    assert big_easy.first_start == 10.0
    assert big_easy.at_head and big_plain.at_head
    waits_easy, waits_plain = head_waits(easy.records), head_waits(plain.records)
    # Under EASY no head waits longer than the limits of the jobs in its way (small jobs
    # queued behind the big one wait for its 30 s run); under plain backfill the big one
    # waited for the whole stream.
    assert waits_easy["max_s"] <= 40.0
    assert waits_plain["max_s"] > 590.0
    assert waits_easy["at_head_max_s"] <= 40.0 and waits_plain["at_head_max_s"] > 590.0
    assert big_easy.head_since == 1.0  # first at the head right after its arrival
    assert waits_easy["never_started"] == waits_plain["never_started"] == 0


def test_strict_fifo_marks_every_blocked_head() -> None:
    workload = Workload("heads", [known("a", 0.0, 100.0), known("b", 1.0, 10.0),
                                  known("c", 2.0, 10.0)], node(1))
    result = simulate(workload, make_policy("fifo"), EXACT)
    assert {r.id for r in result.records if r.at_head} == {"b", "c"}
    waits = head_waits(result.records)
    assert (waits["jobs"], waits["max_s"]) == (2, 108.0)
    # b was the head from 1 to 100, c from 100 (when b started) to 110.
    assert waits["at_head_max_s"] == 99.0 and waits["at_head_avg_s"] == (99.0 + 10.0) / 2


def test_limits_replace_nothing_else() -> None:
    """The same workload with generous limits replays exactly as without them."""
    base = stream(50)
    generous = replace(base, jobs=[replace(j, spec=replace(j.spec, time_limit_s=10_000))
                                   for j in base.jobs])
    a = simulate(base, make_policy("fifo", backfill=True), EXACT)
    b = simulate(generous, make_policy("fifo", backfill=True), EXACT)
    assert [(r.id, r.first_start, r.end) for r in a.records] == \
        [(r.id, r.first_start, r.end) for r in b.records]
