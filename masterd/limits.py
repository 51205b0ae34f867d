"""Per-connection limits against hostile or broken peers, below aiohttp.

aiohttp parses whatever arrives, however slowly: a client that sends its headers one byte a
second holds a connection (and a slot of the per-IP budget) forever. :class:`GuardedSite`
listens like ``web.TCPSite`` but wraps every connection's protocol in :class:`GuardedProtocol`,
which

* refuses a connection beyond ``max_per_ip`` concurrent ones from the same address (503);
* gives each HTTP request ``request_timeout_s`` from its first byte to arrive whole, headers
  and body (408, then close);
* gives each WebSocket frame from a node the same time from its first byte (close);
* closes a keep-alive connection idle for ``idle_timeout_s``.

A slow sender costs one timer and never blocks anyone else: everything here is callbacks on the
event loop. :func:`limits_middleware` tells the guard when a request's body is in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from shared.protocol import MAX_FRAME, encode_rpc_error

log = logging.getLogger("trellis.master.limits")

IDLE_TIMEOUT_S = 75.0


@dataclass
class LimitStats:
    refused: int = 0  # connections over the per-IP cap
    timed_out: int = 0  # requests or frames that did not arrive in time


def _http_error(status: int, reason: str, code: str, message: str) -> bytes:
    body = encode_rpc_error(None, code, message)
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/msgpack\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


class PeerLimits:
    def __init__(self, max_per_ip: int, request_timeout_s: float,
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.max_per_ip = max_per_ip
        self.request_timeout_s = request_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.counts: dict[str, int] = {}
        self.guards: dict[int, GuardedProtocol] = {}  # id(transport) -> guard
        self.stats = LimitStats()

    def guard_for(self, transport: Any) -> GuardedProtocol | None:
        return self.guards.get(id(transport)) if transport is not None else None


class _FrameClock:
    """Finds WebSocket frame boundaries in the client's byte stream (RFC 6455 §5.2), so the
    guard knows when a frame has been half-sent for too long."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._need_head = 2
        self._payload_left = 0

    @property
    def partial(self) -> bool:
        return bool(self._head) or self._payload_left > 0

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._payload_left:
                step = min(self._payload_left, len(view))
                self._payload_left -= step
                view = view[step:]
                continue
            take = min(self._need_head - len(self._head), len(view))
            self._head += view[:take]
            view = view[take:]
            if len(self._head) < self._need_head:
                return
            b1 = self._head[1]
            size7 = b1 & 0x7F
            need = 2 + (2 if size7 == 126 else 8 if size7 == 127 else 0) + (4 if b1 & 0x80 else 0)
            if need > self._need_head:
                self._need_head = need
                continue
            if size7 == 126:
                size = int.from_bytes(self._head[2:4], "big")
            elif size7 == 127:
                size = int.from_bytes(self._head[2:10], "big")
            else:
                size = size7
            self._head.clear()
            self._need_head = 2
            self._payload_left = size


