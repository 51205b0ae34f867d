"""Time limits end to end, real master and node daemons, real job processes: a job that
traps its warning signal records it and then ends ``timeout`` at its limit; a master killed
and restarted while such a job runs still stops it at the limit counted from its journalled
start, without warning it twice; a job ignoring SIGTERM is SIGKILLed after its own grace;
the default limit, the maximum's gate and its opening by SIGHUP; bad options refused."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from demo.cluster import LocalCluster, default_job_user
from tests.e2e.cli import ctl

USER = default_job_user()


def trapping_job(shared: Path, name: str) -> list[str]:
    """A shell job that records its start and every SIGUSR1 (with the time), then sleeps on.
    The whole process group gets the signal: each short ``sleep`` dies of it and the shell's
    trap runs."""
    out = shared / name
    script = (f"trap 'date +%s.%N >> {out}.warned' USR1; date +%s.%N > {out}.started; "
              "while true; do sleep 0.2; done")
    return ["sh", "-c", script]


def submit(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    code, out, err = ctl(cluster, "submit", "--user", USER, "--kind", "cpu", "--cpus", "1",
                         *args)
    assert code == 0, err
    return out["job"]


def job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return cluster.client().call("job", {"id": job_id})


def ended(cluster: LocalCluster, job_id: str, timeout: float = 60) -> dict[str, Any]:
    return cluster.wait_for(f"{job_id} to end", lambda: (
        (found := job(cluster, job_id))["job"]["state"] not in ("queued", "starting",
                                                                "running") and found),
        timeout)


def test_warning_then_timeout(make_cluster, shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=1,
                                         extra_master={"stop_grace_s": 2})
    submitted = submit(cluster, "--time", "0:05", "--signal", "USR1@3", "--",
                       *trapping_job(shared_dir, "warned"))
    assert submitted["time_limit_s"] == 5 and submitted["warning"] == "USR1@3"
    job_id = submitted["id"]
    # B: signals the batch shell only, not the child shell it started (which would say so).
    shell_only = shared_dir / "shell-only"
    child = shared_dir / "child.sh"
    child.write_text(f"trap 'echo child >> {shell_only}' USR1\n"
                     "while true; do sleep 0.2; done\n")
    leader = shared_dir / "leader.sh"
    leader.write_text(f"sh {child} &\ntrap 'echo leader >> {shell_only}' USR1\n"
                      "while true; do wait; done\n")
    batch = submit(cluster, "--time", "0:05", "--signal", "B:USR1@3", "--", "sh",
                   str(leader))["id"]
    running = cluster.wait_for("it to run", lambda: (
        (found := job(cluster, job_id)["job"])["state"] == "running" and found), 30)
    assert running["time_limit_at"] == running["start_time"] + 5
    code, text, err = ctl(cluster, "show", job_id, json_out=False)
    assert code == 0 and "Time limit: 0:00:05 (warning USR1@3, reached at " in text, err

    result = ended(cluster, job_id)
    view = result["job"]
    assert view["state"] == "timeout", view
    assert view["reason"] == "time limit 0:00:05 reached"
    assert view["time_limit_at"] is None  # ended
    start, end = view["start_time"], view["end_time"]
    assert 5.0 <= end - start < 5.0 + 2 + 3  # at the limit, within the grace and some slack
    # The job saw the warning once, about 3 s before its limit, while it ran.
    marks = [float(x) for x in (shared_dir / "warned.warned").read_text().split()]
    assert len(marks) == 1
    assert start + 1.0 < marks[0] < start + 4.5
    kinds = [e["kind"] for e in result["events"]]
    assert kinds.index("warned") < kinds.index("stop_requested") < kinds.index("timeout")
    warned = next(e for e in result["events"] if e["kind"] == "warned")
    assert warned["detail"]["signal"] == "SIGUSR1" and len(warned["detail"]["nodes"]) == 1
    assert ended(cluster, batch)["job"]["state"] == "timeout"
    assert shell_only.read_text().split() == ["leader"]
    code, listed, err = ctl(cluster, "jobs", "--state", "timeout")
    assert code == 0 and {j["id"] for j in listed["jobs"]} == {job_id, batch}, err


def test_a_restarted_master_stops_the_job_at_its_journalled_limit(
        make_cluster, shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=1,
                                         extra_master={"stop_grace_s": 2})
    job_id = submit(cluster, "--time", "0:09", "--signal", "USR1@7", "--",
                    *trapping_job(shared_dir, "restart"))["id"]
    warned_file = shared_dir / "restart.warned"
    # Warned at start + 2 (journalled), then the master dies and comes back at about start + 3.
    cluster.wait_for("the warning", warned_file.exists, 30)
    cluster.wait_for("the warning in the journal", lambda: any(
        e["kind"] == "warned" for e in job(cluster, job_id)["events"]), 10)
    cluster.restart_master(signal.SIGKILL)
    cluster.wait_nodes(1)
    after = job(cluster, job_id)["job"]
    assert after["state"] == "running" and after["time_limit_at"] == after["start_time"] + 9

    result = ended(cluster, job_id)
    view = result["job"]
    assert view["state"] == "timeout" and view["reason"] == "time limit 0:00:09 reached"
    # Counted from the journalled start, not from the restart.
    assert 9.0 <= view["end_time"] - view["start_time"] < 9.0 + 2 + 3
    started = float((shared_dir / "restart.started").read_text())
    assert abs(started - view["start_time"]) < 2
    # The journalled warning was not sent again by the new master.
    assert len(warned_file.read_text().split()) == 1
    assert [e["kind"] for e in result["events"]].count("warned") == 1


def test_grace_default_maximum_and_bad_input(make_cluster, shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=1, extra_master={
        "stop_grace_s": 30, "max_grace_s": 4, "default_time_limit_s": 600,
        "max_time_limit_s": 3600})
    stubborn = ["sh", "-c", f"trap '' TERM; date +%s.%N > {shared_dir}/stubborn.started; "
                            "while true; do sleep 0.2; done"]
    # Its own grace (2 s) instead of stop_grace_s (30 s): SIGKILLed 2 s after SIGTERM.
    own = submit(cluster, "--time", "0:03", "--grace", "2", "--", *stubborn)
    # A grace above max_grace_s (4 s) is capped to it.
    capped = submit(cluster, "--time", "0:03", "--grace", "100", "--", *stubborn)
    # No --time: the master's default, written into the job.
    default = submit(cluster, "--", "sleep", "300")
    assert default["time_limit_s"] == 600
    for submitted, grace in ((own, 2.0), (capped, 4.0)):
        view = ended(cluster, submitted["id"])["job"]
        assert view["state"] == "timeout" and view["signal"] == signal.SIGKILL, view
        took = view["end_time"] - view["start_time"]
        assert 3.0 + grace <= took < 3.0 + grace + 3, (submitted["id"], took)

    # Over the maximum: it waits with the reason, not refused, though a core is free (the
    # default job holds one of the node's cores, the stubborn ones have ended); SIGHUP with
    # a larger maximum lets it run.
    cluster.wait_for("the default job to run", lambda: job(
        cluster, default["id"])["job"]["state"] == "running", 30)
    long = submit(cluster, "--time", "2:00:00", "--", "sleep", "300")
    assert long["reason"] == "time limit 2:00:00 exceeds the maximum 1:00:00"
    assert long["state"] == "queued"
    node = cluster.client().call("nodes")["nodes"][0]
    assert node["cpus_free"] >= 1 and job(cluster, long["id"])["job"]["state"] == "queued"
    config = cluster.root / "master.toml"
    config.write_text(config.read_text().replace("max_time_limit_s = 3600",
                                                 "max_time_limit_s = 86400"))
    assert cluster.master is not None and cluster.master.proc is not None
    cluster.master.proc.send_signal(signal.SIGHUP)
    cluster.wait_for("it to run once the maximum is raised", lambda: job(
        cluster, long["id"])["job"]["state"] == "running", 30)

    # Bad input: one sentence, exit 2, nothing submitted.
    before = len(cluster.client().call("jobs")["jobs"])
    for args, says in ((["--time", "1:2:3:4"], "is not one of Slurm's time forms"),
                       (["--signal", "NOPE@5"], "is not a signal a job may ask for"),
                       (["--grace", "-3"], "must be 0 to 3600 seconds")):
        code, _, err = ctl(cluster, "submit", "--user", USER, "--kind", "cpu", *args, "--",
                           "true")
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert len(cluster.client().call("jobs")["jobs"]) == before
