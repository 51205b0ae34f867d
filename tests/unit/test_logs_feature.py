"""The master's half of job output (masterd/features/logs.py) against nodes that keep logs in
memory: which nodes a job's output is on, chunks per part, long polls across parts, errors."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from masterd.core.scheduler import JobError
from masterd.features.logs import JobLogs
from masterd.runtime.commands import CommandFailed
from masterd.runtime.context import NodeCommands
from shared.messages import LogData, ReadLog
from shared.model import Job, JobSpec, JobState, NodeAllocation, Placement
from shared.schema import encode
from tests.unit.feature_context import FeatureHarness


class Nodes:
    """Nodes answering read_log from in-memory logs, waiting as noded does."""

    def __init__(self) -> None:
        self.logs: dict[str, bytearray] = {}
        self.ended: set[str] = set()
        self.down: set[str] = set()
        self.sent: list[tuple[str, ReadLog]] = []
        self.grew = asyncio.Event()

    def write(self, node: str, data: bytes) -> None:
        self.logs.setdefault(node, bytearray()).extend(data)
        self.grew.set()

    async def send(self, node: str, type_: str, body: Any,
                   timeout_s: float | None = None) -> dict[str, Any]:
        assert type_ == "read_log" and isinstance(body, ReadLog)
        self.sent.append((node, body))
        if node in self.down:
            raise CommandFailed(node, type_, "node_unreachable", "the node is not connected")
        if node not in self.logs and not body.pending:
            raise CommandFailed(node, type_, "no_output", f"node {node} has no output of job "
                                f"{body.job_id}")
        deadline = time.monotonic() + body.wait_s
        while True:
            log = self.logs.get(node, bytearray())
            offset = body.offset or 0
            if body.offset is None and body.tail is not None:
                lines = log.splitlines(keepends=True)[-body.tail:] if body.tail else []
                offset = len(log) - sum(len(line) for line in lines)
            start = min(offset, len(log))
            data = bytes(log[start:start + body.max_bytes])
            ended = node in self.ended
            if data or ended or len(log) > start or time.monotonic() >= deadline:
                return encode(LogData(data=data, offset=start, size=len(log),
                                      done=ended and start + len(data) >= len(log)))
            self.grew.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.grew.wait(), deadline - time.monotonic())


def job_on(nodes: list[str], state: JobState = JobState.RUNNING) -> Job:
    spec = JobSpec(name="j", command=("true",), user="nobody", gpus=1)
    job = Job(id="j", spec=spec, submit_time=0.0)
    job.state = state
    if nodes:
        job.placement = Placement(tuple(NodeAllocation(node=n, gpus=(0,)) for n in nodes))
    return job


def run(tmp_path: Path, scenario: Callable[[JobLogs, Nodes, FeatureHarness], Any]) -> Any:
    async def main() -> Any:
        harness = FeatureHarness(tmp_path)
        nodes = Nodes()
        ctx = dataclasses.replace(harness.ctx, nodes=NodeCommands(
            send=nodes.send, status=lambda node: "disconnected"))
        try:
            return await scenario(JobLogs(ctx), nodes, harness)
        finally:
            await harness.close()

    return asyncio.run(main())


def test_every_part_is_read_from_its_own_offset(tmp_path: Path) -> None:
    async def scenario(logs: JobLogs, nodes: Nodes, _: FeatureHarness) -> None:
        job = job_on(["a", "b"])
        nodes.write("a", b"a1\na2\n")
        nodes.write("b", b"b1\n")
        reply = await logs.read(job)
        assert reply["nodes"] == ["a", "b"] and not reply["done"]
        assert [(p["node"], p["data"], p["next"]) for p in reply["parts"]] == [
            ("a", b"a1\na2\n", 6), ("b", b"b1\n", 3)]
        reply = await logs.read(job, offsets={"a": 3}, tail=0)
        assert [(p["node"], p["data"]) for p in reply["parts"]] == [("a", b"a2\n"),
                                                                   ("b", b"")]
        one = await logs.read(job, node="b")
        assert [p["node"] for p in one["parts"]] == ["b"]
        # The reply's bytes are shared among the parts asked for.
        small = await logs.read(job, max_bytes=4)
        assert [p["data"] for p in small["parts"]] == [b"a1", b"b1"]

    run(tmp_path, scenario)


def test_a_follow_wakes_when_any_part_grows(tmp_path: Path) -> None:
    async def scenario(logs: JobLogs, nodes: Nodes, _: FeatureHarness) -> None:
        job = job_on(["a", "b"])
        nodes.write("a", b"x")
        nodes.write("b", b"y")
        started = time.monotonic()
        waiting = asyncio.ensure_future(logs.read(job, offsets={"a": 1, "b": 1}, wait_s=20))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        nodes.write("b", b"more")
        reply = await asyncio.wait_for(waiting, 5)
        assert time.monotonic() - started < 5
        assert [(p["node"], p["data"]) for p in reply["parts"]] == [("a", b""),
                                                                   ("b", b"more")]
        # The waits asked for no data: nothing was read and thrown away.
        waits = [cmd for _, cmd in nodes.sent if cmd.wait_s > 0]
        assert waits and all(cmd.max_bytes == 0 for cmd in waits)

    run(tmp_path, scenario)


def test_a_follow_of_an_ended_job_ends_and_close_ends_the_waits(tmp_path: Path) -> None:
    async def scenario(logs: JobLogs, nodes: Nodes, _: FeatureHarness) -> None:
        done = job_on(["a"], JobState.FINISHED)
        nodes.write("a", b"all\n")
        nodes.ended.add("a")
        reply = await logs.read(done, offsets={"a": 4}, wait_s=20)
        assert reply["done"] and reply["parts"][0]["done"]
        running = job_on(["b"])
        nodes.write("b", b"")
        waiting = asyncio.ensure_future(logs.read(running, offsets={"b": 0}, wait_s=20))
        await asyncio.sleep(0.2)
        logs.close()  # the master shuts down
        reply = await asyncio.wait_for(waiting, 5)
        assert reply["parts"][0]["data"] == b"" and not reply["done"]

    run(tmp_path, scenario)


def test_an_ended_job_without_a_placement_is_found_by_its_placed_event(
        tmp_path: Path) -> None:
    async def scenario(logs: JobLogs, nodes: Nodes, harness: FeatureHarness) -> None:
        job = job_on([], JobState.QUEUED)  # re-queued after running on c
        with pytest.raises(JobError) as err:
            await logs.read(job)
        assert err.value.code == "not_started"
        assert str(err.value) == "job j has not started; it has no output yet"
        await harness.journal.submit(1, job)  # its row, which its events hang off
        await harness.ctx.journal.persist([], [
            (1.0, "j", None, "placed", {"placement": [{"node": "old", "gpus": [0],
                                                        "cpus": []}], "attempt": 0}),
            (2.0, "j", None, "placed", {"placement": [{"node": "c", "gpus": [0],
                                                        "cpus": []}], "attempt": 1})])
        assert await logs.nodes_of(job) == ["c"]
        nodes.write("c", b"before the requeue\n")
        nodes.ended.add("c")
        reply = await logs.read(job)
        assert reply["parts"][0]["data"] == b"before the requeue\n"
        cancelled = job_on([], JobState.CANCELLED)
        cancelled.id = "never"
        with pytest.raises(JobError) as err:
            await logs.read(cancelled)
        assert "ended (cancelled) without ever starting" in str(err.value)

    run(tmp_path, scenario)


def test_unreachable_and_empty_nodes_and_wrong_nodes_are_named(tmp_path: Path) -> None:
    async def scenario(logs: JobLogs, nodes: Nodes, _: FeatureHarness) -> None:
        job = job_on(["a", "b"], JobState.FINISHED)
        nodes.write("a", b"kept\n")
        nodes.ended.add("a")
        # b kept nothing (removed after its retention): a's part is still read.
        reply = await logs.read(job)
        assert reply["parts"][0]["data"] == b"kept\n"
        assert reply["parts"][1]["missing"] == "node b has no output of job j"
        with pytest.raises(JobError) as err:
            await logs.read(job, node="b")
        assert err.value.code == "no_output"
        nodes.down.add("a")
        with pytest.raises(JobError) as err:
            await logs.read(job)
        assert err.value.code == "node_unreachable"
        assert str(err.value) == ("job j's output is on node a, which is not connected to "
                                  "the master (disconnected); try again once it is back "
                                  "(read the other parts with --node)")
        with pytest.raises(JobError) as err:
            await logs.read(job, node="z")
        assert str(err.value) == "job j did not run on node z; its output is on a, b"
        with pytest.raises(JobError) as err:
            await logs.read(job, offsets={"z": 1})
        assert err.value.code == "invalid_params"

    run(tmp_path, scenario)
