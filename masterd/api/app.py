"""aiohttp wiring: the node WebSocket endpoint and the msgpack RPC endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from prometheus_client import CONTENT_TYPE_LATEST

from masterd.api.authn import (
    authorize_rpc,
    check_node_identity,
    node_may_connect,
    principal_of,
)
from masterd.api.caller import CALLER
from masterd.api.limits import Handler
from masterd.api.metrics import MasterMetrics
from masterd.api.nodeguard import check_event, check_hello
from masterd.api.relay import handle_relay
from masterd.api.rpc import VERSION, Rpc
from masterd.journal.store import StoreError
from masterd.service.master import Master
from masterd.service.sessions import NodeSession
from shared.health import Readiness, readiness_response
from shared.messages import NODE_EVENTS, Hello
from shared.protocol import (
    MAX_FRAME,
    ProtocolError,
    decode_frame,
    decode_rpc_request,
    encode_frame,
    encode_rpc_error,
    encode_rpc_result,
    error_body,
)
from shared.relay import STREAM_FRAMES
from shared.schema import SchemaError, decode

log = logging.getLogger("trellis.master.http")

MSGPACK = "application/msgpack"
STATUS_OF = {"unknown_job": 404, "unknown_node": 404, "unknown_method": 404,
             "unknown_service": 404,
             "frame_too_large": 413, "store_unavailable": 503,
             # A master that lost leadership mid-request: the client retries the leader.
             "not_leader": 503,
             "unauthenticated": 401, "forbidden": 403,
             # trellisctl logs: the node keeps no output of the job, is not connected, or
             # serves as many reads as it takes.
             "no_output": 404, "node_unreachable": 503, "busy": 503}
SHUTTING_DOWN = ("the master is shutting down and accepts no new requests; retry once it "
                 "is back")


@dataclass
class Gate:
    """Lets requests in until the master starts draining, and counts those in flight so the
    drain can wait for them (their journal writes included) before closing the store."""

    closed: bool = False
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def enter(self) -> bool:
        if self.closed:
            return False
        self.inflight += 1
        self.idle.clear()
        return True

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.idle.set()

    async def drain(self, timeout_s: float) -> int:
        """Refuse new requests, wait up to ``timeout_s`` for the ones in flight; returns how
        many were still running when the wait ended."""
        self.closed = True
        if self.inflight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), timeout_s)
        return self.inflight


MASTER_KEY = web.AppKey("master", Master)
RPC_KEY = web.AppKey("rpc", Rpc)
GATE_KEY = web.AppKey("gate", Gate)
METRICS_KEY = web.AppKey("metrics", MasterMetrics)
READY_KEY = web.AppKey("readiness", Readiness)


def _rpc_error(req_id: object, code: str, message: str, status: int,
               detail: dict[str, Any] | None = None) -> web.Response:
    return web.Response(body=encode_rpc_error(req_id, code, message, detail), status=status,
                        content_type=MSGPACK)


async def handle_rpc(request: web.Request) -> web.Response:
    # One coroutine for the whole RPC, its accounting included: this runs per request.
    app = request.app
    gate = app[GATE_KEY]
    if not gate.enter():
        return _rpc_error(None, "shutting_down", SHUTTING_DOWN, 503)
    started = time.perf_counter()
    rpc = app[RPC_KEY]
    method = "invalid"  # the request could not even be parsed into a method call
    error: str | None = None
    req_id = None
    try:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ProtocolError(
                "frame_too_large", f"request body exceeds the {MAX_FRAME}-byte limit") from None
        req = decode_rpc_request(body)
        req_id = req.id
        # A metric label per known method only: arbitrary names must not grow the series.
        method = req.method if req.method in rpc.methods else "unknown"
        principal = principal_of(request)
        authorize_rpc(principal, req.method, req.params, rpc.master)
        # Each request is served in its own task: the caller is seen by this one only.
        CALLER.set(principal)
        result = await rpc.call(req.method, req.params)
        return web.Response(body=encode_rpc_result(req_id, result), content_type=MSGPACK)
    except ProtocolError as exc:
        error = exc.code
        return _rpc_error(req_id, exc.code, exc.message, STATUS_OF.get(exc.code, 400),
                          exc.detail)
    except StoreError as exc:
        error = "store_unavailable"
        return _rpc_error(req_id, "store_unavailable", str(exc), 503)
    except Exception:
        error = "internal"
        log.exception("rpc failed method=%s", method)
        return _rpc_error(req_id, "internal", "the master failed to serve the request; see its "
                          "log", 500)
    finally:
        gate.leave()
        app[METRICS_KEY].observe_rpc(method, time.perf_counter() - started, error)


async def handle_node(request: web.Request) -> web.WebSocketResponse:
    """Read frames as they come; acks resolve at once, events go to a per-node worker.

    Events are handled in order but off the reader, so a handler that sends this node a
    command and waits for its ack cannot deadlock the connection.
    """
    master = request.app[MASTER_KEY]
    if request.app[GATE_KEY].closed:
        raise web.HTTPServiceUnavailable(text=SHUTTING_DOWN)
    principal = principal_of(request)
    if not node_may_connect(principal):
        return web.Response(  # type: ignore[return-value]
            body=encode_rpc_error(None, "forbidden", "only node credentials may open a node "
                                  "session"), status=403, content_type=MSGPACK)
    ws = web.WebSocketResponse(max_msg_size=MAX_FRAME, heartbeat=master.config.node_heartbeat_s)
    await ws.prepare(request)
    # A peer that never says hello must not hold the connection.
    hello_timer = asyncio.get_running_loop().call_later(
        master.config.hello_timeout_s,
        lambda: session is None and asyncio.ensure_future(
            ws.close(code=1008, message=b"no hello in time")))
    session: NodeSession | None = None
    inbox: asyncio.Queue[tuple[int, str, object]] = asyncio.Queue()
    worker: asyncio.Task[None] | None = None

    async def work() -> None:
        assert session is not None
        while True:
            id_, type_, body = await inbox.get()
            try:
                if isinstance(body, Hello):
                    await master.node_hello(session, body)
                else:
                    await master.node_event(session.name, type_, body)
            except Exception as exc:
                log.exception("node=%s event %s failed", session.name, type_)
                await session.reply_error(id_, ProtocolError("internal", str(exc)))
                continue
            # The hello's ack names the epoch this master leads at (the node remembers it)
            # and the node lease (shared.messages.HelloAck).
            await session.reply(id_, master.hello_ack() if isinstance(body, Hello) else None)

    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY:
                if msg.type == WSMsgType.TEXT:
                    await ws.close(code=1003, message=b"binary msgpack frames only")
                break
            try:
                frame = decode_frame(msg.data)
            except ProtocolError as exc:
                # No id can be trusted from a frame we cannot parse: answer on id 0.
                log.warning("node=%s bad frame: %s", session.name if session else "?", exc)
                await ws.send_bytes(encode_frame("error", 0, error_body(exc.code, exc.message)))
                continue
            if frame.type in ("ack", "error"):
                if session is not None:
                    session.resolve(frame.id, frame.type == "ack", frame.body)
                continue
            if frame.type in STREAM_FRAMES:  # a relayed stream's bytes (shared/relay.py)
                if session is not None:
                    master.features.relays.from_node(session.name, frame.type, frame.body,
                                                      msg.data)
                continue
            try:
                schema = NODE_EVENTS.get(frame.type)
                if schema is None:
                    raise ProtocolError("unknown_type", f"unknown message type {frame.type!r}")
                try:
                    body = decode(schema, frame.body)
                except SchemaError as exc:
                    raise ProtocolError("invalid_message", f"{frame.type}: {exc}") from None
                if session is None:
                    if not isinstance(body, Hello):
                        raise ProtocolError("not_registered", "send hello first")
                    check_node_identity(principal, body.inventory.name)
                    check_hello(body)  # an inventory listing a GPU or a core twice
                    master.check_hello(body)  # e.g. a node that has seen a newer epoch
                    hello_timer.cancel()
                    session = NodeSession(body.inventory.name, ws,
                                          master.config.command_timeout_s)
                    session.gpus = frozenset(g.index for g in body.inventory.gpus)
                    worker = asyncio.get_running_loop().create_task(work())
                    inbox.put_nowait((frame.id, "hello", body))
                elif isinstance(body, Hello):
                    raise ProtocolError("already_registered", "hello was already received")
                else:
                    check_event(master.core, session.name, body, session.gpus)
                    inbox.put_nowait((frame.id, frame.type, body))
            except ProtocolError as exc:
                await ws.send_bytes(
                    encode_frame("error", frame.id, error_body(exc.code, exc.message)))
    finally:
        hello_timer.cancel()
        if worker is not None:
            worker.cancel()
        if session is not None:
            session.close()
            if isinstance(ws.exception(), TimeoutError):  # the heartbeat: no pong came
                session.silent_s = 1.5 * master.config.node_heartbeat_s
            master.node_disconnected(session)
    return ws


async def handle_relay_ws(request: web.Request) -> web.StreamResponse:
    """A client's relayed stream into a job (masterd/api/relay.py)."""
    return await handle_relay(request, request.app[MASTER_KEY], request.app[GATE_KEY].closed)


