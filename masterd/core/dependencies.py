"""Job dependencies (Slurm's ``--dependency``): whether a job's terms hold, still wait, or can
never hold, and which waiting jobs to look at again when a job ends.

Plain, synchronous code over what the driver knows of jobs (:class:`Facts`): the master's
dependencies feature (``masterd.features.dependencies``) and the simulator (``sim/engine.py``)
both use it and add only their I/O, so a replay resolves a pipeline exactly as the master does.

Semantics, per (type, named id):

* a job: ``afterok`` holds once it finished, can never hold once it ended otherwise (failed,
  cancelled, timeout); ``afterany`` holds once it ended, however; ``afternotok`` holds once it
  ended but did not finish and can never hold once it finished; ``aftercorr`` on a job that is
  not an array is ``afterok``.
* an array (an id that names an array means the whole array, as Slurm's array job id does):
  ``afterok`` holds once every task finished and can never hold once one ended otherwise;
  ``afterany`` once every task ended; ``afternotok`` once every task ended and at least one did
  not finish (never, if all finished); ``aftercorr`` pairs this job (an array task) with the
  task of the same index and is ``afterok`` on that task.

Every term, and every id of a term, must hold. Unknown ids, cycles and ``aftercorr`` without a
matching task are refused at submission (:func:`refusals`), so resolution meets them only
when a named job vanished (its journal write failed): then the term can never hold.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from shared.dependency import format_term
from shared.model import ArrayTask, Dependency, JobSpec, JobState

# How an ended job's state reads in a sentence ("prep-3 failed").
_ENDED_AS = {JobState.FINISHED: "finished", JobState.FAILED: "failed",
             JobState.CANCELLED: "was cancelled", JobState.TIMEOUT: "timed out",
             JobState.NODE_LOST: "was lost with its node"}


class Status(enum.Enum):
    SATISFIED = "satisfied"
    WAITING = "waiting"
    NEVER = "never"


@dataclass(frozen=True)
class Verdict:
    """A job's dependency as a whole: satisfied, waiting (``sentence`` says for what, e.g.
    "waits for afterok:prep-3 (running)"), or never satisfiable (``sentence`` names the term
    and why: "dependency afterok:prep-3 can never be satisfied: prep-3 failed")."""

    status: Status
    sentence: str = ""


@dataclass
class ArrayTasks:
    """One array as dependencies see it: its tasks by index and how those that ended ended.

    ``held`` counts the tasks the driver still keeps in memory (the master forgets ended jobs
    beyond ``finished_jobs_in_memory``; the summary outlives them while any task is kept).
    """

    tasks: dict[int, str] = field(default_factory=dict)  # index -> job id
    ended: dict[int, JobState] = field(default_factory=dict)  # index -> terminal state
    not_finished: int = 0  # ended tasks whose state is not finished
    first_not_finished: int | None = None  # the lowest such index
    held: int = 0

    def add(self, index: int, job_id: str) -> None:
        if index not in self.tasks:
            self.held += 1
        self.tasks[index] = job_id

    def end(self, index: int, state: JobState) -> None:
        if index in self.ended or not state.terminal:
            return
        self.ended[index] = state
        if state is not JobState.FINISHED:
            self.not_finished += 1
            if self.first_not_finished is None or index < self.first_not_finished:
                self.first_not_finished = index

    @property
    def all_ended(self) -> bool:
        return len(self.ended) == len(self.tasks)


class Facts(Protocol):
    """What resolution needs to know of the ids a dependency names."""

    def state(self, job_id: str) -> JobState | None:
        """The job's state; None when no such job exists."""

    def array(self, array_id: str) -> ArrayTasks | None:
        """The array of that id; None when no array has it."""


def resolve(after: Sequence[Dependency], own: ArrayTask | None, facts: Facts) -> Verdict:
    """Whether ``after`` (a job's terms; ``own``: the job's own array task, for
    ``aftercorr``) holds now, waits, or can never hold."""
    waiting: list[str] = []
    for term in after:
        for target in term.jobs:
            status, why = _pair(term.type, target, own, facts)
            name = format_term(term.type, (target,))
            if status is Status.NEVER:
                return Verdict(Status.NEVER,
                               f"dependency {name} can never be satisfied: {why}")
            if status is Status.WAITING:
                waiting.append(f"{name} ({why})")
    if not waiting:
        return Verdict(Status.SATISFIED)
    more = f" and {len(waiting) - 1} more" if len(waiting) > 1 else ""
    return Verdict(Status.WAITING, f"waits for {waiting[0]}{more}")


