"""What a standby master serves while another master leads: ``not_leader``, naming the leader.

Same port, same guard and authentication as the leader's endpoints (masterd.api.app), so a
client or node configured with every master's URL reaches whichever leads: an RPC is
answered with error code ``not_leader`` and ``detail.leader`` (the leader's advertised URL,
or nil while nobody leads), a node's WebSocket with one ``error`` frame of that body before
it is closed, ``/readyz`` with 503 (it takes no work), ``/healthz`` with 200 (it is alive and
must not be restarted for being a standby) and ``/metrics`` with the leadership gauges. Nothing is
ever done on a standby, so a client may always send the same request to the leader.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from masterd.api.limits import Handler
from masterd.api.metrics import LeadershipCollector
from masterd.service.leader import Leadership
from shared.health import Readiness, readiness_response
from shared.protocol import (
    MAX_FRAME,
    ProtocolError,
    decode_rpc_request,
    encode_frame,
    encode_rpc_error,
    error_body,
)

MSGPACK = "application/msgpack"
NOT_LEADER = "not_leader"


def not_leader_message(leadership: Leadership) -> str:
    if leadership.leader_url:
        return f"this master is a standby; the leader is at {leadership.leader_url}"
    return "this master is a standby and no master leads at the moment; retry shortly"


def make_standby_app(leadership: Leadership,
                     wrap: Callable[[Handler], Handler] | None = None) -> web.Application:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(LeadershipCollector(leadership))

    def detail() -> dict[str, str | None]:
        return {"leader": leadership.leader_url}

    async def rpc(request: web.Request) -> web.Response:
        req_id = None
        # A request it cannot parse is answered not_leader all the same: the leader judges it.
        with contextlib.suppress(ProtocolError, web.HTTPRequestEntityTooLarge):
            req_id = decode_rpc_request(await request.read()).id
        return web.Response(body=encode_rpc_error(req_id, NOT_LEADER,
                                                  not_leader_message(leadership), detail()),
                            status=503, content_type=MSGPACK)

    async def node(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_FRAME)
        await ws.prepare(request)
        await ws.send_bytes(encode_frame("error", 0, error_body(
            NOT_LEADER, not_leader_message(leadership), detail())))
        await ws.close(code=1013, message=b"not the leader")  # 1013: try again later
        return ws

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "standby", **detail()})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": "text/plain; version=0.0.4"})

    app = web.Application(client_max_size=MAX_FRAME)

    def route(handler: Handler) -> Handler:
        return wrap(handler) if wrap is not None else handler

    app.router.add_route("POST", "/v1/rpc", route(rpc))
    app.router.add_route("GET", "/v1/node", route(node))  # type: ignore[arg-type]
    # Readiness as the leader's /readyz reports it: a standby takes no work.
    readiness = Readiness()
    readiness.add("leadership", lambda: not_leader_message(leadership))

    async def ready(_: web.Request) -> web.Response:
        return readiness_response(readiness)

    app.router.add_route("GET", "/healthz", route(health))
    app.router.add_route("GET", "/readyz", route(ready))
    app.router.add_route("GET", "/metrics", route(metrics))
    return app