async def handle_health(request: web.Request) -> web.Response:
    if request.app[GATE_KEY].closed:
        return web.json_response({"status": "shutting_down"}, status=503)
    return web.json_response({"status": "ok"})


async def handle_ready(request: web.Request) -> web.Response:
    return readiness_response(request.app[READY_KEY])


def master_readiness(master: Master, gate: Gate) -> Readiness:
    """The master takes work while its journal is open, it is not draining and it leads."""
    readiness = Readiness()
    readiness.add("journal", lambda: "the journal is closed" if master.journal.closed
                  else None)
    readiness.add("draining", lambda: "the master is shutting down" if gate.closed else None)

    def leading() -> str | None:
        if master.halted:
            return "this master lost the leadership and is stopping"
        if not master.leadership.leader:
            return f"standing by; the leader is {master.leadership.leader_url or 'unknown'}"
        return None

    readiness.add("leadership", leading)
    return readiness


async def handle_metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def handle_unknown(request: web.Request) -> web.Response:
    """Every path and method no route serves (guarded and authenticated like the others)."""
    served = ROUTES.get(request.path)
    if served is not None:
        allowed = served[0]
        return web.Response(
            body=encode_rpc_error(None, "method_not_allowed",
                                  f"{request.path} takes {allowed}, not {request.method}"),
            status=405, headers={"Allow": allowed}, content_type=MSGPACK)
    return web.Response(
        body=encode_rpc_error(None, "not_found",
                              f"no endpoint {request.method} {request.path}; the RPC endpoint "
                              "is POST /v1/rpc"),
        status=404, content_type=MSGPACK)


