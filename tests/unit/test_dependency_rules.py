"""Slurm's dependency syntax (shared.dependency), the time-limit syntax (shared.slurmtime), and
the pure resolution and submission checks (masterd.core.dependencies), arrays included."""

from __future__ import annotations

import argparse

import pytest

from control.cli import build_parser, command_word
from control.submit import jobs_from_args
from control.usage import UsageError
from masterd.core.dependencies import (
    ArrayTasks,
    Batch,
    DependencyBook,
    Status,
    refusals,
    resolve,
)
from shared.dependency import DependencyError, format_dependency, parse_dependency
from shared.model import ArrayTask, Dependency, JobKind, JobSpec, JobState
from shared.schema import decode
from shared.slurmtime import format_time, parse_time_limit

# -- the syntax -------------------------------------------------------------------------------


def test_slurm_forms_parse_and_format_back() -> None:
    terms = parse_dependency("afterok:prep-3:prep-4,afterany:clean, afternotok:x,aftercorr:a")
    assert terms == (Dependency("afterok", ("prep-3", "prep-4")),
                     Dependency("afterany", ("clean",)), Dependency("afternotok", ("x",)),
                     Dependency("aftercorr", ("a",)))
    assert format_dependency(terms) == ("afterok:prep-3:prep-4,afterany:clean,afternotok:x,"
                                        "aftercorr:a")
    assert parse_dependency("prep-3") == (Dependency("afterany", ("prep-3",)),)  # Slurm's old form
    assert parse_dependency("AFTEROK:a") == (Dependency("afterok", ("a",)),)


@pytest.mark.parametrize(("text", "words"), [
    ("afterok:a?afterok:b", "'?' (any one of several) is not supported"),
    ("after:a", "'after' (start after the job starts) is not supported"),
    ("singleton", "'singleton' is not supported"),
    ("afterwards:a", "unknown type 'afterwards'"),
    ("afterok:", "'' is not a job id"),
    ("afterok:a/b", "'a/b' is not a job id"),
    ("afterok:a+60", "a delay ('a+60') is not supported"),
    ("afterok:a,,afterok:b", "has an empty term"),
    ("", "the dependency is empty"),
])
def test_bad_dependencies_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(DependencyError) as exc:
        parse_dependency(text)
    assert words in str(exc.value)


@pytest.mark.parametrize(("text", "seconds"), [
    ("10", 600), ("1:30", 90), ("02:00:00", 7200), ("1-0", 86400), ("1-2:30", 95400),
    ("1-00:00:05", 86405)])
