"""Documentation an RPC handler carries for the protocol reference (docs/protocol.md, written
by ``python -m masterd.api.protocol_doc``): what it returns and the error codes it answers
with beyond the ones every method may. Parameters need none: their schema dataclass is the
documentation (types, bounds, defaults, and the comment above each field)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def returns(result: str, errors: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Mark an RPC handler with a description of its result and its own error codes."""
    def mark(fn: F) -> F:
        fn.rpc_result = result  # type: ignore[attr-defined]
        fn.rpc_errors = errors  # type: ignore[attr-defined]
        return fn

    return mark
