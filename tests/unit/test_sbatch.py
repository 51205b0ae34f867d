"""Batch scripts as sbatch reads them (control/sbatch.py), Slurm's output patterns
(shared/outputpattern.py) and the node's side of a script (noded/batch.py, noded/slurmenv.py):
pure functions, no daemons."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from control.cli import build_parser
from control.sbatch import directives, looks_like_script, parse_script, read_script
from control.submit import jobs_from_args
from control.usage import UsageError
from noded.batch import output_paths, script_command
from noded.slurmenv import slurm_variables
from shared.messages import PrepareJob
from shared.model import ArrayTask, JobSpec, LaunchSpec, NodeAllocation
from shared.outputpattern import PatternFields, check_pattern, expand
from shared.schema import decode

HEAD = "#!/bin/bash\n"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script is submitted from its directory (the job's default workdir)."""
    monkeypatch.chdir(tmp_path)


def parse(body: str):  # type: ignore[no-untyped-def]
    return parse_script(HEAD + body, "job.sh")


def submit_args(tmp_path: Path, body: str, *cli: str, name: str = "job.sh"
                ) -> tuple[list[dict], list[str | None]]:  # type: ignore[type-arg]
    script = tmp_path / name
    script.write_text(HEAD + body)
    args = build_parser().parse_args(["submit", "--user", "nobody", *cli, str(script)])
    return jobs_from_args(args)


# -- directives ------------------------------------------------------------------------------
def test_header_ends_at_the_first_command_and_later_directives_are_warned_about() -> None:
    text = HEAD + ("#SBATCH -J a\n\n# a comment\n#SBATCH --time=5\nmodule load x\n"
                   "#SBATCH --mem=1G\n#TRELLIS --priority -1\n")
    found, unknown, warnings = directives(text, "job.sh")
    assert [(d.line, d.option, d.value) for d in found] == [(2, "job-name", "a"),
                                                            (5, "time", "5")]
    assert not unknown
    assert warnings == ["job.sh line 7: #SBATCH after the first command is ignored (as sbatch "
                        "does)", "job.sh line 8: #TRELLIS after the first command is ignored "
                        "(as sbatch does)"]


def test_spellings_short_long_attached_and_apart_with_trailing_comments() -> None:
    opts = parse("#SBATCH -Jtrain --time 10:00 -c4 --mem=2G   # two gigs\n"
                 "#SBATCH --output=o-%j.txt -e e-%j.txt --qos=urgent -A research\n"
                 "#SBATCH --requeue -d afterok:prep-1 --signal=B:USR1@30\n")
    assert opts.values == {"name": "train", "time": "10:00", "cpus": 4, "memory_mib": 2048,
                           "tenant": "research", "qos": "urgent", "requeue": True,
                           "after": "afterok:prep-1", "signal": "B:USR1@30"}
    assert opts.launch == {"stdout": "o-%j.txt", "stderr": "e-%j.txt"}


def test_not_a_directive_when_spelled_otherwise() -> None:
    # sbatch reads "#SBATCH" at the start of a line only; "# SBATCH" and "#SBATCHX" are
    # comments.
    assert parse("# SBATCH -J a\n#SBATCHX -J b\n  #SBATCH -J c\n").values == {}


def test_resources_per_node_and_task_become_totals() -> None:
    opts = parse("#SBATCH -N 2 --gres=gpu:a100:2 -c 3 --mem=1000 --ntasks-per-node=1\n")
    assert opts.values == {"max_nodes": 2, "gpus": 4, "gpu_model": "a100", "cpus": 6,
                           "memory_mib": 2000}
    assert parse("#SBATCH -N 2 --gpus-per-node=1\n").values["gpus"] == 2
    assert parse("#SBATCH -G h100:3 -N 2\n").values == {"max_nodes": 2, "gpus": 3,
                                                        "gpu_model": "h100"}
    assert parse("#SBATCH --gres=gpu\n").values == {"gpus": 1}
    assert parse("#SBATCH -N 2 -c 4 --mem-per-cpu=1G --gpus-per-task=1\n").values == {
        "max_nodes": 2, "cpus": 8, "memory_mib": 8192, "gpus": 2}
    assert parse("#SBATCH -N 3-3 -n 3\n").values == {"max_nodes": 3}


