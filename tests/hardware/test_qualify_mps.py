"""Qualify CUDA MPS on a GPU server: the control daemon noded starts for shared GPUs answers,
and a client environment as noded gives a shared job reaches it.

Skips with the reason where ``nvidia-cuda-mps-control`` is not installed or NVML does not
start (no driver, no GPU). The daemon's pipe and log directories are a ``trellis-test-``
temporary directory; the daemon is told to quit even when an assertion fails.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from noded.gpu.base import GpuBackendError, open_backend
from noded.mps import BINARY, MpsControl, share_env


def test_mps_daemon_serves_a_shared_job_environment() -> None:
    if shutil.which(BINARY) is None:
        pytest.skip(f"{BINARY} is not installed here (no NVIDIA driver utilities)")
    try:
        backend = open_backend("nvml")
    except GpuBackendError as exc:
        pytest.skip(f"NVML does not start here: {exc}")
    gpus, _ = backend.inventory()
    backend.close()
    state = Path(tempfile.mkdtemp(prefix="trellis-test-mps-"))
    mps = MpsControl(state, gpus)
    try:
        mps.ensure_daemon()
        assert (mps.pipe / "control").exists()
        mps.command("get_server_list")  # the daemon answers (no server before a client)
        env = share_env(mps.pipe, mps.logs, 250, gpus[0].memory_mib)
        if shutil.which("nvidia-smi"):
            # A CUDA client with the job's variables: nvidia-smi is not one, so this only
            # checks the variables are accepted by the tools around it.
            done = subprocess.run(["nvidia-smi", "-L"], env={"PATH": "/usr/bin:/bin", **env},
                                  capture_output=True, text=True, timeout=30, check=False)
            assert done.returncode == 0, done.stderr
    finally:
        mps.close()
        shutil.rmtree(state, ignore_errors=True)
