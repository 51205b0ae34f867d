"""Network partition of a real node daemon running in its own network namespace.

The node reaches the master over a veth pair; the test cuts the link (link down, or 100 %
netem loss both ways). The master must notice, mark the node unreachable after node_grace_s,
place new work elsewhere and keep the node's jobs; when the link returns the node reconciles
(a job that ended meanwhile is reported with its status) and no job runs twice.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from demo.cluster import LocalCluster, default_job_user
from tests.conftest import needs_root

USER = default_job_user()


@dataclass
class Netns:
    name: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str

    def ns(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[Netns]:
    tag = uuid.uuid4().hex[:8]
    # Link-local /30 (never routed off the veth); random so parallel runs do not collide.
    a, b = random.randint(100, 199), random.randrange(0, 64) * 4
    net = Netns(f"trellis-test-{tag}", f"tt{tag}h", f"tt{tag}n",
                f"169.254.{a}.{b + 1}", f"169.254.{a}.{b + 2}")
    try:
        sh("ip", "netns", "add", net.name)
        sh("ip", "link", "add", net.host_if, "type", "veth", "peer", "name", net.ns_if)
        sh("ip", "link", "set", net.ns_if, "netns", net.name)
        sh("ip", "addr", "add", f"{net.host_ip}/30", "dev", net.host_if)
        sh("ip", "link", "set", net.host_if, "up")
        sh(*net.ns("ip", "addr", "add", f"{net.ns_ip}/30", "dev", net.ns_if))
        sh(*net.ns("ip", "link", "set", net.ns_if, "up"))
        sh(*net.ns("ip", "link", "set", "lo", "up"))
        yield net
    finally:
        pids = sh("ip", "netns", "pids", net.name, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        sh("ip", "netns", "del", net.name, check=False)
        sh("ip", "link", "del", net.host_if, check=False)


NFT_DROP = """table inet trellis_test_cut {
    chain input { type filter hook input priority -300; policy drop; }
    chain output { type filter hook output priority -300; policy drop; }
}
"""


def cut(net: Netns, how: str) -> str:
    """Cut the node off; returns how it was done (for heal)."""
    if how == "link_down":
        sh("ip", "link", "set", net.host_if, "down")
        return how
    # 100 % loss both ways: tc netem where the kernel has it, else netfilter dropping every
    # packet in and out of the namespace (the link stays up, packets vanish).
    netem = sh("tc", "qdisc", "add", "dev", net.host_if, "root", "netem", "loss", "100%",
               check=False)
    if netem.returncode == 0:
        sh(*net.ns("tc", "qdisc", "add", "dev", net.ns_if, "root", "netem", "loss", "100%"))
        return "netem"
    if shutil.which("nft") is None:
        pytest.skip("neither tc netem nor nft is available to drop packets")
    subprocess.run(net.ns("nft", "-f", "-"), input=NFT_DROP, text=True, check=True,
                   capture_output=True, timeout=30)
    return "nft"


def heal(net: Netns, how: str) -> None:
    if how == "link_down":
        sh("ip", "link", "set", net.host_if, "up")
    elif how == "netem":
        sh("tc", "qdisc", "del", "dev", net.host_if, "root")
        sh(*net.ns("tc", "qdisc", "del", "dev", net.ns_if, "root"))
    else:
        sh(*net.ns("nft", "delete", "table", "inet", "trellis_test_cut"))


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@needs_root
@pytest.mark.parametrize("how", ["link_down", "total_loss"])
def test_partitioned_node_is_fenced_and_reconciles(netns: Netns, shared_dir: Path,
                                                   how: str) -> None:
    prefix = f"trellis-test-{uuid.uuid4().hex[:6]}"
    n1, n2 = f"{prefix}-n1", f"{prefix}-n2"
    cluster = LocalCluster(
        shared_dir / prefix, nodes=1, gpus_per_node=4, prefix=prefix, auth=True,
        listen_host=netns.host_ip, node_grace_s=2.0, cgroup_mode="affinity",
        node_wrapper={n1: ["ip", "netns", "exec", netns.name]},
        extra_master={"node_heartbeat_s": 1.0})
    starts = shared_dir / "starts"
    starts.mkdir()
    os.chmod(starts, 0o777)
    mark = f'echo "$$" >> {starts}/$TRELLIS_JOB_ID'
    try:
        cluster.start()  # master on the host side of the veth, n1 inside the namespace
        client = cluster.client(timeout=30)

        def submit(job_id: str, script: str) -> None:
            client.call("submit", {"id": job_id, "job": {
                "name": job_id, "command": ["sh", "-c", f"{mark}; {script}"], "user": USER,
                "gpus": 1, "cpus": 0 if job_id != "keeps" else 1}})

        def job(job_id: str) -> dict:
            return client.call("job", {"id": job_id})["job"]

        def status(node: str) -> str:
            return {n["name"]: n["status"] for n in client.call("nodes")["nodes"]}[node]

        submit("keeps", "exec sleep 300")
        submit("ends", "sleep 5; exit 5")  # ends while the node is cut off
        wait_for(lambda: job("keeps")["state"] == job("ends")["state"] == "running", 30,
                 "keeps and ends to run")
        assert job("keeps")["nodes"] == job("ends")["nodes"] == [n1]
        keeps_pid = (starts / "keeps").read_text().split()
        cluster.start_node(2)
        cluster.wait_nodes(2)

        how = cut(netns, how)
        wait_for(lambda: status(n1) == "unreachable", 20, f"{n1} to be unreachable")
        assert job("keeps")["state"] == "running"  # kept by default
        # New work goes elsewhere although n1 has free GPUs.
        submit("elsewhere", "sleep 1")
        wait_for(lambda: job("elsewhere")["state"] == "finished", 30, "elsewhere to finish")
        assert job("elsewhere")["nodes"] == [n2]
        # The jobs on the fenced node go on there, unseen by the master.
        os.kill(int(keeps_pid[0]), 0)
        ends_exit = cluster.root / n1 / "jobs" / "ends" / "exit.json"
        wait_for(ends_exit.exists, 20, "ends to exit on the fenced node")
        assert job("ends")["state"] == "running"

        heal(netns, how)
        wait_for(lambda: status(n1) == "ready", 30, f"{n1} to reconnect")
        assert job("keeps")["state"] == "running"
        assert (starts / "keeps").read_text().split() == keeps_pid
        wait_for(lambda: job("ends")["state"] == "failed", 20, "the exit to be reconciled")
        assert job("ends")["exit_code"] == 5
        # The node is used again once it is back.
        client.call("drain", {"node": n2})
        submit("after", "sleep 0.2; exit 3")
        wait_for(lambda: job("after")["state"] == "failed", 30, "after to end")
        assert job("after")["nodes"] == [n1] and job("after")["exit_code"] == 3
        time.sleep(1.0)
        for job_id in ("keeps", "ends", "elsewhere", "after"):
            assert len((starts / job_id).read_text().split()) == 1, f"{job_id} ran twice"
        events = client.call("job", {"id": "keeps"})["events"]
        assert [e["kind"] for e in events].count("running") == 1
    finally:
        cluster.close()
