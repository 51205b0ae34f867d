"""podman's command line for one node: its own store and run state, runc, cgroupfs."""

from __future__ import annotations

import hashlib
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
        if name == "nproc":
            # podman caps its own (and so conmon's, runc's) nproc at pid_max: no more
            # processes than pids can exist, and runc cannot raise a limit above its own.
            hard = min(hard, _pid_max())
        if hard == resource.RLIM_INFINITY:
            continue  # no ceiling here: podman's default fits
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        flags += ["--ulimit", f"{name}={soft}:{hard}"]
    return flags


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 32768


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

    @property
    def runroot(self) -> Path:
        """podman's run state: it refuses a runroot longer than 50 characters (conmon's
        socket paths must fit sun_path), so it lives under /run, named by the store."""
        digest = hashlib.sha1(str(self.storage).encode()).hexdigest()[:16]
        return Path("/run/trellis-podman") / digest

    def argv(self, *args: str) -> list[str]:
        return [
            self.executable,
            "--root", str(self.storage / "root"),
            "--runroot", str(self.runroot),
            "--tmpdir", str(self.storage / "tmp"),
            "--runtime", self.runtime,
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "none",
            *args,
        ]

    def clean(self) -> None:
        """Remove every container of this store (killing what still runs), unmount the store
        and remove its run state: what is left of a node's containers is then its storage
        directory, removed like any directory."""
        import subprocess

        if self.storage.exists():
            subprocess.run(self.argv("rm", "--all", "--force", "--time", "0"),
                           capture_output=True, timeout=120)
            subprocess.run(["umount", "-R", str(self.storage / "root" / "overlay")],
                           capture_output=True, timeout=60)
        shutil.rmtree(self.runroot, ignore_errors=True)
