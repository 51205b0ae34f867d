"""A small synchronous RPC client for the master (stdlib HTTP, msgpack bodies)."""

from __future__ import annotations

import itertools
import ssl
import urllib.error
import urllib.request
from typing import Any

from shared.auth import Secret, bearer_header
from shared.protocol import ProtocolError, encode_rpc_request, unpack

# Replies list whole job tables; requests stay bounded by the master's frame limit.
MAX_REPLY = 256 << 20


class RpcError(Exception):
    """The master answered with an error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Unreachable(Exception):
    """The master could not be reached or did not answer in time."""


class MasterClient:
    def __init__(self, url: str, timeout: float = 30.0, token: Secret | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.url = url.rstrip("/") + "/v1/rpc"
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._headers = {"Content-Type": "application/msgpack", **bearer_header(token)}
        self._ssl = ssl_context

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        body = encode_rpc_request(method, params or {}, next(self._ids))
        request = urllib.request.Request(
            self.url, data=body, method="POST",
            headers=self._headers,
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout,
                                        context=self._ssl) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            data = exc.read()
            if not data:
                raise RpcError("http_error", f"HTTP {exc.code} from {self.url}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"cannot reach the master at {self.url}: {reason}") from None
        try:
            reply = unpack(data, max_size=MAX_REPLY)
        except ProtocolError as exc:
            raise RpcError("bad_reply", exc.message) from None
        if not isinstance(reply, dict):
            raise RpcError("bad_reply", "the master's reply is not a map")
        if "error" in reply:
            err = reply["error"] or {}
            raise RpcError(str(err.get("code", "error")), str(err.get("message", "")))
        return reply.get("result")
