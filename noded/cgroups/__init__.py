"""CPU/memory confinement of job processes on a node: cgroup v1, cgroup v2 or CPU affinity,
and the GPU device fence on the same groups (``devrules``; v1 devices controller, v2 ``bpfdev``).

``detect_cgroups(parent, ...)`` returns a ``CgroupManager`` for this machine; every backend has
the same interface (see ``base.CgroupManager``) and every cgroupfs write goes through
``shared.kernelfs.KernelWriter``.
"""

from noded.cgroups.affinity import AffinityManager, pin_process
from noded.cgroups.attach import join_group
from noded.cgroups.base import CgroupManager
from noded.cgroups.detect import default_state_dir, detect_cgroups
from noded.cgroups.errors import (
    CgroupError,
    CgroupUnavailableError,
    GroupBusyError,
    GroupNotFoundError,
    LimitsError,
)
from noded.cgroups.limits import GroupLimits
from noded.cgroups.mounts import CgroupMounts, find_mounts
from noded.cgroups.v1 import V1CgroupManager
from noded.cgroups.v2 import V2CgroupManager
from shared.cpulist import format_cpu_list, parse_cpu_list

__all__ = [
    "AffinityManager",
    "CgroupError",
    "CgroupManager",
    "CgroupMounts",
    "CgroupUnavailableError",
    "GroupBusyError",
    "GroupLimits",
    "GroupNotFoundError",
    "LimitsError",
    "V1CgroupManager",
    "V2CgroupManager",
    "default_state_dir",
    "detect_cgroups",
    "find_mounts",
    "format_cpu_list",
    "join_group",
    "parse_cpu_list",
    "pin_process",
]
