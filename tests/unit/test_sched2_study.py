"""The SCHED² study's replays that need no torch: QSSF among the baselines, on its estimates."""

from __future__ import annotations

from pathlib import Path

import pytest

from masterd.core.helios.estimate import ESTIMATE_KEY
from sim.studies import sched2 as study
from sim.truth import TruthModel
from sim.workloads import sched2 as workload
from sim.workloads.philly import helios_estimate

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
pytestmark = pytest.mark.skipif(not (TRACES / "philly-jobs.csv").exists(),
                                reason=f"no Philly trace at {TRACES}")


def test_episode_jobs_carry_helios_estimates_around_their_duration() -> None:
    options = workload.Sched2Options(jobs=300)
    w = workload.episode(TRACES, options, 31, TruthModel(study.TRUTH))
    again = workload.episode(TRACES, options, 31, TruthModel(study.TRUTH))
    estimates = [j.annotations[ESTIMATE_KEY] for j in w.jobs]
    assert estimates == [j.annotations[ESTIMATE_KEY] for j in again.jobs]
    for j in w.jobs:
        assert j.annotations[ESTIMATE_KEY] == helios_estimate(
            j.truth.known_duration, options.seed, j.id)  # type: ignore[arg-type]
    errors = sorted(abs(j.annotations[ESTIMATE_KEY] / j.truth.known_duration - 1)  # type: ignore[operator]
                    for j in w.jobs)
    # Helios' bands: 10% of jobs within ±10%, half within ±50%, a tenth off by 10× or more.
    assert errors[len(errors) // 20] < 0.1
    assert 0.1 < errors[len(errors) // 2] < 1.0
    assert errors[-len(errors) // 20] > 10.0


def test_qssf_is_a_baseline_of_the_study_and_replays_on_the_estimates() -> None:
    assert "qssf" in study.Sched2Study().baselines
    assert "qssf" in study.POLICY_TITLES
    cell = study.Cell("mix", 0.68, 1.0, 30, "qssf", "", str(TRACES), jobs=200)
    result = study.replay_cell(cell)
    fifo = study.replay_cell(study.Cell("mix", 0.68, 1.0, 30, "fifo", "", str(TRACES),
                                        jobs=200))
    assert result.metrics.jobs == fifo.metrics.jobs == 200
    # Shortest expected GPU time first beats arrival order on an overloaded queue.
    assert result.metrics.jct_s < fifo.metrics.jct_s


def test_the_tiny_study_pairs_the_agent_with_the_hold_rule_at_every_load(
        tmp_path: Path) -> None:
    from sim.parallel import SerialRunner

    section = study.run_on(study.tiny(), TRACES, tmp_path, False, SerialRunner())
    tables = {t.to_json()["id"]: t.to_json() for t in section.tables()}
    rows = tables["sched2-paired"]["rows"]
    assert {r[0] for r in rows} == {f"{workload.IMPLIED_LOAD:g} (implied)", "1.2"}
    assert any(r[2] == "SCHED² (learned) vs hold rule, J = 10" for r in rows)
    assert any(r[2] == "hold rule, J = 10 vs hold rule, whole queue" for r in rows)
    # The per-job scorer (beyond the paper) against both hold rules, at every load.
    for load in (f"{workload.IMPLIED_LOAD:g} (implied)", "1.2"):
        assert any(r[0] == load and r[2] == "per-job scorer (learned, whole queue) vs hold "
                   "rule, whole queue" for r in rows)
    sensitivity = [r[0] for r in tables["sched2-sensitivity"]["rows"]]
    assert "per-job scorer (learned, whole queue)" in sensitivity
