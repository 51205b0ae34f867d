"""What a node may say on its channel: only about itself and its own jobs."""

from __future__ import annotations

from typing import Any

from masterd.core.scheduler import SchedulingCore
from shared.messages import GpuUtil, JobExited, JobStarted
from shared.protocol import ProtocolError


def check_event(core: SchedulingCore, node: str, body: Any) -> None:
    """Refuse an event about a job the master placed on other nodes only.

    A job the master does not know is let through: the node is told to forget it, which is
    how stale records are cleaned up after a restart. So is the start or exit of an older
    incarnation of a job (one requeued since, masterd.core.fencing): the node's own stale
    part, which the master journals and stops or forgets there, touching nothing else.
    """
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
