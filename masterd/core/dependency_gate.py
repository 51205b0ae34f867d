"""The dependency gate: which queued jobs wait for others, and what becomes of them when those
end. One controller, plain and synchronous, that the master's feature
(``masterd/features/dependencies.py``, which adds the journal, the look-ups of forgotten jobs
and the cancellation RPC path) and the simulator's engine both drive, so ``--after`` means the
same in a replay as on the cluster.

The controller closes and opens the core's ``dependency`` gate itself and answers each
resolution with an :class:`Outcome`: the driver journals it where ``announce`` says a person
would want a row, and cancels the job where the verdict is ``NEVER`` (the gate stays closed
with the sentence until the cancellation lands, so no pass starts it meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from masterd.core.dependencies import DependencyBook, Facts, Status, resolve
from shared.model import ArrayTask, Job, JobState, WaitReason

GATE = WaitReason.DEPENDENCY.value

SetGate = Callable[[str, str, "str | None"], None]  # (job id, gate, sentence or None: open)
LookUp = Callable[[str], "Job | None"]


@dataclass(frozen=True)
class Outcome:
    """What a resolution did to one queued job."""

    job: Job
    status: Status  # WAITING: gate closed; SATISFIED: gate open; NEVER: cancel the job
    sentence: str  # what it waits for, or why it can never run ("" when satisfied)
    announce: bool  # a change worth a journal row (not a sentence merely brought up to date)


class DependencyGate:
    """Gates queued jobs on their ``after`` terms, over the book of who waits for whom."""

    def __init__(self, facts: Facts, set_gate: SetGate, job: LookUp) -> None:
        self.facts = facts
        self.book = DependencyBook()
        self._set_gate = set_gate
        self._job = job

    def submitted(self, job: Job) -> Outcome | None:
        """A job entered the queue: record its array task, gate it on its dependency."""
        if job.spec.array is not None:
            self.book.add_task(job.id, job.spec.array)
        if not job.spec.after:
            return None
        return self.resolve(job, first=True)

    def resolve(self, job: Job, first: bool = False, was_waiting: bool = False) -> Outcome:
        """Act on a queued job's verdict now. ``first``: just submitted or restored (nothing
        said about it yet in this run); ``was_waiting``: restored, and said to wait before."""
        verdict = resolve(job.spec.after, job.spec.array, self.facts)
        if verdict.status is Status.WAITING:
            self._set_gate(job.id, GATE, verdict.sentence)
            newly = job.id not in self.book.waiting
            if newly:
                self.book.wait(job.id, job.spec.after)
            return Outcome(job, Status.WAITING, verdict.sentence, newly and not was_waiting)
        self.book.settle(job.id)
        if verdict.status is Status.SATISFIED:
            if first and not was_waiting:
                return Outcome(job, Status.SATISFIED, "", False)  # held nothing back
            if was_waiting:
                # Its last word said it waits: close and open the gate, so the core clears it.
                self._set_gate(job.id, GATE, "resolving after a restart")
            self._set_gate(job.id, GATE, None)
            return Outcome(job, Status.SATISFIED, "", True)
        # Never satisfiable: keep it from every pass until the cancellation lands.
        self._set_gate(job.id, GATE, verdict.sentence)
        return Outcome(job, Status.NEVER, verdict.sentence, True)

    def moved(self, job_id: str, task: ArrayTask | None) -> None:
        """A named job moved without ending (started, requeued): the sentences of the jobs
        that wait for it say its state, so bring them up to date."""
        for dependent in self.book.dependents(job_id, task):
            waiting = self._job(dependent)
            if waiting is None or waiting.state is not JobState.QUEUED:
                continue
            verdict = resolve(waiting.spec.after, waiting.spec.array, self.facts)
            if verdict.status is Status.WAITING:
                self._set_gate(dependent, GATE, verdict.sentence)

    def ended(self, job_id: str, task: ArrayTask | None, state: JobState) -> list[Outcome]:
        """A job ended for good: resolve again every queued job that waited for it."""
        self.book.settle(job_id)
        outcomes = []
        for dependent in self.book.ended(job_id, task, state):
            waiting = self._job(dependent)
            if waiting is None or waiting.state is not JobState.QUEUED:
                self.book.settle(dependent)
                continue
            outcomes.append(self.resolve(waiting))
        return outcomes
