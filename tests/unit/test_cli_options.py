"""trellisctl's command line: global options anywhere, -o yaml, '-' for empty fields, what a
simple command imports, and the job lists --array and a file of jobs make."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from control.cli import build_parser, command_word
from control.submit import ARRAY_INDEX_ENV, jobs_from_args
from control.usage import UsageError
from control.values import parse_array
from control.views import show_job
from control.yamlout import dump
from shared.model import JobSpec, StopRules
from shared.schema import decode

ROOT = Path(__file__).resolve().parents[2]


def parse(*words: str) -> argparse.Namespace:
    """As main() parses: with only the named command's parser when that is certain."""
    return build_parser(only=command_word(list(words))).parse_args(list(words))


@pytest.mark.parametrize("words", [
    ["jobs", "--state", "running", "-o", "json"],
    ["-o", "json", "jobs", "--state", "running"],
    ["jobs", "-o", "json", "--state", "running"],
    ["jobs", "--output=json", "--state", "running"],
    ["-ojson", "jobs", "--state", "running"],
])
def test_global_options_anywhere(words: list[str]) -> None:
    args = parse(*words)
    assert (args.command, args.output, args.state) == ("jobs", "json", "running")
    # The same with the whole parser (what --help and completion build).
    full = build_parser().parse_args(words)
    assert (full.command, full.output, full.state) == ("jobs", "json", "running")


def test_global_defaults_survive_the_subcommand() -> None:
    args = parse("--master", "http://m:1", "--timeout", "3", "nodes")
    assert (args.master, args.timeout, args.output, args.token_file) == (
        "http://m:1", 3.0, "table", None)
    args = parse("nodes")
    assert (args.master, args.timeout, args.output) == (None, 30.0, "table")
    args = parse("--timeout", "3", "show", "j1", "--master", "http://m:2", "-o", "yaml")
    assert (args.job_id, args.master, args.timeout, args.output) == ("j1", "http://m:2", 3.0,
                                                                     "yaml")
    args = parse("models", "load", "f.toml", "-o", "json")
    assert (args.models_action, args.file, args.output) == ("load", "f.toml", "json")


def test_words_after_double_dash_belong_to_the_job() -> None:
    args = parse("submit", "--gpus", "1", "-o", "json", "--", "train", "-o", "out.txt")
    assert args.output == "json"
    assert args.job_command == ["--", "train", "-o", "out.txt"]


def test_command_word_is_certain_or_none() -> None:
    assert command_word(["--master", "http://x", "-o", "wide", "jobs"]) == "jobs"
    assert command_word(["--master=http://x", "nodes", "-w"]) == "nodes"
    assert command_word(["--mast", "http://x", "jobs"]) is None  # an abbreviation
    assert command_word(["--help"]) is None
    assert command_word(["bogus"]) is None
    assert command_word([]) is None


def test_bad_output_and_command_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for words in (["jobs", "-o", "xml"], ["bogus"], ["jobs", "--bogus"]):
        with pytest.raises(SystemExit) as exit_:
            parse(*words)
        assert exit_.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_simple_command_imports_only_what_it_needs() -> None:
    """What `trellisctl jobs` loads up to the RPC: no TLS, HTTP library, aiohttp, auth,
    dataclasses/inspect or typing (each costs start-up time the command never uses)."""
    program = (
        "import sys\n"
        "import control.cli as c\n"
        "words = ['jobs', '--state', 'running', '-o', 'json']\n"
        "args = c.build_parser(only=c.command_word(words)).parse_args(words)\n"
        "client = c.make_client(args)\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": "/nonexistent"}
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=60, check=True).stdout.split()
    loaded = set(out)
    assert {"control.cli", "control.client", "control.transport", "msgpack"} <= loaded
    forbidden = {"ssl", "_ssl", "http.client", "urllib.request", "email", "aiohttp",
                 "shared.auth", "dataclasses", "inspect", "typing", "shutil", "json",
                 "tomllib", "getpass", "control.views", "control.completion",
                 "control.submit", "encodings.idna"}
    assert not loaded & forbidden, sorted(loaded & forbidden)


def job_view(**over: Any) -> dict[str, Any]:
    job = {"id": "j1", "name": "j1", "state": "queued", "kind": "cpu", "tenant": "default",
           "user": "alice", "qos": "normal", "gpus": 0, "cpus": 1, "memory_mib": 0,
           "command": ["true"], "submit_time": 1.0, "start_time": None, "end_time": None,
           "queued_s": None, "exit_code": None, "signal": None, "reason": "", "attempts": 0,
           "placement": []}
    job.update(over)
    return job


