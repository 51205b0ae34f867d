"""SODA's network partition in the running node (§V-E): noded's ``[net]`` section switched on.

While a multi-node GPU job runs on this node, GPU jobs are guaranteed ``gpu_share`` of the
data NIC and CPU jobs ``cpu_share`` (75/25 by default); either class may use the whole link
when the other is idle. The mechanism is :mod:`noded.netshape` (HTB through pyroute2, job
traffic classified by nftables); this module is its driver: every ``POLL_S`` it compares the
job parts running here with what the partitioner knows, announces started and ended parts
(a part's kind is ``gpu`` when it holds GPUs here, multi-node when its job spans nodes), and
tells the master whenever the partition goes on or off (a ``partition`` event, which the
master journals and ``trellisctl node`` shows). The partitioner installs the HTB root when the
first multi-node GPU job starts and removes it, restoring the NIC's original root qdisc, when
the last one ends or noded stops.

Which classifier: ``cgroup2`` (``socket cgroupv2``: the jobs' processes must sit in cgroup v2
groups, as under noded's v2 cgroup mode) or ``net_cls`` (a cgroup v1 net_cls hierarchy; the
classifier moves each job's processes into a net_cls group of its own, which re-tags their
existing sockets too). ``auto`` takes cgroup2 when noded runs cgroup v2, else net_cls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noded.cgroups import CgroupError, CgroupManager
from noded.jobs import JobRunner
from noded.netshape import (
    BandwidthPartitioner,
    CgroupV2Classifier,
    JobClassifier,
    NetClsClassifier,
    NetShapeError,
    TrafficShaper,
)
from shared.config import NetConfig
from shared.messages import NetPartitionSwitch
from shared.schema import encode

log = logging.getLogger("trellis.node.partition")

POLL_S = 0.5  # how often started and ended job parts are noticed
CLONE_NEWNET = 0x40000000
Send = Callable[[str, dict[str, Any]], Awaitable[None]]


class PartitionSetupError(ValueError):
    """``[net]`` asks for a partition this node cannot make; the message says why."""


def link_speed(interface: str, sys_class_net: Path = Path("/sys/class/net")) -> int:
    """The NIC's speed in Mbit/s from sysfs (virtual NICs have none: set net.link_mbit)."""
    try:
        speed = int((sys_class_net / interface / "speed").read_text().strip())
    except (OSError, ValueError):
        speed = -1
    if speed <= 0:
        raise PartitionSetupError(
            f"[net]: the speed of {interface!r} is unknown (no /sys/class/net/{interface}/speed "
            "value); set net.link_mbit")
    return speed