class GuardedProtocol(asyncio.Protocol):
    """Wraps aiohttp's per-connection protocol; see the module docstring."""

    def __init__(self, inner_factory: Callable[[], asyncio.Protocol],
                 limits: PeerLimits) -> None:
        self._factory = inner_factory
        self.limits = limits
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.state = "receiving"  # receiving | handling | idle | websocket
        self._timer: asyncio.TimerHandle | None = None
        self._data_while_handling = False
        self._frames: _FrameClock | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        # uvloop's transports quack like asyncio.Transport without subclassing it.
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        limits = self.limits
        count = limits.counts.get(self.peer, 0)
        if count >= limits.max_per_ip:
            limits.stats.refused += 1
            if limits.stats.refused % 100 == 1:
                log.warning("peer=%s refused: %d connections open, at most %d per address "
                            "(refused so far: %d)", self.peer, count, limits.max_per_ip,
                            limits.stats.refused)
            transport.write(_http_error(
                503, "Service Unavailable", "too_many_connections",
                f"{count} connections from {self.peer} are open; at most "
                f"{limits.max_per_ip} are allowed per address"))
            transport.close()
            return
        limits.counts[self.peer] = count + 1
        limits.guards[id(transport)] = self
        self.inner = self._factory()
        self.inner.connection_made(transport)
        self._arm(limits.request_timeout_s, self._request_too_slow)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.state == "idle":
            self.state = "receiving"
            self._arm(self.limits.request_timeout_s, self._request_too_slow)
        elif self.state == "handling":
            self._data_while_handling = True
        elif self.state == "websocket" and self._frames is not None:
            was_partial = self._frames.partial
            self._frames.feed(data)
            if self._frames.partial and not was_partial:
                self._arm(self.limits.request_timeout_s, self._frame_too_slow)
            elif not self._frames.partial:
                self._disarm()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.inner is None:
            return
        limits = self.limits
        limits.guards.pop(id(self.transport), None)
        left = limits.counts.get(self.peer, 1) - 1
        if left > 0:
            limits.counts[self.peer] = left
        else:
            limits.counts.pop(self.peer, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    # -- driven by the middleware ----------------------------------------------------------
    def request_in(self) -> None:
        """The request's headers and body have arrived: the handler's time is not the
        peer's fault, so the clock stops."""
        self._disarm()
        self.state = "handling"
        self._data_while_handling = False

    def websocket(self) -> None:
        self._disarm()
        self.state = "websocket"
        self._frames = _FrameClock()

    def request_done(self) -> None:
        if self.state != "handling":
            return
        if self._data_while_handling:  # a pipelined request is already on its way
            self.state = "receiving"
            self._arm(self.limits.request_timeout_s, self._request_too_slow)
        else:
            self.state = "idle"
            self._arm(self.limits.idle_timeout_s, self._idle_too_long)

    # -- timers --------------------------------------------------------------------------
    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _request_too_slow(self) -> None:
        self._timer = None
        if self.state != "receiving" or self.transport is None:
            return
        self.limits.stats.timed_out += 1
        log.warning("peer=%s request not received within %.1f s; closing", self.peer,
                    self.limits.request_timeout_s)
        if not self.transport.is_closing():
            self.transport.write(_http_error(
                408, "Request Timeout", "request_timeout",
                f"the request did not arrive within {self.limits.request_timeout_s:g} s"))
            self.transport.close()

    def _frame_too_slow(self) -> None:
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        self.limits.stats.timed_out += 1
        log.warning("peer=%s WebSocket frame not received within %.1f s; closing", self.peer,
                    self.limits.request_timeout_s)
        self.transport.abort()

    def _idle_too_long(self) -> None:
        self._timer = None
        if self.state == "idle" and self.transport is not None:
            self.transport.close()


class GuardedSite(web.TCPSite):
    """``web.TCPSite`` whose connections go through :class:`GuardedProtocol`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 limits: PeerLimits, **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.limits = limits

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        limits = self.limits
        self._server = await asyncio.get_running_loop().create_server(
            lambda: GuardedProtocol(server, limits),  # type: ignore[arg-type]
            self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


def limits_middleware(limits: PeerLimits) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Reads a request's body under the guard's clock, then stops the clock for the handler."""

    @web.middleware
    async def middleware(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        guard = limits.guard_for(request.transport)
        if guard is None:  # not behind a GuardedSite (tests with TestServer)
            return await handler(request)
        if request.headers.get("Upgrade", "").lower() == "websocket":
            guard.websocket()
            return await handler(request)
        if request.can_read_body:
            try:
                await request.read()  # cached: the handler's read() returns the same bytes
            except web.HTTPRequestEntityTooLarge:
                guard.request_in()
                guard.request_done()
                return web.Response(
                    body=encode_rpc_error(None, "frame_too_large",
                                          f"request body exceeds the {MAX_FRAME}-byte limit"),
                    status=413, content_type="application/msgpack")
        guard.request_in()
        try:
            return await handler(request)
        finally:
            guard.request_done()

    return middleware