# Path -> the one method it serves and its handler.
ROUTES: dict[str, tuple[str, Handler]] = {
    "/v1/rpc": ("POST", handle_rpc),
    "/v1/node": ("GET", handle_node),
    "/v1/relay": ("GET", handle_relay_ws),
    "/healthz": ("GET", handle_health),
    "/readyz": ("GET", handle_ready),
    "/metrics": ("GET", handle_metrics),
}


def make_app(master: Master, wrap: Callable[[Handler], Handler] | None = None
             ) -> web.Application:
    """``wrap`` is applied to every route's handler (the daemon passes the connection guard
    and authentication, see masterd.main)."""
    app = web.Application(client_max_size=MAX_FRAME)
    metrics = MasterMetrics(master, VERSION, master.clock)
    # Master._run_pass reports each pass here (see masterd.service.master).
    master.observe_pass = metrics.observe_pass
    app[MASTER_KEY] = master
    app[RPC_KEY] = Rpc(master)
    app[GATE_KEY] = Gate()
    app[READY_KEY] = master_readiness(master, app[GATE_KEY])
    app[METRICS_KEY] = metrics

    def route(handler: Handler) -> Handler:
        return wrap(handler) if wrap is not None else handler

    for path, (method, handler) in ROUTES.items():
        app.router.add_route(method, path, route(handler))
    app.router.add_route("*", "/{tail:.*}", route(handle_unknown))
    return app