def test_trellis_lines_win_over_sbatch_lines_whatever_their_order() -> None:
    opts = parse("#TRELLIS --time 5:00 --gpu-model H100 --env A=1\n#SBATCH -t 1:00 "
                 "--gres=gpu:a100:1\n#SBATCH --no-requeue\n#SBATCH --requeue\n")
    assert opts.values["time"] == "5:00" and opts.values["gpu_model"] == "H100"
    assert opts.values["requeue"] is True
    assert opts.env == {"A": "1"}


def test_unsupported_options_are_named_with_their_lines() -> None:
    opts = parse("#SBATCH --licenses db -J a --mail-type=END\n#SBATCH --mail-user=x\n")
    assert opts.unsupported == ["--licenses (line 2)", "--mail-type (line 2)",
                                "--mail-user (line 3)"]
    assert opts.values == {"name": "a"}
    # Whole nodes are a Trellis option now too.
    assert parse("#SBATCH --exclusive\n").values == {"exclusive": True}
    # Partitions are a Trellis option now: -p as sbatch spells it, checked at its line.
    assert parse("#SBATCH -p gpu,debug\n").values == {"partition": "gpu,debug"}
    with pytest.raises(UsageError, match=r"line 2: --partition=a,,b: give partition names"):
        parse("#SBATCH --partition=a,,b\n")
    # #TRELLIS-only spellings are not sbatch's.
    assert parse("#SBATCH --priority 3\n").unsupported == ["--priority (line 2)"]


@pytest.mark.parametrize("line, words", [
    ("#SBATCH --time=banana", ["line 2", "--time=banana", "Slurm's time forms"]),
    ("#SBATCH --mem=lots", ["line 2", "--mem=lots", "size"]),
    ("#SBATCH --gres=nvme:1", ["--gres=nvme:1", "only gpu"]),
    ("#SBATCH -N 1-4", ["-N=1-4", "range"]),
    ("#SBATCH -n 2", ["-n=2", "one task per node"]),
    ("#SBATCH --qos=high", ["--qos=high", "urgent, prior, normal"]),
    ("#SBATCH -d after:3", ["-d=after:3", "not supported"]),
    ("#SBATCH -a 0-9%2", ["-a=0-9%2", "%N limit"]),
    ("#SBATCH --signal=FOO@3", ["--signal=FOO@3", "not a signal"]),
    ("#SBATCH -o out-%t.log", ["-o=out-%t.log", "%t"]),
    ("#SBATCH -o out-%q.log", ["unknown pattern"]),
    ("#SBATCH -J", ["line 2", "-J needs a value"]),
    ("#SBATCH --requeue=yes", ["--requeue takes no value"]),
    ("#SBATCH train", ["expects options", "'train'"]),
    ("#SBATCH -J 'unclosed", ["line 2", "quotation"]),
    ("#SBATCH --export=ALL", ["--export=ALL", "environment"]),
])
def test_bad_values_are_one_sentence_with_their_line(line: str, words: list[str]) -> None:
    with pytest.raises(UsageError) as err:
        parse(line + "\n")
    message = str(err.value)
    assert message.startswith("job.sh line 2: ") and "\n" not in message
    for word in words:
        assert word in message, message


# -- the file ----------------------------------------------------------------------------------
def test_read_script_refusals(tmp_path: Path) -> None:
    (tmp_path / "plain.sh").write_text("echo no shebang\n")
    (tmp_path / "bin.sh").write_bytes(b"#!\xff\xfe")
    (tmp_path / "dos.sh").write_bytes(b"#!/bin/sh\r\necho\r\n")
    (tmp_path / "dir.sh").mkdir()
    os.mkfifo(tmp_path / "fifo.sh")
    cases = {"plain.sh": "has no shebang", "bin.sh": "not UTF-8", "dir.sh": "is a directory",
             "fifo.sh": "not a regular file", "dos.sh": "DOS line breaks",
             "missing.sh": "no such batch script"}
    for name, words in cases.items():
        with pytest.raises(UsageError, match=words):
            read_script(str(tmp_path / name))
    (tmp_path / "ok.sh").write_text("#!/bin/sh\necho hi\n")
    assert read_script(str(tmp_path / "ok.sh")).startswith("#!/bin/sh")


