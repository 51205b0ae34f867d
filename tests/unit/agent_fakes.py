"""A node agent's WebSocket that records what the agent sends, for tests that feed the agent
frames (``NodeAgent._dispatch``) and read its answers."""

from __future__ import annotations

from typing import Any

import msgpack


class SentFrames:
    closed = False

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    async def send_bytes(self, data: bytes) -> None:
        self.frames.append(msgpack.unpackb(data))

    def replies(self) -> dict[int, dict[str, Any]]:
        """The acks and errors, by the id of the command they answer."""
        return {f["id"]: f for f in self.frames if f["type"] in ("ack", "error")}
