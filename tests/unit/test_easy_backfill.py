"""EASY backfill in the fifo policy (masterd/core/backfill.py): the head job gets a
reservation from running jobs' time limits, on specific nodes; a later job starts only if it
ends before the reservation or touches none of its resources. Under plain backfill a stream
of small jobs starves a large head; under EASY it does not."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from masterd.core.policies import make_policy
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Start
from masterd.core.scheduler import SchedulingCore
from shared.model import Job, JobState
from tests.unit.helpers import inventory, job


@dataclass
class MiniReplay:
    """A few lines of discrete-event replay over the real core: jobs arrive, run exactly
    their duration, and a pass follows every instant that changed something."""

    core: SchedulingCore
    durations: dict[str, float] = field(default_factory=dict)
    ends: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)

    def step(self, now: float, arrivals: list[Job]) -> None:
        for job_id, end in sorted(self.ends.items(), key=lambda e: (e[1], e[0])):
            if end <= now:
                self._exit(job_id, end)
        for new in arrivals:
            self.core.submit(new)
        self._pass(now)

    def _exit(self, job_id: str, at: float) -> None:
        del self.ends[job_id]
        running = self.core.jobs[job_id]
        for node in list(running.node_states):
            self.core.node_exited(job_id, node, 0, None, at)
        self._pass(at)

    def _pass(self, now: float) -> None:
        for decision in self.core.schedule(now):
            assert isinstance(decision, Start)
            for node in decision.placement.nodes:
                self.core.node_started(decision.job_id, node, now)
            self.started[decision.job_id] = now
            self.ends[decision.job_id] = now + self.durations[decision.job_id]


def stream(backfill: bool | str, horizon: float = 300.0) -> MiniReplay:
    """One 4-GPU node; 1-GPU jobs of 10 s (limit 10 s) every 3 s from t=0; a 4-GPU job of
    20 s (limit 30 s) arrives at t=1."""
    core = SchedulingCore(FifoPolicy(backfill=backfill))
    core.node_up(inventory("n1", gpus=4, cpus=16))
    replay = MiniReplay(core)
    t = 0.0
    index = 0
    while t <= horizon:
        arrivals = []
        if t == 1.0:
            big = job("big", gpus=4, t=t, time_limit_s=30)
            replay.durations["big"] = 20.0
            arrivals.append(big)
        if t % 3 == 0:
            small = job(f"small{index:03d}", gpus=1, t=t, time_limit_s=10)
            replay.durations[small.id] = 10.0
            arrivals.append(small)
            index += 1
        replay.step(t, arrivals)
        t += 1.0
    return replay


def test_plain_backfill_starves_the_large_head() -> None:
    replay = stream(True)
    assert "big" not in replay.started  # 300 s of small jobs, and it never ran
    assert len(replay.started) > 80


def test_easy_backfill_bounds_the_head_jobs_wait() -> None:
    replay = stream("easy")
    # small000 (started at 0, limit 10) is the only job in the way at t=1: reserved for 10.
    assert replay.started["big"] == 10.0
    # Small jobs still flow, before and after it.
    assert sum(1 for j in replay.started if j.startswith("small")) > 80


def test_strict_fifo_also_waits_only_for_the_running_job() -> None:
    replay = stream(False, horizon=40.0)
    assert replay.started["big"] == 10.0


def core_with(policy: FifoPolicy, nodes: dict[str, int]) -> SchedulingCore:
    core = SchedulingCore(policy)
    for name, gpus in nodes.items():
        core.node_up(inventory(name, gpus=gpus, cpus=16))
    return core


def run(core: SchedulingCore, new: Job, now: float) -> Job:
    """Submit ``new`` alone and start it at ``now`` (it must fit)."""
    core.submit(new)
    decisions = core.schedule(now)
    assert [d.job_id for d in decisions] == [new.id]
    for node in new.node_states:
        core.node_started(new.id, node, now)
    assert new.state is JobState.RUNNING
    return new


def test_a_short_job_that_ends_before_the_reservation_backfills() -> None:
    policy = FifoPolicy(backfill="easy")
    core = core_with(policy, {"n1": 4})
    run(core, job("running", gpus=2, time_limit_s=100), now=0.0)
    for new in (job("head", gpus=4, t=1.0), job("short", gpus=1, t=2.0, time_limit_s=50),
                job("long", gpus=1, t=3.0, time_limit_s=500),
                job("endless", gpus=1, t=4.0)):
        core.submit(new)
    started = [d.job_id for d in core.schedule(10.0)]
    # short ends at 60, before the head's reservation at 100: it runs; the others would
    # hold GPUs the head is promised at 100.
    assert started == ["short"]
    reservation = policy.reservation
    assert reservation is not None
    assert (reservation.job_id, reservation.start, reservation.nodes) == ("head", 100.0, ("n1",))
    assert reservation.held == {"long", "endless"}
    assert len(reservation.placement.allocations[0].gpus) == 4


def test_a_long_job_that_touches_no_reserved_resource_backfills() -> None:
    policy = FifoPolicy(backfill="easy")
    core = core_with(policy, {"n1": 4, "n2": 4})
    run(core, job("on-n1", gpus=4, time_limit_s=100), now=0.0)
    run(core, job("on-n2", gpus=2), now=0.0)  # no limit: never ends, as far as anyone knows
    for new in (job("head", gpus=4, t=1.0), job("long", gpus=2, t=2.0, time_limit_s=10_000),
                job("more", gpus=1, t=3.0, time_limit_s=10_000)):
        core.submit(new)
    started = [d.job_id for d in core.schedule(5.0)]
    # The head is promised n1 at 100; n2's two free GPUs are nobody's: "long" takes them.
    # "more" then finds nothing free: it waits, but not for the reservation (not held).
    assert started == ["long"]
    assert policy.reservation is not None
    assert (policy.reservation.start, policy.reservation.nodes) == (100.0, ("n1",))
    assert policy.reservation.held == frozenset()


def test_a_job_without_a_limit_in_the_way_makes_the_reservation_endless() -> None:
    policy = FifoPolicy(backfill="easy")
    core = core_with(policy, {"n1": 4, "n2": 4})
    run(core, job("forever", gpus=3), now=0.0)  # on one node, no limit
    run(core, job("forever2", gpus=3), now=0.0)
    for new in (job("head", gpus=4, t=1.0), job("short", gpus=1, t=2.0, time_limit_s=1),
                job("short2", gpus=1, t=3.0, time_limit_s=1)):
        core.submit(new)
    started = [d.job_id for d in core.schedule(5.0)]
    reservation = policy.reservation
    assert reservation is not None and reservation.start == math.inf
    # The head is promised one node once its endless job ends: nothing there may backfill,
    # not even a 1-second job (the head could fit the moment that job ends); the other
    # node's free GPU is free to use.
    assert len(started) == 1
    promised = reservation.nodes[0]
    placed = core.jobs[started[0]].placement
    assert placed is not None and promised not in placed.nodes
    assert reservation.held == {"short2"}


def test_the_head_fits_nowhere_then_nothing_is_held() -> None:
    policy = FifoPolicy(backfill="easy")
    core = core_with(policy, {"n1": 4, "n2": 4})
    core.set_drained("n2", True)  # the head needs both nodes; one is drained
    core.submit(job("head", gpus=8, t=1.0))
    core.submit(job("small", gpus=1, t=2.0, time_limit_s=10_000))
    assert [d.job_id for d in core.schedule(5.0)] == ["small"]
    assert policy.reservation is None


def test_nothing_waits_no_reservation_and_jobs_start_in_order() -> None:
    policy = FifoPolicy(backfill="easy")
    core = core_with(policy, {"n1": 4})
    for i in range(3):
        core.submit(job(f"j{i}", gpus=1, t=float(i)))
    assert [d.job_id for d in core.schedule(0.0)] == ["j0", "j1", "j2"]
    assert policy.reservation is None


def test_consolidated_placement_reserves_whole_nodes() -> None:
    policy = make_policy("fifo", backfill="easy", placement="consolidate")
    assert isinstance(policy, FifoPolicy)
    core = core_with(policy, {"n1": 4, "n2": 4})
    run(core, job("a", gpus=1, time_limit_s=50), now=0.0)  # on one node
    run(core, job("b", gpus=1, time_limit_s=80), now=0.0)
    core.submit(job("head", gpus=8, t=1.0))  # needs both nodes whole
    core.submit(job("fits-before", gpus=1, t=2.0, time_limit_s=60))
    started = [d.job_id for d in core.schedule(10.0)]
    reservation = policy.reservation
    assert reservation is not None and reservation.start == 80.0
    assert sorted(reservation.nodes) == ["n1", "n2"]
    assert started == ["fits-before"]  # ends at 70, before 80


def test_backfill_option_is_checked() -> None:
    for bad in ("yes", 1, "EASY", None):
        with pytest.raises(ValueError, match="backfill must be true, false or \"easy\""):
            FifoPolicy(backfill=bad)  # type: ignore[arg-type]
    assert FifoPolicy(backfill=True).reservation is None


@pytest.mark.parametrize("block", ["maintenance", "reservation"])
def test_the_heads_promise_keeps_clear_of_a_block_ahead(block: str) -> None:
    """The head's shadow start is judged on the nodes it may use then: n1 frees first, at
    3,600 s, but its window (or another's reservation) begins at 10,800 s and the head's
    2.5-hour limit would cross it from there; n2 frees at 7,200 s with nothing ahead. Judged
    as of now (the limit ends before the block) the promise was n1 at 3,600 s: a promise the
    block breaks."""
    from dataclasses import replace

    from shared.model import ReservationHold

    policy = FifoPolicy(backfill="easy")
    core = SchedulingCore(policy)
    n1 = inventory("n1", gpus=4, cpus=16)
    core.node_up(replace(n1, maintenance_in_s=10_800.0) if block == "maintenance" else
                 replace(n1, reservations=(ReservationHold("course", 10_800.0),)))
    core.node_up(inventory("n2", gpus=4, cpus=16))
    run(core, job("on-n1", gpus=4, time_limit_s=3_600), now=0.0)
    run(core, job("on-n2", gpus=4, time_limit_s=7_200), now=0.0)
    core.submit(job("head", gpus=4, t=1.0, time_limit_s=9_000))
    assert core.schedule(10.0) == []
    reservation = policy.reservation
    assert reservation is not None
    assert (reservation.start, reservation.nodes) == (7_200.0, ("n2",))
