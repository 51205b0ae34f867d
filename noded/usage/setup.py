"""Building the usage collector for this node: which accounting and counters it can have.

Root on a host whose job groups are cgroup v1 (or CPU affinity) with a v2 hierarchy mounted
gets accounting groups (:mod:`.acctgroup`); a v2 backend's own job groups serve as they are.
Network counters need root and the ``nft`` tool; without them bytes are reported as unknown
(``None``) and the reason is logged once.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import time

from noded.agent import NodeAgent
from noded.gpu.base import GpuBackend
from noded.jobs import JobRunner
from noded.netshape.errors import NetShapeError
from noded.netshape.nft import find_cgroup2_mount
from noded.usage.acctgroup import AccountingGroups
from noded.usage.cgroupstat import Mounts
from noded.usage.collector import UsageCollector, UsageSettings
from noded.usage.netcount import NetCounters
from shared.config import NodeConfig

log = logging.getLogger("trellis.node.usage")


def table_for(parent: str) -> str:
    """The nft table of one node's counters: nodes sharing a host (a demo cluster, tests) each
    have their own, named after their cgroup parent."""
    return "trellis_usage_" + hashlib.sha1(parent.encode()).hexdigest()[:12]


def open_usage(config: NodeConfig, runner: JobRunner, gpus: GpuBackend,
               agent: NodeAgent) -> UsageCollector:
    mounts = Mounts.read()
    root = os.geteuid() == 0
    accounting = None
    if root and mounts.v2 is not None and runner.cgroups.kind != "v2":
        accounting = AccountingGroups(mounts.v2, config.cgroup_parent)
    counters = None
    if not root:
        log.info("usage network_bytes=unknown reason=%r", "counting needs root (nftables)")
    elif mounts.v2 is None:
        log.info("usage network_bytes=unknown reason=%r", "no cgroup v2 hierarchy is mounted")
    else:
        try:
            counters = NetCounters(find_cgroup2_mount(), table_for(config.cgroup_parent))
        except (NetShapeError, OSError) as exc:
            log.warning("usage network_bytes=unknown reason=%r", str(exc))
    settings = UsageSettings(config.usage_interval_s, config.usage_report_s,
                             config.phase_threshold_pct, config.phase_samples)
    return UsageCollector(runner, gpus, lambda: agent.last_samples, agent.send_event, settings,
                          accounting, counters, mounts)


def sweep_usage(parent: str) -> None:
    """What a node of cgroup parent ``parent`` may leave when killed: its accounting groups
    (their processes killed) and its counters' table. Best effort, for harnesses."""
    mounts = Mounts.read()
    if mounts.v2 is not None:
        groups = AccountingGroups(mounts.v2, parent)
        for job in groups.leftovers():
            with contextlib.suppress(OSError, ValueError):
                procs = (groups.root / job / "cgroup.procs").read_text().split()
                for pid in procs:
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
            for _ in range(50):
                with contextlib.suppress(OSError, ValueError):
                    if groups.remove(job):
                        break
                time.sleep(0.02)
        groups.close()
    if os.geteuid() == 0:
        with contextlib.suppress(Exception):
            NetCounters(find_cgroup2_mount(), table_for(parent)).close()
