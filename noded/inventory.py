"""What this server has: CPU topology from sysfs, memory and NICs from psutil."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psutil

from shared.cpulist import parse_cpu_list
from shared.model import CpuCore, NicInfo

SYSFS_CPU = Path("/sys/devices/system/cpu")
SYSFS_NODE = Path("/sys/devices/system/node")


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def cpu_topology(
    offered: str = "", sysfs_cpu: Path = SYSFS_CPU, sysfs_node: Path = SYSFS_NODE
) -> tuple[CpuCore, ...]:
    """Cores this node may hand out: the configured list, else every core we may run on."""
    allowed = set(os.sched_getaffinity(0))
    online = set(parse_cpu_list(_read(sysfs_cpu / "online", ""))) or allowed
    cpus = set(parse_cpu_list(offered)) if offered else allowed
    missing = cpus - online
    if missing:
        raise ValueError(f"configured cpus {sorted(missing)} are not online on this machine")
    numa_of: dict[int, int] = {}
    if sysfs_node.is_dir():
        for entry in sysfs_node.glob("node[0-9]*"):
            for cpu in parse_cpu_list(_read(entry / "cpulist")):
                numa_of[cpu] = int(entry.name[4:])
    cores = []
    for cpu in sorted(cpus):
        topo = sysfs_cpu / f"cpu{cpu}" / "topology"
        siblings = parse_cpu_list(_read(topo / "thread_siblings_list", str(cpu)))
        cores.append(
            CpuCore(
                id=cpu,
                socket=max(0, int(_read(topo / "physical_package_id", "0") or 0)),
                numa_node=numa_of.get(cpu, 0),
                core=max(0, int(_read(topo / "core_id", str(cpu)) or cpu)),
                siblings=tuple(s for s in siblings if s != cpu),
            )
        )
    return tuple(cores)


def memory_mib() -> int:
    return psutil.virtual_memory().total // (1024 * 1024)


def nics() -> tuple[NicInfo, ...]:
    out = []
    for name, stats in sorted(psutil.net_if_stats().items()):
        if name == "lo" or not stats.isup:
            continue
        out.append(NicInfo(name=name[:64], speed_mbps=max(0, stats.speed)))
    return tuple(out)


def hostname() -> str:
    return socket.gethostname()
