"""Relayed streams without daemons: the stream frames' checks, the node's credit (it reads no
more than a window ahead of the acks), a job terminal's end, and the client's exit codes and
port arguments (docs/interactive.md)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from control.interactive import exit_code, parse_ports
from control.usage import UsageError
from noded.relays import NodeStream, SocketEnd, TerminalEnd
from shared.relay import MAX_CHUNK, BadStreamFrame, stream_frame


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
            for _ in range(200):  # until the window is used up
                if data() >= window:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            assert data() == window  # and not a byte more, however fast the job writes
            stream.ack(MAX_CHUNK)
            for _ in range(200):
                if data() >= window + MAX_CHUNK:
                    break
                await asyncio.sleep(0.01)
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
