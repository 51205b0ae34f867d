"""Calling whichever of several masters leads (a highly available master, see
docs/high-availability.md).

Give every master's URL, comma-separated or as a list; :func:`connect` returns a plain
:class:`~control.client.MasterClient` for one URL and a :class:`FailoverClient` for several.
A standby answers ``not_leader`` naming the leader, and the client follows it; a master that
cannot be reached, or is shutting down, sends it on to the next URL. While no master leads
(a takeover takes up to the lease, 15 s by default) it keeps trying, within its timeout.

A request is sent again elsewhere only when the first master cannot have acted on it: a
standby's ``not_leader`` and a draining master's ``shutting_down`` are answered before
anything is done, and a refused connection never reached a master. A request that was sent
and got no answer (a time-out, a reset) may have been carried out: reads are retried, writes
are not (the caller hears ``Unreachable``, as with one master) unless the write is a submission
with its own ``id``, which a retry cannot store twice (the leader answers ``duplicate_job``).

A leader can go silent: frozen (its kernel still accepts connections, nothing answers) or
cut off. A request that may be resent elsewhere therefore waits at most ``attempt_timeout``
(10 s, within the call's ``timeout``) for one master, and a master that timed out is passed
over, even when a standby still names it, for ``attempt_timeout`` after that: the call goes
on with the others until one takes over. A request that cannot be resent keeps the whole
``timeout`` for the master it went to, as with one master.
"""

from __future__ import annotations

import time

from control.client import MasterClient, RpcError, Unreachable
from control.typed import TypedCalls

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

# Methods that change nothing: safe to send again whatever happened to the first attempt.
READ_ONLY = frozenset({"ping", "jobs", "job", "nodes", "node", "events", "models",
                       "profiles", "pools", "services", "place", "logs"})
# Answers given before the master did anything: the request can go to another master.
REDIRECTS = frozenset({"not_leader", "shutting_down"})
# How an unreachable master looks when the request never left (connection refused, no route,
# unknown host): nothing can have been done.
_NEVER_SENT = ("Connection refused", "Errno 111", "No route to host", "Errno 113",
               "Name or service not known", "Temporary failure in name resolution",
               "Network is unreachable", "Errno 101")
_PAUSE_S = (0.1, 0.2, 0.5, 1.0)
# How long a request that may be resent waits for one master before trying the next.
ATTEMPT_S = 10.0


def split_urls(urls: str | Sequence[str]) -> list[str]:
    """Master URLs from ``"http://a:7400,http://b:7400"`` or a list; ValueError when empty."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    found = [u.strip().rstrip("/") for u in items if u and u.strip()]
    if not found:
        raise ValueError("no master URL given")
    return list(dict.fromkeys(found))


def connect(urls: str | Sequence[str], timeout: float = 30.0, **kw: Any
            ) -> MasterClient | FailoverClient:
    """A client for one master, or for several of which one leads."""
    found = split_urls(urls)
    if len(found) == 1:
        return MasterClient(found[0], timeout=timeout, **kw)
    return FailoverClient(found, timeout=timeout, **kw)


class FailoverClient(TypedCalls):
    """``call`` like :class:`MasterClient`, on whichever master leads."""

    def __init__(self, urls: str | Sequence[str], timeout: float = 30.0,
                 attempt_timeout: float = ATTEMPT_S, **kw: Any) -> None:
        self.urls = split_urls(urls)
        self.timeout = timeout
        self.attempt_timeout = min(timeout, attempt_timeout)
        self._clients = [MasterClient(u, timeout=timeout, **kw) for u in self.urls]
        self._current = 0
        # Masters that did not answer in time, with when (monotonic): passed over for a while.
        self._silent: dict[int, float] = {}

    @property
    def url(self) -> str:
        """The RPC URL of the master calls go to now."""
        return self._clients[self._current].url

    def logs(self, job_id: str, follow: bool = False, tail: int | None = None,
             node: str | None = None) -> Any:
        """:meth:`control.client.MasterClient.logs`, from whichever master leads."""
        from control.client import _logs

        # A long poll must end within one attempt's time, or a follow would time out.
        return _logs(self.call, self.attempt_timeout, job_id, follow, tail, node)

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        deadline = time.monotonic() + self.timeout
        resendable = method in READ_ONLY or _has_own_id(method, params)
        tries = 0
        last: Exception | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0 and last is not None:
                raise self._gave_up(last)
            client = self._clients[self._current]
            client.timeout = max(0.05, min(self.attempt_timeout, left) if resendable else left)
            try:
                result = client.call(method, params)
                self._silent.pop(self._current, None)
                return result
            except RpcError as exc:
                if exc.code not in REDIRECTS:
                    raise
                last = exc
                detail = getattr(exc, "detail", None) or {}
                if exc.code == "not_leader" and self._follow(detail.get("leader")) and \
                        self._clients[self._current] is not client:
                    continue  # straight to the named leader
            except Unreachable as exc:
                if not (resendable or _never_sent(exc)):
                    raise
                last = exc
                if "timed out" in str(exc):
                    self._silent[self._current] = time.monotonic()
            self._advance()
            tries += 1
            if tries % len(self._clients) == 0:  # a whole round: nobody leads yet
                pause = _PAUSE_S[min(tries // len(self._clients) - 1, len(_PAUSE_S) - 1)]
                if time.monotonic() + pause > deadline:
                    raise self._gave_up(last)
                time.sleep(pause)

    def _passed_over(self, i: int) -> bool:
        since = self._silent.get(i)
        return since is not None and time.monotonic() - since < self.attempt_timeout

    def _follow(self, leader: object) -> bool:
        """Go to the master a standby named, if it is one of ours (a node's token is never
        sent to an address nobody configured) and it has not just failed to answer."""
        if isinstance(leader, str) and leader.rstrip("/") in self.urls:
            named = self.urls.index(leader.rstrip("/"))
            if self._passed_over(named):
                return False
            self._current = named
            return True
        return False

    def _advance(self) -> None:
        """The next master in turn, passing over those that just timed out while another
        may answer."""
        n = len(self._clients)
        for step in range(1, n + 1):
            i = (self._current + step) % n
            if not self._passed_over(i) or step == n:
                self._current = i
                return

    def _gave_up(self, last: Exception) -> Exception:
        if isinstance(last, RpcError):
            return Unreachable(f"no master leads at {', '.join(self.urls)}: {last.message}")
        return last


def _never_sent(exc: Exception) -> bool:
    text = str(exc)
    return any(mark in text for mark in _NEVER_SENT)


def _has_own_id(method: str, params: dict[str, Any] | None) -> bool:
    return method == "submit" and bool(params and params.get("id"))
