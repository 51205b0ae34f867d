"""The bandwidth partition on a real veth pair between two network namespaces, with real flows.

Everything is made inside namespaces named trellis-test-<unique>-a/-b (veth, addresses, qdiscs,
nft tables), plus cgroups and one mount named after the same unique name; all of it is removed
in finally blocks, whatever the outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from noded.netshape import (
    BandwidthPartitioner,
    CgroupV2Classifier,
    NetClsClassifier,
    NetShapeError,
    TrafficShaper,
)
from noded.netshape.nft import NftRunner, find_cgroup2_mount
from tests.conftest import needs_root

pytestmark = [needs_root, pytest.mark.root]

# The classifiers drive nft (Debian package nftables). Outside CI a missing nft skips; in CI
# (CI=true) it fails, so a pipeline that forgot to install it cannot pass quietly.
needs_nft = pytest.mark.skipif(
    shutil.which("nft") is None and os.environ.get("CI") != "true",
    reason="needs the nft tool: apt-get install nftables",
)

FLOW = Path(__file__).with_name("netshape_flow.py")
SENDER_IP, RECEIVER_IP = "169.254.77.1", "169.254.77.2"  # link-local: never leaves the veth
LINK_MBIT = 100
GPU_PORT, CPU_PORT = 5201, 5202


@dataclass
class NetPair:
    sender_ns: str
    receiver_ns: str
    ifname: str = "va"


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=10)


@pytest.fixture
def netpair(unique_name: str) -> Iterator[NetPair]:
    pair = NetPair(f"{unique_name}-a", f"{unique_name}-b")
    made = []
    try:
        for ns in (pair.sender_ns, pair.receiver_ns):
            _run("ip", "netns", "add", ns)
            made.append(ns)
        # Both ends are created inside the namespaces, so the host's link table is never used.
        _run(
            "ip",
            "-n",
            pair.sender_ns,
            "link",
            "add",
            "va",
            "type",
            "veth",
            "peer",
            "name",
            "vb",
            "netns",
            pair.receiver_ns,
        )
        for ns, dev, ip in (
            (pair.sender_ns, "va", SENDER_IP),
            (pair.receiver_ns, "vb", RECEIVER_IP),
        ):
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in made:  # deleting a namespace takes its veth end, qdiscs and nft tables along
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@pytest.fixture
def v2_cgroups(unique_name: str) -> Iterator[dict[str, Path]]:
    mount = find_cgroup2_mount().path
    groups = {kind: mount / f"{unique_name}-{kind}" for kind in ("gpu", "cpu", "single")}
    try:
        for path in groups.values():
            path.mkdir()
        yield groups
    finally:
        for path in groups.values():
            _rmdir_cgroup(path)


def _rmdir_cgroup(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)  # killed members take a moment to leave


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
        for p in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)


def _start_receiver(pair: NetPair, procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            pair.receiver_ns,
            sys.executable,
            str(FLOW),
            "recv",
            "--host",
            RECEIVER_IP,
            "--ports",
            f"{GPU_PORT},{CPU_PORT}",
            "--warmup",
            "0.7",
            "--measure",
            "3.0",
            "--timeout",
            "12",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(p)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "READY", f"receiver did not start: {line!r} {p.stderr.read()}"
    return p


def _start_sender(
    pair: NetPair, port: int, procs: list[subprocess.Popen[str]], cgroup: Path | None
) -> subprocess.Popen[str]:
    argv = [
        "ip",
        "netns",
        "exec",
        pair.sender_ns,
        sys.executable,
        str(FLOW),
        "send",
        "--host",
        RECEIVER_IP,
        "--port",
        str(port),
        "--wait-stdin",
        "--timeout",
        "12",
    ]
    if cgroup is not None:
        # The shell joins the cgroup, then execs the sender: same pid, and every socket the
        # sender creates belongs to that cgroup.
        argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *argv]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(p)
    return p


def _go(*senders: subprocess.Popen[str]) -> None:
    for s in senders:
        assert s.stdin is not None
        s.stdin.write("go\n")
        s.stdin.flush()


def _measure(receiver: subprocess.Popen[str]) -> dict[int, int]:
    out, err = receiver.communicate(timeout=15)
    result = json.loads(out.strip().splitlines()[-1])
    assert "error" not in result, f"{result} {err}"
    return {int(port): n for port, n in result.items()}


def _assert_split(received: dict[int, int], shaper: TrafficShaper) -> None:
    gpu, cpu = received[GPU_PORT], received[CPU_PORT]
    total = gpu + cpu
    # Sanity: the two flows together filled the shaped link (so they competed), and the link
    # did not carry more than its rate (so the HTB limit was in force).
    mbit = total * 8 / 3.0 / 1e6
    assert 0.5 * LINK_MBIT < mbit < 1.1 * LINK_MBIT, f"aggregate {mbit:.1f} Mbit/s"
    gpu_pct = 100.0 * gpu / total
    assert abs(gpu_pct - 75.0) <= 10.0, f"gpu got {gpu_pct:.1f}% ({gpu} vs {cpu} bytes)"
    by_class = shaper.class_bytes()
    assert set(by_class) == {"gpu", "cpu", "other"}
    assert by_class["gpu"] > 2 * by_class["cpu"] > 0, by_class
    # Only stray packets (ARP, none of the flows) may fall into the default class.
    assert by_class["other"] < 0.01 * (by_class["gpu"] + by_class["cpu"]), by_class


def _table_rules(ns: str, table: str) -> list[str]:
    runner = NftRunner(ns)
    if not runner.table_exists("inet", table):
        return []
    return [
        item["rule"].get("comment", "")
        for item in runner.list_json("chain", "inet", table, "output")
        if "rule" in item
    ]


@needs_nft
def test_cgroup_v2_split_75_25_and_restore(
    netpair: NetPair,
    v2_cgroups: dict[str, Path],
    procs: list[subprocess.Popen[str]],
    unique_name: str,
) -> None:
    shaper = TrafficShaper(netpair.ifname, LINK_MBIT, netns=netpair.sender_ns)
    original = shaper.root_qdisc()
    table = "t" + unique_name.replace("-", "_")
    classifier = CgroupV2Classifier(
        {"gpu": shaper.classid("gpu"), "cpu": shaper.classid("cpu")},
        netns=netpair.sender_ns,
        ifname=netpair.ifname,
        table=table,
    )
    try:
        assert shaper.install() is True
        assert shaper.installed
        assert shaper.original_qdisc == original
        receiver = _start_receiver(netpair, procs)
        gpu = _start_sender(netpair, GPU_PORT, procs, v2_cgroups["gpu"])
        cpu = _start_sender(netpair, CPU_PORT, procs, v2_cgroups["cpu"])
        # Both API forms: the GPU job by its cgroup, the CPU job by its pid.
        classifier.classify("job-gpu", v2_cgroups["gpu"], "gpu")
        classifier.classify("job-cpu", [cpu.pid], "cpu")
        assert sorted(_table_rules(netpair.sender_ns, table)) == [
            "trellis job=job-cpu",
            "trellis job=job-gpu",
        ]
        _go(gpu, cpu)
        _assert_split(_measure(receiver), shaper)

        assert classifier.unclassify("job-cpu") is True
        assert _table_rules(netpair.sender_ns, table) == ["trellis job=job-gpu"]
        classifier.close()
        assert _table_rules(netpair.sender_ns, table) == []
        assert shaper.remove() is True
        assert not shaper.installed
        restored = shaper.root_qdisc()
        assert (restored.kind, restored.handle) == (original.kind, original.handle)
        assert shaper.class_bytes() == {}
        assert shaper.remove() is False  # idempotent
    finally:
        classifier.close()
        shaper.remove()


@needs_nft
def test_net_cls_v1_split_75_25(
    netpair: NetPair, procs: list[subprocess.Popen[str]], unique_name: str
) -> None:
    mount = Path("/tmp") / f"{unique_name}-netcls"
    mount.mkdir()
    mounted = False
    classifier = None
    shaper = TrafficShaper(netpair.ifname, LINK_MBIT, netns=netpair.sender_ns)
    try:
        done = subprocess.run(
            ["mount", "-t", "cgroup", "-o", "net_cls", "trellis-test", str(mount)],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a cgroup v1 net_cls hierarchy: {done.stderr.strip()}")
        mounted = True
        classifier = NetClsClassifier(
            {"gpu": shaper.classid("gpu"), "cpu": shaper.classid("cpu")},
            mount,
            netns=netpair.sender_ns,
            ifname=netpair.ifname,
            prefix=unique_name + "-",
        )
        shaper.install()
        receiver = _start_receiver(netpair, procs)
        gpu = _start_sender(netpair, GPU_PORT, procs, None)
        cpu = _start_sender(netpair, CPU_PORT, procs, None)
        classifier.classify("job-gpu", [gpu.pid], "gpu")
        classifier.classify("job-cpu", [cpu.pid], "cpu")
        assert (mount / f"{unique_name}-job-gpu" / "net_cls.classid").read_text().strip() == str(
            shaper.classid("gpu")
        )
        _go(gpu, cpu)
        _assert_split(_measure(receiver), shaper)
        classifier.close()
        assert not (mount / f"{unique_name}-job-gpu").exists()
        assert shaper.remove() is True
    finally:
        if classifier is not None:
            classifier.close()
        shaper.remove()
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        for stale in mount.glob(f"{unique_name}-*") if mounted else []:
            _rmdir_cgroup(stale)
        if mounted:
            subprocess.run(["umount", str(mount)], capture_output=True, timeout=10)
        mount.rmdir()


def test_restores_administrators_root_qdisc(netpair: NetPair) -> None:
    with IPRoute(netns=netpair.sender_ns, flags=0) as ipr:
        idx = ipr.link_lookup(ifname=netpair.ifname)[0]
        ipr.tc("add", "tbf", index=idx, handle="5:", rate="7mbit", burst=4096, latency="400ms")
    shaper = TrafficShaper(netpair.ifname, LINK_MBIT, netns=netpair.sender_ns)
    before = shaper.root_qdisc()
    assert (before.kind, before.handle) == ("tbf", 0x50000)
    try:
        shaper.install()
        assert shaper.root_qdisc().kind == "htb"
        assert shaper.original_qdisc == before
        shaper.remove()
        after = shaper.root_qdisc()
        assert (after.kind, after.handle) == ("tbf", 0x50000)
        parms = dict(after.options.get_attr("TCA_TBF_PARMS"))
        assert parms["rate"] == dict(before.options.get_attr("TCA_TBF_PARMS"))["rate"]
        assert parms["rate"] == 7_000_000 // 8
    finally:
        shaper.remove()


@needs_nft
def test_partitioner_follows_multi_node_gpu_jobs(
    netpair: NetPair, v2_cgroups: dict[str, Path], unique_name: str
) -> None:
    ns = netpair.sender_ns
    shaper = TrafficShaper(netpair.ifname, LINK_MBIT, gpu_share=0.6, cpu_share=0.3, netns=ns)
    original = shaper.root_qdisc()
    table = "t" + unique_name.replace("-", "_")
    part = BandwidthPartitioner(
        shaper,
        CgroupV2Classifier(
            {"gpu": shaper.classid("gpu"), "cpu": shaper.classid("cpu")},
            netns=ns,
            ifname=netpair.ifname,
            table=table,
        ),
    )
    try:
        part.job_started("cpu-1", "cpu", v2_cgroups["cpu"])
        part.job_started("gpu-1", "gpu", v2_cgroups["single"])
        assert not part.active and not shaper.installed
        assert _table_rules(ns, table) == []

        part.job_started("gpu-multi", "gpu", v2_cgroups["gpu"], multi_node=True)
        assert part.active and shaper.installed
        assert sorted(_table_rules(ns, table)) == [
            "trellis job=cpu-1",
            "trellis job=gpu-1",
            "trellis job=gpu-multi",
        ]
        part.job_ended("cpu-1")
        assert sorted(_table_rules(ns, table)) == ["trellis job=gpu-1", "trellis job=gpu-multi"]

        part.job_ended("gpu-multi")
        assert not part.active and not shaper.installed
        assert _table_rules(ns, table) == []
        assert shaper.root_qdisc().kind == original.kind

        # A job that cannot be classified (its process is gone) does not keep the partition
        # from the others: the error names it, everything else is in place.
        part.job_started("gone", "cpu", [999_999_999])
        with pytest.raises(NetShapeError, match="jobs gone could not be classified"):
            part.job_started("gpu-multi-2", "gpu", v2_cgroups["gpu"], multi_node=True)
        assert part.active and shaper.installed
        assert sorted(_table_rules(ns, table)) == ["trellis job=gpu-1", "trellis job=gpu-multi-2"]
        part.job_ended("gone")
        part.close()  # noded stopping with a multi-node job still running
        assert not shaper.installed
        assert not NftRunner(ns).table_exists("inet", table)
    finally:
        part.close()


@needs_nft
def test_bad_input_is_refused_clearly(netpair: NetPair, unique_name: str) -> None:
    with pytest.raises(NetShapeError, match="interface 'nope0' does not exist"):
        TrafficShaper("nope0", LINK_MBIT, netns=netpair.sender_ns)
    with pytest.raises(NetShapeError, match="does not exist"):
        TrafficShaper("va", LINK_MBIT, netns=unique_name + "-missing")
    assert not os.path.exists(f"/run/netns/{unique_name}-missing")
    shaper = TrafficShaper(netpair.ifname, LINK_MBIT, netns=netpair.sender_ns)
    classifier = CgroupV2Classifier(
        {"gpu": shaper.classid("gpu"), "cpu": shaper.classid("cpu")},
        netns=netpair.sender_ns,
        table="t" + unique_name.replace("-", "_"),
    )
    try:
        with pytest.raises(NetShapeError, match="root cgroup"):
            classifier.classify("job-1", [os.getpid()] if _in_root_v2() else "/", "gpu")
        with pytest.raises(NetShapeError, match="does not exist"):
            classifier.classify("job-1", f"{unique_name}-never-made", "cpu")
        with pytest.raises(NetShapeError, match="process 999999999 does not exist"):
            classifier.classify("job-1", [999999999], "cpu")
        with pytest.raises(NetShapeError, match="'gpu' or 'cpu'"):
            classifier.classify("job-1", "/x", "tpu")  # type: ignore[arg-type]
        with pytest.raises(NetShapeError, match="not a valid name"):
            classifier.classify("../etc", "/x", "gpu")
        assert classifier.jobs() == {}
    finally:
        classifier.close()


def _in_root_v2() -> bool:
    return Path("/proc/self/cgroup").read_text().find("0::/\n") >= 0
