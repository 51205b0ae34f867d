"""The benchmarks' verdicts read the figure they are named after."""

from __future__ import annotations

import argparse
from typing import Any

from bench.load import P99_TARGET_MS, capacity_rps, limited_by_steps
from bench.noded_overhead import MIB, TARGET_CPU_PCT, TARGET_RSS_MB, Window, result, targets_met


def step(rps: float, passing: bool) -> dict[str, Any]:
    return {"achieved_rps": rps, "errors": 0,
            "p99_ms": P99_TARGET_MS / 2 if passing else P99_TARGET_MS * 2}


def test_noded_targets_judge_the_peak_rss_not_the_last_sample() -> None:
    assert targets_met(TARGET_CPU_PCT / 2, (TARGET_RSS_MB - 1) * MIB)
    # A daemon that swelled past the target between samples misses it, however it ends.
    assert not targets_met(TARGET_CPU_PCT / 2, (TARGET_RSS_MB + 1) * MIB)
    assert not targets_met(TARGET_CPU_PCT * 2, (TARGET_RSS_MB - 1) * MIB)
    assert targets_met(TARGET_CPU_PCT, TARGET_RSS_MB * MIB)  # the targets are inclusive


def test_noded_result_reports_the_peak_and_judges_by_it() -> None:
    window = Window(seconds=10.0, cpu_s=0.01, baseline_cpu_s={"idle": 0.0},
                    rss_last=(TARGET_RSS_MB - 20) * MIB, rss_peak=(TARGET_RSS_MB + 10) * MIB,
                    baseline_rss={"idle": 10 * MIB, "import": 50 * MIB})
    out = result(argparse.Namespace(rdt="off"), window, 16, {})
    assert out["rss_mb"] == TARGET_RSS_MB - 20 and out["rss_mb_max"] == TARGET_RSS_MB + 10
    assert out["cpu_pct_of_one_core"] == 0.1
    assert out["targets_met"] is False


def test_going_up_until_a_step_fails_finds_the_capacity() -> None:
    steps = [step(1000, True), step(1500, True), step(2100, False)]
    assert capacity_rps(steps) == 1500
    assert not limited_by_steps(steps)


def test_going_up_with_every_step_passing_is_limited_by_the_steps() -> None:
    steps = [step(1000, True), step(1500, True), step(2250, True)]
    assert capacity_rps(steps) == 2250
    assert limited_by_steps(steps)


def test_going_down_until_a_step_passes_finds_the_capacity() -> None:
    # The case the old verdict got wrong: a passing last step ends a downward search.
    steps = [step(800, False), step(660, True)]
    assert capacity_rps(steps) == 660
    assert not limited_by_steps(steps)


def test_going_down_with_no_step_passing_is_limited_by_the_steps() -> None:
    steps = [step(800, False), step(660, False), step(440, False)]
    assert capacity_rps(steps) is None
    assert limited_by_steps(steps)


def test_errors_fail_a_step_whatever_its_latency() -> None:
    failing = {**step(1000, True), "errors": 3}
    assert capacity_rps([failing]) is None
    assert not limited_by_steps([step(1000, True), failing])
