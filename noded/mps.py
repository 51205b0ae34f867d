"""CUDA MPS for GPUs that host shared jobs (Liquid's fine-grained sharing, §6.2).

Jobs that share a GPU (a placement the master marks ``shared``, for a job that gave
``gpu_milli``) run as clients of NVIDIA's Multi-Process Service on NVIDIA nodes, so their
kernels run concurrently instead of time-slicing, each bounded:

* the control daemon is started once, ``nvidia-cuda-mps-control -d``, with its pipe and log
  directories in noded's state directory (``STATE/mps/pipe``, ``STATE/mps/log``);
* a shared job gets ``CUDA_MPS_PIPE_DIRECTORY``/``CUDA_MPS_LOG_DIRECTORY`` (to reach that
  daemon), ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = its share in percent (``gpu_milli / 10``,
  rounded up) and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` = ``0=<MiB>M``: its share of the GPU's
  memory (device 0 is its GPU: ``CUDA_VISIBLE_DEVICES`` names that one alone).

``mps = "auto"`` uses MPS where the GPU backend is NVML and the control binary exists; ``on``
requires it; ``off`` never uses it (shared jobs then time-slice). The daemon is asked to quit
when noded stops and no shared job is left.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
from pathlib import Path

from noded.jobs import JobRunner
from shared.model import GpuInfo

log = logging.getLogger("trellis.node.mps")

BINARY = "nvidia-cuda-mps-control"


class MpsError(RuntimeError):
    """MPS is required but cannot be used; the message says why."""


def share_env(pipe: Path, logs: Path, gpu_milli: int, gpu_memory_mib: int) -> dict[str, str]:
    percent = min(100, max(1, math.ceil(gpu_milli / 10)))
    limit = max(1, gpu_memory_mib * gpu_milli // 1000)
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit}M",
    }


class MpsControl:
    def __init__(self, state_dir: Path, gpus: tuple[GpuInfo, ...],
                 binary: str | None = None, timeout_s: float = 10.0) -> None:
        found = binary or shutil.which(BINARY)
        if found is None:
            raise MpsError(f"{BINARY} is not installed (it comes with the NVIDIA driver "
                           "utilities); set mps = \"off\" to share GPUs without MPS")
        self.binary = found
        self.pipe = state_dir / "mps" / "pipe"
        self.logs = state_dir / "mps" / "log"
        self.memory = {g.index: g.memory_mib for g in gpus}
        self.timeout_s = timeout_s
        self.started = False

    def _env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe),
                "CUDA_MPS_LOG_DIRECTORY": str(self.logs)}

    def ensure_daemon(self) -> None:
        """Start the control daemon unless it runs (its pipe's control socket exists)."""
        if self.started and (self.pipe / "control").exists():
            return
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        # Clients of every user must reach the daemon's pipes.
        os.chmod(self.pipe, 0o755)
        done = subprocess.run([self.binary, "-d"], env=self._env(), capture_output=True,
                              text=True, timeout=self.timeout_s, check=False)
        if done.returncode != 0:
            raise MpsError(f"{BINARY} -d failed: {(done.stderr or done.stdout).strip()[:300]}")
        self.started = True
        log.info("mps control daemon started pipe=%s", self.pipe)

    def command(self, text: str) -> str:
        """One command to the control daemon (e.g. ``get_server_list``); its answer."""
        done = subprocess.run([self.binary], input=text + "\n", env=self._env(),
                              capture_output=True, text=True, timeout=self.timeout_s,
                              check=False)
        if done.returncode != 0:
            raise MpsError(f"{BINARY} {text!r} failed: {done.stderr.strip()[:300]}")
        return done.stdout

    def job_env(self, runner: JobRunner, job_id: str) -> dict[str, str]:
        """The MPS variables of a job part, if it shares its GPU (else none)."""
        part = runner.parts.get(job_id)
        if part is None:
            return {}
        alloc, spec = part.prepare.allocation, part.prepare.spec
        if not alloc.shared or spec.gpu_milli is None or len(alloc.gpus) != 1:
            return {}
        self.ensure_daemon()
        memory = self.memory.get(alloc.gpus[0], 0)
        return share_env(self.pipe, self.logs, spec.gpu_milli, memory)

    def close(self) -> None:
        if not self.started:
            return
        try:
            self.command("quit")
            log.info("mps control daemon asked to quit")
        except (MpsError, OSError, subprocess.TimeoutExpired) as exc:
            log.warning("mps control daemon did not quit: %s", exc)
        self.started = False


def open_mps(mode: str, backend: str, state_dir: Path, gpus: tuple[GpuInfo, ...],
             binary: str | None = None) -> MpsControl | None:
    """The MPS control for this node's configuration, or None where MPS is not used."""
    if mode == "off":
        return None
    if mode == "auto" and (backend != "nvml" or (binary or shutil.which(BINARY)) is None):
        return None
    return MpsControl(state_dir, gpus, binary)
