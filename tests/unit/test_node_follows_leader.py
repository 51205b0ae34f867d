"""A node follows a silent leader: a master that accepts connections and answers nothing
(frozen: its kernel still completes TCP handshakes) costs a node at most its connect or
heartbeat bound, after which it finds the master that leads by asking every ``/readyz`` at
once (noded/agent.py).

The masters are small aiohttp apps behind a relay that can be frozen: it keeps accepting and
reading but forwards nothing, as a SIGSTOPped master's kernel does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import WSMsgType, web

from noded.agent import NodeAgent
from shared.protocol import MAX_FRAME, decode_frame, encode_frame, error_body
from tests.unit.helpers import inventory, wait_for_async


class _Runner:
    on_exited = None
    parts: dict[str, object] = {}

    def reports(self) -> list[object]:
        return []


class _Gpus:
    name = "emulated"

    def sample(self) -> list[object]:
        return []

    def poll_health(self, timeout: float) -> list[object]:
        return []


@dataclass
class FakeMaster:
    """/readyz and /v1/node as a master serves them: 200 and a session while it leads, 503
    and one not_leader frame naming ``leader_url`` while it stands by."""

    leading: bool
    leader_url: str | None = None
    hellos: int = 0
    sessions: set[web.WebSocketResponse] = field(default_factory=set)

    def app(self) -> web.Application:
        async def ready(_: web.Request) -> web.Response:
            return web.json_response({}, status=200 if self.leading else 503)

        async def node(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse(max_msg_size=MAX_FRAME)
            await ws.prepare(request)
            if not self.leading:
                await ws.send_bytes(encode_frame("error", 0, error_body(
                    "not_leader", "standby", {"leader": self.leader_url})))
                await ws.close()
                return ws
            self.sessions.add(ws)
            try:
                async for msg in ws:
                    if msg.type == WSMsgType.BINARY and decode_frame(msg.data).type == "hello":
                        self.hellos += 1
            finally:
                self.sessions.discard(ws)
            return ws

        app = web.Application()
        app.router.add_get("/readyz", ready)
        app.router.add_get("/v1/node", node)
        return app


class Relay:
    """A TCP relay to ``target`` that can be frozen: it still accepts connections and reads
    what is sent, but passes nothing on in either direction."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.frozen = False
        self.server: asyncio.Server | None = None
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    while self.frozen:  # held, as in a stopped process's socket buffer
                        await asyncio.sleep(0.02)
                    dst.write(data)
                    await dst.drain()
            dst.close()

        tasks = [asyncio.ensure_future(pump(reader, up_writer)),
                 asyncio.ensure_future(pump(up_reader, writer))]
        self._tasks.update(tasks)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.difference_update(tasks)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.server is not None:
            self.server.close()


@contextlib.asynccontextmanager
async def served(master: FakeMaster) -> AsyncIterator[Relay]:
    runner = web.AppRunner(master.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    relay = Relay(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    await relay.start()
    try:
        yield relay
    finally:
        await relay.close()
        await runner.cleanup()


@contextlib.asynccontextmanager
async def running(agent: NodeAgent) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.ensure_future(agent.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def agent_for(*relays: Relay, connect_s: float = 0.5, heartbeat_s: float = 0.6) -> NodeAgent:
    urls = ",".join(f"http://127.0.0.1:{r.port}" for r in relays)
    return NodeAgent(urls, lambda: inventory("trellis-test-n1"), _Runner(),  # type: ignore[arg-type]
                     _Gpus(), connect_timeout_s=connect_s,  # type: ignore[arg-type]
                     heartbeat_s=heartbeat_s, reconnect_max_s=2.0)


async def test_a_frozen_leader_is_left_for_the_master_that_takes_over() -> None:
    a, b = FakeMaster(leading=True), FakeMaster(leading=False)
    async with served(a) as relay_a, served(b) as relay_b:
        b.leader_url = f"http://127.0.0.1:{relay_a.port}"
        agent = agent_for(relay_a, relay_b)
        async with running(agent):
            await wait_for_async(lambda: a.hellos == 1, 5, "the node to join the leader")
            relay_a.frozen = True  # the leader stops answering; its kernel still accepts
            frozen_at = time.monotonic()
            # The standby goes on naming the silent leader until it takes over.
            await asyncio.sleep(1.5)
            assert b.hellos == 0
            b.leading, b.leader_url = True, None
            took_over = time.monotonic()
            await wait_for_async(lambda: b.hellos == 1, 5, "the node to join the new leader")
            # Within a poll of the takeover (LEADER_POLL_S 0.5 s, plus slack for a busy
            # machine), not after aiohttp's 300-s default.
            assert time.monotonic() - took_over < 2.5
            assert "master silent" in agent.last_error or agent.connected.is_set()
            assert time.monotonic() - frozen_at < 6
            assert a.hellos == 1  # never joined the frozen one again


async def test_a_dial_to_a_frozen_master_is_bounded() -> None:
    a, b = FakeMaster(leading=False), FakeMaster(leading=True)
    async with served(a) as relay_a, served(b) as relay_b:
        relay_a.frozen = True  # the first URL accepts and never answers the handshake
        agent = agent_for(relay_a, relay_b, connect_s=0.5)
        started = time.monotonic()
        async with running(agent):
            await wait_for_async(lambda: b.hellos == 1, 5, "the node to join the leader")
            assert time.monotonic() - started < 0.5 + 2.0
            assert agent.connected.is_set()


async def test_one_master_silent_then_back_is_dialled_again() -> None:
    """With one master, a lost heartbeat is a failure (not a normal close): the node backs off
    and redials, and joins again once the master answers."""
    a = FakeMaster(leading=True)
    async with served(a) as relay:
        agent = agent_for(relay)
        async with running(agent):
            await wait_for_async(lambda: a.hellos == 1, 5, "the node to join")
            relay.frozen = True
            await wait_for_async(lambda: not agent.connected.is_set(), 5,
                                 "the node to give the silent master up")
            assert agent.last_error.startswith("master silent: no answer to a ping")
            relay.frozen = False
            await wait_for_async(lambda: agent.connected.is_set() and a.hellos >= 2, 10,
                                 "the node to join the master again")


@pytest.mark.parametrize("leader", ["http://127.0.0.1:1", None])
async def test_a_standby_naming_nobody_of_ours_leaves_the_node_probing(
        leader: str | None) -> None:
    """A standby naming no configured master (or nobody) is not followed; the node keeps
    asking /readyz and joins whichever master starts to lead."""
    a, b = FakeMaster(leading=False, leader_url=leader), FakeMaster(leading=False,
                                                                     leader_url=leader)
    async with served(a) as relay_a, served(b) as relay_b:
        agent = agent_for(relay_a, relay_b)
        async with running(agent):
            await wait_for_async(lambda: agent.last_error.startswith("master is a standby"), 5,
                                 "the first dial to meet a standby")
            b.leading = True
            await wait_for_async(lambda: b.hellos == 1, 5, "the node to join the new leader")
            assert a.hellos == 0


def test_a_standby_naming_the_master_that_went_silent_is_not_followed_there() -> None:
    agent = NodeAgent("http://a:1,http://b:2", lambda: inventory("trellis-test-n1"),
                      _Runner(), _Gpus())  # type: ignore[arg-type]
    agent._current = 1  # dialled b, a standby, after a went silent
    agent._silent.add(0)
    assert agent._follow("http://a:1/") is False and agent._current == 1
    agent._silent.clear()  # once joined again (its /readyz said it leads)
    assert agent._follow("http://a:1/") is True and agent._current == 0
