"""A cgroup v2 group per job that only accounts, on hosts whose controllers are cgroup v1.

On a hybrid host (v1 controllers under /sys/fs/cgroup, the v2 hierarchy mounted beside them,
usually at /sys/fs/cgroup/unified) the v1 backend confines a job, and the job sits in the v2
root, where neither its CPU time nor its sockets can be told apart. A v2 group needs no
controller for either: ``cpu.stat`` counts CPU time in every v2 group, and nftables' ``socket
cgroupv2`` matches a socket by the v2 group of the process that created it. So each job gets
``<v2 mount>/<parent>-acct/<job>``, which the shim joins before it execs the job (its
``cgroup.procs`` is one of the files the shim writes its pid to), like the job's own groups.

Where the backend is v2 itself the job's own group serves, and no extra group is made.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path

from shared.model import check_name

log = logging.getLogger("trellis.node.usage")


class AccountingGroups:
    def __init__(self, v2_mount: Path, parent: str) -> None:
        self.root = v2_mount / f"{check_name(parent, 'cgroup parent')}-acct"

    def create(self, job_id: str) -> Path:
        """The job's group's ``cgroup.procs`` (made if missing)."""
        group = self.root / check_name(job_id, "job id")
        group.mkdir(parents=True, exist_ok=True)
        return group / "cgroup.procs"

    def remove(self, job_id: str) -> bool:
        """Remove the job's group; False while processes remain in it (try again later)."""
        group = self.root / check_name(job_id, "job id")
        try:
            group.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            raise
        return True

    def leftovers(self) -> list[str]:
        with contextlib.suppress(OSError):
            return sorted(p.name for p in self.root.iterdir() if p.is_dir())
        return []

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self.root)
