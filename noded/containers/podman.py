"""podman's command line for one node: its own store and run state, runc, cgroupfs."""

from __future__ import annotations

import platform
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path

# What podman's image config calls this machine's architecture (Go's GOARCH names).
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le",
                 "s390x": "s390x", "riscv64": "riscv64", "armv7l": "arm"}


def node_architecture() -> str:
    machine = platform.machine()
    return ARCHITECTURES.get(machine, machine)


def rlimit_flags() -> list[str]:
    """``--ulimit`` for nofile and nproc at this node's own hard limits: podman's defaults
    (1048576) exceed the hard limits of many hosts, where runc's setrlimit then fails."""
    flags = []
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = resource.getrlimit(which)
        if hard == resource.RLIM_INFINITY:
            continue  # no ceiling here: podman's default fits
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        flags += ["--ulimit", f"{name}={soft}:{hard}"]
    return flags


@dataclass(frozen=True)
class Podman:
    """The node's podman: image store and run state under ``storage`` (never the machine's
    global store), the chosen OCI runtime, cgroupfs (noded, not systemd, owns the groups)."""

    storage: Path
    runtime: str = "runc"
    executable: str = "podman"

    @staticmethod
    def available(runtime: str) -> str:
        """'' when podman and ``runtime`` are installed, else the sentence saying which is not."""
        for tool in ("podman", runtime, "conmon"):
            if shutil.which(tool) is None and not Path(f"/usr/libexec/podman/{tool}").exists():
                return f"{tool} is not installed"
        return ""

    def argv(self, *args: str) -> list[str]:
        return [
            self.executable,
            "--root", str(self.storage / "root"),
            "--runroot", str(self.storage / "run"),
            "--tmpdir", str(self.storage / "tmp"),
            "--runtime", self.runtime,
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "none",
            *args,
        ]
