"""What a node may say on its channel: only about itself, its own GPUs and its own jobs."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from masterd.core.scheduler import SchedulingCore
from shared.messages import GpuHealth, GpuUtil, Hello, JobExited, JobStarted
from shared.protocol import ProtocolError


def check_hello(hello: Hello) -> None:
    """Refuse an inventory that lists a GPU index or a CPU id twice: the master would count
    (and place jobs on) that device twice. Raised as the hello's ``invalid_message``."""
    for field, what, ids in (("gpus", "GPU index", [g.index for g in hello.inventory.gpus]),
                             ("cpus", "CPU id", [c.id for c in hello.inventory.cpus])):
        seen: set[int] = set()
        for i in ids:
            if i in seen:
                raise ProtocolError("invalid_message",
                                    f"hello: inventory.{field} lists {what} {i} twice")
            seen.add(i)


def check_gpu(node: str, body: Any, gpus: Collection[int]) -> None:
    """Refuse a GPU's health or utilisation report for a GPU index not in the inventory the
    node's hello gave (``gpus``): the master would hold out, or show, a GPU that is not
    there."""
    if isinstance(body, GpuHealth | GpuUtil) and body.index not in gpus:
        kind = "gpu_health" if isinstance(body, GpuHealth) else "gpu_util"
        listed = f"GPUs {_runs(sorted(gpus))}" if gpus else "no GPUs"
        raise ProtocolError("unknown_gpu", f"{kind}: node {node} has no GPU {body.index} "
                            f"(its hello listed {listed})")


def _runs(ids: list[int]) -> str:
    """Sorted ids in short: ``0-7, 9`` (an inventory may hold 1,024 GPUs)."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}-{b}" if b > a + 1 else ", ".join(map(str, range(a, b + 1)))
                     for a, b in runs)


def check_event(core: SchedulingCore, node: str, body: Any,
                gpus: Collection[int] | None = None) -> None:
    """Refuse an event about a GPU the node does not have (``gpus``: the indexes its hello
    listed; None: not checked), or about a job the master placed on other nodes only.

    A job the master does not know is let through: the node is told to forget it, which is
    how stale records are cleaned up after a restart. So is the start or exit of an older
    incarnation of a job (one requeued since, masterd.core.fencing): the node's own stale
    part, which the master journals and stops or forgets there, touching nothing else.
    """
    if gpus is not None:
        check_gpu(node, body, gpus)
    if isinstance(body, JobStarted | JobExited | GpuUtil):
        job_id = body.job_id
    else:
        return
    if job_id is None:
        return
    job = core.jobs.get(job_id)
    if job is None or job.placement is None:
        return
    if isinstance(body, JobStarted | JobExited) and body.restarts < job.restarts:
        return
    if node not in job.placement.nodes:
        raise ProtocolError("forbidden", f"job {job_id} does not run on node {node}; a node "
                            "may report only its own jobs")
