"""Which job parts a node reports are the master's, and which resources a returning node
no longer has: the pure half of fencing (docs/high-availability.md, "Fencing on the nodes").

A job part is named by its incarnation: the job id and the job's restart count when it was
prepared (``Job.restarts``, raised each time the job is requeued after a failure). The
master owns exactly one incarnation of a job, on the nodes of its placement, while the job
is starting or running. Anything else a node runs is someone else's and is stopped there:
that, with the node refusing an older incarnation and an older master epoch (noded/jobs.py,
noded/fencing.py), is why no part of a job ever runs twice at once.

Plain synchronous functions over the master's records, with no I/O: the master's
reconciliation and its fencing feature (masterd.features.fencing) call them, and so can
the simulator.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from shared.model import Job, JobState, NodeAllocation, NodeInventory


class Verdict(enum.Enum):
    MINE = "mine"  # the incarnation the master placed on this node, starting or running
    ENDED = "ended"  # the master's incarnation, but the job no longer runs (ended, queued)
    STALE = "stale"  # an older incarnation: the job was requeued since
    FOREIGN = "foreign"  # unknown, never placed on this node, or an incarnation not yet made


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    # One sentence naming the part and why it is not the master's ("" for MINE).
    reason: str = ""

    @property
    def mine(self) -> bool:
        return self.verdict is Verdict.MINE


def incarnation(job_id: str, restarts: int) -> str:
    """How logs and events name an incarnation: ``train-7#2``."""
    return f"{job_id}#{restarts}"


def judge_part(job: Job | None, job_id: str, node: str, restarts: int) -> Judgement:
    """Whether the part of incarnation (``job_id``, ``restarts``) on ``node`` is the master's.

    ``job`` is the master's record of ``job_id`` (None: it has none in memory).
    """
    name = incarnation(job_id, restarts)
    if job is None:
        return Judgement(Verdict.FOREIGN, f"part {name} on node {node} belongs to no job "
                         "the master knows")
    if restarts < job.restarts:
        return Judgement(Verdict.STALE, f"part {name} on node {node} is stale: job {job_id} "
                         f"was requeued and is incarnation {job.restarts} now")
    if restarts > job.restarts:
        return Judgement(Verdict.FOREIGN, f"part {name} on node {node} is newer than "
                         f"incarnation {job.restarts}, the only one the master made")
    if job.state.terminal or job.state is JobState.QUEUED:
        return Judgement(Verdict.ENDED, f"part {name} on node {node} outlived its job, "
                         f"which is {job.state.value} now")
    if node not in job.node_states:
        return Judgement(Verdict.FOREIGN, f"part {name} runs on node {node}, where the "
                         "master never placed it")
    return Judgement(Verdict.MINE)


def missing_resources(inventory: NodeInventory, alloc: NodeAllocation) -> str | None:
    """Why ``alloc`` cannot be held on the node ``inventory`` describes (its GPUs or cores
    are gone), in one sentence; None when everything it holds still exists."""
    gpus = sorted(set(alloc.gpus) - {g.index for g in inventory.gpus})
    cpus = sorted(set(alloc.cpus) - {c.id for c in inventory.cpus})
    if not gpus and not cpus:
        return None
    parts = []
    if gpus:
        parts.append(f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(map(str, gpus))}")
    if cpus:
        parts.append(f"core{'s' if len(cpus) > 1 else ''} {_ranges(cpus)}")
    verb = "no longer exists" if len(gpus) + len(cpus) == 1 else "no longer exist"
    return (f"{' and '.join(parts)} of node {inventory.name} {verb} (the node returned "
            f"with {len(inventory.gpus)} GPUs and {len(inventory.cpus)} cores)")


def placed_on_missing(jobs: Iterable[Job], inventory: NodeInventory
                      ) -> Iterator[tuple[Job, str]]:
    """The starting or running jobs holding resources on ``inventory``'s node that it no
    longer has, each with the sentence saying what is gone."""
    for job in jobs:
        if job.state.terminal or job.state is JobState.QUEUED or job.placement is None:
            continue
        for alloc in job.placement.allocations:
            if alloc.node == inventory.name:
                reason = missing_resources(inventory, alloc)
                if reason is not None:
                    yield job, reason
                break


def _ranges(ids: list[int]) -> str:
    """``0-3, 8`` for [0, 1, 2, 3, 8] (ids sorted)."""
    out: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], -2]:
        if i != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = i
        prev = i
    return ", ".join(out)
