"""Jobs' output, relayed from the nodes that ran them (``trellisctl logs``).

A job part's output stays on its node (noded/shim.py writes it, noded/joblogs.py serves it);
the master relays one bounded chunk per request over the node's WebSocket (``read_log``) and
keeps nothing: the client pulls, so a slow reader simply asks less often, and neither daemon
holds more than the chunk of the request it is serving (back-pressure end to end).

Which nodes: those of the job's placement, or, for a job that has none now (re-queued, or an
ended job read back from the journal), those of its latest ``placed`` event. A request names
one node's part or takes every part, each from its own offset (``tail`` lines from the end
where it has none); the reply gives each part's data and where to continue.

A follow (``wait_s``) is a long poll: when no part has anything new and the job may still
write, the master asks the nodes of the parts still written to wait (bounded) for their
output to grow, without data; the first that grew (or ended) ends the wait and every part is
read again, so no chunk is ever read and thrown away. A master shutting down ends the waits
at once (``close``): its drain does not wait out the followers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masterd.core.scheduler import JobError
from masterd.journal.store import Store
from masterd.runtime.commands import CommandFailed
from masterd.runtime.context import FeatureContext
from shared.messages import MAX_LOG_CHUNK, LogData, ReadLog
from shared.model import Job
from shared.schema import SchemaError, decode

log = logging.getLogger("trellis.master.logs")

MAX_WAIT_S = 30.0  # the longest one logs request waits for output (the RPC's bound)
_EVENT_PAGE = 1000


@dataclass(frozen=True)
class PartChunk:
    """One node's part of a reply: ``data`` starts at ``offset``; continue at ``next``."""

    node: str
    offset: int
    data: bytes
    size: int
    done: bool
    missing: str = ""  # why this part has no output (its node has none), if so

    @property
    def next(self) -> int:
        return self.offset + len(self.data)

    def view(self) -> dict[str, Any]:
        out = {"node": self.node, "offset": self.offset, "data": self.data,
               "next": self.next, "size": self.size, "done": self.done}
        if self.missing:
            out["missing"] = self.missing
        return out


