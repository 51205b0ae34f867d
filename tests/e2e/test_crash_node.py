"""kill -9 noded while jobs run: jobs keep running under their shims, the restarted noded
re-adopts them and re-applies their pinning, exits that happened meanwhile are reported with
their status from exit.json, and nothing starts twice."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from demo.cluster import LocalCluster, default_job_user

USER = default_job_user()


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def allowed_cpus(pid: int) -> set[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            spec = line.split(":", 1)[1].strip()
            out: set[int] = set()
            for part in spec.split(","):
                lo, _, hi = part.partition("-")
                out.update(range(int(lo), int(hi or lo) + 1))
            return out
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def drift_pinning(cluster: LocalCluster, node: str, job_id: str, pid: int) -> None:
    """Undo a job's pinning behind noded's back (what a crash mid-re-pin could leave)."""
    everything = set(range(os.cpu_count() or 1))
    cpuset = Path("/sys/fs/cgroup/cpuset") / node / job_id / "cpuset.cpus"
    if cpuset.exists():
        cpuset.write_text(",".join(map(str, sorted(everything))))
    os.sched_setaffinity(pid, everything)
    assert allowed_cpus(pid) == everything


@pytest.mark.parametrize("cgroup_mode", ["auto", "affinity"])
def test_kill_9_noded_while_jobs_run(make_cluster, shared_dir: Path, cgroup_mode: str) -> None:
    if cgroup_mode == "auto" and os.geteuid() != 0:
        pytest.skip("needs root: real cpuset cgroups")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two cores to see a pinning drift")
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=4, cgroup_mode=cgroup_mode,
                                         node_grace_s=30)
    node = cluster.node_name(1)
    client = cluster.client(timeout=30)
    starts = shared_dir / "starts"
    starts.mkdir()
    os.chmod(starts, 0o777)
    mark = f'echo "$$" >> {starts}/$TRELLIS_JOB_ID'
    # Two jobs, one core each (the machine may have only two).
    scripts = {"keeps": f"{mark}; exec sleep 300", "exits7": f"{mark}; sleep 3; exit 7"}
    for job_id, script in scripts.items():
        client.call("submit", {"id": job_id, "job": {
            "name": job_id, "command": ["sh", "-c", script], "user": USER, "gpus": 1,
            "cpus": 1}})
    wait_for(lambda: all(j["state"] == "running" for j in client.call("jobs")["jobs"]), 30,
             "the jobs to run")
    wait_for(lambda: all((starts / j).exists() for j in scripts), 10, "start markers")
    keeps_pid = int((starts / "keeps").read_text().split()[0])
    placement = client.call("job", {"id": "keeps"})["job"]["placement"][0]
    assert allowed_cpus(keeps_pid) == set(placement["cpus"])

    cluster.node_daemons[node].stop(signal.SIGKILL)
    # The short job ends while noded is down; its shim records how.
    jobs_dir = cluster.root / node / "jobs"
    wait_for(lambda: (jobs_dir / "exits7" / "exit.json").exists(), 15, "exit.json")
    assert json.loads((jobs_dir / "exits7" / "exit.json").read_text())["exit_code"] == 7
    os.kill(keeps_pid, 0)  # still running without noded
    drift_pinning(cluster, node, "keeps", keeps_pid)
    assert client.call("job", {"id": "keeps"})["job"]["state"] == "running"

    cluster.node_daemons[node].start(cluster._env())
    cluster.wait_nodes(1)

    def settled() -> dict[str, dict]:
        jobs = {j["id"]: j for j in client.call("jobs")["jobs"]}
        return jobs if jobs["exits7"]["state"] == "failed" else {}

    jobs = wait_for(settled, 20, "the exits to be reported")
    assert jobs["exits7"]["exit_code"] == 7
    assert jobs["keeps"]["state"] == "running"
    # Re-adopted with its pinning re-applied, never restarted.
    wait_for(lambda: allowed_cpus(keeps_pid) == set(placement["cpus"]), 10,
             "the pinning to be re-applied")
    os.kill(keeps_pid, 0)
    time.sleep(1.0)
    for job_id in scripts:
        assert len((starts / job_id).read_text().split()) == 1, f"{job_id} started twice"
    # The master has recorded the exits, so noded dropped their state; the kept job's stays.
    wait_for(lambda: not (jobs_dir / "exits7").exists(), 10, "forget_job")
    assert (jobs_dir / "keeps" / "shim.json").exists()
    # And it can still be stopped through the re-adopted shim.
    client.call("cancel", {"id": "keeps"})
    wait_for(lambda: client.call("job", {"id": "keeps"})["job"]["state"] == "cancelled", 20,
             "the cancel")
