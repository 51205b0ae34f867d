"""Pick the confinement backend this machine supports."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from noded.cgroups.affinity import AffinityManager
from noded.cgroups.base import CgroupManager, check_parent
from noded.cgroups.errors import CgroupUnavailableError
from noded.cgroups.mounts import DEFAULT_ROOT, PROC_MOUNTS, CgroupMounts, find_mounts
from noded.cgroups.v1 import V1CgroupManager
from noded.cgroups.v2 import V2CgroupManager
from shared.kernelfs import KernelWriter

log = logging.getLogger("trellis.cgroups")

KINDS = ("v1", "v2", "affinity")


def default_state_dir() -> Path:
    """Where the affinity fallback keeps its state when noded does not say."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"trellis-{os.geteuid()}"


def _v1_problem(mounts: CgroupMounts) -> str | None:
    cpuset = mounts.v1.get("cpuset")
    if cpuset is None:
        return "the cgroup v1 cpuset hierarchy is not mounted"
    # root, or a cpuset hierarchy delegated to our user: either way we can make groups there
    if not os.access(cpuset, os.W_OK):
        return f"{cpuset} is not writable (noded is not root)"
    return None


def _v2_problem(mounts: CgroupMounts) -> str | None:
    if mounts.v2 is None:
        return "no cgroup2 hierarchy is mounted"
    try:
        offered = set((mounts.v2 / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return f"cannot read {mounts.v2 / 'cgroup.controllers'}: {exc.strerror or exc}"
    if "cpuset" not in offered:
        return (
            f"cgroup v2 at {mounts.v2} does not delegate the cpuset controller "
            f"(cgroup.controllers: {' '.join(sorted(offered)) or 'none'})"
        )
    if not os.access(mounts.v2, os.W_OK):
        return f"{mounts.v2} is not writable (noded is not root)"
    return None


def detect_cgroups(
    parent: str,
    writer: KernelWriter | None = None,
    root: Path = DEFAULT_ROOT,
    prefer: str | None = None,
    *,
    state_dir: Path | None = None,
    mounts_file: Path = PROC_MOUNTS,
) -> CgroupManager:
    """Return the best confinement for this machine: v1 when the cpuset v1 hierarchy is mounted
    and writable (root), else v2 when cgroup2 delegates cpuset, else CPU affinity.

    ``prefer`` forces one kind and raises CgroupUnavailableError saying why it cannot be had.
    ``writer``, when given, must have the cgroup mount points among its roots. ``state_dir`` is
    where the affinity fallback remembers its jobs (default: $XDG_RUNTIME_DIR or the temp dir).
    ``mounts_file`` lets tests describe an emulated tree under ``root``.
    """
    check_parent(parent)
    if prefer is not None and prefer not in KINDS:
        raise ValueError(f"prefer={prefer!r} is not one of {', '.join(KINDS)}")
    mounts = find_mounts(root, mounts_file)
    chosen: CgroupManager
    if prefer in (None, "v1"):
        problem = _v1_problem(mounts)
        if problem is None:
            chosen = V1CgroupManager(parent, mounts.v1, writer, others=mounts.v1_others)
            log.info("cgroup backend kind=v1 parent=%s mounts=%s", parent, mounts.v1)
            return chosen
        if prefer == "v1":
            raise CgroupUnavailableError(f"cgroup v1 requested but {problem}")
        log.info("cgroup v1 unavailable reason=%r", problem)
    if prefer in (None, "v2"):
        problem = _v2_problem(mounts)
        if problem is None and mounts.v2 is not None:
            chosen = V2CgroupManager(parent, mounts.v2, writer)
            log.info("cgroup backend kind=v2 parent=%s mount=%s", parent, mounts.v2)
            return chosen
        if prefer == "v2":
            raise CgroupUnavailableError(f"cgroup v2 requested but {problem}")
        log.info("cgroup v2 unavailable reason=%r", problem)
    directory = state_dir if state_dir is not None else default_state_dir()
    log.info("cgroup backend kind=affinity parent=%s state_dir=%s", parent, directory)
    return AffinityManager(parent, directory)
