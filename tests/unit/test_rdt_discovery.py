"""Discovery of RDT capabilities from info/ and the mount table, on every emulated profile."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rdt import FeatureUnavailable, Resctrl, ResctrlNotMounted, detect_resctrl
from rdt.capabilities import parse_mounts, resctrl_mount_options
from rdt.emulated import build_tree, open_resctrl
from rdt.schemata import MAX_MBPS
from shared.model import RdtCapabilities


def test_full_profile_reports_every_feature(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "resctrl", "full")
    caps = open_resctrl(tree.root).capabilities
    assert caps.l3 is not None and caps.mb is not None and caps.l3_mon is not None
    assert caps.l3.cbm_mask == 0x7FF and caps.l3.cbm_len == 11 and caps.l3.min_cbm_bits == 1
    assert caps.l3.domains == (0, 1) and not caps.l3.cdp
    assert (caps.mb.min_bandwidth, caps.mb.bandwidth_gran, caps.mb.delay_linear) == (10, 10, True)
    assert caps.mb.unit == "percent" and not caps.mba_mbps
    # The kernel's limit is the smallest num_closids of the enabled resources (L3 16, MB 8).
    assert (caps.l3.num_closids, caps.mb.num_closids, caps.num_closids) == (16, 8, 8)
    assert caps.l3_mon.num_rmids == 64 and caps.l3_mon.domains == (0, 1)
    assert caps.l3_mon.features == {"llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"}
    assert caps.to_model() == RdtCapabilities(cat=True, mba=True, mbm=True, mba_mbps=False)


def test_no_mb_profile_has_no_mba(tmp_path: Path) -> None:
    caps = open_resctrl(build_tree(tmp_path / "r", "no_mb").root).capabilities
    assert caps.mb is None and caps.l3 is not None and caps.l3_mon is not None
    assert caps.num_closids == 16
    assert caps.to_model() == RdtCapabilities(cat=True, mba=False, mbm=True, mba_mbps=False)


def test_mbps_profile_reads_the_mount_option(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "mbps")
    assert "mba_MBps" in tree.mounts.read_text()
    rc = open_resctrl(tree.root)
    assert rc.capabilities.mba_mbps and rc.capabilities.mb is not None
    assert rc.capabilities.mb.mbps and rc.capabilities.mb.unit == "MBps"
    assert rc.schemata(None).get("MB") == {0: MAX_MBPS, 1: MAX_MBPS}
    assert rc.capabilities.to_model().mba_mbps


def test_gaps_profile_takes_cache_ids_from_the_system(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "gaps")
    assert "L3:0=fff;2=fff" in (tree.root / "schemata").read_text()
    caps = open_resctrl(tree.root).capabilities
    assert caps.l3 is not None and caps.mb is not None and caps.l3_mon is not None
    assert caps.l3.domains == caps.mb.domains == caps.l3_mon.domains == (0, 2)
    assert caps.l3.cbm_len == 12


def test_few_closids_profile(tmp_path: Path) -> None:
    caps = open_resctrl(build_tree(tmp_path / "r", "few_closids").root).capabilities
    assert caps.num_closids == 4


def test_monitoring_only_machine(tmp_path: Path) -> None:
    rc = open_resctrl(build_tree(tmp_path / "r", "mon_only").root)
    caps = rc.capabilities
    assert caps.l3 is None and caps.mb is None and not caps.can_allocate and caps.num_closids == 0
    assert caps.l3_mon is not None and caps.l3_mon.mbm
    with pytest.raises(FeatureUnavailable, match="no RDT allocation"):
        rc.create_group("trellis-x")
    assert rc.create_mon_group("trellis-m") is True
    assert rc.mon_groups(None) == ["trellis-m"]
    assert rc.read_mbm(None, "trellis-m") == {0: 0, 1: 0}


def test_cdp_exposes_code_and_data_masks(tmp_path: Path) -> None:
    caps = open_resctrl(build_tree(tmp_path / "r", "full", cdp=True).root).capabilities
    assert caps.l3 is not None and caps.l3.cdp
    assert caps.l3.resources == ("L3CODE", "L3DATA") and caps.l3.num_closids == 8
    assert "cdp" in caps.mount_options


def test_detect_returns_none_with_reason_when_not_mounted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree = build_tree(tmp_path / "r", "full")
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    caplog.set_level(logging.INFO, logger="trellis.rdt")
    assert detect_resctrl(tree.root, mounts) is None
    assert "no resctrl filesystem mounted at" in caplog.text
    # A resctrl mount elsewhere does not count for this root.
    mounts.write_text("resctrl /sys/fs/resctrl resctrl rw 0 0\n")
    assert detect_resctrl(tree.root, mounts) is None
    assert detect_resctrl(tree.root, tmp_path / "no-such-mounts") is None
    assert "cannot read mount table" in caplog.text
    with pytest.raises(ResctrlNotMounted):
        Resctrl(tree.root, mounts)


def test_detect_finds_the_emulated_mount(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "r", "mbps")
    rc = detect_resctrl(tree.root, tree.mounts)
    assert rc is not None and rc.capabilities.mba_mbps


def test_detect_rejects_a_malformed_info_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree = build_tree(tmp_path / "r", "full")
    (tree.root / "info" / "MB" / "bandwidth_gran").write_text("ten\n")
    with caplog.at_level(logging.INFO, logger="trellis.rdt"):
        assert detect_resctrl(tree.root, tree.mounts) is None
    assert "bandwidth_gran holds 'ten'" in caplog.text


def test_mount_table_parsing_handles_escapes_and_shadowing(tmp_path: Path) -> None:
    root = tmp_path / "with space"
    text = (
        "resctrl /elsewhere resctrl rw 0 0\n"
        f"resctrl {str(root).replace(' ', chr(92) + '040')} resctrl rw,relatime 0 0\n"
        f"resctrl {str(root).replace(' ', chr(92) + '040')} resctrl rw,mba_MBps 0 0\n"
        "garbage\n"
    )
    entries = parse_mounts(text)
    assert [e.target for e in entries][1] == str(root)
    mounts = tmp_path / "mounts"
    mounts.write_text(text)
    assert "mba_MBps" in resctrl_mount_options(root, mounts)  # the later mount wins


def test_detect_on_this_machine_agrees_with_proc_mounts() -> None:
    mounted = any(
        e.fstype == "resctrl" and e.target == "/sys/fs/resctrl"
        for e in parse_mounts(Path("/proc/mounts").read_text())
    )
    rc = detect_resctrl()
    assert (rc is not None) == mounted
