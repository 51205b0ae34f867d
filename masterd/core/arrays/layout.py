"""Which concrete GPUs and cores belong to which array.

The map is a pure function of the node inventories and the configuration, so a restarted master
derives the same map and therefore the same borrowers from the same running placements.

Rules, per GPU model M (a node's model is that of its first GPU):

* **GPUs** go to arrays by whole node: ``large:M`` takes whole nodes, ``small:M`` the rest, so a
  large job finds whole nodes and small jobs never fragment them. Nodes are considered biggest
  first (most GPUs, then name) and added to the large array while that brings its GPU count
  strictly closer to the configured target without passing the upper bound (a tie leaves the
  node in the small array); if the lower bound is still
  not met, further nodes are added while the upper bound allows. Bounds therefore hold up to
  whole-node granularity, and the upper bound always holds.
* **Cores** of every GPU node are split: ``cpu_job_cores`` of them form that node's share of the
  CPU-job array ``cpu``; the rest form the GPU-job CPU array ``gpu-cpu:M`` that GPU jobs of the
  node use. CPU-job cores are taken from NUMA nodes with the fewest GPUs first, highest physical
  core first (SMT siblings stay together), so GPU jobs keep the cores near their GPUs.
* Nodes without GPUs give all their cores to ``cpu``.

Unschedulable (down, drained) nodes keep their place in the map so it does not shift when a
node blinks; nodes removed from the cluster drop out. A changed configuration (``resize``) can
move nodes between arrays: jobs left on the wrong side then count as borrowers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from masterd.core.arrays.config import ArrayConfig, Size
from masterd.core.cluster import NodeView
from shared.model import JobSpec, NodeInventory

LARGE, SMALL, GPU_CPU, CPU = "large", "small", "gpu-cpu", "cpu"
GPU_KINDS = (LARGE, SMALL)
_KIND_ORDER = {LARGE: 0, SMALL: 1, GPU_CPU: 2, CPU: 3}


@dataclass(frozen=True)
class ArrayId:
    """A resource array: ``large``/``small`` hold GPUs, ``gpu-cpu``/``cpu`` hold cores."""

    kind: str
    gpu_model: str | None = None

    @property
    def name(self) -> str:
        return self.kind if self.gpu_model is None else f"{self.kind}:{self.gpu_model}"

    @property
    def holds_gpus(self) -> bool:
        return self.kind in GPU_KINDS

    @property
    def unit(self) -> str:
        return "gpus" if self.holds_gpus else "cores"

    def sort_key(self) -> tuple[int, str, int]:
        # GPU arrays first (their jobs are the expensive ones), model by model.
        return (1 if self.gpu_model is None else 0, self.gpu_model or "", _KIND_ORDER[self.kind])

    def __str__(self) -> str:
        return self.name


CPU_ARRAY = ArrayId(CPU)


@dataclass(frozen=True)
class NodeArrays:
    """One node's units by array."""

    node: str
    gpu_array: ArrayId | None  # owner of every GPU on the node (None on GPU-less nodes)
    gpu_cpu_array: ArrayId | None
    gpus: frozenset[int]
    gpu_job_cpus: frozenset[int]
    cpu_job_cpus: frozenset[int]

    def core_owner(self, core: int) -> ArrayId | None:
        if core in self.gpu_job_cpus:
            return self.gpu_cpu_array
        if core in self.cpu_job_cpus:
            return CPU_ARRAY
        return None


@dataclass(frozen=True)
class Home:
    """Where a queued job belongs: the job array it queues in and the arrays it may use."""

    job_array: ArrayId
    allowed: frozenset[ArrayId]


@dataclass(frozen=True)
class ArrayMap:
    nodes: Mapping[str, NodeArrays]
    arrays: tuple[ArrayId, ...]  # every resource array, in processing order
    default_gpu_model: str | None
    gpu_jobs_borrow_cpu_cores: bool = False  # config: GPU jobs may borrow CPU-job cores

    @property
    def gpu_models(self) -> list[str]:
        return sorted({a.gpu_model for a in self.arrays if a.gpu_model is not None})

    def home(self, spec: JobSpec) -> Home | None:
        """The job's array, or None when no array can ever host it (no node of its model)."""
        if spec.gpus == 0:
            return Home(CPU_ARRAY, frozenset({CPU_ARRAY}))
        model = spec.gpu_model or self.default_gpu_model
        if model is None or model not in self.gpu_models:
            return None
        job_array = ArrayId(spec.array_kind, model)
        return Home(job_array, frozenset({job_array, ArrayId(GPU_CPU, model)}))

    def lenders(self, spec: JobSpec, home: Home) -> list[frozenset[ArrayId]]:
        """Groups of arrays a job may borrow from, in preference order.

        A group is what must be lendable together for the job to use any of it: a GPU job on
        another model's node needs that node's GPU array and its GPU-job cores.
        """
        if home.job_array == CPU_ARRAY:
            return [frozenset({ArrayId(GPU_CPU, m)}) for m in self.gpu_models]
        model = home.job_array.gpu_model
        other = LARGE if home.job_array.kind == SMALL else SMALL
        groups = [frozenset({ArrayId(other, model)})]
        if self.gpu_jobs_borrow_cpu_cores:
            # Idle cores of the CPU-job array on the job's own nodes; a waiting CPU job
            # stops the lending and reclaims them (the borrower is preempted).
            groups.insert(0, frozenset({CPU_ARRAY}))
        if spec.gpu_model is None:
            # A job that named no model runs on any model, its own kind first.
            for m in self.gpu_models:
                if m == model:
                    continue
                for kind in (home.job_array.kind, other):
                    groups.append(frozenset({ArrayId(kind, m), ArrayId(GPU_CPU, m)}))
        return [g for g in groups if all(a in self.arrays for a in g)]

    def cpu_job_cores(self) -> dict[str, frozenset[int]]:
        """Each node's cores of the CPU-job array (where CPU inference replicas go, §V-D)."""
        return {name: na.cpu_job_cpus for name, na in self.nodes.items()}

    def small_job_cores(self) -> dict[str, frozenset[int]]:
        """The GPU-job cores of the small-job arrays' nodes: where a one-GPU job (a GPU
        inference replica) goes without borrowing."""
        return {name: na.gpu_job_cpus for name, na in self.nodes.items()
                if na.gpu_array is not None and na.gpu_array.kind == SMALL}

    def size(self, array: ArrayId) -> int:
        total = 0
        for na in self.nodes.values():
            if array.holds_gpus:
                total += len(na.gpus) if na.gpu_array == array else 0
            elif array == CPU_ARRAY:
                total += len(na.cpu_job_cpus)
            elif na.gpu_cpu_array == array:
                total += len(na.gpu_job_cpus)
        return total

    def owners_of(self, array: ArrayId) -> list[ArrayId]:
        """Job arrays whose jobs own ``array``'s units (and so stop it lending when waiting)."""
        if array.kind == GPU_CPU:
            return [ArrayId(k, array.gpu_model) for k in GPU_KINDS]
        return [array]

    def borrowed_units(
        self, placement_allocs: Iterable[tuple[str, Iterable[int], Iterable[int]]], home: Home
    ) -> Counter[ArrayId]:
        """Units per foreign array that a placement holds outside ``home``."""
        out: Counter[ArrayId] = Counter()
        for node, gpus, cpus in placement_allocs:
            na = self.nodes.get(node)
            if na is None:
                continue
            gpu_list = list(gpus)
            if gpu_list and na.gpu_array is not None and na.gpu_array not in home.allowed:
                out[na.gpu_array] += len(gpu_list)
            for core in cpus:
                owner = na.core_owner(core)
                if owner is not None and owner not in home.allowed:
                    out[owner] += 1
        return out


