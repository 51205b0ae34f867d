"""End-to-end: a real master and node daemons as separate processes on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from demo.cluster import LocalCluster, default_job_user
from tests.conftest import needs_root

TRAINER = str(Path(__file__).resolve().parents[2] / "demo" / "trainer.py")
USER = default_job_user()


def ctl(cluster: LocalCluster, *args: str) -> tuple[int, Any, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "control.cli", "--master", cluster.url, "-o", "json", *args],
        capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    out = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else None
    return proc.returncode, out, proc.stderr


def submit(cluster: LocalCluster, *args: str) -> str:
    code, out, err = ctl(cluster, "submit", "--user", USER, *args)
    assert code == 0, err
    return out["job"]["id"]


def wait_states(cluster: LocalCluster, ids: list[str], states: set[str],
                timeout: float = 60) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        code, out, err = ctl(cluster, "jobs")
        assert code == 0, err
        jobs = {j["id"]: j for j in out["jobs"]}
        if all(jobs[i]["state"] in states for i in ids):
            return jobs
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs not in {states}: "
                                 f"{ {i: jobs[i]['state'] for i in ids} }\n"
                                 + cluster.log("master"))
        time.sleep(0.3)


def test_jobs_run_to_completion_with_exit_codes(make_cluster, shared_dir: Path) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    code, out, _ = ctl(cluster, "nodes")
    assert code == 0 and len(out["nodes"]) == 2
    assert all(n["gpus"] == 4 and n["status"] == "ready" for n in out["nodes"])

    env_file = shared_dir / "env"
    ok = submit(cluster, "--name", "ok", "--gpus", "2", "--", "sh", "-c",
                f"env > {env_file}; python3 {TRAINER} --iterations 5 --gpu-ms 5")
    wide = submit(cluster, "--name", "wide", "--gpus", "8", "--", "python3", TRAINER,
                  "--iterations", "5", "--gpu-ms", "5")
    bad = submit(cluster, "--name", "bad", "--gpus", "1", "--", "python3", TRAINER,
                 "--iterations", "5", "--fail-at", "2")
    cpu = submit(cluster, "--name", "etl", "--kind", "cpu", "--cpus", "1", "--", "true")
    jobs = wait_states(cluster, [ok, wide, bad, cpu], {"finished", "failed", "cancelled"})
    assert jobs[ok]["state"] == "finished" and jobs[ok]["exit_code"] == 0
    assert jobs[wide]["state"] == "finished" and len(jobs[wide]["nodes"]) == 2
    assert jobs[bad]["state"] == "failed" and jobs[bad]["exit_code"] == 3
    assert jobs[cpu]["state"] == "finished"

    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    placement = jobs[ok]["placement"][0]
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, placement["gpus"]))
    assert env["WORLD_SIZE"] == "1" and env["RANK"] == "0" and env["LOCAL_RANK"] == "0"
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    assert env["USER"] == USER

    code, out, _ = ctl(cluster, "show", bad)
    assert code == 0
    kinds = [e["kind"] for e in out["events"]]
    assert kinds[0] == "submitted" and "running" in kinds and kinds[-1] == "failed"


def test_master_restart_loses_nothing_and_runs_nothing_twice(make_cluster,
                                                             shared_dir: Path) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    starts = shared_dir / "starts"
    starts.mkdir()
    os.chmod(starts, 0o777)
    script = f'echo "$$" >> {starts}/$TRELLIS_JOB_ID; sleep 2'
    ids = [submit(cluster, "--name", f"r{i}", "--gpus", "4", "--", "sh", "-c", script)
           for i in range(4)]
    wait_states(cluster, ids[:2], {"running"}, timeout=30)
    cluster.restart_master()  # kill -9 while two run and two wait
    ids.append(submit(cluster, "--name", "late", "--gpus", "4", "--", "sh", "-c", script))
    jobs = wait_states(cluster, ids, {"finished", "failed"}, timeout=90)
    assert all(jobs[i]["state"] == "finished" for i in ids), jobs
    for job_id in ids:
        lines = (starts / job_id).read_text().split()
        assert len(lines) == 1, f"{job_id} started {len(lines)} times"


def test_cancel_a_running_job(make_cluster) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=4)
    job = submit(cluster, "--name", "long", "--gpus", "1", "--", "sleep", "300")
    wait_states(cluster, [job], {"running"}, timeout=30)
    code, _, err = ctl(cluster, "cancel", job)
    assert code == 0, err
    jobs = wait_states(cluster, [job], {"cancelled"}, timeout=30)
    assert jobs[job]["signal"] == 15


def test_drain_keeps_new_work_off_a_node(make_cluster) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    drained = cluster.node_name(1)
    code, out, err = ctl(cluster, "drain", drained)
    assert code == 0 and out["status"] == "drained", err
    ids = [submit(cluster, "--name", f"d{i}", "--gpus", "1", "--", "true") for i in range(3)]
    jobs = wait_states(cluster, ids, {"finished"}, timeout=60)
    assert all(jobs[i]["nodes"] == [cluster.node_name(2)] for i in ids)
    code, out, _ = ctl(cluster, "undrain", drained)
    assert out["status"] == "ready"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--gpus", "-1"], "gpus: must be at least 0"),
        (["--gpus", "64"], "asks for 64 GPUs but the cluster has 8"),
        (["--gpus", "1", "--user", "no-such-user-xyz"], "Unix user 'no-such-user-xyz' does not"),
        (["--gpus", "1", "--user", "root"], "jobs may not run as root"),
        (["--gpus", "1", "--id", "../etc"], "job id '../etc' is not a valid name"),
        (["--gpus", "1", "--id", "a/b"], "job id 'a/b' is not a valid name"),
        (["--gpus", "1", "--qos", "urgent", "--kind", "cpu"], "a cpu job cannot ask for GPUs"),
    ],
)
def test_bad_submissions_get_clear_errors(make_cluster, args: list[str], fragment: str) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    user = [] if "--user" in args else ["--user", USER]
    code, _, err = ctl(cluster, "submit", *user, *args, "--", "true")
    assert code == 1, err
    assert fragment in err, err
    assert "Traceback" not in err
    # The master keeps serving, and nothing half-accepted lingers.
    code, out, _ = ctl(cluster, "jobs")
    assert code == 0 and out["jobs"] == []


def test_cli_errors(make_cluster) -> None:
    cluster = make_cluster(nodes=1)
    code, _, err = ctl(cluster, "show", "nope")
    assert code == 1 and "does not exist" in err
    proc = subprocess.run([sys.executable, "-m", "control.cli", "--master",
                           "http://127.0.0.1:9", "jobs"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 3 and "cannot reach the master" in proc.stderr
    code, _, err = ctl(cluster, "submit", "--gpus", "1")
    assert code == 2 and "needs a command" in err


@needs_root
def test_jobs_are_pinned_with_real_cgroups_and_run_unprivileged(make_cluster,
                                                                shared_dir: Path) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=2)
    out_file = shared_dir / "who"
    job = submit(cluster, "--name", "who", "--gpus", "1", "--cpus", "1", "--", "sh", "-c",
                 f"(id -u; grep Cpus_allowed_list /proc/self/status; cat /proc/self/cgroup)"
                 f" > {out_file}")
    jobs = wait_states(cluster, [job], {"finished", "failed"})
    assert jobs[job]["state"] == "finished", cluster.log(cluster.node_name(1))
    text = out_file.read_text()
    uid, allowed = text.split("\n")[:2]
    assert uid.strip() == "65534"  # nobody
    core = jobs[job]["placement"][0]["cpus"][0]
    assert allowed.split(":")[1].strip() == str(core)
    assert f"cpuset:/{cluster.node_name(1)}/{job}" in text


def test_affinity_pinning_without_cgroups(make_cluster, shared_dir: Path) -> None:
    """The path a node takes when not root: CPU affinity instead of a cpuset cgroup."""
    cluster = make_cluster(nodes=1, gpus_per_node=2, cgroup_mode="affinity")
    out_file = shared_dir / "aff"
    job = submit(cluster, "--name", "aff", "--gpus", "1", "--cpus", "1", "--", "sh", "-c",
                 f"grep Cpus_allowed_list /proc/self/status > {out_file}")
    jobs = wait_states(cluster, [job], {"finished", "failed"})
    assert jobs[job]["state"] == "finished", cluster.log(cluster.node_name(1))
    core = jobs[job]["placement"][0]["cpus"][0]
    assert out_file.read_text().split(":")[1].strip() == str(core)


def test_multi_node_job_starts_everywhere_or_nowhere(make_cluster, shared_dir: Path) -> None:
    """Node 2 refuses the user, so the two-node job must not start on node 1 either."""
    cluster = make_cluster(nodes=2, gpus_per_node=4,
                           extra_node={2: {"allowed_users": ["someone-else"]}})
    marker = shared_dir / "ran"
    job = submit(cluster, "--name", "split", "--gpus", "8", "--", "sh", "-c",
                 f"touch {marker}-$RANK")
    jobs = wait_states(cluster, [job], {"failed"}, timeout=60)
    # A refused user fails at once: retrying cannot change the node's answer.
    assert "not allowed" in jobs[job]["reason"]
    assert not list(shared_dir.glob("ran-*")), "a rank ran although its peer refused"
    # The refused job freed everything: a job that fits node 1 alone runs there.
    ok = submit(cluster, "--name", "fits", "--gpus", "4", "--", "true")
    assert wait_states(cluster, [ok], {"finished", "failed"})[ok]["state"] == "finished"
