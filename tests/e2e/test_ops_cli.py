"""Every trellisctl command against a real master and node daemons; JSON output checked."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.cluster import LocalCluster, default_job_user
from tests.e2e.test_bench_interrupt import heed_stop_signals

REPO = Path(__file__).resolve().parents[2]
USER = default_job_user()
CLI = [sys.executable, "-m", "control.cli"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="trellis-test-"))
    os.chmod(root, 0o777)
    c = LocalCluster(root / "c", nodes=2, gpus_per_node=2, prefix=f"trellis-test-cli{os.getpid()}")
    try:
        c.start()
        yield c
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


def ctl(cluster: LocalCluster | None, *args: str, output: str = "json",
        timeout: float = 60) -> tuple[int, Any, str]:
    master = ["--master", cluster.url] if cluster is not None else []
    proc = subprocess.run([*CLI, *master, "-o", output, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    out: Any = proc.stdout
    if output == "json" and proc.returncode == 0 and proc.stdout.strip():
        out = json.loads(proc.stdout)
    return proc.returncode, out, proc.stderr


def submit(cluster: LocalCluster, *args: str) -> str:
    code, out, err = ctl(cluster, "submit", "--user", USER, *args)
    assert code == 0, err
    return out["job"]["id"]


def wait_state(cluster: LocalCluster, job_id: str, states: set[str],
               timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        code, out, err = ctl(cluster, "show", job_id)
        assert code == 0, err
        if out["job"]["state"] in states:
            return out["job"]
        assert time.monotonic() < deadline, (out["job"], cluster.log("master"))
        time.sleep(0.2)


@pytest.fixture(scope="module")
def running(cluster: LocalCluster) -> str:
    """A long job on node 1 (drained node 2 keeps it there), tenant 'vision'."""
    code, _, err = ctl(cluster, "drain", cluster.node_name(2))
    assert code == 0, err
    job = submit(cluster, "--name", "long", "--tenant", "vision", "--gpus", "1", "--cpus", "1",
                 "--", "sleep", "300")
    wait_state(cluster, job, {"running"})
    code, _, err = ctl(cluster, "undrain", cluster.node_name(2))
    assert code == 0, err
    return job


def test_nodes_json_table_and_wide(cluster: LocalCluster, running: str) -> None:
    code, out, err = ctl(cluster, "nodes")
    assert code == 0, err
    nodes = {n["name"]: n for n in out["nodes"]}
    assert set(nodes) == {cluster.node_name(1), cluster.node_name(2)}
    assert nodes[cluster.node_name(1)]["jobs"] == [running]
    assert all(n["status"] == "ready" and n["gpus"] == 2 for n in nodes.values())
    code, text, _ = ctl(cluster, "nodes", output="table")
    assert code == 0 and text.splitlines()[0].split()[:2] == ["NODE", "STATUS"]
    code, text, _ = ctl(cluster, "nodes", output="wide")
    header = text.splitlines()[0]
    assert code == 0 and "ADDRESS" in header and "GPU UTIL" in header
    assert running in text


def test_node_detail(cluster: LocalCluster, running: str) -> None:
    name = cluster.node_name(1)
    code, out, err = ctl(cluster, "node", name)
    assert code == 0, err
    assert out["node"]["name"] == name and out["node"]["status"] == "ready"
    [part] = out["jobs"]
    assert part["id"] == running and len(part["cpus"]) == 1 and len(part["gpus"]) == 1
    holders = {g["index"]: g["job"] for g in out["node"]["gpu_detail"]}
    assert holders[part["gpus"][0]] == running
    assert set(out["rdt"]) == {"cat", "mba", "mbm", "mba_mbps"}
    code, text, _ = ctl(cluster, "node", name, output="table")
    assert code == 0 and f"Node:     {name} (ready)" in text
    assert "GPU  UTIL" in text and running in text
    code, text, _ = ctl(cluster, "node", name, output="wide")
    assert code == 0 and "UUID" in text and "GPU-" in text
    code, _, err = ctl(cluster, "node", "no-such-node")
    assert code == 1 and "unknown_node: node 'no-such-node' is not registered" in err


def test_jobs_filters_and_wide(cluster: LocalCluster, running: str) -> None:
    done = submit(cluster, "--name", "quick", "--tenant", "audio", "--kind", "cpu", "--cpus",
                  "1", "--", "true")
    wait_state(cluster, done, {"finished"})
    code, out, err = ctl(cluster, "jobs")
    assert code == 0, err
    ids = {j["id"] for j in out["jobs"]}
    assert {running, done} <= ids
    for args, expected, absent in (
        (["--state", "running"], running, done),
        (["--state", "active"], running, done),
        (["--state", "finished"], done, running),
        (["--tenant", "vision"], running, done),
        (["--node", cluster.node_name(1)], running, None),
    ):
        code, out, err = ctl(cluster, "jobs", *args)
        assert code == 0, err
        got = {j["id"] for j in out["jobs"]}
        assert expected in got and (absent is None or absent not in got), (args, got)
    code, text, _ = ctl(cluster, "jobs", "--state", "running", output="wide")
    lines = text.splitlines()
    assert code == 0 and lines[0].split()[:4] == ["ID", "NAME", "STATE", "KIND"]
    assert "PLACEMENT" in lines[0] and "USER" in lines[0]
    row = next(line for line in lines if line.startswith(running))
    assert f"{cluster.node_name(1)}:g" in row and USER in row
    code, _, err = ctl(cluster, "jobs", "--state", "bogus")
    assert code == 2 and "invalid choice: 'bogus'" in err


def test_submit_show_cancel_drain_undrain_json(cluster: LocalCluster) -> None:
    code, out, err = ctl(cluster, "submit", "--user", USER, "--id", "cli-c1", "--gpus", "1",
                         "--", "sleep", "300")
    assert code == 0, err
    assert out["job"]["id"] == "cli-c1" and out["job"]["gpus"] == 1
    wait_state(cluster, "cli-c1", {"running"})
    code, out, err = ctl(cluster, "show", "cli-c1")
    assert code == 0 and out["job"]["state"] == "running"
    assert [e["kind"] for e in out["events"]][:2] == ["submitted", "placed"]
    code, out, err = ctl(cluster, "cancel", "cli-c1")
    assert code == 0 and out["job"]["id"] == "cli-c1", err
    assert wait_state(cluster, "cli-c1", {"cancelled"})["signal"] == signal.SIGTERM
    node = cluster.node_name(2)
    code, out, err = ctl(cluster, "drain", node, "--reason", "fan 3 replaced")
    assert (code, out) == (0, {"node": node, "status": "drained"}), err
    code, out, err = ctl(cluster, "node", node)
    assert code == 0 and [(c["kind"], c["reason"]) for c in out["node"]["conditions"]] == [
        ("drained", "drained by an operator: fan 3 replaced")], err
    code, out, err = ctl(cluster, "undrain", node)
    assert (code, out) == (0, {"node": node, "status": "ready"}), err


def test_events(cluster: LocalCluster, running: str) -> None:
    code, out, err = ctl(cluster, "events", "-n", "1000")
    assert code == 0, err
    rows = out["events"]
    assert rows and out["last"] == rows[-1]["seq"]
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)
    assert {"seq", "time", "job", "node", "kind", "detail"} == set(rows[0])
    mine = [r for r in rows if r["job"] == running]
    assert [r["kind"] for r in mine][:3] == ["submitted", "placed", "running"]
    code, out, _ = ctl(cluster, "events", "--job", running)
    assert code == 0 and {r["job"] for r in out["events"]} == {running}
    code, out, _ = ctl(cluster, "events", "--after", str(rows[0]["seq"]), "--limit", "2")
    assert code == 0 and [r["seq"] for r in out["events"]] == [r["seq"] for r in rows[1:3]]
    code, out, _ = ctl(cluster, "events", "-n", "2")
    assert code == 0 and len(out["events"]) == 2
    code, text, _ = ctl(cluster, "events", "--job", running, output="table")
    assert code == 0 and text.splitlines()[0].split() == ["SEQ", "TIME", "JOB", "NODE", "KIND",
                                                          "DETAIL"]
    assert "submitted" in text and "tenant=vision" in text
    code, _, err = ctl(cluster, "events", "--after", "-1")
    assert code == 2 and "--after must be 0 or more" in err


class Lines:
    """A child's stdout lines, read by a thread: select() cannot see lines already sitting in
    the pipe wrapper's buffer."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stream = proc.stdout
        threading.Thread(target=lambda: [self.queue.put(line) for line in stream],
                         daemon=True).start()

    def next(self, timeout: float) -> str:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output within {timeout} s") from None


