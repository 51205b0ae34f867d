"""Exception types for resctrl access. Every message names what was wrong."""

from __future__ import annotations


class ResctrlError(Exception):
    """Base class: anything resctrl refused or that Trellis refused to ask of it."""


class ResctrlNotMounted(ResctrlError):
    """No resctrl filesystem at the expected mount point."""


class DiscoveryError(ResctrlError):
    """``info/`` or the root group holds something this code cannot interpret."""


class InvalidGroupName(ResctrlError, ValueError):
    """A group name that could leave Trellis's own groups (or is otherwise malformed)."""


class GroupNotFound(ResctrlError):
    """The group directory does not exist."""


class FeatureUnavailable(ResctrlError):
    """The machine (or the mount) lacks the RDT feature the call needs."""


class OutOfClosids(ResctrlError):
    """mkdir of a control group failed with ENOSPC: every CLOSID is taken."""


class OutOfRmids(ResctrlError):
    """mkdir failed with ENOSPC because every RMID is taken."""


class RmidsInLimbo(ResctrlError):
    """mkdir failed with EBUSY: freed RMIDs still wait for their cache lines to drain."""


class KernelRejected(ResctrlError):
    """The kernel refused a write or mkdir; the message carries ``info/last_cmd_status``."""

    def __init__(self, message: str, *, errno: int | None = None, status: str = "") -> None:
        super().__init__(message)
        self.errno = errno
        self.status = status


class ProcessNotFound(ResctrlError):
    """The process whose threads were to be assigned does not exist (any more)."""


class SchemataParseError(ResctrlError, ValueError):
    """A schemata text that does not follow the kernel's format."""


class LockTimeout(ResctrlError):
    """Another process held the resctrl flock for longer than we are willing to wait."""


class InvalidValue(ResctrlError, ValueError):
    """A requested setting that cannot be expressed on this machine (bad type, domain, range)."""
