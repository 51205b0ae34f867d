"""The typed SDK reads what the master answers: the master's own views decode strictly into
shared.views (same keys, same types), and the client tolerates keys a newer master adds."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from control.typed import Calls, TypedCalls
from masterd.api.rpc import event_view, job_view
from masterd.journal.store import EventRow
from shared.model import Job, JobSpec, JobState, NodeAllocation, Placement
from shared.schema import SchemaError, decode
from shared.views import EventPage, JobView, decode_view


def placed_job() -> Job:
    spec = JobSpec(name="train", command=("python3", "train.py"), user="alice", gpus=2)
    job = Job(id="train-7", spec=spec, submit_time=10.0, state=JobState.RUNNING,
              start_time=12.0, attempts=1)
    job.placement = Placement((NodeAllocation(node="n1", gpus=(0, 1), cpus=(2, 3),
                                              memory_mib=512),))
    return job


def test_the_masters_job_view_is_exactly_the_documented_job_view() -> None:
    for job in (placed_job(), Job(id="q-1", spec=placed_job().spec, submit_time=1.0)):
        view = job_view(job)
        assert set(view) == {f.name for f in dataclasses.fields(JobView)}
        typed = decode(JobView, view)  # strict: no unknown keys, every type right
        assert typed.id == job.id and typed.state == job.state.value
    typed = decode(JobView, job_view(placed_job()))
    assert typed.placement[0].gpus == (0, 1) and typed.nodes == ("n1",)


def test_a_newer_masters_extra_keys_are_ignored_at_every_level() -> None:
    view: dict[str, Any] = job_view(placed_job())
    view["added_later"] = 1
    view["placement"][0]["also_new"] = "x"
    typed = decode_view(JobView, view)
    assert typed.placement[0].cpus == (2, 3)


def test_a_reply_that_breaks_the_schema_names_the_field() -> None:
    view = job_view(placed_job())
    view["gpus"] = "two"
    with pytest.raises(SchemaError, match=r"result\.gpus"):
        decode_view(JobView, view)


class Recorder(TypedCalls):
    """A synchronous client whose ``call`` answers from a table (the typed layer only)."""

    def __init__(self, replies: dict[str, Any]) -> None:
        self.replies = replies
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self.sent.append((method, params or {}))
        return self.replies[method]


def test_typed_calls_send_the_documented_params_and_read_the_result() -> None:
    row = EventRow(seq=3, time=1.0, job_id="train-7", node=None, kind="submitted", detail={})
    client = Recorder({"submit": {"job": job_view(placed_job())},
                       "jobs": {"jobs": [job_view(placed_job())]},
                       "events": {"events": [event_view(row)], "last": 3},
                       "drain": {"node": "n1", "status": "drained"}})
    spec = placed_job().spec
    assert client.submit(spec, id="train-7").id == "train-7"
    method, params = client.sent[-1]
    assert method == "submit" and params["id"] == "train-7"
    assert decode(JobSpec, params["job"]) == spec  # the spec travels as its wire form
    assert [j.id for j in client.jobs(state="running")] == ["train-7"]
    assert client.sent[-1] == ("jobs", {"state": "running"})  # unset filters are not sent
    page = client.events(after=2)
    assert isinstance(page, EventPage) and page.last == 3 and page.events[0].kind == "submitted"
    assert client.drain("n1") == "drained"


def test_a_reply_without_its_key_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="no 'jobs'"):
        Calls.jobs().read({"nothing": []})
