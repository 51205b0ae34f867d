"""Liveness and readiness for probes and load balancers: ``GET /healthz`` and ``GET /readyz``
on the master (masterd.api.app, masterd.api.standby) and on noded's metrics listener.

``/healthz`` says the process serves HTTP. ``/readyz`` says it should be sent work: every
check of :class:`Readiness` passes. A check is a name and a function returning None when
ready, else a sentence saying why not; the master checks its journal, the drain and the
leadership, a node its session with the master, and whatever else must hold adds one check
(``Readiness.add``). Both answer JSON and need no credentials (probes carry none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

Check = Callable[[], str | None]


@dataclass
class Readiness:
    checks: list[tuple[str, Check]] = field(default_factory=list)

    def add(self, name: str, check: Check) -> None:
        self.checks.append((name, check))

    def report(self) -> tuple[bool, dict[str, str]]:
        """Whether every check passes, and each check's verdict ("ok" or why not)."""
        verdicts: dict[str, str] = {}
        for name, check in self.checks:
            try:
                problem = check()
            except Exception as exc:  # a broken check reports, it does not 500 the probe
                problem = f"check failed: {type(exc).__name__}: {exc}"
            verdicts[name] = "ok" if problem is None else problem
        return all(v == "ok" for v in verdicts.values()), verdicts


def readiness_response(readiness: Readiness) -> web.Response:
    ready, checks = readiness.report()
    return web.json_response({"status": "ready" if ready else "not_ready", "checks": checks},
                             status=200 if ready else 503)
