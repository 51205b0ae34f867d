"""The ``logs`` RPC: a job's output, relayed chunk by chunk from its nodes (masterd.features.logs).
``trellisctl logs`` and the SDK's ``logs()`` iterators call it in a loop, passing each part's
``next`` back as its offset."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from masterd.api.visibility import check_owner
from masterd.core.scheduler import JobError
from masterd.features.logs import MAX_WAIT_S
from masterd.service.master import Master
from shared.messages import MAX_LOG_CHUNK
from shared.model import NAME_PATTERN
from shared.rpcdoc import returns
from shared.schema import bounded

_NODE = re.compile(NAME_PATTERN)
MAX_OFFSET = 1 << 62


@dataclass(frozen=True)
class LogsParams:
    id: str = bounded(max_len=256)
    # Only this node's part of the job (default: every part).
    node: str | None = bounded(None, pattern=NAME_PATTERN)
    # Where to go on in each part, node -> offset (a previous reply's `next`); a part not
    # named starts `tail` lines from its end, or at its beginning.
    offsets: dict[str, int] | None = None
    # Start this many lines from the end of each part not in `offsets` (0: at its end).
    tail: int | None = bounded(None, min=0, max=1 << 31)
    # The most bytes of output in the reply, shared among the parts.
    max_bytes: int = bounded(MAX_LOG_CHUNK, min=1, max=MAX_LOG_CHUNK)
    # When no part has anything new and the job may still write, wait up to this long for
    # output (a long poll: `trellisctl logs -f`); 0 answers at once.
    wait_s: float = bounded(0.0, min=0, max=MAX_WAIT_S)

    def __post_init__(self) -> None:
        if self.offsets is None:
            return
        if len(self.offsets) > 1024:
            raise ValueError(f"offsets: names {len(self.offsets)} nodes, at most 1024 allowed")
        for node, offset in self.offsets.items():
            if not _NODE.fullmatch(node):
                raise ValueError(f"offsets: {node[:80]!r} is not a node name")
            # The node channel's limit (shared.messages.ReadLog.offset): no log is longer.
            if isinstance(offset, bool) or not 0 <= offset <= MAX_OFFSET:
                raise ValueError(f"offsets.{node}: must be an offset from 0 to {MAX_OFFSET}, "
                                 f"got {offset!r}")


def method_table(master: Master) -> dict[str, tuple[type, Callable[[Any], Awaitable[Any]]]]:
    @returns("`job`, its `state`, `nodes` (every node its parts ran on, rank 0 first), "
             "`parts`: per part read, `{node, offset, data, next, size, done}` (`data`: bytes "
             "of output from `offset`; pass `next` back in `offsets`; `size`: the log's size "
             "when read; `done`: the part has ended and is read to its end; `missing`: why a "
             "part has no output, when its node has none), and `done`: every part is read "
             "to its end and the job has ended.",
             ("unknown_job", "forbidden", "not_started", "no_output", "node_unreachable",
              "busy"))
    async def logs(p: LogsParams) -> dict[str, Any]:
        """A job's output (its stdout and stderr, as its nodes keep them), one bounded chunk
        per part and call, while it runs and after it ended. Nodes cap each part's log
        (`log_max_mb`) and remove finished jobs' logs after `log_retention_h`."""
        job = await master.find_job(p.id)
        if job is None:
            raise JobError("unknown_job", f"job {p.id!r} does not exist")
        check_owner(job, "read the output of")
        return await master.features.logs.read(job, p.node, p.offsets, p.tail, p.max_bytes,
                                               p.wait_s)

    return {"logs": (LogsParams, logs)}
