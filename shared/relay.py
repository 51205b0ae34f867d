"""Byte streams into a running job: its terminal (``trellisctl run --pty``) and its TCP ports
(``trellisctl port-forward``), relayed client ⇄ master ⇄ node (docs/interactive.md).

Two hops, one framing: the client's WebSocket to the master (``GET /v1/relay``) and the node's
existing WebSocket (``/v1/node``) carry the same kinds of frames, each a node-channel frame
(:func:`shared.protocol.encode_frame`) of id 0 whose body names its ``stream``:

* ``relay_data`` ``{stream, data}``: at most :data:`MAX_CHUNK` bytes of the stream;
* ``relay_ack`` ``{stream, bytes}``: the receiver has passed on that many bytes (written to
  the terminal, the socket, the user's screen): the sender may send that many more;
* ``relay_resize`` ``{stream, rows, cols}``: the client's window changed (terminals only);
* ``relay_close`` ``{stream, reason}``: the stream is over, with why.

Flow control is credit end to end: a sender has at most ``window`` bytes sent and not yet
acknowledged by the far end, and every hop forwards acks rather than making its own. So
each hop holds at most one window per stream and direction, whatever the reader's speed: a
reader that stalls stops the acks, which stops the writer (its pty or socket fills, and the
kernel blocks the job's process), and the master's memory does not grow.

A stream is opened by the ``relay_open`` command (:class:`shared.messages.RelayOpen`, a node
command beside the others, answered with an ack once the node has the terminal or the
connection) and by the client's first frame on ``/v1/relay``, ``relay_open`` too
(:class:`ClientOpen`); the master answers ``relay_opened`` ``{stream, node, window}`` or an
``error`` frame ``{code, message}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.schema import bounded

MAX_CHUNK = 256 * 1024  # bytes of one relay_data frame (well under the 1 MiB frame limit)
MAX_WINDOW = 64 << 20
STREAM_FRAMES = frozenset({"relay_data", "relay_ack", "relay_resize", "relay_close"})
KINDS = ("pty", "tcp")


@dataclass(frozen=True)
class ClientOpen:
    """Client to master, the first frame on ``/v1/relay``: which job and what of it."""

    job: str = bounded(max_len=256)
    kind: str = bounded(pattern=r"pty|tcp")
    port: int = bounded(0, min=0, max=65535)
    rows: int = bounded(0, min=0, max=10000)
    cols: int = bounded(0, min=0, max=10000)
    probe: bool = False


class BadStreamFrame(ValueError):
    """A stream frame that is not one (wrong fields or types, too much data)."""


def stream_frame(type_: str, body: dict[str, Any]) -> tuple[int, Any]:
    """The stream id and payload of a stream frame (data bytes, ack count, (rows, cols), or
    the close reason), checked by hand: this runs per chunk, schema decoding would cost more
    than the relay itself."""
    stream = body.get("stream")
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 1:
        raise BadStreamFrame(f"{type_}: 'stream' must be a positive integer")
    if type_ == "relay_data":
        data = body.get("data")
        if not isinstance(data, bytes) or len(data) > MAX_CHUNK:
            raise BadStreamFrame(f"relay_data: 'data' must be at most {MAX_CHUNK} bytes")
        return stream, data
    if type_ == "relay_ack":
        count = body.get("bytes")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_WINDOW:
            raise BadStreamFrame("relay_ack: 'bytes' must be a positive count of bytes")
        return stream, count
    if type_ == "relay_resize":
        rows, cols = body.get("rows"), body.get("cols")
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 10000
                   for v in (rows, cols)):
            raise BadStreamFrame("relay_resize: 'rows' and 'cols' must be 1 to 10000")
        return stream, (rows, cols)
    if type_ == "relay_close":
        reason = body.get("reason", "")
        return stream, str(reason)[:512] if isinstance(reason, str) else ""
    raise BadStreamFrame(f"{type_!r} is not a stream frame")
