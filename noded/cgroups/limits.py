"""What a job's group is confined to, and the kernel's CPU-list text format."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_CPU = 8192  # the kernel's largest NR_CPUS; anything above is a typo, not a machine
MAX_NODE = 1024  # likewise MAX_NUMNODES
MIN_MEMORY_BYTES = 1 << 20  # below 1 MiB nothing runs; catches MiB passed where bytes are meant
MIN_QUOTA_CORES = 0.01  # 1 ms per 100 ms period: the kernel's minimum CFS quota
MAX_CLASSID = 0xFFFFFFFF


def _id_tuple(value: Any, what: str, limit: int) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{what} must be a sequence of integers, got {value!r}")
    items = list(value)
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{what} must hold integers, got {v!r}")
        if not 0 <= v < limit:
            raise ValueError(f"{what} entry {v} is out of range 0..{limit - 1}")
    if not items:
        raise ValueError(f"{what} must not be empty: a group with no {what} cannot run anything")
    if len(set(items)) != len(items):
        raise ValueError(f"{what} {tuple(items)} lists an entry twice")
    return tuple(sorted(items))


@dataclass(frozen=True)
class GroupLimits:
    """Confinement of one job's group.

    ``cpus``/``mems`` are normalised to sorted tuples so that a value read back from the kernel
    compares equal to the one written. ``memory_bytes`` is rounded down to a page by the kernel;
    ``cpu_quota_cores`` reads back as quota/period, so 1/3 comes back as 0.33333.
    """

    cpus: tuple[int, ...]  # cores the job may run on (cpuset.cpus / affinity)
    mems: tuple[int, ...] = (0,)  # NUMA memory nodes (cpuset.mems)
    memory_bytes: int | None = None  # memory limit; None = unlimited
    cpu_quota_cores: float | None = None  # CFS quota in cores; None = unlimited
    net_classid: int | None = None  # v1 net_cls classid, when that controller is mounted

    def __post_init__(self) -> None:
        object.__setattr__(self, "cpus", _id_tuple(self.cpus, "cpus", MAX_CPU))
        object.__setattr__(self, "mems", _id_tuple(self.mems, "mems", MAX_NODE))
        mem = self.memory_bytes
        if mem is not None:
            if isinstance(mem, bool) or not isinstance(mem, int):
                raise ValueError(f"memory_bytes must be an integer number of bytes, got {mem!r}")
            if mem < MIN_MEMORY_BYTES:
                raise ValueError(
                    f"memory_bytes={mem} is below 1 MiB; the field is in bytes (None = unlimited)"
                )
        quota = self.cpu_quota_cores
        if quota is not None:
            if isinstance(quota, bool) or not isinstance(quota, (int, float)):
                raise ValueError(f"cpu_quota_cores must be a number, got {quota!r}")
            if not math.isfinite(quota) or quota < MIN_QUOTA_CORES:
                raise ValueError(
                    f"cpu_quota_cores={quota} must be at least {MIN_QUOTA_CORES} (None = unlimited)"
                )
            object.__setattr__(self, "cpu_quota_cores", float(quota))
        cid = self.net_classid
        if cid is not None and (
            isinstance(cid, bool) or not isinstance(cid, int) or not 0 < cid <= MAX_CLASSID
        ):
            raise ValueError(f"net_classid must be an integer in 1..0xFFFFFFFF, got {cid!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": list(self.cpus),
            "mems": list(self.mems),
            "memory_bytes": self.memory_bytes,
            "cpu_quota_cores": self.cpu_quota_cores,
            "net_classid": self.net_classid,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GroupLimits:
        unknown = set(data) - {"cpus", "mems", "memory_bytes", "cpu_quota_cores", "net_classid"}
        if unknown:
            raise ValueError(f"unknown GroupLimits fields {sorted(unknown)}")
        if "cpus" not in data:
            raise ValueError("GroupLimits needs 'cpus'")
        return cls(
            cpus=data["cpus"],
            mems=data.get("mems", (0,)),
            memory_bytes=data.get("memory_bytes"),
            cpu_quota_cores=data.get("cpu_quota_cores"),
            net_classid=data.get("net_classid"),
        )
