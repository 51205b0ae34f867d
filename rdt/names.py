"""Group names: the only user-influenced part of a resctrl path, so they are checked strictly.

Every group Trellis creates is named ``trellis-<name>`` where ``<name>`` follows the shared
NAME_PATTERN (letters, digits, '-', '_'; no '/', no '.'). The prefix means a Trellis request can
never name the default group, ``info``, ``mon_groups``, ``mon_data`` or a group some other tool
created, and the character set means it can never form '..', a '/', a NUL or a hidden file.
"""

from __future__ import annotations

import re

from rdt.errors import InvalidGroupName
from shared.model import NAME_PATTERN, check_name

GROUP_PREFIX = "trellis-"
GROUP_PATTERN = re.escape(GROUP_PREFIX) + NAME_PATTERN
_GROUP_RE = re.compile(GROUP_PATTERN)
MAX_GROUP_NAME = len(GROUP_PREFIX) + 63


def is_group_name(name: object) -> bool:
    return isinstance(name, str) and _GROUP_RE.fullmatch(name) is not None


def check_group_name(name: object, what: str = "resctrl group") -> str:
    """Return ``name`` if it is a valid Trellis group name, else raise InvalidGroupName."""
    if is_group_name(name):
        assert isinstance(name, str)
        return name
    if not isinstance(name, str):
        raise InvalidGroupName(f"{what} name must be a string, got {type(name).__name__}")
    shown = name if len(name) <= 80 else name[:77] + "..."
    raise InvalidGroupName(
        f"{what} name {shown!r} is invalid: it must be {GROUP_PREFIX!r} followed by 1-63 "
        f"letters, digits, '-' or '_' (at most {MAX_GROUP_NAME} characters, no '/', '.' or NUL)"
    )


def group_for_job(job_name: str) -> str:
    """The resctrl group name for a job (raises ValueError for a bad job name)."""
    try:
        return GROUP_PREFIX + check_name(job_name, "job")
    except ValueError as exc:
        raise InvalidGroupName(str(exc)) from exc
