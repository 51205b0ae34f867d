"""Intel RDT through the Linux resctrl filesystem: groups, schemata (MB, L3), MBM/CMT monitoring.

Use ``detect_resctrl()`` on a real server (None when resctrl is not mounted) or
``rdt.emulated.open_resctrl(root)`` over a tree from ``rdt.emulated.build_tree``.
"""

from rdt.capabilities import (
    BandwidthAllocation,
    CacheAllocation,
    Monitoring,
    ResctrlCapabilities,
)
from rdt.errors import (
    DiscoveryError,
    FeatureUnavailable,
    GroupNotFound,
    InvalidGroupName,
    InvalidValue,
    KernelRejected,
    LockTimeout,
    OutOfClosids,
    OutOfRmids,
    ProcessNotFound,
    ResctrlError,
    ResctrlNotMounted,
    RmidsInLimbo,
    SchemataParseError,
)
from rdt.monitor import BandwidthMeter
from rdt.names import GROUP_PREFIX, check_group_name, group_for_job, is_group_name
from rdt.resctrl import DEFAULT_ROOT, Resctrl, detect_resctrl

__all__ = [
    "DEFAULT_ROOT",
    "GROUP_PREFIX",
    "BandwidthAllocation",
    "BandwidthMeter",
    "CacheAllocation",
    "DiscoveryError",
    "FeatureUnavailable",
    "GroupNotFound",
    "InvalidGroupName",
    "InvalidValue",
    "KernelRejected",
    "LockTimeout",
    "Monitoring",
    "OutOfClosids",
    "OutOfRmids",
    "ProcessNotFound",
    "Resctrl",
    "ResctrlCapabilities",
    "ResctrlError",
    "ResctrlNotMounted",
    "RmidsInLimbo",
    "SchemataParseError",
    "check_group_name",
    "detect_resctrl",
    "group_for_job",
    "is_group_name",
]
