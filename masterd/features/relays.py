"""Jobs' terminals and TCP ports, relayed between a client and the job's node (shared/relay.py,
docs/interactive.md): ``trellisctl run --pty`` and ``trellisctl port-forward``.

A client opens a stream on ``/v1/relay`` (masterd/api/relay.py); the master opens it on the
node of the job's rank 0 with ``relay_open`` over the node's own WebSocket (GPU servers keep
no inbound port) and from then on passes frames along: the client's data, acks and window
sizes to the node, the node's data, acks and close to the client. It keeps no bytes of its
own beyond the frames in flight: each direction of a stream has at most ``relay_window_kib``
unacknowledged, end to end, and a peer that sends more loses the stream. A slow client so
slows the job, not the master's memory.

Terminals end with their job: the job's session ending closes the stream. A job run on a
terminal whose client is gone (a dropped connection, a client that never attached) is
cancelled after ``terminal_grace_s`` unless a client attaches again in time; one client at
a time is attached to a terminal.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from masterd.core.scheduler import JobError
from masterd.runtime.commands import CommandFailed
from masterd.runtime.context import FeatureContext
from shared.messages import RelayOpen
from shared.model import Job, JobState
from shared.relay import BadStreamFrame, stream_frame

log = logging.getLogger("trellis.master.relays")


@dataclass
class MasterStream:
    id: int
    job_id: str
    node: str
    kind: str
    window: int
    # Frames for the client, in order: (type, payload, the node's frame as it came or
    # None). At most a window of data, as the node may have no more than that unacked.
    outbox: asyncio.Queue[tuple[str, Any, bytes | None]] = field(
        default_factory=asyncio.Queue)
    buffered: int = 0  # data bytes in the outbox
    to_node: int = 0  # bytes the client sent the node that the node has not acked
    closed: bool = False
    node_closed: bool = False


class Relays:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.streams: dict[int, MasterStream] = {}
        self._ids = itertools.count(1)
        self._attached: dict[str, int] = {}  # job id -> the stream of its attached terminal
        self._orphaned: dict[str, asyncio.TimerHandle] = {}  # terminals without a client
        ctx.events.job_transition.subscribe(self._on_transition)
        ctx.events.node_disconnected.subscribe(self._on_node_gone)
        ctx.events.restored.subscribe(self._on_restored)

    # -- opening ----------------------------------------------------------------------------
    async def open(self, job: Job, kind: str, port: int = 0, rows: int = 0, cols: int = 0,
                   probe: bool = False) -> MasterStream:
        """Open a stream into ``job`` (the caller checked the client may); raises JobError."""
        if job.state is not JobState.RUNNING or job.placement is None:
            raise JobError("not_running", f"job {job.id} is {job.state.value}, not running; "
                           "only a running job's terminal or ports can be reached")
        if kind == "pty" and not job.spec.launch.pty:
            raise JobError("no_terminal", f"job {job.id} was not started on a terminal "
                           "(trellisctl run --pty)")
        if kind == "tcp" and not 0 < port < 65536:
            raise JobError("invalid_params", f"port must be 1 to 65535, got {port}")
        if kind == "pty" and not probe and job.id in self._attached:
            raise JobError("busy", f"job {job.id}'s terminal is attached to another client")
        node = job.placement.nodes[0]
        window = self.ctx.config().relay_window_kib * 1024
        stream = MasterStream(next(self._ids), job.id, node, kind, window)
        self.streams[stream.id] = stream
        if kind == "pty" and not probe:
            self._attached[job.id] = stream.id
            self._cancel_orphan_timer(job.id)
        cmd = RelayOpen(stream=stream.id, job_id=job.id, restarts=job.restarts, kind=kind,
                        port=port, rows=rows, cols=cols, window=window, probe=probe)
        try:
            await self.ctx.nodes.send(node, "relay_open", cmd)
        except CommandFailed as exc:
            # A node that answered late may have opened it all the same: it is told.
            self.release(stream, "the master gave up waiting for the node",
                         tell_node=exc.code == "timeout")
            if exc.code == "node_unreachable":
                raise JobError("node_unreachable", f"job {job.id}'s node {node} is not "
                               f"connected to the master ({exc.message})") from None
            if exc.code == "timeout":
                raise JobError("node_unreachable", f"node {node} did not answer in time "
                               f"({exc.message})") from None
            raise JobError(exc.code, exc.message) from None
        if probe:
            self.release(stream, "", tell_node=False)
        else:
            log.info("job=%s stream=%d %s opened on node=%s%s", job.id, stream.id, kind, node,
                     f" port={port}" if kind == "tcp" else "")
        return stream

    def release(self, stream: MasterStream, reason: str, tell_node: bool = True) -> None:
        """The client's side of the stream ended (it closed, or its connection dropped)."""
        if stream.closed:
            return
        stream.closed = True
        self.streams.pop(stream.id, None)
        if tell_node and not stream.node_closed:
            self.ctx.tasks.spawn(self._push(stream.node, "relay_close",
                                            {"stream": stream.id, "reason": reason[:512]}))
        if stream.kind == "pty" and self._attached.get(stream.job_id) == stream.id:
            del self._attached[stream.job_id]
            job = self.ctx.core.job(stream.job_id)
            if job is not None and not job.state.terminal:
                self._arm_orphan_timer(stream.job_id)

    # -- the client's frames ------------------------------------------------------------------
    async def from_client(self, stream: MasterStream, type_: str, body: dict[str, Any]
                          ) -> None:
        """Pass one of the client's frames on to the node; raises BadStreamFrame."""
        body = dict(body, stream=stream.id)  # the client's own stream number is not trusted
        _, payload = stream_frame(type_, body)
        if type_ == "relay_data":
            stream.to_node += len(payload)
            if stream.to_node > stream.window:
                raise BadStreamFrame(f"the client sent more than the window of "
                                     f"{stream.window} bytes before an ack")
        elif type_ == "relay_resize" and stream.kind != "pty":
            raise BadStreamFrame("relay_resize: only a terminal has a window size")
        elif type_ == "relay_close":
            self.release(stream, payload or "closed by the client")
            return
        await self._push(stream.node, type_, body)

    # -- the node's frames ----------------------------------------------------------------------
    def from_node(self, node: str, type_: str, body: dict[str, Any],
                  raw: bytes | None = None) -> None:
        """A stream frame from ``node``'s WebSocket, read straight off it: never waits.
        ``raw``: the frame as it came, passed on to the client as it is (the stream has the
        same number on both hops), which spares encoding every chunk again."""
        try:
            sid, payload = stream_frame(type_, body)
        except BadStreamFrame as exc:
            log.warning("node=%s bad stream frame: %s", node, exc)
            return
        stream = self.streams.get(sid)
        if stream is None or stream.node != node or stream.node_closed:
            return  # closed here already; the node hears of it
        if type_ == "relay_data":
            stream.buffered += len(payload)
            if stream.buffered > stream.window:
                log.warning("node=%s stream=%d sent past its window; closed", node, sid)
                self._end_from_node(stream, "the node sent more than the window allows")
                self.ctx.tasks.spawn(self._push(node, "relay_close", {
                    "stream": sid, "reason": "more data than the window allows"}))
                return
            stream.outbox.put_nowait((type_, payload, raw))
        elif type_ == "relay_ack":
            stream.to_node = max(0, stream.to_node - payload)
            stream.outbox.put_nowait((type_, payload, raw))
        elif type_ == "relay_close":
            self._end_from_node(stream, payload or "closed on the node")

    def _end_from_node(self, stream: MasterStream, reason: str) -> None:
        stream.node_closed = True
        stream.outbox.put_nowait(("relay_close", reason, None))

    async def _push(self, node: str, type_: str, body: dict[str, Any]) -> None:
        await self.ctx.nodes.push(node, type_, body)

    # -- terminals without a client -------------------------------------------------------------
    def _arm_orphan_timer(self, job_id: str) -> None:
        self._cancel_orphan_timer(job_id)
        grace = self.ctx.config().terminal_grace_s
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a restore outside the daemon (tools, tests): nothing to time
            return
        self._orphaned[job_id] = loop.call_later(
            grace, lambda: self.ctx.tasks.spawn(self._orphan_expired(job_id, grace)))

    def _cancel_orphan_timer(self, job_id: str) -> None:
        timer = self._orphaned.pop(job_id, None)
        if timer is not None:
            timer.cancel()

    async def _orphan_expired(self, job_id: str, grace: float) -> None:
        self._orphaned.pop(job_id, None)
        job = self.ctx.core.job(job_id)
        if job is None or job.state.terminal or job_id in self._attached:
            return
        log.info("job=%s terminal without a client for %g s: cancelled", job_id, grace)
        assert self.ctx.jobs.stop is not None
        try:
            await self.ctx.jobs.stop(job_id, JobState.CANCELLED,
                                     f"its terminal had no client for {grace:g} s "
                                     "(terminal_grace_s): the connection dropped")
        except JobError as exc:
            log.info("job=%s not cancelled: %s", job_id, exc)

    async def _on_transition(self, job: Job, transition: Any) -> None:
        if not job.spec.launch.pty:
            return
        if job.state.terminal:
            self._cancel_orphan_timer(job.id)
        elif job.state is JobState.RUNNING and job.id not in self._attached:
            self._arm_orphan_timer(job.id)

    def _on_restored(self) -> None:
        # A master that restarted has no client attached to any terminal: each gets the
        # grace to come back. A job still starting has no terminal to attach to yet; its
        # grace begins when it runs (_on_transition), however long its start takes.
        for job in self.ctx.core.active_jobs().values():
            if job.spec.launch.pty and job.state is JobState.RUNNING:
                self._arm_orphan_timer(job.id)

    def _on_node_gone(self, node: str, _: float) -> None:
        for stream in list(self.streams.values()):
            if stream.node == node and not stream.node_closed:
                self._end_from_node(stream, f"the job's node {node} disconnected")

    def close(self) -> None:
        """The master is shutting down: every stream ends now."""
        for stream in list(self.streams.values()):
            if not stream.node_closed:
                self._end_from_node(stream, "the master is shutting down")
        for timer in self._orphaned.values():
            timer.cancel()
        self._orphaned.clear()
