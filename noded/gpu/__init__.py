"""GPU telemetry and health for the node daemon: NVML on real servers, emulation elsewhere."""

from noded.gpu.base import (
    APPLICATION_XIDS,
    GpuBackend,
    GpuBackendError,
    GpuHealthEvent,
    GpuSample,
    open_backend,
    switch_groups,
    xid_reason,
)
from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
from noded.gpu.nvml import NvmlGpuBackend
from noded.gpu.progress import PROGRESS_ENV

__all__ = [
    "APPLICATION_XIDS",
    "PROGRESS_ENV",
    "EmulatedGpuBackend",
    "EmulatedGpuConfig",
    "GpuBackend",
    "GpuBackendError",
    "GpuHealthEvent",
    "GpuSample",
    "NvmlGpuBackend",
    "open_backend",
    "switch_groups",
    "xid_reason",
]
