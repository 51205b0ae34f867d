"""The Python client of the master's RPC (synchronous; :mod:`control.aclient` is the
asyncio twin). msgpack bodies over HTTP; see docs/sdk.md."""

from __future__ import annotations

import itertools

from control.transport import BadUrl, HttpError, post, split_url
from control.typed import TypedCalls
from shared.protocol import ProtocolError, encode_rpc_request, unpack

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl
    from collections.abc import Iterator
    from typing import Any

    from control.logs import LogChunk
    from shared.auth import Secret

# Replies list whole job tables; requests stay bounded by the master's frame limit.
MAX_REPLY = 256 << 20
RPC_PATH = "/v1/rpc"


class RpcError(Exception):
    """The master answered with an error. ``detail``: the error's machine-readable part, if
    it has one (``submit_many``: which jobs were refused and why)."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail


class Unreachable(Exception):
    """The master could not be reached or did not answer in time."""


def auth_headers(token: Secret | None) -> dict[str, str]:
    """Request headers of every call (``shared.auth`` is imported only with a token)."""
    headers = {"Content-Type": "application/msgpack"}
    if token is not None:
        from shared.auth import bearer_header

        headers.update(bearer_header(token))
    return headers


def result_of(status: int, data: bytes, url: str) -> Any:
    """The ``result`` of a reply, or :class:`RpcError` for an error reply (both clients)."""
    if not data and status >= 400:
        raise RpcError("http_error", f"HTTP {status} from {url}")
    try:
        reply = unpack(data, max_size=MAX_REPLY)
    except ProtocolError as exc:
        raise RpcError("bad_reply", exc.message) from None
    if not isinstance(reply, dict):
        raise RpcError("bad_reply", "the master's reply is not a map")
    if "error" in reply:
        err = reply["error"] if isinstance(reply["error"], dict) else {}
        detail = err.get("detail")
        raise RpcError(str(err.get("code", "error")), str(err.get("message", "")),
                       detail if isinstance(detail, dict) else None)
    return reply.get("result")


class MasterClient(TypedCalls):
    """The synchronous client: ``call(method, params)`` for any RPC, and a typed method for
    each one trellisctl uses (control.typed)."""

    def __init__(self, url: str, timeout: float = 30.0, token: Secret | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.url = url.rstrip("/") + RPC_PATH
        self._target = split_url(url)  # BadUrl (a ValueError) names what is wrong
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._headers = auth_headers(token)
        self._ssl = ssl_context

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        body = encode_rpc_request(method, params or {}, next(self._ids))
        try:
            reply = post(self._target, RPC_PATH, body, self._headers, self.timeout, self._ssl,
                         MAX_REPLY)
        except (OSError, HttpError) as exc:
            raise Unreachable(f"cannot reach the master at {self.url}: {_reason(exc)}") from None
        return result_of(reply.status, reply.body, self.url)

    def logs(self, job_id: str, follow: bool = False, tail: int | None = None,
             node: str | None = None) -> Iterator[LogChunk]:
        """A job's output as :class:`control.logs.LogChunk` s (``node``, ``data`` bytes,
        ``offset``), from every node it ran on or only ``node``; ``tail``: from that many
        lines before the end; ``follow``: until the job ends. See docs/sdk.md."""
        return _logs(self.call, self.timeout, job_id, follow, tail, node)


def _logs(call: Any, timeout: float, job_id: str, follow: bool, tail: int | None,
          node: str | None) -> Iterator[LogChunk]:
    from control.logs import check_tail, follow_wait, iter_logs

    check_tail(tail)  # now, not at the first chunk
    return iter_logs(call, job_id, follow=follow, tail=tail, node=node,
                     wait_s=follow_wait(timeout))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


__all__ = ["BadUrl", "MasterClient", "RpcError", "Unreachable", "auth_headers", "result_of"]
