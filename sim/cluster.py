"""Simulated clusters: node groups from configuration, built into real NodeInventory objects."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from shared.model import CpuCore, GpuInfo, NicInfo, NodeInventory, check_name


class ClusterConfigError(ValueError):
    """A cluster description that cannot be built; the message names the offending field."""


@dataclass(frozen=True)
class NodeGroup:
    """``count`` identical nodes. Topology: GPUs are spread evenly over ``sockets`` NUMA nodes,
    ``gpus_per_switch`` consecutive GPUs share a PCIe switch."""

    count: int
    gpus_per_node: int
    gpu_model: str = "K80"
    gpu_memory_mib: int = 12288
    cpu_cores: int = 20
    sockets: int = 2
    gpus_per_switch: int = 2
    memory_mib: int = 65536
    nic_mbps: int = 56000
    prefix: str = "node"

    def __post_init__(self) -> None:
        checks = (
            ("count", self.count >= 1, "must be at least 1"),
            ("gpus_per_node", self.gpus_per_node >= 0, "must not be negative"),
            ("cpu_cores", self.cpu_cores >= 0, "must not be negative"),
            ("sockets", self.sockets >= 1, "must be at least 1"),
            ("gpus_per_switch", self.gpus_per_switch >= 1, "must be at least 1"),
            ("memory_mib", self.memory_mib >= 0, "must not be negative"),
            ("gpu_memory_mib", self.gpu_memory_mib >= 0, "must not be negative"),
            ("nic_mbps", self.nic_mbps >= 0, "must not be negative"),
        )
        for name, ok, message in checks:
            if not ok:
                raise ClusterConfigError(f"node group {self.prefix!r}: {name} {message}")
        if self.cpu_cores and self.cpu_cores < self.sockets:
            raise ClusterConfigError(
                f"node group {self.prefix!r}: {self.cpu_cores} cores cannot fill "
                f"{self.sockets} sockets"
            )
        try:
            check_name(f"{self.prefix}-0", "node name")
        except ValueError as exc:
            raise ClusterConfigError(f"node group prefix: {exc}") from None


def build_node(name: str, group: NodeGroup) -> NodeInventory:
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-sim-{name}-{i}",
            model=group.gpu_model,
            memory_mib=group.gpu_memory_mib,
            numa_node=i * group.sockets // group.gpus_per_node,
            pcie_switch=i // group.gpus_per_switch,
        )
        for i in range(group.gpus_per_node)
    )
    per_socket = max(group.cpu_cores // group.sockets, 1)
    cpus = tuple(
        CpuCore(id=c, socket=min(c // per_socket, group.sockets - 1),
                numa_node=min(c // per_socket, group.sockets - 1), core=c)
        for c in range(group.cpu_cores)
    )
    return NodeInventory(
        name=check_name(name, "node name"),
        hostname=name,
        address=f"sim://{name}",
        gpus=gpus,
        cpus=cpus,
        memory_mib=group.memory_mib,
        nics=(NicInfo(name="ib0", speed_mbps=group.nic_mbps),),
    )


def build_cluster(groups: Iterable[NodeGroup]) -> list[NodeInventory]:
    nodes: list[NodeInventory] = []
    seen: set[str] = set()
    for group in groups:
        for i in range(group.count):
            name = f"{group.prefix}-{i:04d}"
            if name in seen:
                raise ClusterConfigError(f"two node groups produce node {name}: use prefixes")
            seen.add(name)
            nodes.append(build_node(name, group))
    return nodes


_GROUP_FIELDS = {f.name: f.type for f in fields(NodeGroup)}


def group_from_mapping(data: Mapping[str, Any], where: str) -> NodeGroup:
    unknown = sorted(set(data) - set(_GROUP_FIELDS))
    if unknown:
        raise ClusterConfigError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(_GROUP_FIELDS)}"
        )
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        want_str = key in ("gpu_model", "prefix")
        if want_str and not isinstance(value, str):
            raise ClusterConfigError(f"{where}.{key}: must be a string, got {value!r}")
        if not want_str and (isinstance(value, bool) or not isinstance(value, int)):
            raise ClusterConfigError(f"{where}.{key}: must be an integer, got {value!r}")
        kwargs[key] = value
    if "count" not in kwargs or "gpus_per_node" not in kwargs:
        raise ClusterConfigError(f"{where}: count and gpus_per_node are required")
    return NodeGroup(**kwargs)


def load_cluster_file(path: Path) -> list[NodeGroup]:
    """A TOML or JSON file: ``[[group]]`` tables (TOML) or ``{"groups": [...]}`` (JSON)."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ClusterConfigError(f"cannot read cluster file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ClusterConfigError(f"{path}: not valid {path.suffix or 'TOML'}: {exc}") from None
    raw = data.get("groups", data.get("group")) if isinstance(data, dict) else None
    if not isinstance(raw, list) or not raw:
        raise ClusterConfigError(f"{path}: expected a non-empty list of node groups under 'group'")
    groups = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ClusterConfigError(f"{path}: group[{i}] must be a table")
        groups.append(group_from_mapping(entry, f"{path}: group[{i}]"))
    return groups
