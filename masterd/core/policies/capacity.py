"""Capacity baseline (GENIE §7.1, as in YARN's Capacity Scheduler): GPU shares per model type.

Each model type is guaranteed a share of the cluster's GPUs. ``quotas`` maps model type
names (matched like the model database: case and punctuation ignored) to fractions of all
GPUs; the key ``"*"`` covers every other type, jobs without a model type included. Without
``quotas`` the GPUs are split equally among the model types present (queued or running) at
each pass. Shares become whole GPUs by the largest-remainder method, so no GPU is stranded by
rounding (16 GPUs over 6 types: 3, 3, 3, 3, 2, 2 — not 2 each with 4 left over).

A pass has two rounds. First every type starts jobs within its guarantee, in queue order; the
first job of a type that does not fit blocks its type (its own FIFO queue), not the others. A
job larger than its type's whole guarantee may start while its type holds no GPUs, so it is
not starved; it is never preempted, and not owed GPUs (reclaiming a share would not make it
fit). Then, with ``lend`` (default), GPUs nobody is owed are lent: the types'
next jobs start beyond their guarantee, in queue order, as *borrowers*. With ``preempt``
(default) a type that is owed GPUs gets them back: when its first waiting job is within its
guarantee and does not fit, borrowers of other types are preempted, most recently started
first, until enough GPUs are being freed — and nothing is lent while any type is owed GPUs,
so what is reclaimed is not lent again at once. A preempted job goes back to the head of the
queue and restarts (the core re-queues it). Which running jobs are borrowers is derived from
the snapshot alone: a type's running jobs in start order, those beyond its guarantee.

Placement is the black-box one: ``spec.gpus`` packed. CPU-only jobs have no GPU share and are
packed in queue order after the GPU jobs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from masterd.core.cluster import ClusterSnapshot
from masterd.core.genie.modeldb import normalise
from masterd.core.placement import FreePool, pack
from masterd.core.policy import Decision, Preempt, Start
from shared.model import Job

OTHER = "*"


def _type_of(job: Job) -> str:
    return normalise(job.spec.model_type) if job.spec.model_type else OTHER


def largest_remainder(shares: Mapping[str, float], total: int) -> dict[str, int]:
    """Whole GPUs per type, in proportion to ``shares``; ``round(total·Σshares)`` in all.

    Each type gets the floor of its exact share; the GPUs left over go one each to the largest
    fractional parts (ties by type name, so the split is deterministic).
    """
    exact = {t: share * total for t, share in shares.items()}
    seats = {t: math.floor(v + 1e-9) for t, v in exact.items()}
    target = min(total, round(sum(exact.values())))
    leftover = target - sum(seats.values())
    for t in sorted(exact, key=lambda t: (-(exact[t] - seats[t]), t))[:max(0, leftover)]:
        seats[t] += 1
    return seats


class CapacityPolicy:
    name = "capacity"

    def __init__(
        self,
        quotas: Mapping[str, float] | None = None,
        lend: bool = True,
        preempt: bool = True,
    ) -> None:
        for flag, value in (("lend", lend), ("preempt", preempt)):
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be true or false, got {value!r}")
        self.lend = lend
        self.preempt = preempt
        self.quotas: dict[str, float] | None = None
        if quotas is not None:
            if not isinstance(quotas, Mapping) or not quotas:
                raise ValueError("quotas must be a non-empty table of model type -> fraction")
            parsed: dict[str, float] = {}
            for name, share in quotas.items():
                if not isinstance(name, str) or not (name == OTHER or normalise(name)):
                    raise ValueError(f"quotas: {name!r} is not a model type name")
                if isinstance(share, bool) or not isinstance(share, int | float) or not (
                    math.isfinite(share) and 0 < share <= 1
                ):
                    raise ValueError(f"quotas[{name!r}] must be a fraction in (0, 1], "
                                     f"got {share!r}")
                parsed[OTHER if name == OTHER else normalise(name)] = float(share)
            if sum(parsed.values()) > 1 + 1e-9:
                raise ValueError(f"quotas add up to {sum(parsed.values()):g}, more than 1")
            self.quotas = parsed

    def guarantees(self, types: set[str], total_gpus: int) -> dict[str, int]:
        """Each present type's guaranteed GPUs."""
        if self.quotas is None:
            shares = {t: 1.0 / len(types) for t in types}
        else:
            # Types without their own quota share the "*" quota (equally, by largest remainder).
            others = sorted(t for t in types if t not in self.quotas)
            shares = {t: self.quotas[t] for t in types if t in self.quotas}
            if others and OTHER in self.quotas:
                shares.update({t: self.quotas[OTHER] / len(others) for t in others})
        seats = largest_remainder(shares, total_gpus) if shares else {}
        return {t: seats.get(t, 0) for t in types}

    def decide(
        self, snapshot: ClusterSnapshot, queue: Sequence[Job], now: float
    ) -> list[Decision]:
        by_type: dict[str, list[Job]] = {}
        for job in snapshot.running.values():
            if job.placement is not None and job.placement.gpu_count:
                by_type.setdefault(_type_of(job), []).append(job)
        used = {t: sum(j.placement.gpu_count for j in jobs)  # type: ignore[union-attr]
                for t, jobs in by_type.items()}
        gpu_jobs = [j for j in queue if j.spec.gpus]
        guarantee = self.guarantees({_type_of(j) for j in gpu_jobs} | set(used),
                                    snapshot.total_gpus)
        pool = FreePool(snapshot)
        decisions: list[Decision] = []

        # Round 1: every type within its guarantee, each type's queue in order.
        blocked: set[str] = set()
        owed: list[Job] = []  # per type, the first job within its guarantee that did not fit
        borrowing: list[Job] = []  # the jobs left once their type's guarantee is reached
        for job in gpu_jobs:
            t = _type_of(job)
            if t in blocked:
                borrowing.append(job)
                continue
            held = used.get(t, 0)
            within = held + job.spec.gpus <= guarantee[t]
            if within or held == 0:
                placement = pack(job.spec, pool)
                if placement is None:
                    blocked.add(t)
                    # A job larger than its whole share is not owed GPUs: reclaiming the
                    # share would not make it fit. It waits for idle ones like a borrower.
                    (owed if within else borrowing).append(job)
                    continue
                pool.take(placement)
                used[t] = held + placement.gpu_count
                decisions.append(Start(job.id, placement))
            else:
                blocked.add(t)  # this job and the rest of its type may only borrow
                borrowing.append(job)

        if owed:
            if self.preempt:
                decisions += self._reclaim(owed, by_type, guarantee, pool)
            # Nothing is lent while a type is owed GPUs: what is freed goes to the owner.
            return decisions + self._cpu_jobs(queue, pool)
        if self.lend:
            # Round 2: lend idle GPUs in queue order; a type's first misfit blocks it.
            misfit: set[str] = set()
            for job in borrowing:
                t = _type_of(job)
                if t in misfit:
                    continue
                placement = pack(job.spec, pool)
                if placement is None:
                    misfit.add(t)
                    continue
                pool.take(placement)
                decisions.append(Start(job.id, placement))
        return decisions + self._cpu_jobs(queue, pool)

    def _reclaim(
        self,
        owed: list[Job],
        by_type: dict[str, list[Job]],
        guarantee: Mapping[str, int],
        pool: FreePool,
    ) -> list[Decision]:
        """Preempt borrowers, newest first, until every owed job could have its GPUs."""
        # Only what the owners are owed is reclaimed, never more than their shares.
        owing = sum(j.spec.gpus for j in owed)
        borrowers: list[tuple[float, str, Job]] = []
        freeing = 0  # GPUs already on their way back (borrowers stopping)
        for t, jobs in by_type.items():
            held = 0
            for job in sorted(jobs, key=lambda j: (_started(j), j.id)):
                gpus = job.placement.gpu_count  # type: ignore[union-attr]
                if held > 0 and held + gpus > guarantee.get(t, 0):
                    if job.stopping:
                        freeing += gpus
                    else:
                        borrowers.append((_started(job), job.id, job))
                held += gpus
        borrowers.sort(key=lambda b: (-b[0], b[1]))  # most recently started first
        free = sum(pool.free_gpu_count(node) for node in pool.views)
        need = owing - free - freeing
        decisions: list[Decision] = []
        owed_types = {_type_of(j) for j in owed}
        for _, job_id, job in borrowers:
            if need <= 0:
                break
            if _type_of(job) in owed_types:
                continue  # a type does not reclaim from itself
            decisions.append(Preempt(job_id, "capacity: lent GPUs reclaimed for a model "
                                             "type below its guaranteed share"))
            need -= job.placement.gpu_count  # type: ignore[union-attr]
        return decisions

    @staticmethod
    def _cpu_jobs(queue: Sequence[Job], pool: FreePool) -> list[Decision]:
        decisions: list[Decision] = []
        for job in queue:
            if job.spec.gpus == 0:
                placement = pack(job.spec, pool)
                if placement is not None:
                    pool.take(placement)
                    decisions.append(Start(job.id, placement))
        return decisions


def _started(job: Job) -> float:
    # A job still starting has no start time yet: it is the newest.
    return job.start_time if job.start_time is not None else math.inf
