"""The emulated resctrl tree: kernel layout per profile and the kernel behaviour it emulates."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rdt.emulated import (
    PROFILES,
    EmulatedFs,
    advance_mbm,
    build_tree,
    main,
    open_resctrl,
    set_counter,
)
from rdt.resctrl import detect_resctrl
from shared.kernelfs import KernelWriteError, KernelWriter


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_has_the_kernel_layout(tmp_path: Path, profile: str) -> None:
    tree = build_tree(tmp_path / "resctrl", profile)
    prof = tree.profile
    root = tree.root
    assert (root / "info" / "last_cmd_status").read_text().strip() == "ok"
    for name in ("tasks", "cpus", "cpus_list"):
        assert (root / name).is_file()
    if prof.cat:
        for name in ("cbm_mask", "min_cbm_bits", "num_closids", "shareable_bits"):
            assert (root / "info" / "L3" / name).is_file()
    if prof.mba:
        for name in ("min_bandwidth", "bandwidth_gran", "num_closids", "delay_linear"):
            assert (root / "info" / "MB" / name).is_file()
    assert (root / "schemata").exists() == (prof.cat or prof.mba)
    assert (root / "info" / "L3_MON" / "mon_features").read_text().split() == list(
        prof.mon_features
    )
    for d in prof.domains:
        for event in prof.mon_features:
            assert (root / "mon_data" / f"mon_L3_{d:02d}" / event).read_text().strip() == "0"
    assert (root / "mon_groups").is_dir()
    rc = detect_resctrl(root, tree.mounts)  # plain discovery works on every profile
    assert rc is not None and rc.capabilities.can_allocate == (prof.cat or prof.mba)


def test_build_tree_rejects_bad_requests(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown resctrl profile"):
        build_tree(tmp_path / "a", "quantum")
    with pytest.raises(TypeError, match="unknown profile setting"):
        build_tree(tmp_path / "b", "full", colour="red")
    with pytest.raises(ValueError, match="contiguous"):
        build_tree(tmp_path / "c", "full", cbm_mask=0x5)
    with pytest.raises(ValueError, match="mba_MBps needs"):
        build_tree(tmp_path / "d", "no_mb", mbps=True)
    build_tree(tmp_path / "e", "full")
    with pytest.raises(FileExistsError, match="not empty"):
        build_tree(tmp_path / "e", "full")


def test_a_root_path_with_spaces_is_escaped_in_the_mount_table(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "demo node" / "resctrl", "full")
    assert "\\040" in tree.mounts.read_text()
    assert detect_resctrl(tree.root, tree.mounts) is not None


@pytest.fixture
def fs(tmp_path: Path) -> EmulatedFs:
    tree = build_tree(tmp_path / "resctrl", "full")
    return EmulatedFs(tree.root, KernelWriter([tree.root]))


def test_schemata_write_updates_only_the_named_ids(fs: EmulatedFs) -> None:
    fs.mkdir(fs.root / "g", what="test")
    path = fs.root / "g" / "schemata"
    assert path.read_text() == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"
    fs.write(path, "L3:1=3\n", what="test", compare=False)
    assert path.read_text() == "L3:0=7ff;1=3\nMB:0=100;1=100\n"
    fs.write(path, "MB:0=41\n", what="test", compare=False)  # the kernel rounds up to 50
    assert path.read_text() == "L3:0=7ff;1=3\nMB:0=50;1=100\n"
    assert (fs.root / "info" / "last_cmd_status").read_text().strip() == "ok"


@pytest.mark.parametrize(
    ("value", "status"),
    [
        ("L3:0=3", ""),  # no trailing newline: EINVAL
        ("L3 0=3\n", "Missing ':'"),
        ("L3:\n", "Missing 'L3' value"),
        ("L2:0=3\n", "Unknown or unsupported resource name 'L2'"),
        ("L3:0=3;0=7\n", "Duplicate domain 0"),
        ("L3:7=3\n", "Unknown domain id 7"),
        ("L3:0=xyz\n", "Non-hex character in the mask xyz"),
        ("L3:0=fff\n", "Mask out of range"),
        ("MB:0=5\n", "MB value 5 out of range [10,100]"),
        ("MB:0=ten\n", "Invalid MB value ten"),
        ("MB:0=50\nL3:a=3\n", "Missing '=' or non-numeric domain"),
    ],
)
def test_schemata_write_refusals(fs: EmulatedFs, value: str, status: str) -> None:
    fs.mkdir(fs.root / "g", what="test")
    path = fs.root / "g" / "schemata"
    before = path.read_text()
    with pytest.raises(KernelWriteError) as exc:
        fs.write(path, value, what="test", compare=False)
    assert exc.value.errno == errno.EINVAL
    assert path.read_text() == before  # all or nothing, like the kernel's staged configs
    if status:
        assert (fs.root / "info" / "last_cmd_status").read_text().strip() == status


def test_kernel_refusals_for_mkdir_rmdir_and_counters(fs: EmulatedFs) -> None:
    with pytest.raises(OSError) as exc:
        fs.mkdir(fs.root / "info" / "x", what="test")
    assert exc.value.errno == errno.EPERM
    with pytest.raises(OSError) as exc:
        fs.mkdir(fs.root / "nope" / "mon_groups" / "x", what="test")
    assert exc.value.errno == errno.ENOENT
    with pytest.raises(OSError) as exc:
        fs.rmdir(fs.root / "info", what="test")
    assert exc.value.errno == errno.EPERM
    with pytest.raises(KernelWriteError) as wexc:
        fs.write(fs.root / "mon_data" / "mon_L3_00" / "mbm_total_bytes", "0\n", what="t")
    assert wexc.value.errno == errno.EACCES
    with pytest.raises(KernelWriteError) as wexc:
        fs.write(fs.root / "tasks", "abc\n", what="t", compare=False)
    assert wexc.value.errno == errno.EINVAL
    with pytest.raises(PermissionError, match="outside"):
        fs.mkdir(fs.root / ".." / "escape", what="test")
    assert not (fs.root.parent / "escape").exists()


def test_counter_helpers_validate_their_input(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "resctrl", "full")
    with pytest.raises(ValueError):
        advance_mbm(tree.root, None, 0, -1)
    with pytest.raises(ValueError):
        advance_mbm(tree.root, None, 0, 10, local_bytes=11)
    with pytest.raises(ValueError, match="bad group name"):
        advance_mbm(tree.root, "..", 0, 10)
    with pytest.raises(FileNotFoundError):
        advance_mbm(tree.root, "trellis-missing", 0, 10)
    with pytest.raises(ValueError, match="Unavailable"):
        set_counter(tree.root, None, 0, "mbm_total_bytes", "banana")
    set_counter(tree.root, None, 0, "mbm_total_bytes", "Unavailable")
    advance_mbm(tree.root, None, 0, 10)  # counting resumes from zero after Unavailable
    rc = open_resctrl(tree.root)
    assert rc.read_mbm(None)[0] == 10


def test_cli_builds_and_advances(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "demo" / "resctrl"
    assert main(["build", str(root), "--profile", "gaps"]) == 0
    assert f"root={root}" in capsys.readouterr().out
    assert main(["advance", str(root), "", "2", "4096"]) == 0
    assert open_resctrl(root).read_mbm(None) == {0: 0, 2: 4096}
    assert main(["build", str(root)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert os.path.isdir(root / "info")
