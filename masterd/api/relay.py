"""``GET /v1/relay``: a client's WebSocket for one relayed stream into a running job, its
terminal or one TCP connection to a port of it (masterd/features/relays.py, shared/relay.py).

The client's first frame is ``relay_open`` (:class:`shared.relay.ClientOpen`), within
``hello_timeout_s``; the master answers ``relay_opened`` ``{stream, node, window}`` or an
``error`` frame ``{code, message}`` and closes. Only the job's owner or an admin may open
one (as for ``logs``). Then stream frames go both ways until either side closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSMsgType, web

from masterd.api.authn import authorize_rpc, principal_of
from masterd.api.caller import CALLER
from masterd.api.visibility import check_owner
from masterd.core.scheduler import JobError
from masterd.features.relays import MasterStream, Relays
from masterd.service.master import Master
from shared.protocol import MAX_FRAME, ProtocolError, decode_frame, encode_frame, error_body
from shared.relay import STREAM_FRAMES, BadStreamFrame, ClientOpen
from shared.schema import SchemaError, decode

log = logging.getLogger("trellis.master.relay")


async def _refuse(ws: web.WebSocketResponse, code: str, message: str) -> web.WebSocketResponse:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_bytes(encode_frame("error", 0, error_body(code, message)))
        await ws.close()
    return ws


async def handle_relay(request: web.Request, master: Master, closed: bool
                       ) -> web.StreamResponse:
    if closed:
        raise web.HTTPServiceUnavailable(text="the master is shutting down")
    principal = principal_of(request)
    ws = web.WebSocketResponse(max_msg_size=MAX_FRAME, heartbeat=master.config.node_heartbeat_s)
    await ws.prepare(request)
    try:
        # The same rule as the logs RPC: clients reach their own jobs, admins every job.
        authorize_rpc(principal, "relay", {}, master)
        CALLER.set(principal)
        try:
            msg = await ws.receive(timeout=master.config.hello_timeout_s)
        except TimeoutError:
            return await _refuse(ws, "invalid_message", "no relay_open frame in time")
        if msg.type != WSMsgType.BINARY:
            return await _refuse(ws, "invalid_message", "the first frame must be a binary "
                                 "msgpack relay_open")
        frame = decode_frame(msg.data)
        if frame.type != "relay_open":
            return await _refuse(ws, "invalid_message", f"the first frame must be relay_open, "
                                 f"not {frame.type!r}")
        try:
            want = decode(ClientOpen, frame.body, "relay_open")
        except SchemaError as exc:
            return await _refuse(ws, "invalid_params", str(exc))
        job = await master.find_job(want.job)
        if job is None:
            return await _refuse(ws, "unknown_job", f"job {want.job!r} does not exist")
        check_owner(job, "reach the terminal and ports of")
        relays = master.features.relays
        stream = await relays.open(job, want.kind, want.port, want.rows, want.cols, want.probe)
    except ProtocolError as exc:
        return await _refuse(ws, exc.code, exc.message)
    except JobError as exc:
        return await _refuse(ws, exc.code, str(exc))
    try:
        await ws.send_bytes(encode_frame("relay_opened", 0, {
            "stream": stream.id, "node": stream.node, "window": stream.window}))
    except (ConnectionError, RuntimeError):
        relays.release(stream, "the client disconnected")  # gone before it heard
        return ws
    if want.probe:
        await ws.close()
        return ws
    await _relay(ws, relays, stream)
    return ws


async def _relay(ws: web.WebSocketResponse, relays: Relays, stream: MasterStream) -> None:
    """Until either side ends the stream: the client's frames to the node (``_from_client``)
    beside the node's frames to the client (``_to_client``). Whichever ends first, the other
    is cancelled, and only then is the connection closed (after what was sent is flushed): a
    close while a reader waits would cut the last frames off."""
    loop = asyncio.get_running_loop()
    reading = loop.create_task(_from_client(ws, relays, stream))
    writing = loop.create_task(_to_client(ws, stream))
    try:
        await asyncio.wait((reading, writing), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (reading, writing):
            task.cancel()
        await asyncio.gather(reading, writing, return_exceptions=True)
        reason = (reading.result() if reading.done() and not reading.cancelled()
                  and reading.exception() is None else "the client disconnected")
        relays.release(stream, reason)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.close()


async def _from_client(ws: web.WebSocketResponse, relays: Relays, stream: MasterStream) -> str:
    """Pass the client's frames on; returns why it stopped (a relay_close: "")."""
    async for msg in ws:
        if msg.type != WSMsgType.BINARY:
            break
        try:
            frame = decode_frame(msg.data)
            if frame.type not in STREAM_FRAMES:
                raise BadStreamFrame(f"{frame.type!r} is not a stream frame")
            await relays.from_client(stream, frame.type, frame.body)
        except (ProtocolError, BadStreamFrame) as exc:
            await ws.send_bytes(encode_frame("error", 0, error_body(
                "invalid_message", str(exc))))
            return f"the client sent a bad frame: {exc}"
        if frame.type == "relay_close":
            return ""
    return "the client disconnected"


async def _to_client(ws: web.WebSocketResponse, stream: MasterStream) -> None:
    """The node's frames to the client, in order, until the node's relay_close."""
    while True:
        type_, payload, raw = await stream.outbox.get()
        if type_ == "relay_data":
            # Out of the outbox now: the client may ack it before send_bytes returns, and
            # the node then sends more at once.
            stream.buffered -= len(payload)
        if raw is None:
            key = {"relay_data": "data", "relay_ack": "bytes"}.get(type_, "reason")
            raw = encode_frame(type_, 0, {"stream": stream.id, key: payload})
        try:
            await ws.send_bytes(raw)
        except (ConnectionError, RuntimeError):
            return
        if type_ == "relay_close":
            return
