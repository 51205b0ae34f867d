"""Pure parts of noded.netshape: class plan, validation, parsers, nft script text."""

from __future__ import annotations

from pathlib import Path

import pytest

from noded.netshape import NetShapeError, TrafficShaper, plan_classes
from noded.netshape.classify import (
    check_cgroup_path,
    parse_proc_cgroup_v2,
    render_header,
    render_rule,
)
from noded.netshape.htb import fmt_handle, handle, validate_shares
from noded.netshape.nft import Cgroup2Mount, parse_mountinfo_cgroup2


def _by_name(plan: list) -> dict:
    return {c.name: c for c in plan}


def test_plan_default_split() -> None:
    plan = _by_name(plan_classes(100, 0.75, 0.25))
    assert plan["root"].rate_bit == plan["root"].ceil_bit == 100_000_000
    assert plan["gpu"].rate_bit == 75_000_000
    assert plan["cpu"].rate_bit == 25_000_000
    assert plan["other"].rate_bit == 1_000_000  # the 1% floor: gpu + cpu take the whole link
    for name in ("gpu", "cpu", "other"):
        assert plan[name].ceil_bit == 100_000_000
        assert plan[name].parent == plan["root"].classid == handle(0x7E1, 1)
    assert fmt_handle(plan["gpu"].classid) == "7e1:10"
    assert fmt_handle(plan["cpu"].classid) == "7e1:20"
    assert fmt_handle(plan["other"].classid) == "7e1:30"


def test_plan_quanta_follow_rates_and_stay_in_kernel_range() -> None:
    for link in (10, 100, 10_000, 100_000):
        plan = _by_name(plan_classes(link, 0.75, 0.25))
        assert 1_600 <= plan["cpu"].quantum <= plan["gpu"].quantum <= 200_000
        if plan["cpu"].quantum > 1_600:
            assert plan["gpu"].quantum == pytest.approx(3 * plan["cpu"].quantum, rel=0.01)


def test_plan_leftover_goes_to_other() -> None:
    plan = _by_name(plan_classes(1000, 0.5, 0.2))
    assert plan["other"].rate_bit == 300_000_000


@pytest.mark.parametrize(
    ("gpu", "cpu", "msg"),
    [
        (0.0, 0.25, "gpu_share must be in"),
        (0.75, 0.0, "cpu_share must be in"),
        (1.5, 0.1, "gpu_share must be in"),
        (0.8, 0.3, "at most 1"),
        (-0.1, 0.5, "gpu_share must be in"),
        ("0.75", 0.25, "must be a number"),
        (True, 0.25, "must be a number"),
    ],
)
def test_bad_shares(gpu: object, cpu: object, msg: str) -> None:
    with pytest.raises(NetShapeError, match=msg):
        validate_shares(gpu, cpu)  # type: ignore[arg-type]


@pytest.mark.parametrize("link", [0, -5, 1.5, True, "100"])
def test_bad_link_rate(link: object) -> None:
    with pytest.raises(NetShapeError, match="link_mbit must be a positive integer"):
        plan_classes(link, 0.75, 0.25)  # type: ignore[arg-type]


def test_shaper_validates_before_touching_anything() -> None:
    with pytest.raises(NetShapeError, match="at most 1"):
        TrafficShaper("lo", 100, gpu_share=0.9, cpu_share=0.2)
    with pytest.raises(NetShapeError, match="not a valid Linux ifname"):
        TrafficShaper("a/b", 100)
    with pytest.raises(NetShapeError, match="not a valid Linux ifname"):
        TrafficShaper("x" * 16, 100)
    with pytest.raises(NetShapeError, match="network namespace 'trellis-test-no-such-ns'"):
        TrafficShaper("lo", 100, netns="trellis-test-no-such-ns")
    with pytest.raises(NetShapeError, match="namespace name"):
        TrafficShaper("lo", 100, netns="../etc")


def test_shaper_checks_interface_exists() -> None:
    # Reading the link table needs no privileges.
    with pytest.raises(NetShapeError, match="interface 'trellis-nope' does not exist"):
        TrafficShaper("trellis-nope", 100)
    shaper = TrafficShaper("lo", 100)
    assert shaper.classid("gpu") == 0x07E10010
    with pytest.raises(NetShapeError, match="unknown traffic class"):
        shaper.classid("tpu")


def test_parse_proc_cgroup_v2() -> None:
    hybrid = "9:name=systemd:/\n4:memory:/x\n1:cpu:/\n0::/trellis/job-7\n"
    assert parse_proc_cgroup_v2(hybrid) == "/trellis/job-7"
    assert parse_proc_cgroup_v2("0::/\n") == "/"
    assert parse_proc_cgroup_v2("4:memory:/x\n") is None


def test_check_cgroup_path() -> None:
    assert check_cgroup_path("/system.slice/trellis@job-1.service") == [
        "system.slice",
        "trellis@job-1.service",
    ]
    with pytest.raises(NetShapeError, match="root cgroup"):
        check_cgroup_path("/")
    with pytest.raises(NetShapeError, match="unsupported component"):
        check_cgroup_path("/a/../b")
    with pytest.raises(NetShapeError, match="unsupported component"):
        check_cgroup_path('/a"; flush ruleset; "')


def test_parse_mountinfo() -> None:
    hybrid = (
        "30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw\n"
        "35 30 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "41 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    assert parse_mountinfo_cgroup2(hybrid) == Cgroup2Mount(Path("/sys/fs/cgroup/unified"), "/")
    v2_only = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    assert parse_mountinfo_cgroup2(v2_only) == Cgroup2Mount(Path("/sys/fs/cgroup"), "/")
    assert parse_mountinfo_cgroup2(hybrid.splitlines()[0]) is None


def test_nft_script_text() -> None:
    assert render_header("trellis_netshape") == (
        "add table inet trellis_netshape\n"
        "add chain inet trellis_netshape output "
        "{ type filter hook output priority mangle; policy accept; }\n"
    )
    rule = render_rule(
        "trellis_netshape",
        "eth1",
        'socket cgroupv2 level 2 "trellis/job-7"',
        0x07E10010,
        "trellis job=job-7",
    )
    assert rule == (
        'add rule inet trellis_netshape output oifname "eth1" socket cgroupv2 level 2 '
        '"trellis/job-7" meta priority set 7e1:10 comment "trellis job=job-7"\n'
    )
    assert "oifname" not in render_rule("t", None, "meta cgroup 0x1", 0x10010, "c")
