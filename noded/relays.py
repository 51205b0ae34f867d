"""The node's end of relayed streams (shared/relay.py): a job's terminal, a job's TCP port.

The master opens a stream with ``relay_open``; from then on ``relay_data``, ``relay_ack``,
``relay_resize`` and ``relay_close`` frames travel on the node's WebSocket, the one it dialled
(a GPU server keeps no inbound port). Each stream has two pumps:

* out: read the terminal (the master side of the job's pseudo-terminal, noded/terminals.py)
  or the socket, at most ``window`` bytes ahead of the acks the client sends back; with no
  credit left nothing is read, so the job's writes block in the kernel, not in memory here;
* in: write what the client sent to the terminal or socket, and ack each chunk once written,
  so the client never has more than a window in flight towards a job that does not read.

A TCP stream connects to 127.0.0.1 (or wherever the job listens) on the node: jobs share
the node's network namespace. It is refused unless a process of the job listens on that
port, so a job's owner reaches the job's port, not every service of the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import psutil

from noded.jobs import JobRefused, JobRunner, _job_processes
from noded.terminals import set_size
from shared.messages import RelayOpen
from shared.relay import MAX_CHUNK, BadStreamFrame, stream_frame

log = logging.getLogger("trellis.node.relays")

Send = Callable[[str, dict[str, Any]], Awaitable[None]]
CONNECT_TIMEOUT_S = 5.0
_CLOSING: set[asyncio.Task[None]] = set()


class NodeStream:
    def __init__(self, sid: int, job_id: str, kind: str, window: int, end: Endpoint,
                 send: Send, ended: Callable[[NodeStream], None],
                 terminal: int | None = None) -> None:
        self.id = sid
        self.job_id = job_id
        self.kind = kind
        self.window = window
        self.end = end
        self.send = send
        self.ended = ended
        self.terminal = terminal  # the pty's master fd, for resizes
        self.unacked = 0  # bytes sent and not yet acknowledged by the client
        self.inbound = 0  # bytes received and not yet written
        self._credit = asyncio.Event()
        self._incoming: asyncio.Queue[bytes] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self.closed = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._pump_out()), loop.create_task(self._pump_in())]

    # -- from the client ------------------------------------------------------------------
    def data(self, data: bytes) -> None:
        if self.inbound + len(data) > self.window:
            # The master forwards the client's credit: more than a window is a broken peer.
            self.close("more data arrived than the window allows", tell=True)
            return
        self.inbound += len(data)
        self._incoming.put_nowait(data)

    def ack(self, count: int) -> None:
        self.unacked = max(0, self.unacked - count)
        self._credit.set()

    def resize(self, rows: int, cols: int) -> None:
        if self.terminal is not None:
            with contextlib.suppress(OSError):
                set_size(self.terminal, rows, cols)

    # -- pumps ------------------------------------------------------------------------------
    async def _pump_out(self) -> None:
        reason = "closed"
        try:
            while True:
                while self.unacked >= self.window:
                    self._credit.clear()
                    await self._credit.wait()
                try:
                    data = await self.end.read(min(MAX_CHUNK, self.window - self.unacked))
                except (OSError, ValueError) as exc:
                    reason = f"read failed: {getattr(exc, 'strerror', None) or exc}"
                    data = b""
                if not data and reason == "closed":
                    reason = ("the job's terminal closed (its session ended)"
                              if self.kind == "pty" else "the job closed the connection")
                if not data:
                    break
                self.unacked += len(data)
                await self.send("relay_data", {"stream": self.id, "data": data})
        except asyncio.CancelledError:
            return
        self.close(reason, tell=True)

    async def _pump_in(self) -> None:
        try:
            while True:
                data = await self._incoming.get()
                await self.end.write(data)
                self.inbound -= len(data)
                await self.send("relay_ack", {"stream": self.id, "bytes": len(data)})
        except asyncio.CancelledError:
            return
        except OSError as exc:
            self.close(f"write failed: {exc.strerror or exc}", tell=True)

    def close(self, reason: str, tell: bool) -> None:
        """End the stream (``tell``: say so to the master, which tells the client)."""
        if self.closed:
            return
        self.closed = True
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        with contextlib.suppress(OSError, RuntimeError):
            self.end.close()
        self.ended(self)
        if tell:
            task = asyncio.get_running_loop().create_task(
                self.send("relay_close", {"stream": self.id, "reason": reason[:512]}))
            _CLOSING.add(task)  # kept until sent: the loop holds tasks only weakly
            task.add_done_callback(_CLOSING.discard)
        log.info("job=%s stream=%d %s closed: %s", self.job_id, self.id, self.kind, reason)


class NodeRelays:
    """Every open stream of this node, by the id the master gave it."""

    def __init__(self, runner: JobRunner, send: Send) -> None:
        self.runner = runner
        self.send = send
        self.streams: dict[int, NodeStream] = {}

    async def open(self, cmd: RelayOpen) -> dict[str, Any]:
        node = self.runner.node
        part = self.runner.parts.get(cmd.job_id)
        if part is None or part.state != "running" or part.restarts != cmd.restarts:
            raise JobRefused("not_running", f"job {cmd.job_id} is not running on node {node}")
        if cmd.stream in self.streams:
            raise JobRefused("invalid_message", f"stream {cmd.stream} is open already")
        terminal: int | None = None
        if cmd.kind == "pty":
            master = self._terminal_of(cmd)
            if cmd.probe:
                return {}
            if cmd.rows and cmd.cols:
                set_size(master, cmd.rows, cmd.cols)
            end: Endpoint = TerminalEnd(master)
            terminal = master
        else:
            host = self._listener(part, cmd.port)
            if cmd.probe:
                return {}
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, cmd.port, limit=MAX_CHUNK),
                    CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                raise JobRefused("connect_failed", f"cannot connect to port {cmd.port} of job "
                                 f"{cmd.job_id} on node {node}: "
                                 f"{getattr(exc, 'strerror', None) or exc or 'timed out'}"
                                 ) from None
            end = SocketEnd(reader, writer)
        stream = NodeStream(cmd.stream, cmd.job_id, cmd.kind, cmd.window, end, self.send,
                            self._ended, terminal)
        self.streams[cmd.stream] = stream
        stream.start()
        log.info("job=%s stream=%d %s opened%s", cmd.job_id, cmd.stream, cmd.kind,
                 f" port={cmd.port}" if cmd.kind == "tcp" else "")
        return {}

    def _terminal_of(self, cmd: RelayOpen) -> int:
        node = self.runner.node
        master = self.runner.terminals.master(cmd.job_id)
        if master is None:
            raise JobRefused("no_terminal", f"job {cmd.job_id} has no terminal on node {node}: "
                             "it was not started with --pty, or noded restarted since")
        if any(s.job_id == cmd.job_id and s.kind == "pty" for s in self.streams.values()):
            raise JobRefused("busy", f"job {cmd.job_id}'s terminal is attached already")
        return master

    def _listener(self, part: Any, port: int) -> str:
        """Where to connect for the job's listening ``port``; refused unless one of the job's
        processes listens there."""
        pids = set(_job_processes(part))
        for pid in pids:
            try:
                conns = psutil.Process(pid).net_connections(kind="inet")
            except psutil.Error:
                continue
            for conn in conns:
                if conn.status != psutil.CONN_LISTEN or conn.laddr.port != port:
                    continue
                ip = ipaddress.ip_address(conn.laddr.ip)
                if ip.is_unspecified:
                    return "127.0.0.1" if ip.version == 4 else "::1"
                return str(ip)
        raise JobRefused("not_listening", f"no process of job {part.job_id} listens on TCP "
                         f"port {port} on node {self.runner.node}")

    def frame(self, type_: str, body: dict[str, Any]) -> None:
        """A stream frame from the master (a stream closed here already ignores it)."""
        try:
            sid, payload = stream_frame(type_, body)
        except BadStreamFrame as exc:
            log.warning("bad stream frame from the master: %s", exc)
            return
        stream = self.streams.get(sid)
        if stream is None:
            return
        if type_ == "relay_data":
            stream.data(payload)
        elif type_ == "relay_ack":
            stream.ack(payload)
        elif type_ == "relay_resize":
            stream.resize(*payload)
        else:
            stream.close(payload or "closed by the client", tell=False)

    def _ended(self, stream: NodeStream) -> None:
        self.streams.pop(stream.id, None)

    def close_all(self, reason: str) -> None:
        """The session to the master ended: its ends of every stream are gone."""
        for stream in list(self.streams.values()):
            stream.close(reason, tell=False)


class Endpoint(Protocol):
    """What a stream relays to and from: the job's terminal or a socket of the job."""

    async def read(self, n: int) -> bytes: ...  # b"": over

    async def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class TerminalEnd:
    """The master side of a job's pseudo-terminal, through a copy of noded's descriptor that
    this end closes (noded's stays open for the next attach). Plain non-blocking reads and
    writes on the event loop's readiness callbacks: loops differ in what their pipe
    transports accept (uvloop's take no terminal)."""

    def __init__(self, master: int) -> None:
        self.fd = os.dup(master)
        os.set_blocking(self.fd, False)
        self.loop = asyncio.get_running_loop()

    async def read(self, n: int) -> bytes:
        while True:
            try:
                return os.read(self.fd, n)
            except BlockingIOError:
                await self._ready(self.loop.add_reader, self.loop.remove_reader)
            except OSError as exc:
                if exc.errno == errno.EIO:  # every user of the terminal closed it
                    return b""
                raise

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except BlockingIOError:
                await self._ready(self.loop.add_writer, self.loop.remove_writer)

    async def _ready(self, add: Callable[..., None], remove: Callable[[int], Any]) -> None:
        fd = self.fd
        if fd < 0:
            raise ConnectionError("the terminal's relay is closed")
        ready = self.loop.create_future()
        add(fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            if self.fd == fd:  # close() removed the callbacks with the descriptor
                remove(fd)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            self.loop.remove_reader(fd)
            self.loop.remove_writer(fd)
            os.close(fd)


class SocketEnd:
    """A TCP connection to the job's port."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def read(self, n: int) -> bytes:
        return await self.reader.read(n)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()
