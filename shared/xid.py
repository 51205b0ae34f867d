"""NVIDIA's Xid numbers, sorted by what they mean for a job and for its GPU.

One classification for the node daemon (which Xids take a GPU out of service) and the master
(which faults stop the job on the GPU and keep the GPU out until it is returned). It follows
the immediate action NVIDIA's Xid catalogue gives each Xid for Ampere and newer GPUs
(docs.nvidia.com/deploy/xid-errors, "Resolution Bucket (Immediate Action)"):

* **application** (``RESTART_APP`` and an investigation of the application): the program
  crashed or misbehaved, the GPU is fine. The job's own business: the GPU stays in service
  and nothing is stopped (the NVIDIA Kubernetes device plugin skips the same set).
* **fatal** (``RESET_GPU`` or ``RESTART_BM``: the device needs a reset, or the host a reboot,
  before it can run anything again): every job using the GPU is stopped (and requeued where
  it may be) and the GPU stays out of service until an operator returns it.
* **other** (informational or "watch" Xids such as a recorded row remap, 63, or a high
  single-bit ECC rate, 92): the GPU is taken out of service so no new job lands on a device
  that is degrading, but the job running there is left alone.
"""

from __future__ import annotations

import enum

# Xids the NVIDIA Kubernetes device plugin treats as application errors: the application
# crashed or misbehaved, the GPU itself is fine, so they must not take a GPU out of service.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# Xids after which the GPU needs a reset (or the host a reboot) before it runs anything
# again: NVIDIA's catalogue gives them the immediate action RESET_GPU or RESTART_BM.
FATAL_XIDS = frozenset({
    46,   # GPU stopped processing (the engine hung; not the application's 43)
    48,   # Double Bit ECC Error: uncorrectable, the memory contents are gone
    61,   # Internal micro-controller breakpoint/warning
    62,   # Internal micro-controller halt
    64,   # ECC page retirement or row remapper recording failure
    74,   # NVLink Error
    79,   # GPU has fallen off the bus
    95,   # Uncontained ECC error
    119,  # GSP RPC Timeout
    120,  # GSP Error
    140,  # Unrecovered ECC error
    154,  # GPU recovery action changed: a reset (or reboot) is required
})

# Xids after which the device no longer answers at all (NVML then returns GPU_IS_LOST).
LOST_XIDS = frozenset({79})

# Names from NVIDIA's Xid catalogue, for messages operators read. Unknown Xids are still
# reported, just without a name.
XID_NAMES: dict[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    46: "GPU stopped processing",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "Video processor exception",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    140: "Unrecovered ECC error",
    154: "GPU recovery action changed",
}


class XidClass(enum.StrEnum):
    APPLICATION = "application"
    FATAL = "fatal"
    OTHER = "other"


def classify(xid: int) -> XidClass:
    if xid in APPLICATION_XIDS:
        return XidClass.APPLICATION
    if xid in FATAL_XIDS:
        return XidClass.FATAL
    return XidClass.OTHER


def is_fatal(xid: int | None) -> bool:
    """Whether a GPU taken out of service with this Xid must stop its jobs. ``None``: the GPU
    went out without an Xid (NVML says it is lost or needs a reset, or another device
    appeared at its index): it cannot run anything either, so that is fatal too."""
    return xid is None or xid in FATAL_XIDS


def xid_reason(xid: int) -> str:
    name = XID_NAMES.get(xid)
    return f"Xid {xid} ({name})" if name else f"Xid {xid}"
