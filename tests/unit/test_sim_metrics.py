"""Metrics against hand-computed values."""

from __future__ import annotations

import pytest

from masterd.core.genie.metrics import average_normalised_latency, makespan, qos_guarantee
from shared.model import JobKind, QosClass
from sim.engine import JobRecord, Sample, SimResult
from sim.metrics import (
    fragmentation,
    gpu_rates,
    outcome,
    outcomes,
    percentile,
    qos_by_class,
    queue_by_tenant,
    summarise,
    time_weighted,
)


def rec(id: str, submit: float, start: float | None, end: float | None, *, ect: float,
        lat11: float = 10.0, qos: QosClass = QosClass.NORMAL, tenant: str = "t",
        state: str = "finished", run_time: float | None = None) -> JobRecord:
    r = JobRecord(id=id, tenant=tenant, qos=qos, kind=JobKind.TRAINING, gpus=1, submit=submit,
                  ect=ect, lat11=lat11, first_start=start, end=end, state=state)
    if end is not None and start is not None:
        r.run_time = run_time if run_time is not None else end - start
    return r


RECORDS = [
    # submit, start, end, ECT: a meets (12 <= 20), b misses (30 > 25), c urgent misses.
    rec("a", 0.0, 2.0, 12.0, ect=20.0, tenant="x"),
    rec("b", 5.0, 10.0, 30.0, ect=25.0, lat11=20.0, qos=QosClass.PRIOR, tenant="y"),
    rec("c", 8.0, 12.0, 17.0, ect=8.0, lat11=5.0, qos=QosClass.URGENT, tenant="x"),
    rec("r", 9.0, None, None, ect=9.0, state="rejected"),
]


def test_records_become_genie_outcomes() -> None:
    tasks = outcomes(RECORDS)
    assert len(tasks) == 3  # the rejected job was never scheduled
    a = tasks[0]
    assert (a.submit_time, a.start_time, a.end_time, a.ect, a.single_gpu_latency) == (
        0.0, 2.0, 12.0, 20.0, 10.0)
    # Only a finished job completed: one that failed (or was cancelled) by its ECT did not.
    for state in ("failed", "cancelled"):
        gone = outcome(rec("f", 0.0, 1.0, 5.0, ect=20.0, state=state))
        assert not gone.completed and gone.start_time == 1.0
    assert outcome(rec("u", 0.0, None, None, ect=20.0, state="unfinished")).start_time is None


def test_qos_guarantee_eq14() -> None:
    assert qos_guarantee(outcomes(RECORDS)) == pytest.approx(100 / 3)  # 1 of 3 scheduled
    assert qos_by_class(RECORDS) == {"urgent": 0.0, "prior": 0.0, "normal": 100.0}
    assert qos_guarantee(outcomes([])) is None
    failed = rec("f", 0.0, 1.0, 5.0, ect=20.0, state="failed")
    assert qos_guarantee(outcomes([RECORDS[0], failed])) == 50.0


def test_makespan_and_normalised_latency_eq15_16() -> None:
    tasks = outcomes(RECORDS)
    assert makespan(tasks) == 30.0  # first submit 0, last end 30
    # walltimes 10, 20, 5 over Lat11 10, 20, 5: all exactly 1.
    assert average_normalised_latency(tasks) == 1.0
    # JCTs 12, 25, 9 over the same: the slowdown the summary reports.
    assert average_normalised_latency(tasks, include_wait=True) == pytest.approx(
        (1.2 + 1.25 + 1.8) / 3)
    # Preempted after its first start: the time lost counts in its walltime.
    slow = [rec("s", 0.0, 0.0, 30.0, ect=0.0, lat11=10.0, run_time=10.0)]
    assert average_normalised_latency(outcomes(slow)) == 3.0
    zero = rec("z", 0.0, 0.0, 0.0, ect=0.0, lat11=0.0)  # no work: Eq. 16 undefined
    assert average_normalised_latency(outcomes([zero])) is None


def test_summary_reports_genie_metrics_of_the_scheduled_jobs() -> None:
    result = SimResult(policy="p", workload="w", seed=1, records=RECORDS, total_gpus=4,
                       usage=[(0.0, 1, 1.0)], samples=[], events=0, passes=0,
                       stale_events=0, end_time=30.0)
    summary = summarise(result)
    assert summary["qos_pct"] == pytest.approx(100 / 3)
    assert summary["qos_pct_by_class"] == {"urgent": 0.0, "prior": 0.0, "normal": 100.0}
    assert summary["makespan_s"] == 30.0
    assert summary["avg_norm_latency"] == 1.0
    assert summary["avg_slowdown"] == pytest.approx((1.2 + 1.25 + 1.8) / 3)


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values, 50) == 50.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert percentile([], 99) is None


def test_queue_delay_per_tenant() -> None:
    stats = queue_by_tenant(RECORDS)
    # a waited 2, c waited 4 (tenant x); b waited 5 (tenant y).
    assert stats["x"] == {"jobs": 2, "avg_queue_s": 3.0, "p99_queue_s": 4.0}
    assert stats["y"] == {"jobs": 1, "avg_queue_s": 5.0, "p99_queue_s": 5.0}
    # Preemption: time not running after the first start also counts as queueing.
    preempted = rec("p", 0.0, 1.0, 20.0, ect=0.0, run_time=15.0)
    assert preempted.queue_delay == 5.0


def test_time_weighted_step_function() -> None:
    series = [(0.0, 0.0), (10.0, 4.0), (30.0, 2.0)]
    # over [0, 40]: 0·10 + 4·20 + 2·10 = 100 -> 2.5
    assert time_weighted(series, 0.0, 40.0) == 2.5
    assert time_weighted(series, 10.0, 20.0) == 4.0
    assert time_weighted(series, 5.0, 5.0) is None


def test_fragmentation_sched2_eq1() -> None:
    assert fragmentation([0.0, 0.0, 0.0, 0.0]) == 0.0  # idle server
    assert fragmentation([5.0, 5.0, 5.0, 5.0]) == 0.0  # all free together
    # x = (4, 0, 0, 0): 1 − 16/(4·16) = 0.75
    assert fragmentation([4.0, 0.0, 0.0, 0.0]) == 0.75
    # x = (1, 3): 1 − 16/(2·10) = 0.2
    assert fragmentation([1.0, 3.0]) == pytest.approx(0.2)


def test_gpu_rates_and_summary() -> None:
    records = [rec("a", 0.0, 0.0, 100.0, ect=200.0)]
    result = SimResult(
        policy="p", workload="w", seed=1, records=records, total_gpus=4,
        usage=[(0.0, 2, 1.0), (50.0, 4, 4.0), (100.0, 0, 0.0)],
        samples=[Sample(0.0, 2, 1.0, 0, 1, 0.5, 0), Sample(50.0, 4, 4.0, 0, 2, 0.1, 0)],
        events=3, passes=2, stale_events=0, end_time=100.0,
    )
    active, useful = gpu_rates(result)
    assert active == pytest.approx((2 * 50 + 4 * 50) / 100 / 4)  # 0.75
    assert useful == pytest.approx((1 * 50 + 4 * 50) / 100 / 4)  # 0.625
    summary = summarise(result)
    assert summary["fragmentation"] == pytest.approx(0.3)
    assert summary["qos_pct"] == 100.0 and summary["avg_jct_s"] == 100.0
    assert summary["finished"] == 1 and summary["p99_queue_s"] == 0.0
