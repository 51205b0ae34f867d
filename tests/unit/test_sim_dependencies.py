"""The simulator honours dependencies through the master's own resolution code
(masterd.core.dependencies): a pipeline runs in order, a failure cancels what can never run,
arrays are waited for whole or task by task, and an unknown id is rejected."""

from __future__ import annotations

from pathlib import Path

from masterd.core.policies import make_policy
from shared.dependency import parse_dependency
from shared.model import ArrayTask, JobSpec
from sim.cluster import NodeGroup, build_cluster
from sim.engine import Outage, SimConfig, simulate
from sim.truth import TruthConfig, TruthParams
from sim.workloads.base import SimJob, Workload

EXACT = SimConfig(seed=1, truth=TruthConfig(noise_sigma=0.0, interference=False))


def nodes(gpus: int = 2) -> list:
    return build_cluster([NodeGroup(count=1, gpus_per_node=gpus, cpu_cores=8, sockets=1,
                                    gpus_per_switch=gpus, prefix="n")])


def sim_job(name: str, submit: float, duration: float, after: str = "",
            array: ArrayTask | None = None) -> SimJob:
    spec = JobSpec(name=name, command=("x",), user="u", gpus=1, cpus=1,
                   after=parse_dependency(after) if after else (), array=array)
    return SimJob(name, spec, submit, TruthParams(known_duration=duration, known_gpus=1))


def records(jobs: list[SimJob], config: SimConfig = EXACT, gpus: int = 2) -> dict:
    result = simulate(Workload("deps", jobs, nodes(gpus)), make_policy("fifo"), config)
    return {r.id: r for r in result.records}


def test_a_pipeline_runs_in_order() -> None:
    got = records([sim_job("prep", 0.0, 100.0), sim_job("train", 1.0, 50.0, "afterok:prep"),
                   sim_job("eval", 2.0, 10.0, "afterok:train"),
                   sim_job("free", 3.0, 10.0)])
    assert (got["prep"].first_start, got["prep"].end) == (0.0, 100.0)
    assert (got["train"].first_start, got["train"].end) == (100.0, 150.0)
    assert (got["eval"].first_start, got["eval"].end) == (150.0, 160.0)
    assert got["free"].first_start == 3.0  # the gated jobs did not block the queue


def test_a_failure_cancels_the_rest_with_the_reason() -> None:
    config = SimConfig(seed=1, truth=EXACT.truth, max_retries=0,
                       outages=(Outage("n-0000", 50.0, 10.0),))
    got = records([sim_job("prep", 0.0, 100.0), sim_job("train", 1.0, 50.0, "afterok:prep"),
                   sim_job("eval", 2.0, 10.0, "afterok:train"),
                   sim_job("cleanup", 3.0, 10.0, "afternotok:prep")], config)
    assert got["prep"].state == "node_lost"  # its node failed; no requeue allowed
    assert got["train"].state == "cancelled" and got["train"].first_start is None
    assert got["train"].reason == ("dependency afterok:prep can never be satisfied: prep "
                                   "was lost with its node")
    assert got["eval"].reason.endswith("train was cancelled")
    assert got["cleanup"].state == "finished" and got["cleanup"].first_start == 60.0


def test_arrays_whole_and_by_index() -> None:
    got = records([sim_job("t_0", 0.0, 10.0, array=ArrayTask("t", 0)),
                   sim_job("t_1", 0.0, 30.0, array=ArrayTask("t", 1)),
                   sim_job("u_0", 1.0, 5.0, "aftercorr:t", ArrayTask("u", 0)),
                   sim_job("u_1", 1.0, 5.0, "aftercorr:t", ArrayTask("u", 1)),
                   sim_job("all", 2.0, 5.0, "afterok:t")], gpus=4)
    assert got["u_0"].first_start == 10.0
    assert got["u_1"].first_start == 30.0
    assert got["all"].first_start == 30.0


def test_an_unknown_id_is_rejected() -> None:
    got = records([sim_job("lone", 0.0, 5.0, "afterok:later"), sim_job("later", 1.0, 5.0)])
    assert got["lone"].state == "rejected" and "later" in got["lone"].reason
    assert got["later"].state == "finished"


def test_a_job_file_carries_dependencies(tmp_path: Path) -> None:
    from sim.workloads import jobfile
    from sim.workloads.base import LoadOptions, TraceError

    path = tmp_path / "jobs.csv"
    path.write_text("id,submit,duration,gpus,after\nprep,0,100,1,\n"
                    "train,1,50,1,afterok:prep\n")
    workload = jobfile.load(path, LoadOptions(), nodes())
    got = {r.id: r for r in simulate(workload, make_policy("fifo"), EXACT).records}
    assert got["train"].first_start == 100.0
    path.write_text("id,submit,duration,gpus,after\nx,0,1,1,afterok:a?afterok:b\n")
    try:
        jobfile.load(path, LoadOptions(), nodes())
    except TraceError as exc:
        assert "column after" in str(exc) and "not supported" in str(exc)
    else:
        raise AssertionError("a bad after column was accepted")
