"""A job's memory_mib is a real kernel limit: a job that goes past it is stopped by the
kernel's OOM killer, and the master records why.

Runs on the cgroup hierarchy this machine has (noded picks it: v1 memory controller, or v2's
memory.max); the count comes from memory.oom_control (v1) or memory.events (v2).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from demo.cluster import LocalCluster, default_job_user
from tests.conftest import needs_root

pytestmark = [needs_root, pytest.mark.root]

# Writes every byte of 256 MiB, far past its 64 MiB limit (no swap here to hide in).
HOG = "x = b'x' * (256 << 20); import time; time.sleep(30)"


def test_a_job_past_its_memory_limit_is_oom_killed_and_the_master_says_so(
        make_cluster: Callable[..., LocalCluster]) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=1)
    client = cluster.client()
    hog = client.call("submit", {"job": {
        "name": "hog", "user": default_job_user(), "kind": "cpu", "gpus": 0, "cpus": 1,
        "memory_mib": 64, "command": ["python3", "-c", HOG]}})["job"]["id"]
    fine = client.call("submit", {"job": {
        "name": "fine", "user": default_job_user(), "kind": "cpu", "gpus": 0, "cpus": 1,
        "memory_mib": 64, "command": ["python3", "-c", "x = b'x' * (8 << 20)"]}})["job"]

    def ended(job_id: str) -> Callable[[], dict | None]:
        def check() -> dict | None:
            reply = client.call("job", {"id": job_id})
            done = reply["job"]["state"] in ("failed", "finished", "cancelled")
            return {**reply["job"], "events": reply["events"]} if done else None
        return check

    job = cluster.wait_for("the hog to end", ended(hog), timeout=60)
    assert job["state"] == "failed"
    seen = json.dumps({k: v for k, v in job.items() if k != "events"}, default=str)
    assert job["signal"] == 9, seen  # the OOM killer's SIGKILL
    assert job["reason"].startswith("out of memory: the kernel's OOM killer stopped it"), job
    assert "(64 MiB)" in job["reason"]
    reasons = [e["detail"].get("reason") for e in job["events"] if e["kind"] == "failed"]
    assert reasons and reasons[-1] == job["reason"]
    # A job within its limit is untouched.
    assert cluster.wait_for("the other to end", ended(fine["id"]), timeout=60)["state"] \
        == "finished"
    assert "killed by the OOM killer" in cluster.log(cluster.node_name(1))
