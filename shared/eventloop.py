"""Event-loop set-up shared by both daemons."""

from __future__ import annotations

import asyncio


def install_uvloop() -> None:
    """Use uvloop when it is installed; the standard loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
