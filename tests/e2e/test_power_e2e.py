"""Cluster Energy Saving with real processes: the suspend program stops a real trellis-noded
and the resume program starts it again; the power state survives a master restart.

One master, two nodes of 4 emulated GPUs, ``[master.power]`` on with a buffer of one idle
node and decisions every half second. The idle second node is powered down; a job of 8 GPUs
can only run with it, so the master wakes it, the node rejoins and the job runs. Before that,
the suspend program is first missing, then failing, then hanging: each attempt gives a
``power_failed`` event and leaves the node on and usable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import time
from pathlib import Path

from demo.cluster import TREE, LocalCluster, default_job_user

USER = default_job_user()


def script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def events_of(cluster: LocalCluster, kind: str) -> list[dict]:
    rows = cluster.client().call("events", {"tail": 1000})["events"]
    return [e for e in rows if e["kind"] == kind]


def status_of(cluster: LocalCluster, node: str) -> str:
    nodes = cluster.client().call("nodes")["nodes"]
    return next(n["status"] for n in nodes if n["name"] == node)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_power_down_wake_and_run(make_cluster, shared_dir: Path) -> None:
    root = shared_dir / f"power-{os.getpid()}"
    root.mkdir()
    pids = root / "pids"
    pids.mkdir()
    suspend = root / "suspend"
    resume = root / "resume"
    cluster: LocalCluster = make_cluster(nodes=2, gpus_per_node=4, extra_master={"power": {
        "enabled": True, "suspend_program": str(suspend), "resume_program": str(resume),
        "check_interval_s": 0.5, "buffer_nodes": 1, "history_threshold": -1.0,
        "future_threshold": -1.0e9, "cooldown_steps": 0, "forecast": False,
        "program_timeout_s": 2.0, "resume_timeout_s": 60.0}})
    first, second = cluster.node_name(1), cluster.node_name(2)
    daemon = cluster.node_daemons[second]
    assert daemon.proc is not None
    (pids / second).write_text(str(daemon.proc.pid))
    resumed: list[int] = []
    try:
        # 1. Missing program: a clear event, the node stays usable.
        cluster.wait_for("a power_failed event (missing program)",
                         lambda: events_of(cluster, "power_failed"))
        failed = events_of(cluster, "power_failed")[0]
        assert failed["node"] == second and "cannot be run" in failed["detail"]["error"]
        assert status_of(cluster, second) == "ready"
        # 2. A failing program.
        script(suspend, "echo 'no BMC answer' >&2\nexit 3\n")
        cluster.wait_for("a power_failed event (exit 3)", lambda: any(
            "exited with status 3" in e["detail"]["error"]
            and "no BMC answer" in e["detail"]["error"]
            for e in events_of(cluster, "power_failed")))
        assert status_of(cluster, second) in ("ready", "powering_down")
        # 3. A hanging program: killed after program_timeout_s.
        script(suspend, "sleep 30\n")
        cluster.wait_for("a power_failed event (timeout)", lambda: any(
            "did not finish" in e["detail"]["error"] for e in events_of(cluster, "power_failed")),
            timeout=30)
        # The node took jobs all along: a job placed now runs there or on the first node.
        job = cluster.client().call("submit", {"job": {
            "name": "while-failing", "command": ["sleep", "0.2"], "user": USER, "gpus": 4,
            "cpus": 1}})["job"]["id"]
        cluster.wait_for("the job to finish", lambda: cluster.client().call(
            "job", {"id": job})["job"]["state"] == "finished")
        # 4. The real programs: suspend stops the node's daemon, resume starts it again.
        script(suspend, f'for n in "$@"; do kill -TERM "$(cat {pids}/$n)"; done\n')
        script(resume, "".join([
            'for n in "$@"; do\n',
            f'  PYTHONPATH={TREE} setsid {sys.executable} -m noded.main -c {cluster.root}/$n.toml'
            f' >> {root}/$n.resumed.log 2>&1 < /dev/null &\n',
            f'  echo $! > {pids}/$n\n',
            "done\n"]))
        cluster.wait_for("the second node powered down",
                         lambda: status_of(cluster, second) == "powered_down", timeout=30)
        cluster.wait_for("its daemon to exit", lambda: not alive(daemon.proc.pid), timeout=15)
        assert status_of(cluster, first) == "ready"
        # The state is journalled: a master killed and restarted still knows it.
        cluster.restart_master()
        cluster.wait_for("the first node back", lambda: status_of(cluster, first) == "ready")
        nodes = cluster.client().call("nodes")["nodes"]
        assert {n["name"]: n["status"] for n in nodes}[second] == "powered_down"
        # A job of 8 GPUs fits only with the powered-down node: it waits, the node is woken.
        big = cluster.client().call("submit", {"job": {
            "name": "needs-both", "command": ["sleep", "1"], "user": USER, "gpus": 8,
            "cpus": 2}})["job"]["id"]
        cluster.wait_for("a wake-up", lambda: events_of(cluster, "power_powering_up"))
        pid = int(cluster.wait_for("the resumed daemon's pid", lambda: (
            (pids / second).read_text().strip() if (pids / second).read_text().strip()
            != str(daemon.proc.pid) else None), timeout=30))
        resumed.append(pid)
        cluster.wait_for("the big job to run on both nodes", lambda: cluster.client().call(
            "job", {"id": big})["job"]["state"] in ("running", "finished"), timeout=60)
        placed = cluster.client().call("job", {"id": big})["job"]["placement"]
        assert {a["node"] for a in placed} == {first, second}
        cluster.wait_for("the big job to finish", lambda: cluster.client().call(
            "job", {"id": big})["job"]["state"] == "finished", timeout=60)
        assert events_of(cluster, "power_on")  # the node rejoined: its state was cleared
        power = cluster.client().call("power")
        assert power["wakeups"] >= 1  # counted since the restart
        import urllib.request
        scraped = urllib.request.urlopen(f"{cluster.url}/metrics", timeout=10).read().decode()
        assert "trellis_power_wakeups_total" in scraped
        assert "trellis_nodes_powered_down" in scraped
    finally:
        for pid in resumed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while resumed and any(alive(p) for p in resumed) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in resumed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
