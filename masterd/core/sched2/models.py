"""The GPU models of a cluster as SCHED²'s policies need them: servers, GPUs per server, and
which model a job's predictions use (its own, else the cluster's first: SCHED² assumes
identical GPUs, §III-A)."""

from __future__ import annotations

from dataclasses import dataclass

from masterd.core.cluster import ClusterSnapshot
from shared.model import JobSpec


@dataclass(frozen=True)
class GpuModels:
    servers: dict[str, int]  # GPU model -> servers of that model (schedulable or not)
    gpus_per_server: dict[str, int]  # GPU model -> most GPUs one such server has

    @classmethod
    def of(cls, snapshot: ClusterSnapshot) -> GpuModels:
        sizes = {m: by for m, by in snapshot.node_sizes().items() if m is not None}
        return cls({m: sum(by.values()) for m, by in sizes.items()},
                   {m: max(by) for m, by in sizes.items()})

    @property
    def names(self) -> list[str]:
        return sorted(self.servers)

    def model_for(self, spec: JobSpec) -> str | None:
        if spec.gpu_model is not None:
            return spec.gpu_model if spec.gpu_model in self.servers else None
        names = self.names
        return names[0] if names else None