def _pair(kind: str, target: str, own: ArrayTask | None, facts: Facts) -> tuple[Status, str]:
    array = facts.array(target)
    if array is not None:
        if kind == "aftercorr":
            if own is None:
                return Status.NEVER, (f"{target} is an array and this job is not an array "
                                      "task to pair with one of its tasks")
            task = array.tasks.get(own.index)
            if task is None:
                return Status.NEVER, f"array {target} has no task of index {own.index}"
            state = array.ended.get(own.index) or facts.state(task)
            return _on_job("afterok", task, state)
        return _on_array(kind, target, array)
    return _on_job("afterok" if kind == "aftercorr" else kind, target, facts.state(target))


def _on_job(kind: str, target: str, state: JobState | None) -> tuple[Status, str]:
    if state is None:
        return Status.NEVER, f"{target} does not exist"
    if not state.terminal:
        return Status.WAITING, state.value
    finished = state is JobState.FINISHED
    if kind == "afterany":
        return Status.SATISFIED, ""
    if kind == "afterok":
        return ((Status.SATISFIED, "") if finished
                else (Status.NEVER, f"{target} {_ENDED_AS[state]}"))
    # afternotok
    return ((Status.NEVER, f"{target} finished") if finished else (Status.SATISFIED, ""))


def _on_array(kind: str, target: str, array: ArrayTasks) -> tuple[Status, str]:
    count = len(array.tasks)
    progress = f"array: {len(array.ended)} of {count} tasks ended"
    if kind == "afterok" and array.first_not_finished is not None:
        index = array.first_not_finished
        return Status.NEVER, (f"its task {array.tasks[index]} "
                              f"{_ENDED_AS[array.ended[index]]}")
    if not array.all_ended:
        return Status.WAITING, progress
    if kind == "afternotok" and not array.not_finished:
        return Status.NEVER, f"every task of array {target} finished"
    return Status.SATISFIED, ""


# -- who waits for whom ---------------------------------------------------------------------


class DependencyBook:
    """Arrays and the jobs that still wait for their dependency, for one driver.

    The driver tells it of every array task (:meth:`add_task`), every end (:meth:`ended`)
    and every job that waits (:meth:`wait`) until its dependency resolves (:meth:`settle`);
    :meth:`dependents` then names the waiting jobs to look at again when a job ends.
    """

    def __init__(self) -> None:
        self.arrays: dict[str, ArrayTasks] = {}
        self.waiting: dict[str, tuple[Dependency, ...]] = {}
        # A named id (job or array) -> the waiting jobs naming it, in the order they waited.
        self._named: dict[str, dict[str, None]] = {}

    def add_task(self, job_id: str, task: ArrayTask) -> None:
        self.arrays.setdefault(task.id, ArrayTasks()).add(task.index, job_id)

    def ended(self, job_id: str, task: ArrayTask | None, state: JobState) -> list[str]:
        """A job ended: count it in its array, and return the waiting jobs naming it or its
        array (to resolve again), in the order they started waiting."""
        if task is not None:
            array = self.arrays.get(task.id)
            if array is not None and array.tasks.get(task.index) == job_id:
                array.end(task.index, state)
        return self.dependents(job_id, task)

    def dependents(self, job_id: str, task: ArrayTask | None = None) -> list[str]:
        found = dict(self._named.get(job_id, {}))
        if task is not None:
            found.update(self._named.get(task.id, {}))
        return list(found)

    def forget_task(self, job_id: str, task: ArrayTask) -> ArrayTasks | None:
        """The driver no longer keeps this (ended) task; returns its array once no task of
        it is kept (the driver then answers for the array from elsewhere, e.g. the
        journal), else None."""
        array = self.arrays.get(task.id)
        if array is None or array.tasks.get(task.index) != job_id:
            return None
        array.held -= 1
        if array.held > 0:
            return None
        return self.arrays.pop(task.id)

    def wait(self, job_id: str, after: tuple[Dependency, ...]) -> None:
        self.waiting[job_id] = after
        for term in after:
            for target in term.jobs:
                self._named.setdefault(target, {})[job_id] = None

    def settle(self, job_id: str) -> None:
        """The job no longer waits (its dependency resolved, or it ended)."""
        after = self.waiting.pop(job_id, None)
        if after is None:
            return
        for term in after:
            for target in term.jobs:
                named = self._named.get(target)
                if named is not None:
                    named.pop(job_id, None)
                    if not named:
                        del self._named[target]