def test_show_prints_dash_for_empty_fields() -> None:
    text = show_job({"job": job_view(), "events": [
        {"time": 1.0, "node": None, "kind": "submitted", "detail": {}}]})
    assert "None" not in text
    for label in ("Exit code:", "Signal:", "Reason:", "Started:", "Ended:", "Queued:"):
        line = next(line for line in text.splitlines() if line.startswith(label))
        assert line.split()[-1] == "-", line
    text = show_job({"job": job_view(exit_code=0, state="finished"), "events": []})
    assert next(x for x in text.splitlines() if x.startswith("Exit code:")).split()[-1] == "0"


def test_show_says_where_an_images_pull_stands() -> None:
    def image_line(state: str, **metrics: float) -> str:
        text = show_job({"job": job_view(state=state, image="reg:5000/team/pt:1"),
                         "metrics": {k: {"last": v, "value": v, "count": 1}
                                     for k, v in metrics.items()}, "events": []})
        return next(x for x in text.splitlines() if x.startswith("Image:"))

    assert image_line("queued") == "Image:      reg:5000/team/pt:1"
    assert image_line("running").endswith("(pulling)")
    assert image_line("running", image_pull_layers=3, image_pull_s=4.25).endswith(
        "(pulling: 3 layer(s) copied, 4.2 s so far)")
    assert image_line("running", image_pull_s=9.0, image_pulled=1).endswith("(pulled in 9.0 s)")
    assert image_line("finished", image_cached=1).endswith("(in the node's cache)")
    # A host job shows no Image line.
    assert "Image:" not in show_job({"job": job_view(), "events": []})


def test_yaml_reads_back_as_the_same_data() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML (the test extra) reads the output back")
    data = {
        "jobs": [job_view(), job_view(id="j2", placement=[{"node": "n1", "gpus": [0, 1],
                                                            "cpus": [], "memory_mib": 0}])],
        "strings": ["yes", "No", "on", "null", "~", "", " lead", "trail ", "a: b", "#x", "- x",
                    "12", "1e3", "0x1f", "1_000", "2024-05-01", "12:30", "tab\there",
                    "line\nbreak", 'quote"s', "back\\slash", "ünïcödé", "\x00\x85\u2028",
                    "[x]", "{y}", "*a", "&b", "!t", "%p", "@q", "`r", "'s", ".inf", "-",
                    "?", ":"],
        "numbers": [0, -3, 2**63, 1.5, -0.0, 1e-05, 1e+20, 3.0, math.inf, -math.inf],
        "nested": [[1, [2, []]], [{}], {"k": {"kk": [{"a": None, "b": True, "c": False}]}}],
        "empty": {}, "none": None,
    }
    text = dump(data)
    back = yaml.safe_load(text)
    assert json.dumps(back, sort_keys=True) == json.dumps(data, sort_keys=True)
    nan = yaml.safe_load(dump({"x": math.nan}))["x"]
    assert math.isnan(nan)


@pytest.mark.parametrize(("spec", "indices"), [
    ("0-3", [0, 1, 2, 3]),
    ("1,3,5-7", [1, 3, 5, 6, 7]),
    ("0-9:3", [0, 3, 6, 9]),
    ("7", [7]),
    ("3,1,3", [1, 3]),
])
def test_array_specs(spec: str, indices: list[int]) -> None:
    assert parse_array(spec) == indices


@pytest.mark.parametrize(("spec", "message"), [
    ("5-3", "ends before it starts"),
    ("0-9:0", "step 0 must be at least 1"),
    ("a-b", "is not N, N-M or N-M:STEP"),
    ("-1", "is not N, N-M or N-M:STEP"),
    ("4:2", "a step needs a range"),
    ("0-20000", "more than 10000 jobs"),
    ("0-9%2", "%N limit"),
    ("", "is not N"),
])
def test_bad_array_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("%", "%").replace("(", r"\(")):
        parse_array(spec)


