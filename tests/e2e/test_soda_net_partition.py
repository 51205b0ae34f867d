"""SODA's network partition (§V-E) in the running daemons, with real flows through a real NIC.

Two nodes; node 1's ``[net]`` section shapes its data NIC, one end of a veth pair between two
network namespaces. A two-node GPU job (its rank on node 1 sends through the NIC) and a CPU
job on node 1 (sending too) run at once: while both send, the GPU job gets 75 % of the link
(±10 points); each alone gets the whole link; the partition goes on when the GPU job starts
and off when it ends, the master journals both switches, ``trellisctl node`` and noded's
/metrics show it, and the NIC's original root qdisc is back afterwards.

Everything made on the system is named ``trellis-test-soda-<unique>`` (namespaces, the
net_cls hierarchy's mount point, the nft table) and removed in ``finally`` blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyroute2 import IPRoute

from demo.cluster import LocalCluster, free_port
from tests.conftest import needs_root

pytestmark = [
    needs_root,
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("nft") is None and os.environ.get("CI") != "true",
                       reason="needs the nft tool: apt-get install nftables"),
]

FLOW = Path(__file__).with_name("soda_flow.py")
SENDER_IP, RECEIVER_IP = "169.254.78.1", "169.254.78.2"  # link-local, inside the veth only
LINK_MBIT = 100
GPU_PORT, CPU_PORT = 5301, 5302


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=10)


@pytest.fixture
def name() -> str:
    return f"trellis-test-soda-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def netpair(name: str) -> Iterator[tuple[str, str]]:
    sender, receiver = f"{name}-a", f"{name}-b"
    made = []
    try:
        for ns in (sender, receiver):
            _run("ip", "netns", "add", ns)
            made.append(ns)
        _run("ip", "-n", sender, "link", "add", "va", "type", "veth", "peer", "name", "vb",
             "netns", receiver)
        for ns, dev, ip in ((sender, "va", SENDER_IP), (receiver, "vb", RECEIVER_IP)):
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        yield sender, receiver
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@pytest.fixture
def net_cls(name: str) -> Iterator[Path]:
    """A cgroup v1 net_cls hierarchy of the test's own (this host mounts none)."""
    mount = Path("/tmp") / f"{name}-netcls"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "cgroup", "-o", "net_cls", name, str(mount)],
                              capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a cgroup v1 net_cls hierarchy: {done.stderr.strip()}")
        try:
            yield mount
        finally:
            for group in sorted((p for p in mount.rglob("*") if p.is_dir()),
                                key=lambda p: len(p.parts), reverse=True):
                for _ in range(50):
                    try:
                        group.rmdir()
                        break
                    except OSError:
                        time.sleep(0.05)
            subprocess.run(["umount", str(mount)], capture_output=True, timeout=10)
    finally:
        mount.rmdir()


def _root_qdisc(ns: str) -> tuple[str, int]:
    with IPRoute(netns=ns, flags=0) as ipr:
        idx = ipr.link_lookup(ifname="va")[0]
        for msg in ipr.get_qdiscs(index=idx):
            if msg["parent"] == 0xFFFFFFFF:
                return msg.get_attr("TCA_KIND"), msg["handle"]
    return "noop", 0


def _share(counts: dict[str, list[int]], port: int, lo: int, hi: int) -> int:
    return sum(counts[str(port)][lo:hi])


