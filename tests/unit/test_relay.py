"""Relayed streams without daemons: the stream frames' checks, the node's credit (it reads no
more than a window ahead of the acks), a job terminal's end, and the client's exit codes and
port arguments (docs/interactive.md)."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace
from typing import Any

import pytest

from control.interactive import exit_code, parse_ports
from control.usage import UsageError
from noded.relays import NodeStream, SocketEnd, TerminalEnd
from shared.relay import MAX_CHUNK, BadStreamFrame, stream_frame
from tests.unit.helpers import wait_for_async


@pytest.mark.parametrize(("type_", "body", "payload"), [
    ("relay_data", {"stream": 3, "data": b"abc"}, b"abc"),
    ("relay_ack", {"stream": 3, "bytes": 10}, 10),
    ("relay_resize", {"stream": 3, "rows": 40, "cols": 100}, (40, 100)),
    ("relay_close", {"stream": 3, "reason": "bye"}, "bye"),
])
def test_stream_frames(type_: str, body: dict[str, Any], payload: Any) -> None:
    assert stream_frame(type_, body) == (3, payload)


@pytest.mark.parametrize(("type_", "body", "message"), [
    ("relay_data", {"stream": 0, "data": b""}, "'stream' must be a positive integer"),
    ("relay_data", {"stream": True, "data": b""}, "'stream' must be a positive integer"),
    ("relay_data", {"stream": 1, "data": "text"}, "'data' must be at most"),
    ("relay_data", {"stream": 1, "data": b"x" * (MAX_CHUNK + 1)}, "'data' must be at most"),
    ("relay_ack", {"stream": 1, "bytes": 0}, "positive count"),
    ("relay_resize", {"stream": 1, "rows": 0, "cols": 80}, "1 to 10000"),
    ("relay_open", {"stream": 1}, "is not a stream frame"),
])
def test_bad_stream_frames_say_what_is_wrong(type_: str, body: dict[str, Any],
                                             message: str) -> None:
    with pytest.raises(BadStreamFrame, match=message):
        stream_frame(type_, body)


def test_exit_codes_follow_srun() -> None:
    assert exit_code({"state": "finished", "exit_code": 0}) == 0
    assert exit_code({"state": "failed", "exit_code": 7}) == 7
    assert exit_code({"state": "failed", "exit_code": None, "signal": 9}) == 137
    assert exit_code({"state": "cancelled", "exit_code": 0}) == 130
    assert exit_code({"state": "timeout", "signal": 15}) == 124
    assert exit_code({"state": "node_lost"}) == 255
    assert exit_code({"state": "failed", "exit_code": None, "signal": None}) == 1


def test_port_arguments() -> None:
    assert parse_ports("8888") == (8888, 8888)
    assert parse_ports("9000:6006") == (9000, 6006)
    for bad in ("http", "1:x", "0", "70000:80"):
        with pytest.raises(UsageError):
            parse_ports(bad)


async def _flooded_stream(window: int) -> tuple[list[tuple[str, dict[str, Any]]], NodeStream,
                                                 asyncio.Server]:
    async def flood(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        block = b"x" * 65536
        try:
            while True:
                writer.write(block)
                await writer.drain()
        except ConnectionError:
            pass

    server = await asyncio.start_server(flood, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=MAX_CHUNK)
    sent: list[tuple[str, dict[str, Any]]] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        sent.append((type_, body))

    stream = NodeStream(1, "job", "tcp", window, SocketEnd(reader, writer), send,
                        lambda s: None)
    stream.start()
    return sent, stream, server


def test_the_node_reads_no_more_than_a_window_ahead_of_the_acks() -> None:
    async def main() -> None:
        window = 256 * 1024
        sent, stream, server = await _flooded_stream(window)

        def data() -> int:
            return sum(len(b["data"]) for t, b in sent if t == "relay_data")

        try:
            await wait_for_async(lambda: data() >= window, what="the window used up")
            await asyncio.sleep(0.1)  # a flood's chance to go past it
            assert data() == window  # and not a byte more, however fast the job writes
            stream.ack(MAX_CHUNK)
            await wait_for_async(lambda: data() >= window + MAX_CHUNK, what="the acked bytes")
            await asyncio.sleep(0.1)
            assert data() == window + MAX_CHUNK
        finally:
            stream.close("done", tell=False)
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_a_terminal_end_reads_until_the_job_closes_it() -> None:
    async def main() -> None:
        master, slave = os.openpty()
        end = TerminalEnd(master)
        try:
            os.write(slave, b"hello\n")
            assert b"hello" in await asyncio.wait_for(end.read(1024), 5)
            await end.write(b"typed\n")
            assert os.read(slave, 1024) == b"typed\n"
            os.close(slave)
            slave = -1
            rest = b""
            while more := await asyncio.wait_for(end.read(1024), 5):  # b"": EIO, hung up
                rest += more
            assert rest == b"typed\r\n"  # the terminal's echo, then its end
        finally:
            end.close()
            os.close(master)
            if slave >= 0:
                os.close(slave)

    asyncio.run(main())


# -- the master's relay feature, with a stand-in for the rest of the master ----------------------
class _Master:
    """What masterd.features.relays.Relays uses of a FeatureContext."""

    def __init__(self, job: Any) -> None:
        from masterd.runtime.events import MasterEvents
        from shared.config import MasterConfig

        self.job = job
        self.pushed: list[tuple[str, str, dict[str, Any]]] = []
        self.commands: list[tuple[str, str, Any]] = []
        self.stopped: list[tuple[str, Any, str]] = []
        self.tasks: set[asyncio.Future[Any]] = set()
        config = MasterConfig(relay_window_kib=256, terminal_grace_s=0.05)
        self.ctx = SimpleNamespace(
            events=MasterEvents(), config=lambda: config,
            core=SimpleNamespace(job=lambda job_id: self.job if job_id == job.id else None,
                                 active_jobs=lambda: {}),
            nodes=SimpleNamespace(send=self._send, push=self._push),
            tasks=SimpleNamespace(spawn=self._spawn),
            jobs=SimpleNamespace(stop=self._stop))

    async def _send(self, node: str, type_: str, body: Any) -> dict[str, Any]:
        self.commands.append((node, type_, body))
        return {}

    async def _push(self, node: str, type_: str, body: dict[str, Any]) -> None:
        self.pushed.append((node, type_, body))

    def _spawn(self, awaitable: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(awaitable)
        self.tasks.add(task)
        return task

    async def _stop(self, job_id: str, end: Any, reason: str) -> None:
        self.stopped.append((job_id, end, reason))


def _running_job(pty: bool) -> Any:
    from shared.model import (
        Job,
        JobKind,
        JobSpec,
        JobState,
        LaunchSpec,
        NodeAllocation,
        Placement,
    )

    spec = JobSpec(name="sh", command=("sh",), user="nobody", kind=JobKind.CPU, cpus=1,
                   launch=LaunchSpec(pty=pty))
    return Job(id="sh-1", spec=spec, submit_time=0.0, state=JobState.RUNNING,
               placement=Placement((NodeAllocation(node="n1", cpus=(0,)),)))


def test_the_master_holds_no_more_than_a_window_and_drops_a_node_that_sends_more() -> None:
    from masterd.features.relays import Relays

    async def main() -> None:
        master = _Master(_running_job(pty=True))
        relays = Relays(master.ctx)  # type: ignore[arg-type]
        stream = await relays.open(master.job, "pty", rows=40, cols=100)
        assert master.commands[0][:2] == ("n1", "relay_open")
        assert (master.commands[0][2].rows, master.commands[0][2].window) == (40, 256 * 1024)
        chunk = b"x" * (64 * 1024)
        for _ in range(4):  # a whole window: queued for the client
            relays.from_node("n1", "relay_data", {"stream": stream.id, "data": chunk})
        relays.from_node("other", "relay_data", {"stream": stream.id, "data": chunk})
        assert stream.buffered == 256 * 1024 and stream.outbox.qsize() == 4
        relays.from_node("n1", "relay_data", {"stream": stream.id, "data": b"y"})
        assert stream.node_closed and stream.buffered == 256 * 1024 + 1
        relays.from_node("n1", "relay_data", {"stream": stream.id, "data": b"z"})
        assert stream.buffered == 256 * 1024 + 1  # nothing more is taken
        assert stream.outbox.qsize() == 5  # the four chunks, then the close
        await asyncio.gather(*master.tasks)
        assert master.pushed[-1][1] == "relay_close"
        # A second client is refused while one is attached; the terminal's client leaving
        # starts the grace, after which the job is cancelled.
        with pytest.raises(Exception, match="attached to another client"):
            await relays.open(master.job, "pty")
        relays.release(stream, "the client disconnected")
        await wait_for_async(lambda: master.stopped, what="the job cancelled after the grace")
        assert "terminal_grace_s" in master.stopped[0][2]

    asyncio.run(main())


def test_a_job_without_a_terminal_or_not_running_is_refused() -> None:
    from masterd.core.scheduler import JobError
    from masterd.features.relays import Relays
    from shared.model import JobState

    async def main() -> None:
        master = _Master(_running_job(pty=False))
        relays = Relays(master.ctx)  # type: ignore[arg-type]
        with pytest.raises(JobError, match="was not started on a terminal"):
            await relays.open(master.job, "pty")
        master.job.state = JobState.QUEUED
        with pytest.raises(JobError, match="is queued, not running"):
            await relays.open(master.job, "tcp", port=80)
        assert master.commands == []

    asyncio.run(main())


def test_a_restarted_master_gives_running_terminals_the_grace_and_not_starting_ones() -> None:
    import dataclasses

    from masterd.features.relays import Relays
    from shared.model import JobState

    async def main() -> None:
        running = _running_job(pty=True)
        starting = dataclasses.replace(running, id="sh-2", state=JobState.STARTING)
        master = _Master(running)
        master.ctx.core.active_jobs = lambda: {j.id: j for j in (running, starting)}
        relays = Relays(master.ctx)  # type: ignore[arg-type]
        master.ctx.events.restored.emit()
        # The running one's client may come back within the grace; the one still starting
        # (an image pull, a slow node) has no terminal yet: its grace starts when it runs.
        assert set(relays._orphaned) == {"sh-1"}
        relays.close()

    asyncio.run(main())
