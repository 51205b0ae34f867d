"""The node lease with real daemons: a node cut off from every master stops its requeueable
part before the master requeues it elsewhere, and leaves a --no-requeue part running.

* A node's link is cut (its own network namespace, every frame dropped at a private bridge:
  demo/netlab.py). Its requeueable job is stopped on the node (the job records the moment
  it got SIGTERM) before the master journals the requeue that runs it on the other node; the
  --no-requeue job keeps running there through the cut, although the master ended it
  node_lost. When the link is back the node reports what it stopped (``part_fenced`` in
  trellisctl events).
* The master is frozen (SIGSTOP) longer than the lease: the node stops the requeueable job,
  not the other; once the master is resumed, the node's report makes the master requeue the
  job (not fail it), and the other job was never stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from demo.cluster import LocalCluster, default_job_user
from demo.harness import live_environs
from demo.netlab import NetLab
from tests.conftest import needs_root
from tests.e2e.cli import ctl as plain_ctl

pytestmark = needs_root

USER = default_job_user()
# The shortest lease these settings allow: node_grace_s 1 + max_grace_s 1 + 1.5 x
# node_heartbeat_s 1 + node_fence_margin_s 1.5 = 5 <= node_lost_s 8. A requeueable part is
# stopped after 8 - (1.5 + 1.5) - 1 = 4 s without a word from the master, and is dead (its
# grace is 1 s, its job exits on SIGTERM) 3 s before the master requeues it.
MASTER = {"node_lost_s": 8.0, "node_heartbeat_s": 1.0, "max_grace_s": 1.0,
          "node_fence_margin_s": 1.5}


def marking(marks: Path) -> list[str]:
    """A job that appends "NODE RESTARTS" to its own file, and on SIGTERM "NODE RESTARTS
    TIME" (the wall clock) to its .stops file before it exits."""
    own = f'{marks}/"$TRELLIS_JOB_ID"'
    return ["sh", "-c",
            f'echo "$TRELLIS_NODE $TRELLIS_RESTART_COUNT" >> {own}; '
            f"trap 'echo \"$TRELLIS_NODE $TRELLIS_RESTART_COUNT $(date +%s.%N)\" "
            f">> {own}.stops; exit 143' TERM; sleep 300 & wait"]


def ctl(cluster: LocalCluster, *args: str, json_out: bool = True) -> tuple[int, Any, str]:
    """trellisctl as an admin (with the cluster's token where it has them)."""
    token = (["--token-file", str(cluster.token_file("admin"))] if "admin" in cluster.tokens
             else [])
    return plain_ctl(cluster, *token, *args, json_out=json_out)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def live_parts(job_id: str) -> set[str]:
    """The nodes where a live process of ``job_id`` runs (its TRELLIS_NODE), from /proc."""
    return {env.get("TRELLIS_NODE", "") for env in live_environs()
            if env.get("TRELLIS_JOB_ID") == job_id}


def job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return cluster.client().call("job", {"id": job_id})["job"]  # type: ignore[no-any-return]


def events(cluster: LocalCluster, job_id: str) -> list[dict[str, Any]]:
    return [e for e in cluster.client().call("events", {"tail": 500})["events"]
            if e["job"] == job_id]


def submit_both(cluster: LocalCluster, marks: Path, first: str, second: str | None) -> None:
    """"again" (requeueable: the default) and "once" (--no-requeue), both on ``first``."""
    client = cluster.client()
    if second is not None:
        client.call("drain", {"node": second})
    code, _, err = ctl(cluster, "submit", "--id", "again", "--requeue", "--gpus", "1",
                       "--cpus", "1", "--user", USER, "--", *marking(marks))
    assert code == 0, err
    code, _, err = ctl(cluster, "submit", "--id", "once", "--no-requeue", "--gpus", "1",
                       "--cpus", "1", "--user", USER, "--", *marking(marks))
    assert code == 0, err
    cluster.wait_for("both jobs running on the first node", lambda: all(
        lines(marks / j) == [f"{first} 0"] for j in ("again", "once")))
    if second is not None:
        client.call("undrain", {"node": second})