# -- refusals at submission -----------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """A submission as the checks see it: the jobs' specs and the ids given (None: the
    master names the job, so nothing in the batch can name it)."""

    specs: Sequence[JobSpec]
    ids: Sequence[str | None]


# Error codes of the refusals (docs/protocol.md lists them).
UNKNOWN = "unknown_dependency"  # a named id is neither a job nor an array
CYCLE = "dependency_cycle"
INVALID = "invalid_dependency"  # aftercorr without a task to pair with, an id taken


def refusals(batch: Batch, facts: Facts,
             waits_for: Callable[[str], Iterable[str]] = lambda job_id: ()
             ) -> dict[int, tuple[str, str]]:
    """Why jobs of a submission must be refused, by index, as (error code, sentence): a
    named id that is neither a job nor an array (existing, or given in the batch),
    ``aftercorr`` without a task to pair with, an array id already taken, a job id that is
    an array's, or a cycle. ``waits_for(id)``: what an existing job still waits for (cycles
    may run through it)."""
    out: dict[int, tuple[str, str]] = {}
    given: dict[str, int] = {job_id: i for i, job_id in enumerate(batch.ids) if job_id}
    new_arrays: dict[str, dict[int, str]] = {}  # arrays the batch creates (their ids given)
    first_task: dict[str, int] = {}  # array id -> index in the batch of its first task
    for i, (spec, job_id) in enumerate(zip(batch.specs, batch.ids, strict=True)):
        if spec.array is not None and job_id:
            new_arrays.setdefault(spec.array.id, {})[spec.array.index] = job_id
            first_task.setdefault(spec.array.id, i)
    for array_id, first in first_task.items():
        if facts.array(array_id) is not None:
            out[first] = (INVALID, f"array id {array_id} is taken by an existing array; "
                                   "give the new array another id")
        elif (facts.state(array_id) is not None
              or (array_id in given and batch.specs[given[array_id]].array is None)):
            out[first] = (INVALID, f"array id {array_id} is taken by job {array_id}")
    for job_id, i in given.items():
        if batch.specs[i].array is None and i not in out and (
                facts.array(job_id) is not None or job_id in new_arrays):
            out[i] = (INVALID, f"job id {job_id} is taken by an array")
    for i, spec in enumerate(batch.specs):
        if i in out or not spec.after:
            continue
        why = _term_refusal(spec, batch.ids[i], facts, given, new_arrays)
        if why is not None:
            out[i] = why
    for i, why in _cycles(batch, new_arrays, waits_for, facts).items():
        out.setdefault(i, (CYCLE, why))
    return out


def _term_refusal(spec: JobSpec, job_id: str | None, facts: Facts, given: Mapping[str, int],
                  new_arrays: Mapping[str, Mapping[int, str]]) -> tuple[str, str] | None:
    own = spec.array
    for term in spec.after:
        for target in term.jobs:
            name = format_term(term.type, (target,))
            if target == job_id or (own is not None and target == own.id):
                return CYCLE, (f"dependency {name}: a job cannot depend on itself or its own "
                               "array")
            array = facts.array(target)
            batch_array = new_arrays.get(target)
            is_job = facts.state(target) is not None or target in given
            if array is None and batch_array is None and not is_job:
                return UNKNOWN, (f"dependency {name}: {target} is neither a job nor an "
                                 "array this master knows")
            if term.type != "aftercorr" or (array is None and batch_array is None):
                continue
            if own is None:
                return INVALID, (f"dependency {name}: aftercorr pairs tasks of two arrays "
                                 "by index, and this job is not an array task (use "
                                 f"afterok:{target} to wait for the whole array)")
            indices = array.tasks if array is not None else batch_array
            assert indices is not None
            if own.index not in indices:
                return INVALID, (f"dependency {name}: array {target} has no task of index "
                                 f"{own.index} to pair with")
    return None


def _cycles(batch: Batch, new_arrays: Mapping[str, Mapping[int, str]],
            waits_for: Callable[[str], Iterable[str]], facts: Facts) -> dict[int, str]:
    """Jobs of the batch on a dependency cycle (through the batch and the jobs that still
    wait), each with the cycle spelled out."""
    edges: dict[str, list[str]] = {}
    index_of: dict[str, int] = {}
    for i, (spec, job_id) in enumerate(zip(batch.specs, batch.ids, strict=True)):
        if job_id:
            index_of[job_id] = i
            edges[job_id] = [t for term in spec.after for t in term.jobs]

    def successors(node: str) -> Iterable[str]:
        if node in edges:
            return edges[node]
        if node in new_arrays:
            return new_arrays[node].values()
        array = facts.array(node)
        if array is not None:
            return array.tasks.values()
        return waits_for(node)

    found: dict[int, str] = {}
    done: set[str] = set()
    for start in index_of:
        if start in done:
            continue
        # Iterative depth-first search; ``path`` is the chain from ``start`` being explored.
        path: list[str] = [start]
        on_path = {start}
        stack: list[Iterator[str]] = [iter(successors(start))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                stack.pop()
                continue
            if nxt in on_path:
                cycle = [*path[path.index(nxt):], nxt]
                text = " -> ".join(cycle)
                for member in cycle:
                    if member in index_of:
                        found.setdefault(index_of[member], f"dependency cycle: {text}")
                continue
            if nxt in done:
                continue
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(successors(nxt)))
    return found