def test_array_jobs_carry_their_index() -> None:
    args = parse("submit", "--array", "0-2", "--name", "sweep", "--id", "sw", "--cpus", "1",
                 "--user", "alice", "--env", "A=1", "--", "run.sh")
    jobs, ids = jobs_from_args(args)
    assert [j["name"] for j in jobs] == ["sweep_0", "sweep_1", "sweep_2"]
    assert ids == ["sw_0", "sw_1", "sw_2"]
    assert [j["env"][ARRAY_INDEX_ENV] for j in jobs] == ["0", "1", "2"]
    assert all(j["env"]["A"] == "1" and j["env"]["TRELLIS_ARRAY_COUNT"] == "3" for j in jobs)
    assert all(j["command"] == ["run.sh"] and j["kind"] == "cpu" for j in jobs)
    long = parse("submit", "--array", "100-101", "--name", "n" * 63, "--user", "alice", "--",
                 "x")
    names = [j["name"] for j in jobs_from_args(long)[0]]
    assert names == ["n" * 59 + "_100", "n" * 59 + "_101"]


def test_a_fractional_gpu_request_reaches_the_spec() -> None:
    from shared.model import JobSpec
    from shared.schema import decode

    args = parse("submit", "--gpus", "1", "--gpu-milli", "250", "--cpus", "1", "--user", "alice",
                 "--", "infer.py")
    [job], _ = jobs_from_args(args)
    assert job["gpu_milli"] == 250
    assert decode(JobSpec, job).gpu_milli == 250


def test_file_of_jobs(tmp_path: Path) -> None:
    toml = tmp_path / "jobs.toml"
    toml.write_text('tenant = "vision"\nuser = "alice"\ncpus = 2\n\n'
                    '[[jobs]]\nname = "a"\ncommand = ["a.sh"]\nid = "job-a"\n\n'
                    '[[jobs]]\ncommand = ["b.py", "--x"]\ngpus = 1\n')
    jobs, ids = jobs_from_args(parse("submit", "-f", str(toml), "--qos", "urgent"))
    assert ids == ["job-a", None]
    assert [(j["name"], j["tenant"], j["cpus"], j["qos"], j["kind"]) for j in jobs] == [
        ("a", "vision", 2, "urgent", "cpu"), ("b-py", "vision", 2, "urgent", "training")]
    listed = tmp_path / "jobs.json"
    listed.write_text(json.dumps([{"command": ["x"], "user": "bob"}] * 3))
    jobs, ids = jobs_from_args(parse("submit", "-f", str(listed)))
    assert len(jobs) == 3 and ids == [None] * 3
    for content, message in (
        ('{"jobs": []}', "the jobs list is empty"),
        ('{"jobs": [1]}', r"jobs\[0\] is not a table"),
        ('{"jobs": [{"user": "bob"}]}', r"jobs\[0\]: submit needs a command"),
        ('{"jobs": [{"command": "x y", "user": "bob"}]}', "must be a list of words"),
        ("[", "Expecting value"),
    ):
        listed.write_text(content)
        with pytest.raises(UsageError, match=message):
            jobs_from_args(parse("submit", "-f", str(listed)))
    listed.write_text(json.dumps([{"command": ["x"], "user": "bob"}] * 2))
    with pytest.raises(UsageError, match="--id and --array apply to one job"):
        jobs_from_args(parse("submit", "-f", str(listed), "--array", "0-1"))


def test_requeue_flags_become_the_specs_stop_rule(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for flag, value in (("--requeue", True), ("--no-requeue", False)):
        args = parse("submit", flag, "--gpus", "1", "--env", "A=1", "--", "train")
        [job], _ = jobs_from_args(args)
        assert job["stop"] == {"requeue": value} and job["env"] == {"A": "1"}
        assert decode(JobSpec, job).stop == StopRules(requeue=value)
    [job], _ = jobs_from_args(parse("submit", "--gpus", "1", "--", "train"))
    assert "stop" not in job and decode(JobSpec, job).stop == StopRules()
    # A file's stop rules are merged with the command line's, key by key.
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"command": ["train"], "gpus": 1,
                                "stop": {"grace_s": 60, "requeue": True}}))
    [job], _ = jobs_from_args(parse("submit", "-f", str(path), "--no-requeue"))
    assert job["stop"] == {"grace_s": 60, "requeue": False}
    with pytest.raises(SystemExit) as exit_:
        parse("submit", "--requeue", "--no-requeue", "--", "train")
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_gpu_reset_needs_an_index_that_is_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    from control.cli import main

    assert main(["gpu", "reset", "n1", "two"]) == 2
    assert "INDEX must be a GPU's index (0, 1, ...), got 'two'" in capsys.readouterr().err
    assert main(["gpu"]) == 2
    assert "gpu needs an action: trellisctl gpu reset NODE INDEX" in capsys.readouterr().err