def test_a_cut_off_node_stops_its_requeueable_part_before_the_requeue(
        shared_dir: Path) -> None:
    marks = shared_dir / "marks"
    marks.mkdir()
    os.chmod(marks, 0o777)
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    with NetLab() as lab:
        here = lab.add("host", own_namespace=False)
        far = lab.add("n1")
        first, second = f"{prefix}-n1", f"{prefix}-n2"
        with LocalCluster(shared_dir / prefix, prefix=prefix, nodes=2, gpus_per_node=2,
                          node_grace_s=1.0, listen_host=here.address, auth=True,
                          node_wrapper={first: far.wrapper},
                          extra_master=MASTER) as cluster:
            cluster.start()
            submit_both(cluster, marks, first, second)

            lab.cut("n1", "drop")
            cluster.wait_for("the requeueable job running on the other node", lambda: lines(
                marks / "again") == [f"{first} 0", f"{second} 1"], 60)
            # Its part on the cut-off node got SIGTERM before the master decided to requeue
            # it, and no longer runs; the --no-requeue job still runs there.
            [stopped] = lines(marks / "again.stops")
            node, restarts, at = stopped.split()
            assert (node, restarts) == (first, "0")
            [requeue] = [e for e in events(cluster, "again")
                         if e["kind"] == "requeue_requested"]
            assert float(at) < requeue["time"], (float(at), requeue["time"])
            # (Polled: /proc is read while processes come and go.)
            cluster.wait_for("the requeueable job running on the other node only",
                             lambda: live_parts("again") == {second}, 10)
            assert job(cluster, "once")["state"] == "node_lost"
            assert live_parts("once") == {first}, live_parts("once")
            assert lines(marks / "once.stops") == []

            lab.restore("n1")
            cluster.wait_for(f"{first} back", lambda: {
                n["name"]: n["status"] for n in cluster.client().call("nodes")["nodes"]
            }[first] == "ready", 60)
            # What it stopped on its own is reported and journalled: trellisctl events.
            cluster.wait_for("the fenced part journalled", lambda: any(
                e["kind"] == "part_fenced" and e["node"] == first
                for e in events(cluster, "again")), 30)
            code, text, err = ctl(cluster, "events", "--tail", "200", json_out=False)
            assert code == 0 and "part_fenced" in text, err
            [fenced] = [e for e in events(cluster, "again") if e["kind"] == "part_fenced"]
            assert fenced["detail"]["reason"].startswith(
                f"stopped by node {first}: no contact with any master for ")
            assert fenced["detail"]["part"] == "stale"  # the master had requeued it
            again = job(cluster, "again")
            assert (again["state"], again["restarts"], again["nodes"]) == (
                "running", 1, [second])
            # The ended job's part is stopped now that its node can hear it (as before).
            cluster.wait_for("the ended job's part stopped on return",
                             lambda: not live_parts("once"), 30)


def test_a_frozen_master_gets_the_stopped_part_back_as_a_requeue(
        make_cluster, shared_dir: Path) -> None:
    marks = shared_dir / "marks"
    marks.mkdir()
    os.chmod(marks, 0o777)
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=2, node_grace_s=1.0,
                                         extra_master=MASTER)
    node = cluster.node_name(1)
    submit_both(cluster, marks, node, None)
    assert cluster.master is not None and cluster.master.proc is not None
    pid = cluster.master.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen_at = time.monotonic()
        cluster.wait_for("the requeueable part stopped by its node",
                         lambda: lines(marks / "again.stops"), 30)
        assert time.monotonic() - frozen_at < MASTER["node_lost_s"]
        assert not live_parts("again") and live_parts("once") == {node}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    # Back: the node's report of what it stopped makes the master requeue the job (its
    # restart count one higher), not fail it; the --no-requeue job was never stopped.
    cluster.wait_for("the requeued job running again", lambda: lines(marks / "again") == [
        f"{node} 0", f"{node} 1"], 60)
    again = job(cluster, "again")
    assert (again["state"], again["restarts"]) == ("running", 1)
    kinds = [e["kind"] for e in events(cluster, "again")]
    assert "part_fenced" in kinds and "requeued" in kinds and "failed" not in kinds
    [fenced] = [e for e in events(cluster, "again") if e["kind"] == "part_fenced"]
    assert fenced["detail"]["part"] == "mine" and fenced["node"] == node
    once = job(cluster, "once")
    assert (once["state"], once["restarts"]) == ("running", 0)
    assert lines(marks / "once") == [f"{node} 0"] and lines(marks / "once.stops") == []
    assert live_parts("once") == {node}
