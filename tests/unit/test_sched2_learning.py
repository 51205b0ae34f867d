"""SCHED²'s learning fixes: the packing feature, canonical server order, the hold rule in the
agent's seat, model flags, the elapsed-time discount and the imitation (margin) loss."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from masterd.core.policies.sched2 import Sched2Policy
from masterd.core.sched2.agent import HoldAgent, hold_action
from masterd.core.sched2.network import QNetwork, Shape, random_network
from masterd.core.sched2.state import NO_PLACEMENT, GpuState, Observation
from masterd.core.scheduler import SchedulingCore
from tests.unit.helpers import inventory, job
from tests.unit.test_sched2_policy import HOUR, Scripted, modeldb, work

J = 3


def core_with(agent: object, shape: Shape) -> SchedulingCore:
    policy = Sched2Policy(model=random_network(shape), modeldb=modeldb(),
                          agent=agent)  # type: ignore[arg-type]
    core = SchedulingCore(policy)
    for i in range(shape.servers):
        core.node_up(inventory(f"s{i}", gpus=8))
    return core


def test_packing_feature_says_what_locality_packing_would_give_now() -> None:
    shape = Shape(2, 8, J, packing=True)
    agent = Scripted([0, J])
    core = core_with(agent, shape)
    core.submit(job("six", gpus=6, t=0.0, **work()))
    core.submit(job("four", gpus=4, t=1.0, **work()))
    core.submit(job("eleven", gpus=11, t=2.0, **work()))
    core.schedule(10.0)
    step = shape.job_step
    first, second = agent.seen
    assert first.jobs.shape == (shape.job_features,) == ((4 + 3) * J + 4,)
    # An empty cluster: six and four pack on one server (best), eleven on two (its best).
    assert [first.jobs[i * step + 6] for i in range(3)] == [0.0, 0.0, 0.0]
    # six placed: 2 + 8 free; four still fits one server; eleven no longer fits at all.
    assert second.jobs[0 * step + 6] == 0.0  # "four" moved to slot 0
    assert second.jobs[1 * step + 6] == NO_PLACEMENT and not second.mask[1]
    assert second.now == 10.0


def test_a_spread_placement_shows_its_slowdown() -> None:
    shape = Shape(2, 8, J, packing=True)
    agent = Scripted([0, 0, J])
    core = core_with(agent, shape)
    core.submit(job("a", gpus=5, t=0.0, **work()))
    core.submit(job("b", gpus=5, t=1.0, **work()))
    core.submit(job("c", gpus=4, t=2.0, **work()))
    core.schedule(10.0)
    third = agent.seen[2]  # 3 + 3 free: c (4 GPUs) only spread over both servers
    value = third.jobs[6]
    assert value > 0 and math.isfinite(value)
    assert hold_action(third, shape) == J  # the hold rule says "no job" to it


def test_canonical_order_ignores_server_names() -> None:
    shape = Shape(3, 8, J, canonical=True)
    views = []
    for row in (0, 2):  # the same situation, the busy GPUs on the first or the last server
        state = GpuState(shape)
        state._absent[:] = False
        state._ends[row, :2] = 2 * HOUR
        state._ends[1, :1] = HOUR
        views.append((state.features(0.0, HOUR, canonical=True),
                      state.features(0.0, HOUR)))
    (a, plain_a), (b, plain_b) = views
    assert np.array_equal(a, b) and not np.array_equal(plain_a, plain_b)
    rows = [tuple(r) for r in a]
    assert rows == sorted(rows, reverse=True)


def test_flags_round_trip_and_old_files_read_as_off(tmp_path: Path) -> None:
    shape = Shape(2, 8, J, packing=True, canonical=True)
    random_network(shape).save(tmp_path / "m.npz")
    assert QNetwork.load(tmp_path / "m.npz").shape == shape
    random_network(Shape(2, 8, J)).save(tmp_path / "old.npz")
    assert QNetwork.load(tmp_path / "old.npz").shape == Shape(2, 8, J)


def test_the_hold_rule_needs_the_packing_feature() -> None:
    with pytest.raises(ValueError, match="packing feature"):
        HoldAgent(Shape(2, 8, J)).act(Observation(np.zeros((2, 8)), np.zeros(22),
                                                  np.ones(J + 1, dtype=bool)))


TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


@pytest.mark.skipif(not (TRACES / "philly-jobs.csv").exists(), reason=f"no trace at {TRACES}")
def test_the_hold_rule_in_the_agents_seat_is_sched2_hold_start_for_start() -> None:
    from masterd.core.policies import make_policy
    from sim.engine import SimConfig, simulate
    from sim.oracle import oracle_modeldb
    from sim.studies import sched2 as study
    from sim.truth import TruthModel
    from sim.workloads import sched2 as workload

    w = workload.episode(TRACES, workload.Sched2Options(jobs=300, load=1.0), 30,
                         TruthModel(study.TRUTH))
    db = oracle_modeldb(study.TRUTH, workload.GPU_MODEL)
    shape = Shape(15, 8, 10, packing=True, canonical=True)
    seat = simulate(w, Sched2Policy(model=random_network(shape), modeldb=db,
                                    agent=HoldAgent(shape)), SimConfig(seed=1, truth=study.TRUTH))
    rule = simulate(w, make_policy("sched2-hold", modeldb=db),
                    SimConfig(seed=1, truth=study.TRUTH))
    starts = {r.id: (r.first_start, r.nodes_used) for r in rule.records}
    assert len(starts) == 300
    assert {r.id: (r.first_start, r.nodes_used) for r in seat.records} == starts
