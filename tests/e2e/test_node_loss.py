"""Node loss and GPU failures with real daemons: a noded killed with SIGKILL and kept down
is declared lost after node_lost_s; its requeueable job runs again on the other node with
TRELLIS_RESTART_COUNT=1, a --no-requeue job ends node_lost naming the node. An Xid 79
raised on an emulated GPU stops and requeues the job on it and keeps the GPU out of service
until ``trellisctl gpu reset``; an application Xid changes nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from demo.cluster import LocalCluster, default_job_user
from noded.gpu.emulated import write_fault
from tests.e2e.cli import ctl

USER = default_job_user()


def marking(marks: Path) -> list[str]:
    """A job that appends "NODE RESTARTS" to its own file in ``marks``, then runs on."""
    return ["sh", "-c", f'echo "$TRELLIS_NODE $TRELLIS_RESTART_COUNT" >> '
                        f'{marks}/"$TRELLIS_JOB_ID"; exec sleep 300']


def lines(marks: Path, job_id: str) -> list[str]:
    path = marks / job_id
    return path.read_text().splitlines() if path.exists() else []


def job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return cluster.client().call("job", {"id": job_id})["job"]  # type: ignore[no-any-return]


def test_a_killed_node_is_lost_and_its_jobs_requeued_or_ended(make_cluster,
                                                              shared_dir: Path) -> None:
    # node_lost_s as short as the node lease allows (node_grace_s + max_grace_s + 1.5 x
    # node_heartbeat_s + node_fence_margin_s); the node is killed, so stops nothing itself.
    cluster: LocalCluster = make_cluster(nodes=2, gpus_per_node=2, node_grace_s=1.0,
                                         extra_master={"node_lost_s": 5.0,
                                                       "node_heartbeat_s": 1.0,
                                                       "max_grace_s": 1.0,
                                                       "node_fence_margin_s": 0.5})
    marks = shared_dir / "marks"
    marks.mkdir()
    os.chmod(marks, 0o777)
    first, second = cluster.node_name(1), cluster.node_name(2)
    client = cluster.client()
    # Both jobs on the first node: the second is drained while they are placed.
    client.call("drain", {"node": second})
    client.call("submit", {"id": "again", "job": {
        "name": "again", "command": marking(marks), "user": USER, "gpus": 1, "cpus": 1}})
    code, _, err = ctl(cluster, "submit", "--id", "once", "--no-requeue", "--gpus", "1",
                       "--cpus", "1", "--user", USER, "--", *marking(marks))
    assert code == 0, err
    cluster.wait_for("both jobs running on the first node", lambda: all(
        lines(marks, j) == [f"{first} 0"] for j in ("again", "once")))
    client.call("undrain", {"node": second})

    cluster.node_daemons[first].stop(signal.SIGKILL)  # and it stays down
    cluster.wait_for("the requeued job running on the other node",
                     lambda: lines(marks, "again") == [f"{first} 0", f"{second} 1"], 30)
    again = job(cluster, "again")
    assert again["state"] == "running" and again["restarts"] == 1
    assert again["nodes"] == [second]
    once = job(cluster, "once")
    assert once["state"] == "node_lost" and once["restarts"] == 0
    assert once["reason"].startswith(f"node {first} lost") and "--no-requeue" in once["reason"]
    nodes = {n["name"]: n["status"] for n in client.call("nodes")["nodes"]}
    assert nodes == {first: "down", second: "ready"}
    # What an operator reads: the node down, the job's restart and its journal.
    code, text, err = ctl(cluster, "show", "again", json_out=False)
    assert code == 0, err
    assert "Restarts:   1" in text and "requeued" in text and "node_down" not in text
    kinds = [e["kind"] for e in client.call("events", {"tail": 200})["events"]]
    assert "node_down" in kinds and "requeued" in kinds and "node_lost" in kinds
    code, text, _ = ctl(cluster, "nodes", json_out=False)
    assert f"{first}" in text and "down" in text


def test_a_fatal_xid_requeues_the_job_until_the_gpu_is_reset(make_cluster,
                                                            shared_dir: Path) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=2)
    marks = shared_dir / "marks"
    marks.mkdir()
    os.chmod(marks, 0o777)
    node = cluster.node_name(1)
    client = cluster.client()
    client.call("submit", {"id": "train", "job": {
        "name": "train", "command": marking(marks), "user": USER, "gpus": 1, "cpus": 1}})
    cluster.wait_for("the job running", lambda: lines(marks, "train") == [f"{node} 0"])
    [gpu] = job(cluster, "train")["placement"][0]["gpus"]
    other = 1 - gpu
    faults = cluster.root / node / "gpu-faults"
    # An application Xid on the other GPU is the application's business: nothing happens.
    write_fault(faults, other, 13)
    write_fault(faults, gpu, 79)
    cluster.wait_for("the job running again on the other GPU",
                     lambda: lines(marks, "train") == [f"{node} 0", f"{node} 1"], 30)
    train = job(cluster, "train")
    assert train["state"] == "running" and train["restarts"] == 1
    assert train["placement"][0]["gpus"] == [other]
    detail = client.call("node", {"node": node})["node"]
    assert detail["gpus_unhealthy"] == [gpu]
    fault = next(g["fault"] for g in detail["gpu_detail"] if g["index"] == gpu)
    assert fault["xid"] == 79 and fault["fatal"] and "fallen off the bus" in fault["reason"]
    code, text, _ = ctl(cluster, "node", node, json_out=False)
    assert code == 0 and "out (Xid 79)" in text and f"trellisctl gpu reset {node} {gpu}" in text

    # Refusals, one sentence each, nothing changed.
    code, _, err = ctl(cluster, "gpu", "reset", node, str(other))
    assert code == 1 and err.strip() == (f"trellisctl: gpu_in_service: GPU {other} of node "
                                         f"{node} is in service; only a GPU out of service "
                                         "can be reset")
    code, _, err = ctl(cluster, "gpu", "reset", "no-such-node", "0")
    assert code == 1 and "unknown_node: node 'no-such-node' is not registered" in err
    code, _, err = ctl(cluster, "gpu", "reset", node, "x")
    assert code == 2 and "INDEX must be a GPU's index" in err
    assert client.call("node", {"node": node})["node"]["gpus_unhealthy"] == [gpu]

    code, out, err = ctl(cluster, "gpu", "reset", node, str(gpu))
    assert code == 0 and out["healthy"] and out["was"]["xid"] == 79, err
    cluster.wait_for("the GPU back in service", lambda: client.call(
        "node", {"node": node})["node"]["gpus_unhealthy"] == [])
    # The node cleared its own record too: a job is placed on the GPU again.
    client.call("submit", {"id": "next", "job": {
        "name": "next", "command": marking(marks), "user": USER, "gpus": 1, "cpus": 1}})
    cluster.wait_for("a job on the returned GPU", lambda: lines(marks, "next"))
    assert job(cluster, "next")["placement"][0]["gpus"] == [gpu]
    kinds = [e["kind"] for e in client.call("events", {"tail": 200})["events"]]
    assert "gpu_fault" in kinds and "gpu_reset" in kinds


def test_a_passing_health_check_returns_the_gpu(make_cluster, shared_dir: Path) -> None:
    ok = shared_dir / "gpu-ok"
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=2, node_sections={"gpu": {
        "health_check": ["test", "-e", str(ok)], "health_check_s": 0.3}})
    node = cluster.node_name(1)
    client = cluster.client()

    def unhealthy() -> list[int]:
        return client.call("node", {"node": node})["node"]["gpus_unhealthy"]  # type: ignore[no-any-return]

    write_fault(cluster.root / node / "gpu-faults", 0, 48)
    cluster.wait_for("GPU 0 out of service", lambda: unhealthy() == [0])
    # The check fails while the operator's condition does not hold: the GPU stays out.
    cluster.wait_for("a few checks", lambda: "health check failed" in cluster.log(node))
    assert unhealthy() == [0]
    ok.touch()
    cluster.wait_for("GPU 0 back in service", lambda: unhealthy() == [], 30)
    # The master applies the return, then journals it: on a busy machine the event may land
    # a moment after the GPU reads healthy.
    rows = cluster.wait_for("the return journalled", lambda: [
        e for e in client.call("events", {"tail": 100})["events"]
        if e["kind"] == "gpu_returned"], 30)
    assert rows[0]["detail"]["reason"] == "health check passed"