def test_time_limits(text: str, seconds: int) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["0", "-5", "1:60", "1:2:3:4", "ten", "400-0"])
def test_bad_time_limits(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time_limit(text)


def test_format_time() -> None:
    assert format_time(3600) == "1:00:00" and format_time(90061) == "1-01:01:01"


# -- the command line -------------------------------------------------------------------------


def parse(*words: str) -> argparse.Namespace:
    return build_parser(only=command_word(list(words))).parse_args(list(words))


def test_submit_after_reaches_the_spec_and_arrays_carry_their_task() -> None:
    for flag in ("--after", "-d", "--dependency"):
        [job], _ = jobs_from_args(parse("submit", flag, "afterok:a:b,afterany:c", "--cpus",
                                        "1", "--user", "alice", "--", "x"))
        assert job["after"] == [{"type": "afterok", "jobs": ["a", "b"]},
                                {"type": "afterany", "jobs": ["c"]}]
        assert decode(JobSpec, job).after[0].jobs == ("a", "b")
    with pytest.raises(UsageError, match="--after: dependency 'afterok:a\\?afterok:b'"):
        jobs_from_args(parse("submit", "--after", "afterok:a?afterok:b", "--user", "alice",
                             "--", "x"))
    jobs, ids = jobs_from_args(parse("submit", "--array", "0-1", "--id", "sw", "--name", "s",
                                     "--user", "alice", "--", "x"))
    assert [j["array"] for j in jobs] == [{"id": "sw", "index": 0}, {"id": "sw", "index": 1}]
    jobs, ids = jobs_from_args(parse("submit", "--array", "3", "--name", "s", "--user",
                                     "alice", "--", "x"))
    assert jobs[0]["array"] == {"id": "s", "index": 3} and ids == [None]
    assert decode(JobSpec, jobs[0]).array == ArrayTask("s", 3)


def test_update_takes_slurm_times() -> None:
    args = parse("update", "j1", "--time", "1:00:00", "--qos", "normal", "--priority", "-2")
    assert (args.job_id, args.time, args.qos, args.priority) == ("j1", "1:00:00", "normal",
                                                                   -2)


# -- resolution -------------------------------------------------------------------------------


class Facts:
    def __init__(self, states: dict[str, JobState],
                 arrays: dict[str, ArrayTasks] | None = None) -> None:
        self.states = states
        self.arrays = arrays or {}

    def state(self, job_id: str) -> JobState | None:
        return self.states.get(job_id)

    def array(self, array_id: str) -> ArrayTasks | None:
        return self.arrays.get(array_id)


def after(text: str) -> tuple[Dependency, ...]:
    return parse_dependency(text)


@pytest.mark.parametrize(("kind", "state", "status"), [
    ("afterok", JobState.RUNNING, Status.WAITING),
    ("afterok", JobState.FINISHED, Status.SATISFIED),
    ("afterok", JobState.FAILED, Status.NEVER),
    ("afterok", JobState.CANCELLED, Status.NEVER),
    ("afterok", JobState.TIMEOUT, Status.NEVER),
    ("afterany", JobState.QUEUED, Status.WAITING),
    ("afterany", JobState.FAILED, Status.SATISFIED),
    ("afterany", JobState.FINISHED, Status.SATISFIED),
    ("afternotok", JobState.FINISHED, Status.NEVER),
    ("afternotok", JobState.TIMEOUT, Status.SATISFIED),
    ("afternotok", JobState.STARTING, Status.WAITING),
    ("aftercorr", JobState.FINISHED, Status.SATISFIED),  # on a plain job: afterok
    ("aftercorr", JobState.FAILED, Status.NEVER),
])
def test_one_job(kind: str, state: JobState, status: Status) -> None:
    assert resolve(after(f"{kind}:p"), None, Facts({"p": state})).status is status


def test_sentences_name_the_term() -> None:
    facts = Facts({"p": JobState.RUNNING, "q": JobState.QUEUED, "f": JobState.FAILED})
    assert resolve(after("afterok:p:q"), None, facts).sentence == (
        "waits for afterok:p (running) and 1 more")
    assert resolve(after("afterany:p,afterok:f"), None, facts).sentence == (
        "dependency afterok:f can never be satisfied: f failed")
    assert resolve(after("afterok:gone"), None, facts).sentence == (
        "dependency afterok:gone can never be satisfied: gone does not exist")


def make_array(states: list[JobState | None]) -> ArrayTasks:
    array = ArrayTasks()
    for index, state in enumerate(states):
        array.add(index, f"t_{index}")
        if state is not None:
            array.end(index, state)
    return array


def test_a_whole_array() -> None:
    fin, fail = JobState.FINISHED, JobState.FAILED
    running = Facts({}, {"t": make_array([fin, None, None])})
    verdict = resolve(after("afterok:t"), None, running)
    assert verdict.status is Status.WAITING
    assert verdict.sentence == "waits for afterok:t (array: 1 of 3 tasks ended)"
    assert resolve(after("afterok:t"), None, Facts({}, {"t": make_array([fin, fin])})
                   ).status is Status.SATISFIED
    failed = resolve(after("afterok:t"), None, Facts({}, {"t": make_array([fin, None, fail])}))
    assert failed.status is Status.NEVER  # no need to wait for the rest
    assert failed.sentence.endswith("its task t_2 failed")
    assert resolve(after("afterany:t"), None, Facts({}, {"t": make_array([fin, fail])})
                   ).status is Status.SATISFIED
    assert resolve(after("afternotok:t"), None, Facts({}, {"t": make_array([fin, fail])})
                   ).status is Status.SATISFIED
    assert resolve(after("afternotok:t"), None, Facts({}, {"t": make_array([fin, fin])})
                   ).status is Status.NEVER


def test_aftercorr_pairs_tasks_by_index() -> None:
    array = make_array([JobState.FINISHED, None, JobState.FAILED])
    facts = Facts({"t_1": JobState.RUNNING}, {"t": array})
    assert resolve(after("aftercorr:t"), ArrayTask("u", 0), facts).status is Status.SATISFIED
    waiting = resolve(after("aftercorr:t"), ArrayTask("u", 1), facts)
    assert waiting.status is Status.WAITING and waiting.sentence == (
        "waits for aftercorr:t (running)")
    assert resolve(after("aftercorr:t"), ArrayTask("u", 2), facts).status is Status.NEVER
    assert resolve(after("aftercorr:t"), ArrayTask("u", 9), facts).status is Status.NEVER
    assert resolve(after("aftercorr:t"), None, facts).status is Status.NEVER


def test_the_book_names_dependents_and_counts_array_ends() -> None:
    book = DependencyBook()
    for i in range(2):
        book.add_task(f"t_{i}", ArrayTask("t", i))
    book.wait("w1", after("afterok:t"))
    book.wait("w2", after("afterok:x,afterany:t"))
    assert book.ended("t_0", ArrayTask("t", 0), JobState.FINISHED) == ["w1", "w2"]
    assert book.ended("t_0", ArrayTask("t", 0), JobState.FAILED) == ["w1", "w2"]
    assert book.arrays["t"].not_finished == 0  # an end is counted once
    assert book.dependents("x") == ["w2"]
    book.settle("w2")
    assert book.dependents("x") == [] and book.dependents("t") == ["w1"]
    # An array outlives its forgotten tasks until the last one goes.
    assert book.forget_task("t_0", ArrayTask("t", 0)) is None
    gone = book.forget_task("t_1", ArrayTask("t", 1))
    assert gone is not None and "t" not in book.arrays and len(gone.tasks) == 2


# -- refusals at submission -------------------------------------------------------------------


def spec(name: str, deps: str = "", array: ArrayTask | None = None) -> JobSpec:
    return JobSpec(name=name, command=("x",), user="a", kind=JobKind.CPU, cpus=1,
                   after=after(deps) if deps else (), array=array)


def test_refusals() -> None:
    facts = Facts({"old": JobState.FINISHED, "w": JobState.QUEUED},
                  {"arr": make_array([None, None])})
    batch = Batch([spec("a", "afterok:ghost"), spec("b", "afterok:old:arr"),
                   spec("c", "aftercorr:arr"), spec("d", "aftercorr:arr", ArrayTask("d", 5)),
                   spec("e", "afterok:e")], ["a", "b", "c", "d", "e"])
    found = refusals(batch, facts)
    assert set(found) == {0, 2, 3, 4}
    assert found[0][0] == "unknown_dependency"
    assert found[2][0] == "invalid_dependency" and "not an array task" in found[2][1]
    assert "no task of index 5" in found[3][1]
    assert found[4][0] == "dependency_cycle"
    # A cycle through a job that already waits (it names an id that is being submitted).
    cyc = refusals(Batch([spec("n", "afterok:w")], ["n"]), facts,
                   waits_for=lambda job_id: ["n"] if job_id == "w" else [])
    assert cyc == {0: ("dependency_cycle", "dependency cycle: n -> w -> n")}
    # Array ids given: taken by an array, or by a job; a job id taken by an array.
    taken = refusals(Batch([spec("x0", array=ArrayTask("arr", 0)),
                            spec("y0", array=ArrayTask("old", 0)), spec("arr")],
                           ["x0", "y0", "arr"]), facts)
    assert "taken by an existing array" in taken[0][1]
    assert "taken by job old" in taken[1][1]
    assert "job id arr is taken by an array" in taken[2][1]
    # A batch may name an array it creates, and pair with its tasks.
    fine = refusals(Batch([spec("p0", array=ArrayTask("p", 0)),
                           spec("q0", "aftercorr:p", ArrayTask("q", 0)),
                           spec("r", "afterok:p")], ["p0", "q0", "r"]), facts)
    assert fine == {}
