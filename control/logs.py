"""A job's output from the master's ``logs`` RPC, as an iterator of chunks (the SDK's
``MasterClient.logs`` and ``AsyncMasterClient.logs``) and as ``trellisctl logs`` writes it.

Each call returns at most one chunk per part of the job (one part per node it ran on); the
iterator passes each part's ``next`` back as its offset, so the master and the nodes keep
nothing between calls and a slow consumer simply calls less often. Without ``follow`` it
stops at the size each part had at the first reply; with it, a call waits (a long poll) when
nothing is new, and the iterator ends once the job has ended and every part is read to its
end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

# How long one follow call may wait on the master for output (at most half the client's
# timeout, so the answer always comes back in time).
FOLLOW_WAIT_S = 10.0
PREFIX_LINE_MAX = 64 * 1024  # a line this long without its newline is written as it is


@dataclass(frozen=True)
class LogChunk:
    """``data``: bytes of the job's output on ``node``, starting at byte ``offset`` of its
    log there."""

    node: str
    data: bytes
    offset: int


def check_tail(tail: int | None) -> None:
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
        raise ValueError(f"tail must be a number of lines, 0 or more, got {tail!r}")


class _Cursor:
    """Where each part is; what the next call asks for; when the iteration is over."""

    def __init__(self, job_id: str, follow: bool, tail: int | None, node: str | None,
                 wait_s: float) -> None:
        check_tail(tail)
        self.job_id = job_id
        self.follow = follow
        self.tail = tail
        self.node = node
        self.wait_s = wait_s
        self.offsets: dict[str, int] = {}
        self.until: dict[str, int] | None = None  # without follow: each part's size at first
        self.over = False

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"id": self.job_id}
        if self.node is not None:
            params["node"] = self.node
        if self.offsets:
            params["offsets"] = dict(self.offsets)
        if self.tail is not None:
            params["tail"] = self.tail
        if self.follow:
            params["wait_s"] = self.wait_s
        return params

    def take(self, reply: dict[str, Any]) -> list[LogChunk]:
        chunks = []
        parts = reply.get("parts") or []
        if self.until is None:
            self.until = {p["node"]: int(p["size"]) for p in parts}
        for part in parts:
            node = part["node"]
            data = part.get("data") or b""
            if data:
                chunks.append(LogChunk(node, bytes(data), int(part["offset"])))
            self.offsets[node] = int(part["next"])
        if self.follow:
            self.over = bool(reply.get("done"))
        else:
            # The output as it was at the first reply: every part read up to that size (or
            # ended shorter; a log never shrinks but a new attempt may begin it again).
            self.over = all(p.get("done") or self.offsets.get(p["node"], 0)
                            >= self.until.get(p["node"], 0) or not p.get("data")
                            for p in parts)
        return chunks


def follow_wait(timeout: float) -> float:
    return max(0.1, min(FOLLOW_WAIT_S, timeout / 2))


def iter_logs(call: Callable[[str, dict[str, Any]], Any], job_id: str, follow: bool = False,
              tail: int | None = None, node: str | None = None,
              wait_s: float = FOLLOW_WAIT_S) -> Iterator[LogChunk]:
    """The chunks of a job's output through ``call`` (a client's ``call``)."""
    cursor = _Cursor(job_id, follow, tail, node, wait_s)
    while not cursor.over:
        yield from cursor.take(call("logs", cursor.params()))


async def aiter_logs(call: Callable[[str, dict[str, Any]], Awaitable[Any]], job_id: str,
                     follow: bool = False, tail: int | None = None, node: str | None = None,
                     wait_s: float = FOLLOW_WAIT_S) -> AsyncIterator[LogChunk]:
    """:func:`iter_logs` for the asyncio client."""
    cursor = _Cursor(job_id, follow, tail, node, wait_s)
    while not cursor.over:
        for chunk in cursor.take(await call("logs", cursor.params())):
            yield chunk


class PrefixWriter:
    """Writes chunks of several nodes' output to ``out`` as whole lines, each prefixed with
    its node (``[node] ``): a part's unfinished line waits for the rest of it (up to
    PREFIX_LINE_MAX bytes), so lines of different nodes never run into each other."""

    def __init__(self, out: BinaryIO, prefix: bool) -> None:
        self.out = out
        self.prefix = prefix
        self.partial: dict[str, bytes] = {}

    def write(self, chunk: LogChunk) -> None:
        if not self.prefix:
            self.out.write(chunk.data)
            self.out.flush()
            return
        data = self.partial.pop(chunk.node, b"") + chunk.data
        head = f"[{chunk.node}] ".encode()
        whole, sep, rest = data.rpartition(b"\n")
        if sep:
            self.out.write(b"".join(head + line + b"\n" for line in whole.split(b"\n")))
        if len(rest) >= PREFIX_LINE_MAX:
            self.out.write(head + rest + b"\n")
        elif rest:
            self.partial[chunk.node] = rest
        self.out.flush()

    def close(self) -> None:
        """Write what is left of each node's last line."""
        for node, rest in sorted(self.partial.items()):
            self.out.write(f"[{node}] ".encode() + rest + b"\n")
        self.partial.clear()
        self.out.flush()


def run_cli(client: Any, job_id: str, follow: bool, tail: int | None, node: str | None,
            out: BinaryIO) -> int:
    """``trellisctl logs``: the job's output as bytes on ``out`` as it arrives, each line
    prefixed by its node when the job ran on several and no ``--node`` picks one."""
    cursor = _Cursor(job_id, follow, tail, node, follow_wait(getattr(client, "timeout", 30.0)))
    writer: PrefixWriter | None = None
    try:
        while not cursor.over:
            reply = client.call("logs", cursor.params())
            if writer is None:
                several = node is None and len(reply.get("nodes") or ()) > 1
                writer = PrefixWriter(out, prefix=several)
            for chunk in cursor.take(reply):
                writer.write(chunk)
    finally:
        if writer is not None:
            writer.close()
    return 0
