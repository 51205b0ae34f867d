"""Errors of the confinement layer; every message names the group, file or value at fault."""

from __future__ import annotations


class CgroupError(RuntimeError):
    """Base class: something about a job's group could not be done."""


class CgroupUnavailableError(CgroupError):
    """The requested kind of confinement (or a controller a limit needs) is not available."""


class GroupNotFoundError(CgroupError, LookupError):
    """The job has no group (never created, or already removed)."""


class GroupBusyError(CgroupError):
    """The group still holds processes (or child groups), so it cannot be removed."""

    def __init__(self, message: str, pids: list[int] | None = None) -> None:
        super().__init__(message)
        self.pids = pids or []


class LimitsError(CgroupError, ValueError):
    """The limits are well-formed but this machine/parent cannot grant them (e.g. CPU 7 on a
    2-CPU node)."""
