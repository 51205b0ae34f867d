"""The sched2 policy's frozen-time loop, state and rewards, driven through SchedulingCore."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masterd.core.genie.model import Coefficients
from masterd.core.genie.modeldb import ModelDB, ModelEntry
from masterd.core.policies import make_policy
from masterd.core.policies.sched2 import Sched2Policy
from masterd.core.policy import Start
from masterd.core.sched2.estimate import spread_levels
from masterd.core.sched2.network import Shape, random_network
from masterd.core.sched2.state import ABSENT, GpuState, Observation
from masterd.core.scheduler import SchedulingCore
from tests.unit.helpers import inventory, job

J = 3
HOUR = 3600.0


class Scripted:
    """An agent that plays given actions and records what it was shown."""

    def __init__(self, actions: list[int]) -> None:
        self.actions = list(actions)
        self.seen: list[Observation] = []
        self.rewards: list[float] = []

    def act(self, observation: Observation) -> int:
        self.seen.append(observation)
        return self.actions.pop(0) if self.actions else J

    def reward(self, value: float) -> None:
        self.rewards.append(value)


def modeldb() -> ModelDB:
    # 100 samples/s per GPU at any batch; γ = 2: one server loses λγ = 0.5 GPU, two lose more.
    c = Coefficients(k0=100.0, k1=0.0, k2=0.0, gamma=2.0, lam=0.25)
    return ModelDB([ModelEntry("m", "A100", "training", c)])


def work(gpus: int = 1, seconds: float = HOUR) -> dict[str, object]:
    """Spec fields of a job that runs ``seconds`` on one GPU (batch 100 at 100 samples/s)."""
    return {"model_type": "m", "batch": 100, "iterations": int(seconds)}


def setup(actions: list[int], servers: int = 2) -> tuple[SchedulingCore, Scripted]:
    agent = Scripted(actions)
    policy = Sched2Policy(model=random_network(Shape(servers, 8, J)), modeldb=modeldb(),
                          agent=agent)
    core = SchedulingCore(policy)
    for i in range(servers):
        core.node_up(inventory(f"s{i}", gpus=8))
    return core, agent


def started(decisions: list) -> list[str]:  # type: ignore[type-arg]
    return [d.job_id for d in decisions if isinstance(d, Start)]


def test_time_frozen_the_agent_picks_until_it_says_no_job() -> None:
    core, agent = setup([1, 0, J])
    for i in range(3):
        core.submit(job(f"j{i}", gpus=1, t=float(i), **work()))
    decisions = core.schedule(10.0)
    # Slot 1 (j1) first, then slot 0 (j0); "no job" leaves j2 waiting.
    assert started(decisions) == ["j1", "j0"]
    assert len(agent.seen) == 3
    first, second, third = agent.seen
    # An idle cluster: waiting cannot buy locality, so "no job" is not offered yet.
    assert not first.mask[J] and second.mask[J]
    # j1 placed: one GPU busy for an hour shows in the next decision's state at once.
    assert (first.servers == 0).sum() == 16
    assert np.isclose(second.servers.max(), math.log1p(1.0))
    assert (second.servers > 0).sum() == 1 and (third.servers > 0).sum() == 2
    # Eq. 2 for each scheduled job: T_ideal / (T_wait + T_actual).
    assert agent.rewards == pytest.approx([HOUR / (9.0 + HOUR), HOUR / (10.0 + HOUR)])
    assert core.queue()[0].id == "j2"


def test_window_holds_the_first_j_jobs_in_arrival_order_and_statistics_the_rest() -> None:
    core, agent = setup([J, J])
    core.submit(job("busy", gpus=1, t=0.0, **work()))
    # An idle cluster: "no job" is not allowed, so the agent's J is overruled: busy starts.
    assert started(core.schedule(0.0)) == ["busy"]
    for i in range(5):
        core.submit(job(f"w{i}", gpus=1 + i, t=1.0 + i, **work(seconds=HOUR * (i + 1))))
    core.schedule(100.0)
    jobs = agent.seen[-1].jobs
    k = 4
    for slot in range(J):
        gpus = 1 + slot
        base = slot * (k + 2)
        assert jobs[base + k] == pytest.approx(gpus / 8)
        assert jobs[base + k + 1] == pytest.approx(math.log1p((100.0 - (1.0 + slot)) / HOUR))
    # w0 (1 GPU) is the same everywhere; w1 (2 GPUs) slows down over two servers.
    assert jobs[0:k] == pytest.approx([math.log1p(1.0)] * k)
    assert jobs[6] < jobs[6 + k - 1]
    stats = jobs[(k + 2) * J:]
    assert stats[0] == pytest.approx(math.log1p(2) / 10)  # w3, w4 beyond the window
    assert stats[1] == pytest.approx((4 + 5) / 2 / 8)


def test_jobs_that_do_not_fit_are_masked_and_cpu_jobs_start_without_the_agent() -> None:
    core, agent = setup([J], servers=1)
    core.submit(job("cpu", gpus=0, cpus=2, t=0.0))
    core.submit(job("big", gpus=12, t=1.0, **work()))
    assert started(core.schedule(5.0)) == ["cpu"]
    assert agent.seen == []  # nothing in the window fits: no decision to take
    core.submit(job("small", gpus=2, t=2.0, **work()))
    core.schedule(6.0)
    assert agent.seen[-1].mask.tolist() == [False, True, False, False]


def test_remaining_times_count_down_and_missing_servers_are_absent() -> None:
    core, agent = setup([0, J], servers=2)
    core.node_down("s1")
    core.submit(job("a", gpus=2, t=0.0, **work()))
    core.schedule(0.0)
    for node in core.jobs["a"].node_states:
        core.node_started("a", node, 0.0)
    core.submit(job("b", gpus=1, t=1.0, **work()))
    core.schedule(1800.0)
    servers = agent.seen[-1].servers
    row = servers[0]  # s0: two busy GPUs first (sorted), 600 s of their 2,400 s left
    # 2 GPUs on one server: (2 - λγ) × 100 = 150 samples/s, 360,000 samples in 2,400 s.
    assert row[:2] == pytest.approx([math.log1p(600 / HOUR)] * 2)
    assert (row[2:] == 0).all()
    assert (servers[1] == ABSENT).all()  # s1 is down


def test_spread_levels_go_from_concentrated_to_scattered() -> None:
    assert spread_levels(1, 8, 15, 4) == (1, 1, 1, 1)
    assert spread_levels(4, 8, 15, 4) == (1, 2, 3, 4)
    assert spread_levels(16, 8, 15, 4) == (2, 4, 8, 15)
    assert spread_levels(8, 8, 2, 4) == (1, 1, 2, 2)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=25), st.integers(0, 2))
def test_free_gpus_from_the_matrix_equal_the_cores(demands: list[int], down: int) -> None:
    """What the state counts as free is what the core's free sets hold, whatever ran."""
    core = SchedulingCore(make_policy("sif", modeldb=modeldb()))
    for i in range(4):
        core.node_up(inventory(f"s{i}", gpus=8))
    for i in range(down):
        core.node_down(f"s{i}")
    for i, gpus in enumerate(demands):
        core.submit(job(f"j{i}", gpus=gpus, t=float(i), **work()))
    core.schedule(1.0)
    state = GpuState(Shape(4, 8, J))
    state.sync(core.snapshot(), lambda job: 100.0)
    want = sum(len(v.free_gpus) for v in core.snapshot().schedulable.values())
    assert sum(state.free().values()) == want
    busy = {a.node: len(a.gpus) for j in core.running().values() for a in j.placement.allocations}
    assert busy  # something runs
