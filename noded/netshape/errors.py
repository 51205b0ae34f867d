"""The one exception type of the network shaping package."""

from __future__ import annotations


class NetShapeError(Exception):
    """Bad configuration or a kernel/tool refusal; the message names what and where."""