def interactive(argv: list[str]) -> subprocess.Popen[str]:
    """trellisctl as started from a terminal, where Ctrl-C reaches it: a suite run as a
    background job of a non-interactive shell has SIGINT ignored, and a child inherits that,
    so stop()'s SIGINT would never arrive (the CLI rightly keeps an inherited SIG_IGN)."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, bufsize=1, preexec_fn=heed_stop_signals)


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def test_events_follow_prints_new_events_until_ctrl_c(cluster: LocalCluster) -> None:
    before = submit(cluster, "--name", "before", "--kind", "cpu", "--cpus", "1", "--", "true")
    proc = interactive([*CLI, "--master", cluster.url, "-o", "json", "events", "--follow",
                        "-n", "1"])
    lines = Lines(proc)
    try:
        first = json.loads(lines.next(20))  # the newest event when following began
        assert {"seq", "kind", "job"} <= set(first) and first["seq"] > 0
        job = submit(cluster, "--name", "followed", "--kind", "cpu", "--cpus", "1", "--",
                     "true")
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while not any(r["job"] == job and r["kind"] == "finished" for r in seen):
            assert time.monotonic() < deadline, seen
            seen.append(json.loads(lines.next(20)))
        kinds = [r["kind"] for r in seen if r["job"] == job]
        assert kinds[0] == "submitted" and kinds[-1] == "finished"
        seqs = [first["seq"]] + [r["seq"] for r in seen]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # in order, no repeats
        assert before not in {r["job"] for r in seen if r["kind"] == "submitted"}
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert "Traceback" not in err


def test_watch_refreshes_until_ctrl_c(cluster: LocalCluster, running: str) -> None:
    started = time.monotonic()
    proc = interactive([*CLI, "--master", cluster.url, "-o", "json", "jobs", "--state",
                        "running", "--watch"])
    lines = Lines(proc)
    try:
        one = json.loads(lines.next(20))
        two = json.loads(lines.next(20))
        assert running in {j["id"] for j in one["jobs"]}
        assert running in {j["id"] for j in two["jobs"]}
        # Refreshes are 2 s apart, not a busy loop. Counted against the time since the start,
        # not as the gap between two reads here: on a loaded machine this test may read
        # both lines in one go long after the CLI wrote them 2 s apart.
        elapsed = time.monotonic() - started
        refreshes = 2 + lines.queue.qsize()
        assert elapsed >= 2.0 and refreshes <= elapsed / 2.0 + 1, (refreshes, elapsed)
    finally:
        code, err = stop(proc)
    assert code == 0, err

    proc = interactive([*CLI, "--master", cluster.url, "nodes", "--watch"])
    lines = Lines(proc)
    try:
        banners = 0
        deadline = time.monotonic() + 20
        while banners < 2:
            assert time.monotonic() < deadline
            line = lines.next(10)
            banners += line.startswith("every 2s: trellisctl nodes")
    finally:
        code, err = stop(proc)
    assert code == 0, err


def test_completion(cluster: LocalCluster, running: str, tmp_path: Path) -> None:
    code, script, err = ctl(None, "completion", "bash", output="table")
    assert code == 0, err
    path = tmp_path / "trellisctl.bash"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0

    code, out, _ = ctl(cluster, "completion", "words", "nodes", output="table")
    assert code == 0 and sorted(out.split()) == [cluster.node_name(1), cluster.node_name(2)]
    code, out, _ = ctl(cluster, "completion", "words", "jobs", output="table")
    assert code == 0 and running in out.split()
    code, _, err = ctl(cluster, "completion", "words", output="table")
    assert code == 2 and "needs jobs or nodes" in err

    # The script itself, in bash, with trellisctl on PATH completing from this master.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "trellisctl"
    wrapper.write_text(f'#!/bin/sh\ncd {REPO} && exec {sys.executable} -m control.cli "$@"\n')
    wrapper.chmod(0o755)

    def complete(*words: str) -> list[str]:
        words_q = " ".join(f"'{w}'" for w in words)
        program = (f"source {path}\nCOMP_WORDS=({words_q})\n"
                   f"COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n_trellisctl\n"
                   'printf "%s\\n" "${COMPREPLY[@]}"\n')
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
        proc = subprocess.run(["bash", "-c", program], capture_output=True, text=True, env=env,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [w for w in proc.stdout.split("\n") if w]

    assert complete("trellisctl", "ev") == ["events"]
    assert complete("trellisctl", "-o", "w") == ["wide"]
    assert set(complete("trellisctl", "jobs", "--state", "")) >= {"running", "active"}
    assert complete("trellisctl", "--master", cluster.url, "show", running[:3]) == [running]
    assert set(complete("trellisctl", "--master", cluster.url, "node", "")) == {
        cluster.node_name(1), cluster.node_name(2)}
    assert complete("trellisctl", "--master", cluster.url, "jobs", "--node",
                    cluster.node_name(2)) == [cluster.node_name(2)]


def test_exit_codes(cluster: LocalCluster) -> None:
    proc = subprocess.run([*CLI, "--master", "http://127.0.0.1:9", "--timeout", "2", "nodes"],
                          capture_output=True, text=True, cwd=REPO, timeout=30)
    assert proc.returncode == 3 and "cannot reach the master" in proc.stderr
    code, _, err = ctl(cluster, "cancel", "no-such-job")
    assert code == 1 and err.strip() == "trellisctl: unknown_job: job 'no-such-job' does not exist"
    code, _, err = ctl(cluster, "bogus-command")
    assert code == 2 and "invalid choice" in err
    code, _, err = ctl(cluster, "--timeout", "0", "nodes")
    assert code == 2 and "--timeout must be more than 0" in err and "Traceback" not in err