def build_array_map(nodes: Mapping[str, NodeView], config: ArrayConfig) -> ArrayMap:
    """Derive the array map from every known node (schedulable or not)."""
    by_model: dict[str, list[NodeInventory]] = defaultdict(list)
    result: dict[str, NodeArrays] = {}
    for name in sorted(nodes):
        inv = nodes[name].inventory
        model = inv.gpu_model
        if model is None:
            result[name] = NodeArrays(
                node=name,
                gpu_array=None,
                gpu_cpu_array=None,
                gpus=frozenset(),
                gpu_job_cpus=frozenset(),
                cpu_job_cpus=frozenset(c.id for c in inv.cpus),
            )
        else:
            by_model[model].append(inv)
    arrays: set[ArrayId] = {CPU_ARRAY}
    for model, invs in by_model.items():
        cfg = config.for_model(model)
        large_nodes = _choose_large_nodes(invs, cfg.large_gpus(sum(len(i.gpus) for i in invs)),
                                          cfg.large_min, cfg.large_max)
        large, small, gpu_cpu = ArrayId(LARGE, model), ArrayId(SMALL, model), ArrayId(
            GPU_CPU, model
        )
        arrays.update((large, small, gpu_cpu))
        for inv in invs:
            cpu_job = _choose_cpu_job_cores(inv, cfg.cpu_cores(len(inv.cpus)))
            result[inv.name] = NodeArrays(
                node=inv.name,
                gpu_array=large if inv.name in large_nodes else small,
                gpu_cpu_array=gpu_cpu,
                gpus=frozenset(g.index for g in inv.gpus),
                gpu_job_cpus=frozenset(c.id for c in inv.cpus) - cpu_job,
                cpu_job_cpus=cpu_job,
            )
    default_model = config.default_gpu_model
    if default_model not in by_model:
        # The model with the most GPUs hosts jobs that name none; ties go to the first name.
        default_model = min(
            by_model, key=lambda m: (-sum(len(i.gpus) for i in by_model[m]), m), default=None
        )
    return ArrayMap(
        nodes=MappingProxyType(result),
        arrays=tuple(sorted(arrays, key=ArrayId.sort_key)),
        default_gpu_model=default_model,
        gpu_jobs_borrow_cpu_cores=config.gpu_jobs_borrow_cpu_cores,
    )


def _choose_large_nodes(
    invs: list[NodeInventory], target: int, low: Size, high: Size
) -> set[str]:
    capacity = sum(len(i.gpus) for i in invs)
    lo, hi = low.resolve(capacity), high.resolve(capacity)
    ordered = sorted(invs, key=lambda i: (-len(i.gpus), i.name))
    chosen: set[str] = set()
    total = 0
    for inv in ordered:
        g = len(inv.gpus)
        # Take the node if that brings the total strictly closer to the target; on a tie the
        # node stays small, so a share never empties the small array by rounding.
        if total < target and total + g <= hi and (total + g - target) < (target - total):
            chosen.add(inv.name)
            total += g
    for inv in ordered:
        if total >= lo:
            break
        g = len(inv.gpus)
        if inv.name not in chosen and total + g <= hi:
            chosen.add(inv.name)
            total += g
    return chosen


def _choose_cpu_job_cores(inv: NodeInventory, count: int) -> frozenset[int]:
    if count <= 0:
        return frozenset()
    gpus_per_numa = Counter(g.numa_node for g in inv.gpus)
    ranked = sorted(
        inv.cpus, key=lambda c: (gpus_per_numa.get(c.numa_node, 0), -c.socket, -c.core, -c.id)
    )
    return frozenset(c.id for c in ranked[:count])
