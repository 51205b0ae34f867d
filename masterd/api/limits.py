"""Per-connection limits against hostile or broken peers, below aiohttp.

aiohttp parses whatever arrives, however slowly: a client that sends its headers one byte a
second holds a connection (and a slot of the per-IP budget) forever. :class:`GuardedSite`
listens like ``web.TCPSite`` but wraps every connection's protocol in :class:`GuardedProtocol`,
which

* refuses a connection beyond ``max_per_ip`` concurrent ones from the same address (503);
* gives each HTTP request ``request_timeout_s`` from its first byte to arrive whole, headers
  and body (408, then close) -- timed on the bytes as they arrive, so a master too busy to
  get round to a request quickly never blames the client for it;
* gives each WebSocket frame from a node the same time from its first byte (close);
* closes a keep-alive connection idle for ``idle_timeout_s``.

A slow sender never blocks anyone else: everything here is callbacks on the event loop. Each
connection keeps a deadline rather than a timer of its own, and one sweep a few times a second
closes the connections whose deadline has passed: arming and cancelling a timer per request
cost more than the rest of the guard together. :func:`guard_handler` tells the guard when
handlers run.
"""

from __future__ import annotations

import asyncio
import logging
import re
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
        # Deadlines are checked this often, so a timeout fires at most this late.
        self.resolution_s = max(0.02, min(0.25, request_timeout_s / 10, idle_timeout_s / 10))
        self._sweeper: asyncio.TimerHandle | None = None

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure the sweep runs (it stops itself when no connection is open)."""
        if self._sweeper is None:
            self._sweeper = loop.call_later(self.resolution_s, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweeper = None
        now = loop.time()
        for guard in [g for g in self.guards.values()
                      if g.deadline is not None and g.deadline <= now]:
            guard.expire()
        if self.guards:
            self.watch(loop)

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


class _RequestClock:
    """Finds where HTTP/1.1 requests end in the client's byte stream (headers, then
    Content-Length bytes of body), so the guard times what the *peer* sends, not how soon a
    busy event loop gets round to the handler."""

    MAX_HEAD = 64 * 1024  # aiohttp refuses longer headers itself

    def __init__(self) -> None:
        self._head = bytearray()
        self._body_left = 0
        self.completed = 0  # requests received whole so far

    @property
    def partial(self) -> bool:
        return bool(self._head) or self._body_left > 0

    def feed(self, data: bytes) -> None:
        if not self._head and not self._body_left:
            # The usual case: a chunk that starts a request and holds its whole head (and
            # usually its body), found without copying.
            end = data.find(b"\r\n\r\n")
            if end >= 0:
                whole = end + 4 + _content_length(data, end)
                if whole >= len(data):
                    self._body_left = whole - len(data)
                    if not self._body_left:
                        self.completed += 1
                    return
        view = memoryview(data)
        while view:
            if self._body_left:
                step = min(self._body_left, len(view))
                self._body_left -= step
                view = view[step:]
                if not self._body_left:
                    self.completed += 1
                continue
            scan_from = max(0, len(self._head) - 3)
            self._head += view
            view = memoryview(b"")
            end = self._head.find(b"\r\n\r\n", scan_from)
            if end < 0:
                if len(self._head) > self.MAX_HEAD:
                    self._head.clear()  # aiohttp answers 431 and closes; stop timing it
                return
            head, rest = bytes(self._head[:end]), bytes(self._head[end + 4:])
            self._head.clear()
            self._body_left = _content_length(head, len(head))
            if not self._body_left:
                self.completed += 1
            view = memoryview(rest)


_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*([^\r]*)", re.IGNORECASE)


def _content_length(data: bytes, head_end: int) -> int:
    """The Content-Length of the request whose head is ``data[:head_end]``."""
    match = _CONTENT_LENGTH.search(data, 0, head_end)
    if match is None:
        return 0  # no body (chunked bodies are timed only up to their headers)
    try:
        return max(0, int(match.group(1).strip()))
    except ValueError:
        return 0  # aiohttp answers 400


class GuardedProtocol(asyncio.Protocol):
    """Wraps aiohttp's per-connection protocol; see the module docstring.

    The clock is driven by bytes arriving: it runs while a request (or a WebSocket frame) is
    partly received, stops when it is whole, and an idle timer runs between requests.
    """

    def __init__(self, inner_factory: Callable[[], asyncio.Protocol],
                 limits: PeerLimits) -> None:
        self._factory = inner_factory
        self.limits = limits
        self.inner: asyncio.Protocol | None = None
        self.transport: Any = None
        self.peer = ""
        self.websocket_mode = False
        self.busy = 0  # requests whose handler is running
        self.started = 0  # requests whose handler has started
        self._loop: asyncio.AbstractEventLoop | None = None
        self.deadline: float | None = None  # loop time; checked by PeerLimits' sweep
        self._timer_kind = ""
        self._requests = _RequestClock()
        self._frames = _FrameClock()

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        # uvloop's transports quack like asyncio.Transport without subclassing it.
        self.transport = transport
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
        self._loop = asyncio.get_running_loop()
        limits.watch(self._loop)
        self.inner = self._factory()
        self.inner.connection_made(transport)
        # Waiting for the first request counts as receiving it: a silent peer is cut off.
        self._arm("request", self.limits.request_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        clock: _RequestClock | _FrameClock = (
            self._frames if self.websocket_mode else self._requests)
        was_partial = clock.partial
        clock.feed(data)
        if clock.partial:
            if not was_partial or self._timer_kind != "request":
                self._arm("request", self.limits.request_timeout_s)
        elif self._timer_kind in ("request", "idle"):
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
    def request_started(self) -> None:
        self.busy += 1
        self.started += 1

    def websocket(self) -> None:
        """After the upgrade the stream carries WebSocket frames: time those instead."""
        self.websocket_mode = True
        if not self._frames.partial:
            self._disarm()

    def request_done(self) -> None:
        self.busy = max(0, self.busy - 1)
        if not self.busy and not self._requests.partial and not self.websocket_mode:
            self._arm("idle", self.limits.idle_timeout_s)

    # -- timers --------------------------------------------------------------------------
    def _arm(self, kind: str, delay: float) -> None:
        assert self._loop is not None  # armed only once connected
        self.deadline = self._loop.time() + delay
        self._timer_kind = kind

    def _disarm(self) -> None:
        self.deadline = None
        self._timer_kind = ""

    def expire(self) -> None:
        """The deadline passed: act on what was being timed."""
        kind = self._timer_kind
        if kind == "request":
            self._too_slow()
        elif kind == "idle":
            self._idle_too_long()
        else:
            self._disarm()

    def _too_slow(self) -> None:
        self._disarm()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.limits.stats.timed_out += 1
        if self.websocket_mode:
            log.warning("peer=%s WebSocket frame not received within %.1f s; closing",
                        self.peer, self.limits.request_timeout_s)
            transport.abort()
            return
        if self.busy and self.started <= self._requests.completed:
            # A handler is answering a request that arrived whole; the partial bytes are a
            # pipelined one, which is cut off once the answer is out.
            self._arm("request", 0.5)
            return
        log.warning("peer=%s request not received within %.1f s; closing", self.peer,
                    self.limits.request_timeout_s)
        transport.write(_http_error(
            408, "Request Timeout", "request_timeout",
            f"the request did not arrive within {self.limits.request_timeout_s:g} s"))
        transport.close()

    def _idle_too_long(self) -> None:
        self._disarm()
        if not self.busy and self.transport is not None:
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


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard_handler(limits: PeerLimits, handler: Handler) -> Handler:
    """Wrap a route handler so it tells the connection's guard when it runs and when the
    connection turns into a WebSocket. A wrapper per route rather than an aiohttp middleware:
    an application without middlewares skips aiohttp's per-request middleware chain."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        guard = limits.guard_for(request.transport)
        if guard is None:  # not behind a GuardedSite (tests with TestServer)
            return await handler(request)
        if request.headers.get("Upgrade", "").lower() == "websocket":
            guard.websocket()
            return await handler(request)
        guard.request_started()
        try:
            if request.can_read_body:
                # Read here, under the guard's clock, so a body cut off for slowness ends
                # this request quietly (the handler's read() returns these cached bytes).
                try:
                    await request.read()
                except web.HTTPRequestEntityTooLarge:
                    return web.Response(
                        body=encode_rpc_error(None, "frame_too_large",
                                              f"request body exceeds the {MAX_FRAME}-byte "
                                              "limit"),
                        status=413, content_type="application/msgpack")
                except ConnectionError:
                    return web.Response(
                        body=encode_rpc_error(None, "request_timeout",
                                              "the request body did not arrive in time"),
                        status=408, content_type="application/msgpack")
            return await handler(request)
        finally:
            guard.request_done()

    return guarded
