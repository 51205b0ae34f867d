"""trellis-sim end to end through its command line."""

from __future__ import annotations

import argparse
import csv
import json
import logging
from pathlib import Path

import pytest

from masterd.core.policies import REGISTRY
from sim import cli
from sim.cli import main

BASE = ["run", "--no-progress", "--no-plots"]


def test_genie_run_writes_table_json_csv(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    rc = main([*BASE, "--workload", "genie", "--density", "3,6", "--hours", "4",
               "--seeds", "1,2", "--policies", "fifo", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "genie-d3" in printed and "genie-d6" in printed
    assert "QoS guarantee % (Eq.14)" in printed
    document = json.loads((out / "summary.json").read_text())
    assert len(document["runs"]) == 4  # 2 densities × 2 seeds × 1 policy
    assert {r["seed"] for r in document["runs"]} == {1, 2}
    with (out / "runs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 and all(r["policy"] == "fifo" for r in rows)
    assert all(float(r["finished"]) == float(r["jobs"]) for r in rows)
    with (out / "timeseries.csv").open() as handle:
        series = list(csv.DictReader(handle))
    assert series and {r["label"] for r in series} == {"genie-d3", "genie-d6"}
    assert all(0 <= float(r["gpus_active"]) <= float(r["total_gpus"]) == 16 for r in series)


def test_same_seed_same_output_files(tmp_path: Path) -> None:
    args = [*BASE, "--workload", "genie", "--density", "8", "--hours", "3", "--seeds", "5"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    for name in ("summary.json", "runs.csv", "queue_by_tenant.csv", "timeseries.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_unknown_policy_lists_registry(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main([*BASE, "--workload", "genie", "--policies", "fifo,warp-drive",
               "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown policy warp-drive" in err
    assert all(name in err for name in REGISTRY)


def test_malformed_trace_stops_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "philly-vcs.csv").write_text("vc,node num\nabc,2\n")
    (trace / "philly-jobs.csv").write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-01 00:00:00,60,1,60,abc\n"
        "2017-10-01 00:00:05,sixty,1,60,abc\n"
        "2017-10-01 00:00:09,30,2,60,abc\n")
    args = [*BASE, "--workload", "philly", "--trace", str(trace), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "philly-jobs.csv:3:" in err and "duration" in err and "Traceback" not in err
    assert main([*args, "--skip-bad-rows"]) == 0
    document = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert document["runs"][0]["finished"] == 2
    assert any("philly-jobs.csv:3:" in s for s in document["notes"]["skipped_rows"])


def test_file_workload_needs_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("name,submit,duration,gpus\na,0,60,1\nb,10,60,2\n")
    base = [*BASE, "--workload", "file", "--trace", str(jobs), "--out", str(tmp_path / "o")]
    assert main(base) == 2
    assert "needs a cluster" in capsys.readouterr().err
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[[group]]\ncount = 1\ngpus_per_node = 2\ngpu_model = "V100"\n')
    assert main([*base, "--cluster", str(cluster), "--job-csv"]) == 0
    with (tmp_path / "o" / "jobs-jobs-fifo-s1.csv").open() as handle:
        rows = {r["id"]: r for r in csv.DictReader(handle)}
    # Two GPUs: a holds one, b needs both, so b starts the instant a ends.
    assert float(rows["b"]["first_start"]) == pytest.approx(float(rows["a"]["end"]))
    cluster.write_text("[[group]]\ncount = 1\n")
    assert main([*base, "--cluster", str(cluster)]) == 2
    assert "gpus_per_node are required" in capsys.readouterr().err


def test_bad_numbers_and_outage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = [*BASE, "--workload", "genie", "--hours", "1", "--out", str(tmp_path)]
    assert main([*base, "--seeds", "one"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main([*base, "--outage", "genie-0000:x:1"]) == 2
    assert "NODE:START_HOURS:DURATION_HOURS" in capsys.readouterr().err
    assert main([*base, "--outage", "genie-0000:0.1:0.5"]) == 0


def test_plots_written_when_matplotlib_is_available(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots"
    rc = main(["run", "--no-progress", "--workload", "genie", "--density", "4,8", "--hours",
               "3", "--out", str(out)])
    assert rc == 0
    names = {p.name for p in out.glob("*.png")}
    assert {"jct_cdf_genie-d4.png", "gpu_util_genie-d8.png",
            "qos_makespan_by_density.png"} <= names
    assert all((out / n).stat().st_size > 1000 for n in names)


def test_the_placers_warnings_stay_in_the_replays_unless_verbose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    placer = logging.getLogger("trellis.inference")
    before = placer.level
    seen: list[bool] = []

    def command(args: object) -> int:
        seen.append(placer.isEnabledFor(logging.WARNING))
        return 0

    monkeypatch.setattr(cli, "cmd_policies", command)
    assert cli.main(["policies"]) == 0
    assert cli.main(["-v", "policies"]) == 0
    assert seen == [False, True]
    assert placer.level == before  # the command's setting does not outlive it


def test_default_philly_run_is_the_helios_study_setup(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Without a cluster, `--workload philly` replays per VC at the study's scale, in Helios'
    window, jobs at their recorded durations, with Helios' rules: jobs wait and the policies
    differ. With a cluster chosen, nothing is filled in and an idle cluster is said to be."""
    from tests.unit.test_sim_results import write_traces

    traces = write_traces(tmp_path / "traces")
    out = tmp_path / "helios"
    assert main([*BASE, "--workload", "philly", "--trace", str(traces), "--policies",
                 "fifo,qssf,sjf", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Helios study's setup" in printed and "VC scale 0.2125" in printed
    assert "no job waited" not in printed
    document = json.loads((out / "summary.json").read_text())
    notes = document["notes"]["workload_notes"]["philly"]
    assert notes["per_vc"] and notes["vc_scale"] == 0.2125 and notes["nodes"] == 2
    assert notes["since"].startswith("2017-10-01") and notes["until"].startswith("2017-12-01")
    runs = {r["policy"]: r for r in document["runs"]}
    assert all(r["queued_jobs"] > 0 for r in runs.values())
    assert runs["fifo"]["avg_jct_s"] != runs["sjf"]["avg_jct_s"]
    # 32 jobs in the window; the unsized VC's job and the 16-GPU job (one node left to its
    # VC at this scale) can never fit.
    assert runs["fifo"]["finished"] == 30 and runs["fifo"]["rejected"] == 2

    # A cluster of the user's own: used as given; when nothing waits, the run says so.
    idle = tmp_path / "idle"
    assert main([*BASE, "--workload", "philly", "--trace", str(traces), "--nodes", "64",
                 "--policies", "fifo,sjf", "--out", str(idle)]) == 0
    printed = capsys.readouterr().out
    assert "Helios study's setup" not in printed
    assert "no job waited in any run" in printed and "--vc-scale" in printed


def test_default_philly_setup_says_what_it_turns_off() -> None:
    """The Helios setup always replays without interference; a user who set --noise is told
    that interference is off too, not left to find it in the results."""
    from sim.philly_run import apply_helios_setup

    def told(**given: object) -> tuple[str, argparse.Namespace]:
        args = argparse.Namespace(**{"workload": "philly", "nodes": None, "per_vc": False,
                                     "vc_scale": None, "since": None, "until": None,
                                     "noise": None, "no_interference": False, **given})
        sentence = apply_helios_setup(args)
        assert sentence is not None and args.no_interference is True
        return sentence, args

    sentence, args = told()
    assert "recorded duration (no noise, no interference)" in sentence and args.noise == 0.0
    sentence, args = told(noise=0.05)
    assert "; no interference;" in sentence and "no noise" not in sentence
    assert args.noise == 0.05
    sentence, _ = told(no_interference=True)
    assert "; no noise;" in sentence and "no interference" not in sentence


@pytest.mark.parametrize("argv, message", [
    (["--loads", "0.5,fast"], "--loads '0.5,fast': comma-separated loads"),
    (["--eval-loads", "0"], "--eval-loads '0': every load must be in (0, 5]"),
    (["--paper-state"], "--paper-state is the paper's agent's state"),
])
def test_bad_training_options_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture,
                                               argv: list[str], message: str) -> None:
    rc = main(["train", "sched2-scorer", "--out", str(tmp_path / "m.npz"),
               "--trace", str(tmp_path), *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "m.npz").exists()