class JobLogs:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        # Follows waiting for a job's next state change (its parts are all read but the job
        # has not ended: re-queued, or its end not yet recorded): job id -> their events.
        self._changed: dict[str, set[asyncio.Event]] = {}
        self._closing = asyncio.Event()
        ctx.events.job_transition.subscribe(self._on_transition)

    def close(self) -> None:
        """The master is shutting down: end every wait now (its request answers with what
        it has; the client's next call hears that the master is going)."""
        self._closing.set()
        for waiting in self._changed.values():
            for event in waiting:
                event.set()

    async def _on_transition(self, job: Job, _: Any) -> None:
        for event in self._changed.get(job.id, ()):
            event.set()

    # -- where a job's output is ------------------------------------------------------------
    async def nodes_of(self, job: Job) -> list[str]:
        """The nodes a job's parts ran on, rank 0 first; empty if it never started."""
        if job.placement is not None:
            return list(job.placement.nodes)
        placed: list[str] = []
        after = 0
        while True:
            rows = await self.ctx.journal.call(Store.events, job.id, after, _EVENT_PAGE)
            for row in rows:
                if row.kind == "placed" and isinstance(row.detail.get("placement"), list):
                    placed = [str(a.get("node")) for a in row.detail["placement"]
                              if isinstance(a, dict) and a.get("node")]
            if len(rows) < _EVENT_PAGE:
                return placed
            after = rows[-1].seq

    # -- reading ----------------------------------------------------------------------------
    async def read(self, job: Job, node: str | None = None,
                   offsets: Mapping[str, int] | None = None, tail: int | None = None,
                   max_bytes: int = MAX_LOG_CHUNK, wait_s: float = 0.0) -> dict[str, Any]:
        """One chunk of each part's output (see the module docstring); raises JobError."""
        nodes = await self.nodes_of(job)
        if not nodes:
            if job.state.terminal:
                raise JobError("not_started", f"job {job.id} ended ({job.state.value}) without "
                               "ever starting; it has no output")
            raise JobError("not_started", f"job {job.id} has not started; it has no output "
                           "yet")
        if node is not None and node not in nodes:
            raise JobError("invalid_params", f"job {job.id} did not run on node {node}; its "
                           f"output is on {', '.join(nodes)}")
        targets = [node] if node is not None else nodes
        offsets = dict(offsets or {})
        unknown = sorted(set(offsets) - set(nodes))
        if unknown:
            raise JobError("invalid_params", f"offsets names node(s) {', '.join(unknown)}, "
                           f"where job {job.id} did not run; its output is on "
                           f"{', '.join(nodes)}")
        wait_s = min(max(0.0, wait_s), MAX_WAIT_S)
        budget = max(1, max_bytes // len(targets)) if max_bytes > 0 else 0
        # A part may not have begun yet while the master has it starting or running there.
        may_start = (not job.state.terminal and job.placement is not None)

        async def read_all(wait: float) -> list[PartChunk]:
            return list(await asyncio.gather(*(
                self._read_part(job, n, offsets.get(n), tail, budget, wait, may_start,
                                several=len(targets) > 1)
                for n in targets)))

        parts = await read_all(0.0)
        if wait_s > 0 and not any(p.data for p in parts) and not self._closing.is_set():
            waiting = [p for p in parts if not p.done]
            if waiting:
                # Nothing new anywhere: wait for the first part to grow, then read them all.
                for p in parts:
                    offsets[p.node] = p.next
                if await self._first_growth(job, waiting, wait_s, may_start):
                    parts = await read_all(0.0)
            elif not job.state.terminal:
                # Every part read to its end, yet the job goes on (its end not recorded yet,
                # or re-queued): wait for its next state change rather than be asked again
                # at once.
                await self._next_change(job.id, wait_s)
        current = self.ctx.core.job(job.id) or job
        return {
            "job": job.id,
            "state": current.state.value,
            "nodes": nodes,
            "parts": [p.view() for p in parts],
            # Nothing more will come: every part is read to its end and the job has ended.
            "done": current.state.terminal and all(p.done for p in parts),
        }

    async def _read_part(self, job: Job, node: str, offset: int | None, tail: int | None,
                         max_bytes: int, wait_s: float, may_start: bool,
                         several: bool) -> PartChunk:
        cmd = ReadLog(job_id=job.id, offset=offset, tail=tail if offset is None else None,
                      max_bytes=max_bytes, wait_s=wait_s, pending=may_start)
        try:
            chunk = await self._send(job, node, cmd, several)
        except JobError as exc:
            if exc.code != "no_output" or not several:
                raise
            # One part of several left nothing on its node: the others are still worth
            # reading. The reason travels with the part.
            return PartChunk(node, offset or 0, b"", 0, True, missing=str(exc))
        return PartChunk(node, chunk.offset, chunk.data, chunk.size, chunk.done)

    async def _send(self, job: Job, node: str, cmd: ReadLog, several: bool) -> LogData:
        timeout = self.ctx.config().command_timeout_s + cmd.wait_s
        try:
            reply = await self.ctx.nodes.send(node, "read_log", cmd, timeout_s=timeout)
        except CommandFailed as exc:
            raise self._refusal(job, node, exc, several) from None
        try:
            return decode(LogData, reply, "read_log")
        except SchemaError as exc:
            log.warning("node=%s job=%s bad read_log answer: %s", node, job.id, exc)
            raise JobError("node_error", f"node {node} answered read_log for job {job.id} "
                           f"with a malformed chunk ({exc})") from None

    def _refusal(self, job: Job, node: str, exc: CommandFailed, several: bool) -> JobError:
        others = " (read the other parts with --node)" if several else ""
        if exc.code == "node_unreachable":
            status = self.ctx.nodes.status(node)
            return JobError("node_unreachable", f"job {job.id}'s output is on node {node}, "
                            f"which is not connected to the master ({status}); try again "
                            f"once it is back{others}")
        if exc.code == "timeout":
            return JobError("node_unreachable", f"node {node} did not answer a read of job "
                            f"{job.id}'s output in time ({exc.message}){others}")
        return JobError(exc.code, exc.message)

    async def _first_growth(self, job: Job, parts: list[PartChunk], wait_s: float,
                            may_start: bool) -> bool:
        """Until one of ``parts`` has output past its ``next`` or ends (True), or ``wait_s``
        passed or the master is closing (False)."""
        several = len(parts) > 1
        waits = [asyncio.ensure_future(self._send(job, p.node, ReadLog(
            job_id=job.id, offset=p.next, max_bytes=0, wait_s=wait_s, pending=may_start),
            several=several)) for p in parts]
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            done, _ = await asyncio.wait([*waits, closing],
                                         return_when=asyncio.FIRST_COMPLETED)
            grew = False
            for finished in done:
                if finished is closing:
                    continue
                try:
                    answer = finished.result()  # an unreachable node is the caller's error
                except JobError as exc:
                    if exc.code != "no_output":
                        raise
                    return True  # the read that follows reports it
                grew = grew or answer.size > answer.offset or answer.done
            return grew
        finally:
            closing.cancel()
            for waiter in waits:
                waiter.cancel()
            # The others' answers are not needed; their errors are not news either.
            for waiter in waits:
                with contextlib.suppress(asyncio.CancelledError, JobError):
                    await waiter

    async def _next_change(self, job_id: str, wait_s: float) -> None:
        changed = asyncio.Event()
        self._changed.setdefault(job_id, set()).add(changed)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait_s)
        finally:
            waiting = self._changed.get(job_id)
            if waiting is not None:
                waiting.discard(changed)
                if not waiting:
                    del self._changed[job_id]
