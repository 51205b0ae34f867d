"""The dependency gate (masterd.core.dependency_gate) on a real core: what the master's
feature and the simulator both drive. It closes and opens the core's gate itself and says
which changes are worth a journal row."""

from __future__ import annotations

from masterd.core.dependencies import ArrayTasks, Status
from masterd.core.dependency_gate import GATE, DependencyGate
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.scheduler import SchedulingCore
from shared.dependency import parse_dependency
from shared.model import Job, JobSpec, JobState
from tests.unit.helpers import inventory


class Facts:
    """Job states as a test sets them (the core's jobs first, as the master's facts)."""

    def __init__(self, core: SchedulingCore) -> None:
        self.core = core
        self.ended: dict[str, JobState] = {}

    def state(self, job_id: str) -> JobState | None:
        if job_id in self.ended:
            return self.ended[job_id]
        job = self.core.jobs.get(job_id)
        return job.state if job is not None else None

    def array(self, array_id: str) -> ArrayTasks | None:
        return None


def setup() -> tuple[SchedulingCore, Facts, DependencyGate]:
    core = SchedulingCore(FifoPolicy())
    core.node_up(inventory("n1", gpus=2, cpus=4))
    facts = Facts(core)
    return core, facts, DependencyGate(facts, core.set_gate, core.jobs.get)


def queued(core: SchedulingCore, job_id: str, after: str = "") -> Job:
    spec = JobSpec(name=job_id, command=("x",), user="u", gpus=1, cpus=1,
                   after=parse_dependency(after) if after else ())
    job = Job(id=job_id, spec=spec, submit_time=0.0)
    core.submit(job)
    return job


def test_a_job_waits_then_is_let_go_when_its_dependency_finishes() -> None:
    core, facts, gate = setup()
    queued(core, "prep")
    train = queued(core, "train", "afterok:prep")
    outcome = gate.submitted(train)
    assert outcome is not None and outcome.status is Status.WAITING and outcome.announce
    assert train.wait == GATE and "afterok:prep" in train.reason
    assert [d.job_id for d in core.schedule(1)] == ["prep"]  # train is kept from the pass
    # prep moves (started): train's sentence follows, with no new row.
    gate.moved("prep", None)
    again = gate.resolve(train)
    assert again.status is Status.WAITING and not again.announce
    facts.ended["prep"] = JobState.FINISHED
    [done] = gate.ended("prep", None, JobState.FINISHED)
    assert done.status is Status.SATISFIED and done.announce and not train.gates
    assert "train" not in gate.book.waiting


def test_a_failed_dependency_is_never_satisfiable_and_keeps_the_gate_closed() -> None:
    core, facts, gate = setup()
    queued(core, "prep")
    train = queued(core, "train", "afterok:prep")
    gate.submitted(train)
    facts.ended["prep"] = JobState.FAILED
    [never] = gate.ended("prep", None, JobState.FAILED)
    assert never.status is Status.NEVER and never.announce
    assert "can never be satisfied" in never.sentence
    assert train.gates.get(GATE) == never.sentence  # no pass starts it before it is cancelled


def test_satisfied_at_submission_says_nothing_and_a_restored_waiter_is_reopened() -> None:
    core, facts, gate = setup()
    facts.ended["prep"] = JobState.FINISHED
    train = queued(core, "train", "afterok:prep")
    quiet = gate.submitted(train)
    assert quiet is not None and quiet.status is Status.SATISFIED and not quiet.announce
    assert not train.gates
    # Restored after a master restart with its row saying it waited: the gate is opened and
    # that is announced (the journal's last word about it was "waiting").
    evalj = queued(core, "eval", "afterok:prep")
    evalj.wait = GATE
    reopened = gate.resolve(evalj, first=True, was_waiting=True)
    assert reopened.status is Status.SATISFIED and reopened.announce and not evalj.gates


def test_a_dependent_that_ended_meanwhile_is_dropped_from_the_book() -> None:
    core, _facts, gate = setup()
    queued(core, "prep")
    train = queued(core, "train", "afterok:prep")
    gate.submitted(train)
    core.cancel("train", 1.0, "its user cancelled it")
    assert gate.ended("prep", None, JobState.FINISHED) == []
    assert gate.book.waiting == {}