def test_read_script_unreadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "secret.sh"
    script.write_text("#!/bin/sh\n")

    def refuse(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("builtins.open", refuse)  # root reads any file; a user would not
    with pytest.raises(UsageError, match=r"cannot read the batch script .*: Permission denied"):
        read_script(str(script))


def test_script_or_command(tmp_path: Path) -> None:
    assert not looks_like_script("sleep")  # submit sleep 10 stays a command
    assert looks_like_script("train.sh") and looks_like_script("./train")
    (tmp_path / "train").write_text("#!/bin/sh\n")
    assert looks_like_script("train")


# -- submit script.sh -------------------------------------------------------------------------
def test_submit_script_command_line_wins_and_the_script_travels(tmp_path: Path) -> None:
    jobs, ids = submit_args(tmp_path, "#SBATCH -J fromscript -t 10 -c 2 --qos=prior\n"
                            "echo $1\n", "-t", "0:30", "--qos", "urgent", "--env", "B=2")
    (job,) = jobs
    assert ids == [None]
    assert job["name"] == "fromscript" and job["time_limit_s"] == 30 and job["qos"] == "urgent"
    assert job["cpus"] == 2 and job["kind"] == "cpu"
    assert job["command"] == ["job.sh"]
    assert job["launch"]["script"].startswith(HEAD) and job["launch"]["slurm_env"] is True
    assert job["launch"]["stdout"] == "slurm-%j.out"  # sbatch's default
    assert job["workdir"] == str(tmp_path)
    assert job["env"] == {"TRELLIS_SUBMIT_DIR": str(tmp_path), "B": "2"}
    # What the CLI builds decodes as a spec the master accepts.
    spec = decode(JobSpec, job)
    assert spec.launch.script == job["launch"]["script"]


def test_submit_script_array_and_args(tmp_path: Path) -> None:
    script = tmp_path / "arr.sh"
    script.write_text(HEAD + "#SBATCH --array=0-2 -o a-%A_%a.out\n")
    args = build_parser().parse_args(["submit", "--user", "nobody", "--stdout", "x-%a.out",
                                      str(script), "one", "--two"])
    jobs, _ = jobs_from_args(args)
    assert [j["array"]["index"] for j in jobs] == [0, 1, 2]
    assert all(j["command"] == ["arr.sh", "one", "--two"] for j in jobs)
    assert jobs[0]["launch"]["stdout"] == "x-%a.out"
    assert jobs[0]["name"] == "arr-sh_0"


def test_submit_refuses_unsupported_unless_told(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match=r"does not support --licenses \(line 2\); remove"):
        submit_args(tmp_path, "#SBATCH --licenses=db\n")
    jobs, _ = submit_args(tmp_path, "#SBATCH --licenses=db\n", "--ignore-unsupported")
    assert len(jobs) == 1
    assert "ignoring unsupported --licenses (line 2)" in capsys.readouterr().err


def test_old_command_form_is_unchanged(tmp_path: Path) -> None:
    for words in (["--", "job.sh", "x"], ["sleep", "1"]):
        args = build_parser().parse_args(["submit", "--user", "nobody", *words])
        (job,), _ = jobs_from_args(args)
        assert "launch" not in job and job["command"] == [w for w in words if w != "--"]
    args = build_parser().parse_args(["submit", "--stdout", "%u.log", "--", "true"])
    (job,), _ = jobs_from_args(args)
    assert job["launch"] == {"stdout": "%u.log"}
    with pytest.raises(UsageError, match=r"--stdout: .*%z"):
        jobs_from_args(build_parser().parse_args(["submit", "--stdout", "%z", "--", "true"]))


# -- patterns ---------------------------------------------------------------------------------
def test_patterns() -> None:
    fields = PatternFields("train-7", "train", "alice", "gpu3", "arr-2", 5)
    assert expand("o-%j-%x-%A_%a-%u-%N-100%%.log", fields) == \
        "o-train-7-train-arr-2_5-alice-gpu3-100%.log"
    assert expand("%3a", fields) == "005"
    plain = PatternFields("j-1", "j", "bob", "n1")
    assert expand("%A_%a", plain) == "j-1_0"
    for bad in ("%", "a%", "%J", "%5%", "%y", ""):
        with pytest.raises(ValueError):
            check_pattern(bad)
    check_pattern("100%% done %j")


def test_launch_spec_refuses_bad_scripts_and_patterns() -> None:
    with pytest.raises(ValueError, match="no shebang"):
        LaunchSpec(script="echo hi\n")
    with pytest.raises(ValueError, match=r"launch\.stderr"):
        LaunchSpec(stderr="e-%s.log")


# -- the node's side --------------------------------------------------------------------------
def test_script_command_follows_linux_shebang_rules(tmp_path: Path) -> None:
    path = tmp_path / "slurm_script"
    assert script_command("#!/bin/bash\n", path, ["a"]) == ["/bin/bash", str(path), "a"]
    assert script_command("#! /usr/bin/env  python3 -u\n", path, []) == \
        ["/usr/bin/env", "python3 -u", str(path)]
    with pytest.raises(ValueError):
        script_command("#!\n", path, [])


def _prepare(rank: int = 1, **spec_kw: object) -> PrepareJob:
    spec = JobSpec(name="train", command=("t.sh",), user="alice", gpus=2, cpus=4,
                   launch=LaunchSpec(script="#!/bin/sh\n", stdout="o-%j-%N.out",
                                     stderr="o-%j-%N.out", slurm_env=True),
                   **spec_kw)  # type: ignore[arg-type]
    alloc = NodeAllocation(node="n2", gpus=(0,), cpus=(4, 5), memory_mib=512)
    return PrepareJob(job_id="train-3", spec=spec, allocation=alloc, node_rank=rank, nnodes=2,
                      nodes=("n1", "n2"))


def test_output_paths_under_the_workdir_and_stderr_with_stdout() -> None:
    assert output_paths(_prepare(), "train-3", "n2", "/w") == ("/w/o-train-3-n2.out", None)


def test_slurm_variables_mirror_trellis_ones() -> None:
    prepare = _prepare(array=ArrayTask(id="sweep", index=4))
    env = {"TRELLIS_JOB_ID": "train-3", "NNODES": "2", "NODE_RANK": "1",
           "CUDA_VISIBLE_DEVICES": "0", "TRELLIS_RESTART_COUNT": "0",
           "TRELLIS_ARRAY_COUNT": "10", "TRELLIS_SUBMIT_DIR": "/home/alice"}
    got = slurm_variables(env, prepare, "n2")
    expected = {
        "SLURM_JOB_ID": "train-3", "SLURM_JOB_NAME": "train", "SLURM_ARRAY_JOB_ID": "sweep",
        "SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "10",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
        "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "2",
        "SLURM_JOB_NODELIST": "n1,n2", "SLURM_SUBMIT_DIR": "/home/alice", "SLURM_GPUS": "2",
        "SLURM_GPUS_ON_NODE": "1", "SLURM_JOB_GPUS": "0", "SLURM_MEM_PER_NODE": "512",
        "SLURM_JOB_USER": "alice", "SLURM_TASKS_PER_NODE": "1(x2)",
    }
    assert {k: got.get(k) for k in expected} == expected
    assert "SLURM_ARRAY_JOB_ID" not in slurm_variables(env, _prepare(), "n2")


# -- the shim's output files ------------------------------------------------------------------
def _shim(tmp_path: Path, script: str, **launch: object) -> tuple[dict, bytes]:  # type: ignore[type-arg]
    import json
    import subprocess
    import sys

    jobdir = tmp_path / "job"
    jobdir.mkdir()
    (jobdir / "launch.json").write_text(json.dumps({
        "command": ["sh", "-c", script], "env": {"PATH": "/usr/bin:/bin"},
        "uid": os.getuid(), "gid": os.getgid(), "workdir": str(tmp_path), "cpus": [],
        "log_max_bytes": 0, **launch}))
    # (The shim exits 127 itself when it cannot start the job; exit.json says why.)
    subprocess.run([sys.executable, "-m", "noded.shim", str(jobdir)], timeout=60,
                   cwd=Path(__file__).resolve().parents[2])
    return (json.loads((jobdir / "exit.json").read_text()),
            (jobdir / "output.log").read_bytes())


def test_shim_tees_stdout_and_stderr_files_of_the_log(tmp_path: Path) -> None:
    out, err = tmp_path / "o.txt", tmp_path / "e.txt"
    out.write_text("old content is truncated\n")
    script = "seq 1 200000; echo oops >&2; seq 7 9; echo again >&2"
    result, log = _shim(tmp_path, script, stdout_file=str(out), stderr_file=str(err))
    assert result["exit_code"] == 0 and "output_file_error" not in result
    expected_out = "".join(f"{i}\n" for i in range(1, 200001)) + "7\n8\n9\n"
    assert out.read_text() == expected_out
    assert err.read_text() == "oops\nagain\n"
    # The log holds both streams, every byte once.
    assert sorted(log.decode().splitlines()) == sorted([*expected_out.splitlines(), "oops",
                                                        "again"])


def test_shim_appends_for_multi_node_parts_and_survives_a_failing_file(tmp_path: Path) -> None:
    out = tmp_path / "shared.txt"
    out.write_text("rank 0\n")
    result, log = _shim(tmp_path, "echo rank 1", stdout_file=str(out), append_output=True)
    assert out.read_text() == "rank 0\nrank 1\n" and log == b"rank 1\n"
    # /dev/full refuses every write, as a full disk: the job and its log go on.
    (tmp_path / "job").rename(tmp_path / "job-1")
    result, log = _shim(tmp_path, "seq 1 1000; exit 4", stdout_file="/dev/full")
    assert result["exit_code"] == 4 and "No space left" in result["output_file_error"]
    assert log.decode().splitlines()[-1] == "1000"


def test_shim_fails_the_job_naming_a_file_it_cannot_open(tmp_path: Path) -> None:
    result, _ = _shim(tmp_path, "echo never", stdout_file=str(tmp_path / "no" / "o.txt"))
    assert result["exit_code"] == 127
    assert result["error"].startswith(f"cannot open the output file {tmp_path}/no/o.txt")


# -- sbatch's input variables and the one options table ------------------------------------
def test_sbatch_input_variables_win_over_the_script_and_lose_to_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBATCH_TIMELIMIT", "20")
    monkeypatch.setenv("SBATCH_JOB_NAME", "fromenv")
    monkeypatch.setenv("SBATCH_GPUS_PER_NODE", "a100:2")
    monkeypatch.setenv("SBATCH_NO_REQUEUE", "1")
    (job,), _ = submit_args(tmp_path, "#SBATCH -J fromscript -t 10 -N 2 --requeue\n"
                                      "#SBATCH --qos=prior\n", "-t", "0:30")
    assert job["name"] == "fromenv"  # the environment over the script
    assert job["time_limit_s"] == 30  # the command line over the environment
    assert job["gpus"] == 4 and job["gpu_model"] == "a100"  # per node, the script's 2 nodes
    assert job["stop"]["requeue"] is False and job["qos"] == "prior"


def test_a_bad_sbatch_input_variable_is_one_sentence_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBATCH_TIMELIMIT", "soon")
    with pytest.raises(UsageError, match=r"^SBATCH_TIMELIMIT=soon in the environment: 'soon' "
                                         r"is not one of Slurm's time forms"):
        submit_args(tmp_path, "#SBATCH -t 10\n")


def test_every_option_is_spelled_once_and_each_front_end_reads_the_table() -> None:
    import ast

    from control.options import OPTIONS, spellings

    submit = build_parser().parse_args(["submit", "--", "true"])
    names: list[str] = []
    for option in OPTIONS:
        if option.flags:
            assert hasattr(submit, option.dest), option.dest  # trellisctl has it
        for s in option.script:
            names.append(s.name)
            assert s.name in spellings("#TRELLIS")
            assert (s.name in spellings("#SBATCH")) == s.sbatch
            if s.short:
                assert spellings("#SBATCH")[s.name][0] == s.short
    assert len(names) == len(set(names)), "a script spelling belongs to two options"
    # The batch-script reader and the command line no longer import each other.
    sbatch = Path(__file__).resolve().parents[2] / "control" / "sbatch.py"
    imported = {n.module for n in ast.walk(ast.parse(sbatch.read_text()))
                if isinstance(n, ast.ImportFrom)}
    assert "control.submit" not in imported
