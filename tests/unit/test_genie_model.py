"""GENIE's prediction model (Eq. 4–8), cost model (Eq. 9–13) and metrics (Eq. 14–16),
each checked against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from masterd.core.genie import model as perf
from masterd.core.genie.metrics import (
    TaskOutcome,
    average_normalised_latency,
    makespan,
    normalised_latency,
    qos_guarantee,
)
from masterd.core.genie.model import Coefficients, ModelError
from masterd.core.genie.qos import cer, cost, ect, meets_ect, waiting_allowance
from shared.model import QosClass

C = Coefficients(k0=10.0, k1=2.0, k2=-0.01, gamma=0.8, lam=0.5, nu=30.0)


def test_local_batch_is_eq6() -> None:
    assert perf.local_batch(128, 2, 4) == 16.0
    assert perf.local_batch(100, 1, 1) == 100.0


def test_single_gpu_rate_is_eq7_quadratic() -> None:
    # 10 + 2·16 − 0.01·256 = 39.44
    assert perf.single_gpu_rate(C, 16) == pytest.approx(39.44)
    assert perf.single_gpu_rate(C, 1) == pytest.approx(11.99)


def test_single_gpu_rate_holds_at_the_plateau() -> None:
    # The vertex of 10 + 2b − 0.01b² is b = 100, rate 110; beyond it the rate stays 110.
    assert C.plateau_batch == pytest.approx(100.0)
    assert perf.single_gpu_rate(C, 100) == pytest.approx(110.0)
    assert perf.single_gpu_rate(C, 150) == pytest.approx(110.0)
    rising = Coefficients(k0=1.0, k1=1.0, k2=0.01)
    assert rising.plateau_batch is None
    assert perf.single_gpu_rate(rising, 200) == pytest.approx(1 + 200 + 400)


@pytest.mark.parametrize(
    ("d_node", "d_gpn", "expected"),
    [
        (1, 1, 0.0),
        # one node: only intra-node hops, weight λ: (0 + 0.5·3)·0.8 / 3 = λγ = 0.4
        (1, 4, 0.4),
        # one GPU per node: only inter-node hops: (3 + 0)·0.8 / 3 = γ = 0.8
        (4, 1, 0.8),
        # 2×4: (1·4 + 0.5·3)·0.8 / 7 = 4.4 / 7
        (2, 4, 4.4 / 7),
        # 2×2: (1·2 + 0.5·1)·0.8 / 3 = 2 / 3
        (2, 2, 2.0 / 3),
    ],
)
def test_comm_penalty_is_eq8(d_node: int, d_gpn: int, expected: float) -> None:
    assert perf.comm_penalty(C, d_node, d_gpn) == pytest.approx(expected)


def test_inference_has_no_comm_penalty() -> None:
    assert perf.comm_penalty(C, 4, 4, inference=True) == 0.0
    # PR of inference scales linearly: 8 GPUs × sPR(128/8 = 16)
    assert perf.processing_rate(C, 128, 2, 4, inference=True) == pytest.approx(8 * 39.44)


def test_processing_rate_and_latency_are_eq5_and_eq4() -> None:
    pr = (8 - 4.4 / 7) * 39.44
    assert perf.processing_rate(C, 128, 2, 4) == pytest.approx(pr)
    assert perf.latency(C, 128, 1000, 2, 4) == pytest.approx(128 * 1000 / pr + 30.0)
    # Eq. 5 degenerates to Eq. 7 on one GPU.
    assert perf.processing_rate(C, 64, 1, 1) == pytest.approx(perf.single_gpu_rate(C, 64))


def test_infeasible_placements_are_none() -> None:
    # More GPUs than samples in the global batch.
    assert perf.processing_rate(C, 4, 2, 4) is None
    # Local batch above what one GPU's memory holds.
    small = Coefficients(k0=10, k1=2, k2=-0.01, max_local_batch=32)
    assert perf.processing_rate(small, 64, 1, 1) is None
    assert perf.processing_rate(small, 64, 1, 2) is not None
    # A rate that is not positive.
    assert perf.processing_rate(Coefficients(k0=-50, k1=1, k2=0), 16, 1, 1) is None
    # Communication eats every GPU: 2 GPUs − γ(=3) < 0.
    assert perf.processing_rate(Coefficients(k0=10, k1=1, k2=0, gamma=3.0), 64, 2, 1) is None
    assert perf.latency(Coefficients(k0=10, k1=1, k2=0, gamma=3.0), 64, 10, 2, 1) is None


def test_nominal_single_gpu_latency_ignores_the_memory_guard() -> None:
    small = Coefficients(k0=10, k1=2, k2=-0.01, nu=5, max_local_batch=32)
    assert perf.latency(small, 64, 100, 1, 1) is None
    expected = 64 * 100 / perf.single_gpu_rate(small, 64) + 5
    assert perf.nominal_single_gpu_latency(small, 64, 100) == pytest.approx(expected)
    assert perf.nominal_single_gpu_latency(Coefficients(k0=-1, k1=0, k2=0), 8, 1) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k0": math.nan, "k1": 0, "k2": 0},
        {"k0": 1, "k1": math.inf, "k2": 0},
        {"k0": 1, "k1": 0, "k2": 0, "gamma": -0.1},
        {"k0": 1, "k1": 0, "k2": 0, "lam": -1},
        {"k0": 1, "k1": 0, "k2": 0, "nu": -5},
        {"k0": 1, "k1": 0, "k2": 0, "max_local_batch": 0.5},
        {"k0": "1", "k1": 0, "k2": 0},
        {"k0": True, "k1": 0, "k2": 0},
    ],
)
def test_nonsense_coefficients_are_refused(kwargs: dict) -> None:
    with pytest.raises(ModelError):
        Coefficients(**kwargs)


def test_shapes_need_a_node_and_a_gpu() -> None:
    with pytest.raises(ModelError, match="placement <0, 4>"):
        perf.comm_penalty(C, 0, 4)
    with pytest.raises(ModelError):
        perf.local_batch(8, 1, 0)


# -- QoS and cost (Eq. 9–13) -------------------------------------------------------------------


def test_ect_by_class_is_eq9_from_submission() -> None:
    assert ect(QosClass.URGENT, 100.0, 50.0) == 100.0
    assert ect(QosClass.PRIOR, 100.0, 50.0) == 150.0
    assert ect(QosClass.NORMAL, 100.0, 50.0) == 200.0
    # An explicit deadline overrides the class.
    assert ect(QosClass.NORMAL, 100.0, 50.0, deadline=120.0) == 120.0
    assert ect(QosClass.URGENT, 100.0, 50.0, deadline=1e6) == 1e6


def test_cost_and_cer_are_eq10_and_eq11() -> None:
    # N = 4 nodes, G = 4: <2, 2> costs 4/16 + 0.4·2/4 = 0.45
    assert cost(2, 2, 4, 4, 0.4) == pytest.approx(0.45)
    # <1, 4>: 4/16 + 0.4/4 = 0.35, packed is cheaper than spread
    assert cost(1, 4, 4, 4, 0.4) == pytest.approx(0.35)
    assert cost(4, 1, 4, 4, 0.4) == pytest.approx(0.65)
    assert cost(1, 1, 4, 4, 0.0) == pytest.approx(1 / 16)
    assert cer(90.0, 0.45) == pytest.approx(200.0)
    with pytest.raises(ValueError, match="no GPUs"):
        cost(1, 1, 0, 4, 0.4)


def test_meets_ect_and_waiting_allowance_are_eq12_and_eq13() -> None:
    assert meets_ect(latency=50.0, now=100.0, expected=150.0)
    assert not meets_ect(latency=50.0001, now=100.0, expected=150.0)
    assert waiting_allowance(expected=500.0, latency=120.0, now=100.0) == 280.0
    assert waiting_allowance(expected=100.0, latency=120.0, now=100.0) == -120.0


# -- metrics (Eq. 14–16) -------------------------------------------------------------------------


def outcome(submit: float, start: float, end: float, e: float, single: float) -> TaskOutcome:
    """A completed task."""
    return TaskOutcome(submit_time=submit, ect=e, single_gpu_latency=single, start_time=start,
                       end_time=end)


def test_qos_guarantee_is_eq14() -> None:
    done = [
        outcome(0, 10, 100, 100, 50),  # exactly at its ECT: met
        outcome(0, 10, 101, 100, 50),  # one second late
        outcome(5, 5, 20, 5, 10),  # urgent: ECT = submission, always violated
        outcome(0, 0, 30, 200, 10),
    ]
    assert qos_guarantee(done) == 50.0  # a percentage of the scheduled tasks
    # Scheduled tasks that never completed count against it, however early their ECT was due.
    failed = TaskOutcome(submit_time=0, ect=1000, single_gpu_latency=10, start_time=5)
    queued = TaskOutcome(submit_time=0, ect=1000, single_gpu_latency=10)
    assert qos_guarantee([*done, failed]) == 40.0
    assert qos_guarantee([*done, failed, queued]) == pytest.approx(100 * 2 / 6)


def test_normalised_latency_is_eq15_and_eq16() -> None:
    assert normalised_latency(50.0, 100.0) == 0.5
    done = [outcome(0, 10, 60, 0, 100), outcome(0, 100, 400, 0, 100)]
    # runtimes 50 and 300 over 100: (0.5 + 3) / 2
    assert average_normalised_latency(done) == pytest.approx(1.75)
    # response times 60 and 400 over 100
    assert average_normalised_latency(done, include_wait=True) == pytest.approx(2.3)
    # Left out of the mean: a task that did not complete, and one with Lat(t, <1,1>) = 0
    # (no work: Eq. 16 is undefined for it).
    others = [TaskOutcome(submit_time=0, ect=0, single_gpu_latency=100, start_time=5),
              outcome(0, 0, 50, 0, 0)]
    assert average_normalised_latency([*done, *others]) == pytest.approx(1.75)
    assert average_normalised_latency([*done, *others], include_wait=True) == pytest.approx(2.3)


def test_makespan_spans_first_submission_to_last_completion() -> None:
    assert makespan([outcome(10, 20, 50, 0, 1), outcome(0, 60, 90, 0, 1)]) == 90
    # Over the completed tasks only: an earlier submission that never finished does not count.
    unfinished = TaskOutcome(submit_time=0, ect=0, single_gpu_latency=1, start_time=1)
    assert makespan([outcome(10, 20, 50, 0, 1), unfinished]) == 40


def test_metrics_are_none_with_nothing_to_measure() -> None:
    for fn in (qos_guarantee, makespan, average_normalised_latency):
        assert fn([]) is None
    never_ran = [TaskOutcome(submit_time=0, ect=10, single_gpu_latency=1)]
    assert qos_guarantee(never_ran) == 0.0
    assert makespan(never_ran) is None
    assert average_normalised_latency(never_ran) is None
    assert average_normalised_latency([outcome(0, 0, 5, 0, 0)]) is None


def test_metrics_refuse_inconsistent_input() -> None:
    with pytest.raises(ValueError, match="submit <= start <= end"):
        outcome(10, 5, 20, 0, 1)
    with pytest.raises(ValueError, match="submit <= start <= end"):
        outcome(0, 5, 4, 0, 1)
    with pytest.raises(ValueError, match="submit <= start <= end"):
        TaskOutcome(submit_time=10, ect=0, single_gpu_latency=1, start_time=5)
    with pytest.raises(ValueError, match="needs a start time"):
        TaskOutcome(submit_time=0, ect=0, single_gpu_latency=1, end_time=5)
    with pytest.raises(ValueError, match="single_gpu_latency"):
        outcome(0, 0, 1, 0, -1)
    with pytest.raises(ValueError, match="single_gpu_latency"):
        normalised_latency(1.0, 0.0)