def test_multi_node_gpu_job_gets_75_percent_of_the_data_nic(
        netpair: tuple[str, str], net_cls: Path, name: str, tmp_path: Path) -> None:
    sender_ns, receiver_ns = netpair
    original = _root_qdisc(sender_ns)
    metrics_port = free_port()
    table = "t" + name.replace("-", "_")
    bucket = 0.25
    t0 = 0.0  # when the flows start (epoch seconds), set once the cluster is up

    def sender(port: int, windows: list[tuple[float, float]]) -> list[str]:
        flow = [sys.executable, str(FLOW), "send", "--host", RECEIVER_IP, "--port", str(port)]
        for a, b in windows:
            flow += ["--send", f"{t0 + a}:{t0 + b}"]
        return ["ip", "netns", "exec", sender_ns, *flow]

    receiver: subprocess.Popen[str] | None = None
    cluster = LocalCluster(
        tmp_path / "cluster", nodes=2, gpus_per_node=4, prefix=name[len("trellis-test-"):],
        extra_master={"allow_root_jobs": True},
        node_settings={"allow_root_jobs": True},
        extra_node={1: {"cpus": "0-1", "metrics_port": metrics_port}, 2: {"cpus": "1"}},
        node_sections_by_node={1: {"net": {
            "enabled": True, "interface": "va", "link_mbit": LINK_MBIT, "netns": sender_ns,
            "classifier": "net_cls", "net_cls_mount": str(net_cls), "nft_table": table}}},
    )
    try:
        cluster.start()
        # Scheduling, launching and the partition's install take a few seconds.
        t0 = time.time() + 8.0
        receiver = subprocess.Popen(
            ["ip", "netns", "exec", receiver_ns, sys.executable, str(FLOW), "recv", "--host",
             RECEIVER_IP, "--ports", f"{GPU_PORT},{CPU_PORT}", "--t0", str(t0), "--until",
             str(t0 + 14.0), "--bucket", str(bucket)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert receiver.stdout is not None and receiver.stderr is not None
        assert receiver.stdout.readline().strip() == "READY", receiver.stderr.read()
        node1 = cluster.node_name(1)
        client = cluster.client()
        # The GPU job spans both nodes (8 GPUs, 4 per node); only its rank on node 1 sends,
        # 0-8 s, then stays up until 14 s so the partition stays on while the CPU job is
        # alone. The CPU job (one core: only node 1 has one left) sends 0-4 s and 9-13 s.
        gpu_cmd = " ".join(sender(GPU_PORT, [(0.0, 8.0)]))
        gpu_job = client.call("submit", {"job": {
            "name": "multi", "user": "root", "gpus": 8, "cpus": 2, "command": [
                "sh", "-c", f'if [ "$TRELLIS_NODE" = "{node1}" ]; then {gpu_cmd}; fi; '
                f'sleep {max(1.0, t0 + 14.0 - time.time()):.1f}']}})["job"]["id"]
        cpu_job = client.call("submit", {"job": {
            "name": "etl", "user": "root", "kind": "cpu", "gpus": 0, "cpus": 1,
            "command": sender(CPU_PORT, [(0.0, 4.0), (9.0, 13.0)])}})["job"]["id"]

        def placed() -> dict | None:
            jobs = {j["id"]: j for j in client.call("jobs")["jobs"]}
            running = all(jobs[j]["state"] == "running" for j in (gpu_job, cpu_job))
            return jobs if running else None

        jobs = cluster.wait_for("both jobs running", placed, timeout=20)
        assert [a["node"] for a in jobs[cpu_job]["placement"]] == [node1]

        def partition_on() -> dict | None:
            found = client.call("node", {"node": node1}).get("net_partition")
            return found if found and found["active"] else None

        shown = cluster.wait_for("the partition reported on", partition_on, timeout=20)
        assert shown["jobs"] == gpu_job and shown["gpu_share"] == 0.75
        assert _root_qdisc(sender_ns) == ("htb", 0x7E10000)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                    timeout=5) as r:
            families = {f.name: f.samples for f in
                        text_string_to_metric_families(r.read().decode())}
        assert [s.value for s in families["trellis_net_partition_active"]] == [1.0]
        classes = {s.labels["job"]: s.labels["class"]
                   for s in families["trellis_net_job_class"]}
        assert classes == {gpu_job: "gpu", cpu_job: "cpu"}

        out, _ = receiver.communicate(timeout=t0 + 30 - time.time())
        counts = json.loads(out.strip().splitlines()[-1])
        per_s = 1 / bucket

        def mbit(port: int, a: float, b: float) -> float:
            lo, hi = int(a * per_s), int(b * per_s)
            return _share(counts, port, lo, hi) * 8 / (b - a) / 1e6

        both_gpu, both_cpu = mbit(GPU_PORT, 1.0, 4.0), mbit(CPU_PORT, 1.0, 4.0)
        gpu_pct = 100.0 * both_gpu / (both_gpu + both_cpu)
        summary = (f"both: gpu {both_gpu:.1f} cpu {both_cpu:.1f} Mbit/s ({gpu_pct:.1f}% gpu); "
                   f"gpu alone {mbit(GPU_PORT, 5.0, 8.0):.1f}; "
                   f"cpu alone {mbit(CPU_PORT, 10.0, 13.0):.1f}")
        assert 0.5 * LINK_MBIT < both_gpu + both_cpu < 1.1 * LINK_MBIT, summary
        assert abs(gpu_pct - 75.0) <= 10.0, summary
        assert mbit(GPU_PORT, 5.0, 8.0) > 0.8 * LINK_MBIT, summary
        assert mbit(CPU_PORT, 5.0, 8.0) < 0.02 * LINK_MBIT, summary
        assert mbit(CPU_PORT, 10.0, 13.0) > 0.8 * LINK_MBIT, summary
        print(summary)  # the measured split, for the record (pytest -s)

        # The GPU job ends: the partition goes, the NIC's own root qdisc comes back.
        def partition_off() -> bool:
            found = client.call("node", {"node": node1}).get("net_partition")
            return bool(found) and not found["active"]

        cluster.wait_for("the partition reported off", partition_off, timeout=30)
        assert _root_qdisc(sender_ns) == original
        kinds = [(e["node"], e["detail"]["active"])
                 for e in client.call("events", {"tail": 500})["events"]
                 if e["kind"] == "net_partition"]
        assert kinds == [(node1, True), (node1, False)]
    finally:
        if receiver is not None:
            with contextlib.suppress(Exception):
                receiver.kill()
            receiver.wait(timeout=10)
        cluster.close()
    assert _root_qdisc(sender_ns) == original
