"""What a job running on emulated GPUs says it uses of them.

Beside its progress counter (:mod:`noded.gpu.progress`) a job may write two files into the same
directory (``dirname $TRELLIS_PROGRESS_FILE``), each one decimal number, rewritten whole:

* ``util``: the GPU utilisation its kernels would cause, in percent (0–100), e.g. ``0`` while
  it loads data or saves its model and ``85`` while it trains;
* ``memory``: the GPU memory it holds on each of its GPUs, in MiB.

The emulation then reports these for the job (and sums them over jobs sharing a GPU), which
is what lets noded's usage accounting, Liquid's phase detector and GPU sharing run on machines
without GPUs exactly as on NVML's figures. A job that writes neither keeps the progress-rate
utilisation and the backend's ``busy_memory_mib``. The files belong to the job (an untrusted
user): read like the counter, without following links, a few bytes at most.
"""

from __future__ import annotations

import math
from pathlib import Path

from noded.gpu.progress import read_job_file

UTIL_FILE_NAME = "util"
MEMORY_FILE_NAME = "memory"
MAX_BYTES = 32


def read_declared(path: Path, limit: float) -> float | None:
    """The number in ``path`` within [0, limit], or None when absent or not such a number."""
    data = read_job_file(path, MAX_BYTES)
    if data is None:
        return None
    try:
        value = float(data.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or not 0 <= value <= limit:
        return None
    return value
