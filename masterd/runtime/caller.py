"""Who is calling the RPC being served, for the handlers that answer per caller.

The HTTP layer authenticates every request (masterd.api.authn) and sets :data:`CALLER` for the
task that serves it; a handler, or a feature acting on the request (masterd.features.holds),
reads it with :func:`caller` (it lives in the runtime layer so that features may). A context
variable rather than a parameter: each request runs in its own task, so concurrent requests
never see each other's caller, and handlers that do not care are unchanged.
"""

from __future__ import annotations

from contextvars import ContextVar

from shared.auth import Principal

# Unset (None) for in-process calls (tests, the demo) and open loopback access: an admin.
CALLER: ContextVar[Principal | None] = ContextVar("trellis_rpc_caller", default=None)


def caller() -> Principal | None:
    return CALLER.get()


def is_admin(principal: Principal | None) -> bool:
    """Whether the caller sees and may change every job (admins, and in-process calls)."""
    return principal is None or principal.is_admin


def owns(principal: Principal | None, user: str) -> bool:
    """Whether the caller may see and act on a job of Unix user ``user``."""
    return is_admin(principal) or (principal is not None and principal.name == user)
