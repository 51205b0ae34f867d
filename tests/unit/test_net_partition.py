"""The [net] section and the partition driver's setup: bad input is refused by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from noded.netpartition import PartitionSetupError, find_net_cls_mount, link_speed
from shared.config import ConfigError, NodeConfig, load_config

MOUNTINFO = (
    "25 30 0:22 / /sys/fs/cgroup/cpuset rw,relatime shared:9 - cgroup cgroup rw,cpuset\n"
    "31 30 0:27 / /sys/fs/cgroup/net_cls,net_prio rw shared:14 - cgroup cgroup "
    "rw,net_cls,net_prio\n"
    "40 30 0:35 / /sys/fs/cgroup/unified rw shared:20 - cgroup2 cgroup2 rw\n"
)


def test_net_section_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[node]\nname = "n1"\n[net]\nenabled = true\ninterface = "ib0"\n'
                    "link_mbit = 10000\n")
    net = load_config(NodeConfig, path, "node").net
    assert (net.enabled, net.interface, net.gpu_share, net.cpu_share) == (True, "ib0", 0.75, 0.25)
    for body, error in (
        ("enabled = true\n", "net.interface must name the data NIC"),
        ('interface = "ib0"\ngpu_share = 0.9\ncpu_share = 0.2\n', "at most 1"),
        ('interface = "a/b"\n', "net.interface"),
        ('classifier = "tc"\n', "net.classifier"),
    ):
        path.write_text(f'[node]\nname = "n1"\n[net]\n{body}')
        with pytest.raises(ConfigError, match=re.escape(error)):
            load_config(NodeConfig, path, "node")


def test_net_cls_mount_is_found_by_controller_not_by_name() -> None:
    assert find_net_cls_mount(MOUNTINFO) == Path("/sys/fs/cgroup/net_cls,net_prio")
    assert find_net_cls_mount(MOUNTINFO.splitlines()[0]) is None


def test_a_nic_without_a_speed_asks_for_link_mbit(tmp_path: Path) -> None:
    (tmp_path / "veth0").mkdir()
    (tmp_path / "veth0" / "speed").write_text("-1\n")
    (tmp_path / "eth0").mkdir()
    (tmp_path / "eth0" / "speed").write_text("25000\n")
    assert link_speed("eth0", tmp_path) == 25000
    for name in ("veth0", "missing"):
        with pytest.raises(PartitionSetupError, match=r"set net\.link_mbit"):
            link_speed(name, tmp_path)
