"""SODA's adaptive CPU allocator may give a training part more cores than it asked (§V-B).

The allocator "increases or decreases the CPU core number allocated to J" and starts with "a
large parallelism at the beginning" (§V-B2, §VI-H); 57.1% of the paper's training jobs ended
with 1–5 cores more than they asked (§VI-D). So a job's request is not its ceiling. The
ceiling of a part, decided here at launch, is

    max(cores placed, max_cores_per_gpu × the part's GPUs)

(``adaptive_max_cores_per_gpu`` in the master's configuration; 0 keeps the request as the
ceiling), and the cores above the request come only from **spare** cores of the part's node:

* under SODA's arrays (``soda-arrays``), the idle cores of the CPU-job array on that node
  (§V-C: the CPU resource array of CPU jobs lends idle cores to GPU jobs; a waiting CPU job
  takes them back through the arrays' own reclaim);
* under any other policy, the node's free cores beyond a reserve for its still-free GPUs
  (``reserve_per_gpu`` each, the node's cores per GPU), so widening one job never strands
  another's GPUs without cores.

The node's tuner then holds the whole widened budget and hands back what it does not need, as
it does with a request's cores. Pure and synchronous: the master's feature
(``masterd.features.adaptive``) and the simulator (``sim.soda``) both call it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from masterd.core.arrays import ArrayPolicy
from masterd.core.cluster import ClusterSnapshot, NodeView
from masterd.core.policy import Policy


def ceiling(placed: int, gpus: int, max_cores_per_gpu: int) -> int:
    """The most cores a part may hold: its request, or the per-GPU ceiling if larger."""
    if max_cores_per_gpu < 0:
        raise ValueError(f"max cores per GPU must be at least 0, got {max_cores_per_gpu}")
    return max(placed, max_cores_per_gpu * max(gpus, 0))


def spare_cores(
    free: Collection[int],
    cpu_array: Collection[int] | None,
    free_gpus: int,
    reserve_per_gpu: int,
) -> list[int]:
    """Cores of a node a part may widen into, best last-taken first (ascending ids).

    ``cpu_array``: the node's CPU-job-array cores under SODA's arrays (only those are lent),
    or None without arrays (then ``reserve_per_gpu`` cores per free GPU stay free).
    """
    if cpu_array is not None:
        return sorted(set(free) & set(cpu_array))
    reserve = max(0, free_gpus) * max(0, reserve_per_gpu)
    ordered = sorted(free)
    return ordered[reserve:] if reserve < len(ordered) else []


def node_spare_cores(policy: Policy, snapshot: Callable[[], ClusterSnapshot],
                     view: NodeView) -> list[int]:
    """:func:`spare_cores` of one node under ``policy`` (unwrapped): the CPU-job array's
    cores of the node under SODA's arrays (``snapshot`` is called only then), else its free
    cores beyond a reserve of the node's cores per GPU for each of its free GPUs."""
    cpu_array: Collection[int] | None = None
    if isinstance(policy, ArrayPolicy):
        na = policy.array_map(snapshot()).nodes.get(view.name)
        cpu_array = na.cpu_job_cpus if na is not None else frozenset()
    inv = view.inventory
    return spare_cores(view.free_cpus, cpu_array, len(view.free_gpus),
                       len(inv.cpus) // max(1, len(inv.gpus)))


def widened(held: Iterable[int], gpus: int, spare: Iterable[int],
            max_cores_per_gpu: int) -> tuple[int, ...]:
    """The part's cores after widening: ``held`` plus spare cores up to the ceiling."""
    own = sorted(set(held))
    room = ceiling(len(own), gpus, max_cores_per_gpu) - len(own)
    extra = [c for c in spare if c not in own][:max(room, 0)]
    return tuple(sorted(own + extra))
