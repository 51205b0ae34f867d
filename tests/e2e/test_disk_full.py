"""The master's journal on a full disk: submissions are refused with store_unavailable,
nothing acknowledged is lost, and the master recovers when space returns."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from control.client import MasterClient, RpcError
from demo.cluster import LocalCluster, default_job_user
from tests.conftest import needs_root

USER = default_job_user()


@pytest.fixture
def small_disk(shared_dir: Path) -> Iterator[Path]:
    mount = shared_dir / f"trellis-test-disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "trellis-test-disk", str(mount)],
                   check=True, capture_output=True, timeout=30)
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True,
                          timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def submit(client: MasterClient, job_id: str) -> None:
    # A fat environment fills the journal quickly.
    client.call("submit", {"id": job_id, "job": {
        "name": "fill", "command": ["true"], "user": USER, "kind": "cpu",
        "env": {f"PAD{i}": "x" * 4000 for i in range(4)}}})


@needs_root
def test_full_disk_refuses_then_recovers(small_disk: Path, shared_dir: Path) -> None:
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(shared_dir / prefix, nodes=1, prefix=prefix,
                           cgroup_mode="affinity",
                           extra_master={"state_dir": str(small_disk / "master")})
    acked: list[str] = []
    refused: list[str] = []
    try:
        cluster.start()
        client = cluster.client(timeout=30)
        client.call("drain", {"node": cluster.node_name(1)})  # journal only, nothing runs
        errors: list[RpcError] = []
        for i in range(2000):
            job_id = f"fill-{i:04d}"
            try:
                submit(client, job_id)
                acked.append(job_id)
            except RpcError as exc:
                errors.append(exc)
                refused.append(job_id)
                if len(errors) >= 5:
                    break
        assert errors, "the 2 MiB disk never filled up"
        assert len(acked) > 10
        for exc in errors:
            assert exc.code == "store_unavailable", exc
            assert "disk is full" in exc.message
        # Still serving, and still answering correctly about what it accepted.
        assert client.call("ping")["version"]
        listed = {j["id"] for j in client.call("jobs")["jobs"]}
        assert set(acked) <= listed and not set(refused) & listed

        # A node that reconnects meanwhile is still registered and reconciled.
        node = cluster.node_daemons[cluster.node_name(1)]
        node.stop()
        node.start(cluster._env())
        deadline = time.monotonic() + 20
        while client.call("nodes")["nodes"][0]["status"] != "drained":
            assert time.monotonic() < deadline, cluster.log("master")
            time.sleep(0.2)
        assert "rejected" not in cluster.log(cluster.node_name(1))

        # Space returns: submissions are accepted again without a restart.
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True,
                       capture_output=True, timeout=30)
        deadline = time.monotonic() + 10
        while True:
            try:
                submit(client, "after-space")
                acked.append("after-space")
                break
            except RpcError as exc:
                assert exc.code == "store_unavailable"
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for i in range(20):
            submit(client, f"more-{i}")
            acked.append(f"more-{i}")

        cluster.restart_master()  # kill -9: everything acknowledged must be on disk
        listed = {j["id"] for j in cluster.client().call("jobs")["jobs"]}
        missing = set(acked) - listed
        assert not missing, f"acknowledged but lost: {sorted(missing)[:5]}"
        assert not set(refused) & listed, "refused submissions were stored"
        assert "Traceback" not in cluster.log("master")
    finally:
        cluster.close()
