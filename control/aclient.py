"""The asyncio client of the master's RPC: :class:`MasterClient`'s twin over aiohttp, with
the same errors and the same encoding (``shared.protocol``, ``control.client.result_of``).

    async with AsyncMasterClient("http://10.0.0.1:7400") as master:
        jobs = await master.call("jobs", {"state": "running"})

One connection pool per client; use one client for many calls (and concurrent ones).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp

from control.client import RPC_PATH, Unreachable, auth_headers, result_of
from control.logs import LogChunk, aiter_logs, check_tail, follow_wait
from control.transport import split_url
from control.typed import AsyncTypedCalls
from shared.protocol import encode_rpc_request

if TYPE_CHECKING:
    import ssl

    from shared.auth import Secret


class AsyncMasterClient(AsyncTypedCalls):
    def __init__(self, url: str, timeout: float = 30.0, token: Secret | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        split_url(url)  # the same BadUrl as the synchronous client, before any I/O
        self.url = url.rstrip("/") + RPC_PATH
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._headers = auth_headers(token)
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None
                                               else True))
        return self._session

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        body = encode_rpc_request(method, params or {}, next(self._ids))
        try:
            async with self._open().post(self.url, data=body, headers=self._headers) as resp:
                data = await resp.read()  # unpack() below refuses more than MAX_REPLY
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            raise Unreachable(f"cannot reach the master at {self.url}: {reason}") from None
        return result_of(status, data, self.url)

    def logs(self, job_id: str, follow: bool = False, tail: int | None = None,
             node: str | None = None) -> AsyncIterator[LogChunk]:
        """:meth:`control.client.MasterClient.logs` as an async iterator:
        ``async for chunk in master.logs("train-7", follow=True): ...``."""
        check_tail(tail)
        return aiter_logs(self.call, job_id, follow=follow, tail=tail, node=node,
                          wait_s=follow_wait(self.timeout))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncMasterClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
