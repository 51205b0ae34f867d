"""Job dependencies in the master (``trellisctl submit --after``): the I/O around
:mod:`masterd.core.dependencies`.

* At submission: ids the master no longer keeps in memory are looked up in the journal
  (``preparing``, asynchronous), then the batch is checked as a whole (``screening``): an
  unknown id, a cycle (inside one ``submit_many`` with chosen ids, or through jobs that still
  wait) or an ``aftercorr`` without a task to pair with is refused with one sentence.
* Array tasks the master names take their array's id from the first of them (Slurm's array
  job id); tasks given ids keep the array id they carry (``trellisctl submit --id BASE``).
* A job whose dependency does not hold yet gets its ``dependency`` gate closed with the
  sentence saying what it waits for; when a job it names ends the dependency is resolved
  again: satisfied opens the gate, never satisfiable cancels the job with a reason naming the
  term (which may in turn cancel the jobs that wait for it). Each step is a journalled
  ``dependency`` event.
* Restore: every queued job's dependency is resolved again (gates are not journalled), with
  the journal's record of jobs and array tasks no longer in memory; dependencies that became
  satisfiable or unsatisfiable while the master was down settle then.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from masterd.core.dependencies import ArrayTasks, Batch, Status, refusals
from masterd.core.dependency_gate import GATE, DependencyGate, Outcome
from masterd.core.scheduler import JobError, Transition
from masterd.journal.dependencies import Looked, add_array_tasks, ensure_schema, look_up
from masterd.runtime.context import FeatureContext
from shared.dependency import format_dependency
from shared.model import ArrayTask, Job, JobSpec, JobState

log = logging.getLogger("trellis.master.dependencies")

# Outcomes of jobs and arrays no longer in memory kept for the checks (forgotten ones, and
# what the journal said): they never change once ended; beyond this many the oldest go and
# are read from the journal again when named.
REMEMBERED = 65_536


class _Lru(OrderedDict[str, object]):
    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def put(self, key: str, value: object) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.cap:
            self.popitem(last=False)


class _Facts:
    """What the master knows of named ids: jobs in memory, arrays in the book, and the
    outcomes remembered from forgotten jobs and journal look-ups."""

    def __init__(self, owner: Dependencies) -> None:
        self._owner = owner

    def state(self, job_id: str) -> JobState | None:
        job = self._owner.ctx.core.job(job_id)
        if job is not None:
            return job.state
        known = self._owner.outcomes.get(job_id)
        return known if isinstance(known, JobState) else None

    def array(self, array_id: str) -> ArrayTasks | None:
        array = self._owner.book.arrays.get(array_id)
        if array is not None:
            return array
        known = self._owner.outcomes.get("\0" + array_id)  # arrays keyed apart from jobs
        return known if isinstance(known, ArrayTasks) else None


class Dependencies:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        ctx.journal.now(ensure_schema)  # before serving, on this thread
        self.outcomes = _Lru(REMEMBERED)
        self.facts = _Facts(self)
        # The logic, shared with the simulator; this feature adds the journal and the I/O.
        self.gate = DependencyGate(
            self.facts, lambda job, gate, reason: ctx.jobs.set_gate(job, gate, reason),
            lambda job_id: ctx.core.job(job_id))
        self.book = self.gate.book
        self._rows: list[tuple[str, int, str]] = []  # array tasks to journal this turn
        self._flush_pending = False
        events = ctx.events
        events.preparing.subscribe(self.prepare)
        events.screening.subscribe(self.screen)
        events.reserved.subscribe(self.name_arrays)
        events.job_submitted.subscribe(self.submitted)
        events.job_transition.subscribe(self.transition)
        events.job_ended.subscribe(self.ended)
        events.job_forgotten.subscribe(self.forgotten)
        events.restored.subscribe(self.restore)

    # -- submission ------------------------------------------------------------------------
    def _unknown(self, ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """Of ``ids``: those the master knows nothing of in memory, as jobs and as arrays."""
        jobs, arrays = [], []
        for name in dict.fromkeys(ids):
            if self.facts.state(name) is None:
                jobs.append(name)
            if self.facts.array(name) is None:
                arrays.append(name)
        return jobs, arrays

    async def prepare(self, specs: Sequence[JobSpec], ids: Sequence[str | None]) -> None:
        """Read from the journal what the checks need of ids not in memory: named jobs and
        arrays, and the array ids a batch gives (are they taken?)."""
        given = {job_id for job_id in ids if job_id}
        named = [t for spec in specs for term in spec.after for t in term.jobs
                 if t not in given]
        named += [spec.array.id for spec, job_id in zip(specs, ids, strict=True)
                  if spec.array is not None and job_id]
        if not named:
            return
        jobs, arrays = self._unknown(named)
        if jobs or arrays:
            self._remember(await self.ctx.journal.call(look_up, jobs, arrays))

    def _remember(self, looked: Looked) -> None:
        for job_id, state in looked.jobs.items():
            if self.ctx.core.job(job_id) is None:
                self.outcomes.put(job_id, state)
        for array_id, rows in looked.arrays.items():
            if array_id in self.book.arrays:
                continue
            array = ArrayTasks()
            for index, job_id, state in rows:
                array.tasks[index] = job_id
                array.end(index, state)
            self.outcomes.put("\0" + array_id, array)

    def screen(self, specs: Sequence[JobSpec], ids: Sequence[str | None]
               ) -> Mapping[int, JobError]:
        if not any(spec.after or spec.array is not None for spec in specs):
            return {}
        found = refusals(Batch(specs, ids), self.facts, self._waits_for)
        # The id the user chose names the job best; without one, its name.
        return {i: JobError(code, f"job {ids[i] or specs[i].name}: {why}")
                for i, (code, why) in found.items()}

    def _waits_for(self, job_id: str) -> list[str]:
        return [t for term in self.book.waiting.get(job_id, ()) for t in term.jobs]

    def name_arrays(self, jobs: Sequence[Job], given: Sequence[bool]) -> None:
        """Array tasks the master named: their array's id is the first task's id. (Their
        ``array.id`` as sent only groups them.)"""
        first: dict[str, str] = {}
        for job, has_id in zip(jobs, given, strict=True):
            task = job.spec.array
            if task is None or has_id:
                continue
            array_id = first.setdefault(task.id, job.id)
            if array_id != task.id:
                job.spec = replace(job.spec, array=ArrayTask(id=array_id, index=task.index))

    def submitted(self, job: Job) -> None:
        task = job.spec.array
        if task is not None:
            self._journal_task(task, job.id)
        outcome = self.gate.submitted(job)
        if outcome is not None:
            self._act(outcome)

    def _journal_task(self, task: ArrayTask, job_id: str) -> None:
        self._rows.append((task.id, task.index, job_id))
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        rows, self._rows = self._rows, []
        if rows:
            self.ctx.tasks.spawn(self.ctx.journal.call(add_array_tasks, rows),
                                 name="journal array tasks")

    # -- resolution --------------------------------------------------------------------------
    def _act(self, outcome: Outcome) -> None:
        """Journal what the gate did to a job and carry out a cancellation."""
        job = outcome.job
        if outcome.announce:
            status = {Status.WAITING: "waiting", Status.SATISFIED: "satisfied",
                      Status.NEVER: "never"}[outcome.status]
            self._event(job, format_dependency(job.spec.after), status, outcome.sentence)
        if outcome.status is Status.SATISFIED and outcome.announce:
            self.ctx.request_pass()
        elif outcome.status is Status.NEVER:
            self.ctx.tasks.spawn(self._cancel(job.id, outcome.sentence),
                                 name=f"cancel {job.id}: dependency")

    def _event(self, job: Job, after: str, status: str, reason: str) -> None:
        detail = {"after": after, "status": status, "reason": reason}
        log.info("job=%s dependency %s: %s", job.id, status, reason or after)
        self.ctx.tasks.spawn(self.ctx.journal.persist(
            [job], [(self.ctx.clock(), job.id, None, "dependency", detail)]))

    async def _cancel(self, job_id: str, reason: str) -> None:
        stop = self.ctx.jobs.stop
        assert stop is not None, "the master gives features JobActions.stop"
        try:
            await stop(job_id, JobState.CANCELLED, reason)
        except JobError as exc:  # it ended meanwhile (its user cancelled it, say)
            log.info("job=%s not cancelled for its dependency: %s", job_id, exc)

    async def transition(self, job: Job, transition: Transition) -> None:
        """A named job moved (started, re-queued): the sentences of jobs waiting for it say
        its state, so bring them up to date. Ends are :meth:`ended`'s."""
        if not transition.state.terminal:
            self.gate.moved(job.id, job.spec.array)

    def ended(self, job: Job) -> None:
        for outcome in self.gate.ended(job.id, job.spec.array, job.state):
            self._act(outcome)

    def forgotten(self, job: Job) -> None:
        self.outcomes.put(job.id, job.state)
        task = job.spec.array
        if task is not None:
            gone = self.book.forget_task(job.id, task)
            if gone is not None:
                self.outcomes.put("\0" + task.id, gone)

    # -- restore -------------------------------------------------------------------------------
    def restore(self) -> None:
        """Before serving: rebuild arrays and waiting jobs from the restored jobs and the
        journal, and resolve every queued job's dependency again."""
        jobs = list(self.ctx.core.jobs.values())
        rows: list[tuple[str, int, str]] = []
        for job in jobs:
            task = job.spec.array
            if task is None:
                continue
            self.book.add_task(job.id, task)
            rows.append((task.id, task.index, job.id))
            if job.state.terminal:
                self.book.arrays[task.id].end(task.index, job.state)
        waiting = [job for job in jobs if job.state is JobState.QUEUED and job.spec.after]
        named = [t for job in waiting for term in job.spec.after for t in term.jobs]
        missing_jobs, missing_arrays = self._unknown(named)
        looked = self.ctx.journal.now(look_up, missing_jobs,
                                      [*self.book.arrays, *missing_arrays])
        # Tasks of arrays in memory that the master had forgotten (ended) before it stopped.
        for array_id, array in self.book.arrays.items():
            for index, job_id, state in looked.arrays.pop(array_id, ()):
                if index not in array.tasks:
                    array.tasks[index] = job_id
                array.end(index, state)
        self._remember(looked)
        if rows:  # a crash may have lost the rows of the last batch before it
            self.ctx.journal.now(add_array_tasks, rows)
        for job in waiting:
            self._act(self.gate.resolve(job, first=True, was_waiting=job.wait == GATE))
        if waiting:
            log.info("dependencies restored: waiting=%d arrays=%d", len(self.book.waiting),
                     len(self.book.arrays))
