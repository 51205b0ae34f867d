"""The client's end of a relayed stream into a running job (shared/relay.py): a WebSocket to
the master's ``/v1/relay``, one stream on it, credit flow control.

:func:`open_stream` opens one (a job's terminal, or one TCP connection to a port of the job)
and returns a :class:`RelayStream`: ``send`` waits while a window of bytes is unacknowledged,
``recv`` returns the job's next bytes (b"" once the stream is over) and acknowledges each
chunk the caller asked for the next, so a caller that stops reading stops the job's side.
SDK programs (docs/sdk.md), ``trellisctl run --pty``, ``attach`` and ``port-forward`` use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

import aiohttp

from control.client import Unreachable
from shared.protocol import MAX_FRAME, ProtocolError, decode_frame, encode_frame
from shared.relay import MAX_CHUNK

RELAY_PATH = "/v1/relay"


class RelayRefused(Exception):
    """The master refused the stream: ``code`` and a sentence."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def endpoint(client: Any) -> tuple[str, dict[str, str], ssl.SSLContext | None]:
    """The relay URL, headers and TLS context of a MasterClient, FailoverClient or
    AsyncMasterClient (the master it talks to now)."""
    inner = client
    if hasattr(client, "_clients"):  # FailoverClient: the master it calls now
        inner = client._clients[client._current]
    rpc_url: str = inner.url
    base = rpc_url[: -len("/v1/rpc")] if rpc_url.endswith("/v1/rpc") else rpc_url
    return base + RELAY_PATH, dict(inner._headers), inner._ssl


class RelayStream:
    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse,
                 stream: int, node: str, window: int) -> None:
        self._http = http
        self.ws = ws
        self.stream = stream
        self.node = node
        self.window = window
        self.reason = ""  # why the stream ended, once it has
        self._unacked = 0
        self._credit = asyncio.Event()
        self._owed = 0  # bytes handed to the caller and not acknowledged yet
        self._closed = False
        self._received: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read_frames())

    # -- to the job -------------------------------------------------------------------------
    async def send(self, data: bytes) -> None:
        """Send bytes to the job, waiting while a window of them is unacknowledged."""
        view = memoryview(data)
        while view:
            while self._unacked >= self.window and not self._closed:
                self._credit.clear()
                await self._credit.wait()
            if self._closed:
                raise ConnectionError(f"the stream is closed ({self.reason})")
            step = min(MAX_CHUNK, self.window - self._unacked, len(view))
            self._unacked += step
            await self._frame("relay_data", {"data": bytes(view[:step])})
            view = view[step:]

    async def resize(self, rows: int, cols: int) -> None:
        await self._frame("relay_resize", {"rows": rows, "cols": cols})

    async def _frame(self, type_: str, body: dict[str, Any]) -> None:
        body["stream"] = self.stream
        await self.ws.send_bytes(encode_frame(type_, 0, body))

    # -- from the job ---------------------------------------------------------------------
    async def recv(self) -> bytes:
        """The job's next bytes; b"" once the stream is over (``reason`` says why). Asking
        for more acknowledges what the previous call returned."""
        # Acks go in batches (a quarter of the window, or whatever is owed once nothing more
        # waits here): fewer frames through the master, and the sender never starves.
        if self._owed and (self._owed >= self.window // 4 or self._received.empty()):
            owed, self._owed = self._owed, 0
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._frame("relay_ack", {"bytes": owed})
        data = await self._received.get()
        if data is None:
            self._received.put_nowait(None)  # over: every later call says so too
            return b""
        self._owed += len(data)
        return data

    async def _read_frames(self) -> None:
        """Read the master's frames as they come, whatever the caller does: pings are
        answered and acks counted while the caller is busy. What waits for the caller is at
        most a window of data (the node sends no more before the caller's acks)."""
        try:
            while not self._closed:
                msg = await self.ws.receive()
                if msg.type != aiohttp.WSMsgType.BINARY:
                    self._end(self.reason or "the master closed the connection")
                    break
                try:
                    frame = decode_frame(msg.data)
                except ProtocolError as exc:
                    self._end(f"bad frame from the master: {exc.message}")
                    break
                body = frame.body
                if frame.type == "relay_data" and isinstance(body.get("data"), bytes):
                    self._received.put_nowait(body["data"])
                elif frame.type == "relay_ack" and isinstance(body.get("bytes"), int):
                    self._unacked = max(0, self._unacked - body["bytes"])
                    self._credit.set()
                elif frame.type == "relay_close":
                    self._end(str(body.get("reason") or "closed"))
                elif frame.type == "error":
                    self._end(f"{body.get('code')}: {body.get('message')}")
        finally:
            self._received.put_nowait(None)

    def _end(self, reason: str) -> None:
        if not self._closed:
            self._closed = True
            self.reason = reason
            self._credit.set()

    async def close(self, reason: str = "") -> None:
        if not self.ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                if not self._closed:
                    await self._frame("relay_close", {"reason": reason})
                await self.ws.close()
        self._end(reason or "closed")
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._http.close()

    async def __aenter__(self) -> RelayStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_stream(client: Any, job: str, kind: str, port: int = 0, rows: int = 0,
                      cols: int = 0, probe: bool = False, timeout: float = 30.0
                      ) -> RelayStream:
    """Open a stream into ``job``: its terminal (``kind="pty"``) or a TCP connection to
    ``port`` on its node (``kind="tcp"``). Raises RelayRefused (the master's code and
    sentence) or control.client.Unreachable when the master cannot be reached. With
    ``probe`` the master only checks it could be opened; the stream comes back closed."""
    url, headers, ssl_context = endpoint(client)
    http = aiohttp.ClientSession()
    try:
        ws = await asyncio.wait_for(http.ws_connect(
            url, headers=headers, ssl=ssl_context if ssl_context is not None else True,
            max_msg_size=MAX_FRAME, heartbeat=10.0), timeout)
        await ws.send_bytes(encode_frame("relay_open", 0, {
            "job": job, "kind": kind, "port": port, "rows": rows, "cols": cols,
            "probe": probe}))
        msg = await ws.receive(timeout=timeout)
        if msg.type != aiohttp.WSMsgType.BINARY:
            raise RelayRefused("unavailable", "the master closed the connection without an "
                               "answer")
        frame = decode_frame(msg.data)
        if frame.type == "error":
            raise RelayRefused(str(frame.body.get("code")), str(frame.body.get("message")))
        if frame.type != "relay_opened":
            raise RelayRefused("bad_reply", f"the master answered {frame.type!r}")
        body = frame.body
        stream = RelayStream(http, ws, int(body["stream"]), str(body.get("node", "")),
                             int(body["window"]))
    except aiohttp.WSServerHandshakeError as exc:
        await http.close()
        if exc.status == 401:
            raise RelayRefused("unauthenticated", "the master refused the credentials"
                               ) from None
        raise RelayRefused("unavailable", f"the master refused the relay connection (HTTP "
                           f"{exc.status})") from None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        await http.close()
        reason = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
        raise Unreachable(f"cannot reach the master at {url}: {reason}") from None
    except BaseException:
        await http.close()
        raise
    if probe:
        await stream.close()
    return stream
