"""The baselines of SCHED²'s evaluation: SIF, DSIF, SAF, LRF, SPF (seeds/sched2.md §IV-A)."""

from __future__ import annotations

from masterd.core.cluster import ClusterState
from masterd.core.genie.model import Coefficients
from masterd.core.genie.modeldb import ModelDB, ModelEntry
from masterd.core.policies import make_policy
from masterd.core.policy import Start
from shared.model import Job, NodeAllocation, Placement
from tests.unit.helpers import inventory, job


def modeldb() -> ModelDB:
    # 100 samples/s per GPU; "sensitive" jobs lose most of their speed over two servers.
    return ModelDB([
        ModelEntry("flat", "A100", "training", Coefficients(100.0, 0.0, 0.0)),
        ModelEntry("sensitive", "A100", "training",
                   Coefficients(100.0, 0.0, 0.0, gamma=4.0, lam=0.1)),
    ])


def timed(job_id: str, gpus: int, seconds: float, t: float = 0.0,
          model: str = "flat") -> Job:
    """A job of ``seconds`` on its GPUs packed (batch 100 at 100 samples/s per GPU)."""
    return job(job_id, gpus=gpus, t=t, model_type=model, batch=100,
               iterations=round(seconds * gpus))


def first_pass(name: str, jobs: list[Job], free: dict[str, int],
               now: float = 10.0) -> list[str]:
    """The jobs ``name`` starts on servers with ``free`` GPUs free (of 8)."""
    policy = make_policy(name) if name == "lrf" else make_policy(name, modeldb=modeldb())
    state = ClusterState()
    for node, count in free.items():
        state.upsert_node(inventory(node, gpus=8))
        if count < 8:
            state.allocate(f"hold-{node}", _on(node, 8 - count))
    decisions = policy.decide(state.snapshot({}), jobs, now)
    return [d.job_id for d in decisions if isinstance(d, Start)]


def _on(node: str, gpus: int) -> Placement:
    return Placement((NodeAllocation(node, tuple(range(gpus)), ()),))


def test_sif_lrf_spf_orders() -> None:
    jobs = [timed("long1", 1, 9000, t=0), timed("short4", 4, 100, t=1),
            timed("mid2", 2, 1000, t=2)]
    free = {"a": 4}
    assert first_pass("sif", jobs, free) == ["short4"]  # shortest ideal time first
    assert first_pass("lrf", jobs, free) == ["long1", "mid2"]  # fewest GPUs first
    # GPU × ideal time: 400 (short4) < 2,000 (mid2) < 9,000 (long1)
    assert first_pass("spf", jobs, free) == ["short4"]


def test_a_job_that_does_not_fit_is_skipped_not_blocking() -> None:
    jobs = [timed("big", 8, 10, t=0), timed("small", 1, 20, t=1)]
    assert first_pass("sif", jobs, {"a": 4}) == ["small"]


def test_dsif_delays_a_spread_job_at_most_three_times() -> None:
    policy = make_policy("dsif", modeldb=modeldb())
    state = ClusterState()
    for node in ("a", "b"):
        state.upsert_node(inventory(node, gpus=8))
    state.allocate("x", _on("a", 6))
    state.allocate("y", _on("b", 6))
    snapshot = state.snapshot({})
    queue = [timed("four", 4, 100, model="sensitive")]  # 2 + 2 free: only a spread placement
    assert policy.decide(snapshot, queue, 1.0) == []
    assert policy.decide(snapshot, queue, 1.0) == []  # same instant: not a new delay
    assert policy.decide(snapshot, queue, 2.0) == []
    assert policy.decide(snapshot, queue, 3.0) == []
    decisions = policy.decide(snapshot, queue, 4.0)  # three delays spent: it goes, spread
    assert [len(d.placement.allocations) for d in decisions if isinstance(d, Start)] == [2]


def test_dsif_lets_a_packed_job_go_at_once_and_others_pass_a_delayed_one() -> None:
    policy = make_policy("dsif", modeldb=modeldb())
    state = ClusterState()
    for node in ("a", "b"):
        state.upsert_node(inventory(node, gpus=8))
    state.allocate("x", _on("a", 6))
    state.allocate("y", _on("b", 6))
    queue = [timed("four", 4, 10), timed("one", 1, 50)]
    decisions = policy.decide(state.snapshot({}), queue, 1.0)
    assert [d.job_id for d in decisions if isinstance(d, Start)] == ["one"]


def test_saf_picks_the_shortest_time_on_the_placement_it_would_get() -> None:
    # Two servers with 2 GPUs free each: a 4-GPU job must spread. The sensitive one is
    # short on one server (its ideal) but slow spread; SAF sees that, SIF does not.
    state = ClusterState()
    for node in ("a", "b"):
        state.upsert_node(inventory(node, gpus=8))
    state.allocate("x", _on("a", 6))
    state.allocate("y", _on("b", 6))
    queue = [timed("sensitive4", 4, 100, model="sensitive"), timed("flat4", 4, 300)]
    snapshot = state.snapshot({})
    saf = make_policy("saf", modeldb=modeldb()).decide(snapshot, queue, 1.0)
    sif = make_policy("sif", modeldb=modeldb()).decide(snapshot, queue, 1.0)
    assert [d.job_id for d in saf if isinstance(d, Start)] == ["flat4"]
    assert [d.job_id for d in sif if isinstance(d, Start)] == ["sensitive4"]