def find_net_cls_mount(mountinfo: str) -> Path | None:
    """The first cgroup v1 hierarchy with the net_cls controller in /proc/self/mountinfo."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        parts = right.split()
        if sep and len(parts) >= 3 and parts[0] == "cgroup" and "net_cls" in parts[2].split(","):
            return Path(left.split()[4])
    return None


def enter_netns(name: str, netns_dir: Path = Path("/run/netns")) -> None:
    """Move the calling thread into the named network namespace."""
    path = netns_dir / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetShapeError(f"network namespace {name!r} does not exist ({exc.strerror})") from None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetShapeError(f"cannot enter network namespace {name!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


def make_classifier(config: NetConfig, cgroup_kind: str, shaper: TrafficShaper) -> JobClassifier:
    classids = {"gpu": shaper.classid("gpu"), "cpu": shaper.classid("cpu")}
    netns = config.netns or None
    kind = config.classifier
    if kind == "auto":
        kind = "cgroup2" if cgroup_kind == "v2" else "net_cls"
    if kind == "cgroup2":
        return CgroupV2Classifier(classids, netns=netns, ifname=config.interface,
                                  table=config.nft_table)
    mount = Path(config.net_cls_mount) if config.net_cls_mount else None
    if mount is None:
        mount = find_net_cls_mount(Path("/proc/self/mountinfo").read_text())
    if mount is None:
        raise PartitionSetupError(
            "[net]: no cgroup v1 net_cls hierarchy is mounted to classify job traffic with; "
            "mount one (mount -t cgroup -o net_cls net_cls DIR) and set net.net_cls_mount, "
            "or run noded with cgroup v2 (net.classifier = \"cgroup2\")")
    return NetClsClassifier(classids, mount, netns=netns, ifname=config.interface,
                            table=config.nft_table)


@dataclass
class PartitionState:
    """What /metrics and the master see."""

    active: bool = False
    changes: int = 0  # times it went on or off
    multi_node_jobs: tuple[str, ...] = ()
    classified: dict[str, str] = field(default_factory=dict)  # job -> gpu | cpu
    class_bytes: dict[str, int] = field(default_factory=dict)  # HTB class -> bytes sent


class NetPartition:
    """The driver. pyroute2 and nft block (and pyroute2 cannot run inside a running event
    loop's thread), so every netshape call runs on one worker thread of its own; the event
    loop only takes a snapshot of the running parts and sends the events."""

    def __init__(self, config: NetConfig, runner: JobRunner, cgroups: CgroupManager,
                 send: Send | None = None) -> None:
        self.config = config
        self.runner = runner
        self.cgroups = cgroups
        self.send = send
        self.link_mbit = config.link_mbit or link_speed(config.interface)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netshape")
        self.state = PartitionState()
        self._failed: set[str] = set()  # parts whose classification failed (warned once)
        self._announced: dict[str, frozenset[int]] = {}  # job -> pids it was announced with
        try:
            self._pool.submit(self._setup).result()
        except BaseException:
            self._pool.shutdown(wait=False)
            raise

    def _setup(self) -> None:
        config = self.config
        try:
            if config.netns:
                # This worker thread moves into the NIC's namespace (a network namespace is
                # per thread), so pyroute2 opens its netlink socket there directly. Asked to
                # do it itself, pyroute2 forks a helper, and a fork of noded inherits the event
                # loop's signal wake-up descriptor: the helper's exit reads as a SIGTERM.
                enter_netns(config.netns)
            self.shaper = TrafficShaper(config.interface, self.link_mbit, config.gpu_share,
                                        config.cpu_share)
            classifier = make_classifier(config, self.cgroups.kind, self.shaper)
        except NetShapeError as exc:
            raise PartitionSetupError(f"[net]: {exc}") from None
        self.partitioner = BandwidthPartitioner(self.shaper, classifier)
        log.info("partition ready interface=%s link_mbit=%d gpu_share=%g cpu_share=%g "
                 "classifier=%s netns=%s", config.interface, self.link_mbit, config.gpu_share,
                 config.cpu_share, type(classifier).__name__, config.netns or "-")

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                event = await loop.run_in_executor(self._pool, self.sync, self.running())
                if event is not None:
                    await self._report(event)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), POLL_S)
        finally:
            event = await loop.run_in_executor(self._pool, self.close)
            self._pool.shutdown(wait=False)
            if event is not None:
                await self._report(event)

    def running(self) -> dict[str, tuple[str, bool]]:
        """Running parts as (kind, multi-node), read on the event loop's thread."""
        out = {}
        for part in list(self.runner.parts.values()):
            if part.state == "running":
                kind = "gpu" if part.prepare.allocation.gpus else "cpu"
                out[part.job_id] = (kind, kind == "gpu" and part.prepare.nnodes > 1)
        return out

    def sync(self, running: dict[str, tuple[str, bool]]) -> NetPartitionSwitch | None:
        """Announce started and ended parts; the event to send if the partition switched.
        Runs on the worker thread."""
        known = self.partitioner.jobs()
        for job_id in [j for j in known if j not in running]:
            self._announced.pop(job_id, None)
            self._guard(job_id, lambda j=job_id: self.partitioner.job_ended(j))
        self._failed &= running.keys()
        for job_id, (kind, multi) in running.items():
            try:
                pids = frozenset(self.cgroups.pids(job_id))
            except (CgroupError, OSError) as exc:
                log.debug("partition cannot list job=%s error=%s", job_id, exc)
                continue
            if not pids or self._announced.get(job_id) == pids:
                continue  # not started yet, or nothing new since it was announced
            # Announced again whenever its processes change: the net_cls classifier moves
            # processes, and one forked while its parent was being moved stays behind (and
            # the partition, when it goes on, classifies every job with the pids it knows).
            listed = sorted(pids)
            if self._guard(job_id, lambda j=job_id, k=kind, p=listed, m=multi:
                           self.partitioner.job_started(j, k, p, multi_node=m)):
                self._announced[job_id] = pids
        self.state.class_bytes = self._class_bytes()
        return self._switched("multi-node GPU job started" if self.partitioner.active
                              else "last multi-node GPU job ended")

    def _guard(self, job_id: str, action: Callable[[], None]) -> bool:
        try:
            action()
        except NetShapeError as exc:
            # A part that cannot be classified (gone, no own cgroup) falls into the "other"
            # class; the partition itself stays in force for everyone else. Tried again when
            # its processes change; warned once.
            level = logging.DEBUG if job_id in self._failed else logging.WARNING
            self._failed.add(job_id)
            log.log(level, "partition job=%s error=%s", job_id, exc)
            return False
        return True

    def _switched(self, reason: str) -> NetPartitionSwitch | None:
        jobs = self.partitioner.jobs()
        self.state.multi_node_jobs = tuple(sorted(j for j, n in jobs.items() if n.multi_node))
        self.state.classified = dict(self.partitioner.classifier.jobs())
        active = self.partitioner.active
        if active == self.state.active:
            return None
        self.state.active = active
        self.state.changes += 1
        log.info("partition %s interface=%s jobs=%s reason=%r", "on" if active else "off",
                 self.config.interface, ",".join(self.state.multi_node_jobs) or "-", reason)
        return NetPartitionSwitch(active=active, interface=self.config.interface,
                         link_mbit=self.link_mbit, gpu_share=self.config.gpu_share,
                         cpu_share=self.config.cpu_share, jobs=self.state.multi_node_jobs,
                         reason=reason)

    def close(self) -> NetPartitionSwitch | None:
        """noded is stopping: remove the partition and restore the NIC's original qdisc."""
        try:
            self.partitioner.close()
        except NetShapeError as exc:
            log.error("partition cannot be removed interface=%s error=%s",
                      self.config.interface, exc)
        event = self._switched("noded stopping")
        self.shaper.close()
        return event

    def class_bytes(self) -> dict[str, int]:
        """Bytes each HTB class has sent while the partition is on ({} when off), as read
        at the last round (safe from the event loop's thread)."""
        return dict(self.state.class_bytes)

    def _class_bytes(self) -> dict[str, int]:
        if not self.partitioner.active:
            return {}
        try:
            return self.shaper.class_bytes()
        except NetShapeError as exc:
            log.debug("partition class bytes unreadable: %s", exc)
            return {}

    async def _report(self, event: NetPartitionSwitch) -> None:
        if self.send is None:
            return
        try:
            await self.send("net_partition", encode(event))
        except Exception as exc:  # the master hears the state again at the next change
            log.warning("partition event not sent active=%s error=%s", event.active, exc)
