"""One node's WebSocket session: commands out with acknowledgements, events in."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import Any

from aiohttp import web

from masterd.runtime.commands import CommandFailed
from shared.protocol import ProtocolError, encode_frame, error_body
from shared.schema import encode

__all__ = ["CommandFailed", "NodeSession"]

log = logging.getLogger("trellis.master.session")


class NodeSession:
    def __init__(self, name: str, ws: web.WebSocketResponse, timeout_s: float) -> None:
        self.name = name
        self.ws = ws
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.closed = False
        # The GPU indexes the node's hello listed: it may report on these only.
        self.gpus: frozenset[int] = frozenset()
        # How long the node had been silent when the session ended: 0 for a closed
        # connection, 1.5 × node_heartbeat_s when the heartbeat ended it (no data for a
        # heartbeat period, then no pong within half of one).
        self.silent_s = 0.0

    async def request(self, type_: str, body: Any, timeout_s: float | None = None
                      ) -> dict[str, Any]:
        """Send a command and wait for the node's ack (or raise CommandFailed).

        ``body`` is a message dataclass, or a dict already in wire form (the master encodes
        a job's spec once and reuses it; see masterd.journal.wire). ``timeout_s``: how long
        to wait for the answer, for a command that may wait on the node (read_log); the
        session's ``timeout_s`` otherwise."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if self.closed:
            raise CommandFailed(self.name, type_, "node_unreachable", "the node is not connected")
        id_ = next(self._ids) * 2  # even ids: master-initiated, so they never clash with node ids
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[id_] = fut
        try:
            wire = body if isinstance(body, dict) else encode(body)
            await self.ws.send_bytes(encode_frame(type_, id_, wire))
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise CommandFailed(
                self.name, type_, "timeout", f"no answer within {timeout:g} s",
                unknown_outcome=True) from None
        except ConnectionError as exc:
            raise CommandFailed(self.name, type_, "node_unreachable", str(exc),
                                unknown_outcome=True) from None
        finally:
            self._waiting.pop(id_, None)

    def resolve(self, id_: int, ok: bool, body: dict[str, Any]) -> None:
        fut = self._waiting.get(id_)
        if fut is None or fut.done():
            log.debug("node=%s stray reply id=%s", self.name, id_)
            return
        if ok:
            fut.set_result(body)
        else:
            code = str(body.get("code", "error"))
            fut.set_exception(
                CommandFailed(self.name, "command", code, str(body.get("message", "")))
            )

    async def reply(self, id_: int, body: dict[str, Any] | None = None) -> None:
        await self._send("ack", id_, body or {})

    async def reply_error(self, id_: int, exc: ProtocolError) -> None:
        await self._send("error", id_, error_body(exc.code, exc.message))

    async def _send(self, type_: str, id_: int, body: dict[str, Any]) -> None:
        if self.closed:
            return
        with contextlib.suppress(ConnectionError):
            await self.ws.send_bytes(encode_frame(type_, id_, body))

    async def push(self, type_: str, body: dict[str, Any]) -> None:
        """Send a frame that is not a command (id 0, no ack): a relayed stream's bytes."""
        await self._send(type_, 0, body)

    def close(self) -> None:
        self.closed = True
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(
                    CommandFailed(self.name, "command", "node_unreachable", "connection closed",
                                  unknown_outcome=True)
                )
        self._waiting.clear()
