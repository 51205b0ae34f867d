"""Helios' Philly replay is reproducible from trellis-sim's command line: the command the
study prints under Table 3 regenerates its numbers; and the replay's pieces (Helios' error
model, the rolling estimator as the engine's annotator)."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from masterd.core.helios.estimate import ESTIMATE_KEY, RECORDED_KEY, QssfEstimator
from masterd.core.policies import make_policy
from shared.model import JobSpec
from sim.cli import main
from sim.cluster import NodeGroup, build_cluster
from sim.engine import SimConfig, simulate
from sim.studies import philly as study
from sim.truth import TruthParams
from sim.workloads import philly
from sim.workloads.base import SimJob, Workload
from sim.workloads.philly import HELIOS_ERROR_BANDS, helios_estimate
from tests.unit.test_sim_results import write_traces


def test_table3_command_regenerates_the_study_numbers(tmp_path: Path) -> None:
    traces = write_traces(tmp_path / "traces")
    config = replace(study.tiny(), extra_scales=(), alignment=False)
    (tmp_path / "out").mkdir()
    section = study.run(config, traces, tmp_path / "out", False)
    (table,) = [t for t in section.tables() if t.id == "philly-table3"]
    ours = {(row[0], row[1]): row[3] for row in table.rows}
    args = shlex.split(table.command)
    assert args[:2] == ["trellis-sim", "run"]
    out = tmp_path / "run"
    assert main([*args[1:], "--trace", str(traces), "--out", str(out), "--no-plots",
                 "--no-progress"]) == 0
    runs = {r["policy"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}
    for policy in ("fifo", "sjf", "qssf"):
        title = next(t for (_, t) in ours if t.lower().startswith(policy))
        assert runs[policy]["avg_jct_s"] == pytest.approx(ours[("avg JCT s", title)])
        assert runs[policy]["avg_queue_s"] == pytest.approx(ours[("avg queueing s", title)])
        assert runs[policy]["queued_jobs"] == ours[("queued jobs", title)]


def test_helios_error_model_bands_and_seeding() -> None:
    errors = [helios_estimate(100.0, 1, f"job-{i}") / 100.0 - 1.0 for i in range(4000)]
    assert errors == [helios_estimate(100.0, 1, f"job-{i}") / 100.0 - 1.0 for i in range(4000)]
    assert errors != [helios_estimate(100.0, 2, f"job-{i}") / 100.0 - 1.0 for i in range(4000)]
    magnitude = [abs(e) for e in errors]
    share = [sum(low <= m <= high for m in magnitude) / len(magnitude)
             for _, low, high in HELIOS_ERROR_BANDS]
    for (expected, _, _), got in zip(HELIOS_ERROR_BANDS, share, strict=True):
        assert got == pytest.approx(expected, abs=0.03)
    assert any(e < -1 for e in errors)  # a negative estimate, as the artifact allows


def test_philly_jobs_carry_recorded_duration_and_estimate(tmp_path: Path) -> None:
    from sim.truth import TruthConfig, TruthModel
    from sim.workloads.base import LoadOptions

    traces = write_traces(tmp_path / "traces")
    workload = philly.load(traces, LoadOptions(seed=3), TruthModel(TruthConfig(), 3),
                           per_vc=True)
    job = workload.jobs[0]
    assert job.annotations[RECORDED_KEY] == job.truth.known_duration
    assert job.annotations[ESTIMATE_KEY] == helios_estimate(job.truth.known_duration or 0.0,
                                                            3, job.id)


def test_rolling_estimator_learns_during_a_replay() -> None:
    nodes = build_cluster([NodeGroup(count=1, gpus_per_node=1, cpu_cores=4)])
    jobs = []
    # One user on one GPU. First an eval and a training job run and finish (the history);
    # later, behind a blocker, two of each wait: QSSF runs the evals first, by name.
    plan = [("eval-a", 0.0, 10.0), ("train-a", 0.5, 100.0), ("block", 200.0, 500.0),
            ("train-b", 201.0, 100.0), ("train-c", 202.0, 100.0), ("eval-b", 203.0, 10.0),
            ("eval-c", 204.0, 10.0)]
    for name, submit, duration in plan:
        spec = JobSpec(name=name, command=("x",), user="alice", gpus=1, cpus=1)
        jobs.append(SimJob(id=name, spec=spec, submit=submit,
                           truth=TruthParams(model_type="resnet50", batch=32,
                                             known_duration=duration, known_gpus=1)))
    workload = Workload(name="t", jobs=jobs, nodes=nodes)
    estimator = QssfEstimator()
    result = simulate(workload, make_policy("qssf"), SimConfig(seed=1), annotator=estimator)
    start = {r.id: r.first_start for r in result.records}
    assert len(estimator.history) == 7
    assert start["eval-b"] < start["eval-c"] < start["train-b"] < start["train-c"]
