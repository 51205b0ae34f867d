"""The automatic return of a GPU to service: ``[gpu] health_check``, an operator's command
run for every GPU out of service every ``health_check_s``; exit status 0 returns the GPU.

A GPU taken out by a fault stays out until someone says it is fine (noded/gpu/health.py):
an operator with ``trellisctl gpu reset``, or this check, which is how a site automates the
same judgement (a DCGM diagnostic, ``nvidia-smi -q -i {index}`` succeeding after the driver
reset the GPU, a burn-in script). The command runs as noded's user (root), without a shell;
``{index}`` and ``{uuid}`` in its arguments are replaced, and it also finds
``TRELLIS_GPU_INDEX``, ``TRELLIS_GPU_UUID`` and ``TRELLIS_GPU_REASON`` (why the GPU is out)
in its environment. A check that runs longer than ``health_check_timeout_s`` is killed and
counts as failed. The return goes to the master as the GPU's health event (``healthy``,
reason "health check passed"), which lifts the master's own hold on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence

from noded.gpu.base import GpuBackend

log = logging.getLogger("trellis.gpu.healthcheck")

PASSED = "health check passed"


class GpuHealthCheck:
    def __init__(self, command: Sequence[str], interval_s: float, timeout_s: float,
                 gpus: GpuBackend, unhealthy: Callable[[], dict[int, str]]) -> None:
        if not command:
            raise ValueError("a GPU health check needs a command")
        self.command = tuple(command)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.gpus = gpus
        self.unhealthy = unhealthy  # index -> why, the GPUs out of service now
        self.runs = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
            if stop.is_set():
                return
            for index, reason in sorted(self.unhealthy().items()):
                if await self.check(index, reason):
                    await asyncio.get_running_loop().run_in_executor(
                        None, self.gpus.recover, index, PASSED)
                    log.warning("gpu=%d back in service: %s (was out: %s)", index, PASSED,
                                reason)

    def _uuid(self, index: int) -> str:
        gpus, _ = self.gpus.inventory()
        return next((g.uuid for g in gpus if g.index == index), "")

    async def check(self, index: int, reason: str) -> bool:
        """Run the check for GPU ``index``; True when it exited 0 in time."""
        uuid = self._uuid(index)
        argv = [a.replace("{index}", str(index)).replace("{uuid}", uuid) for a in self.command]
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "TRELLIS_GPU_INDEX": str(index), "TRELLIS_GPU_UUID": uuid,
               "TRELLIS_GPU_REASON": reason}
        self.runs += 1
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        except OSError as exc:
            log.error("gpu=%d health check %r cannot run: %s", index, argv[0], exc)
            return False
        try:
            _, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            log.warning("gpu=%d health check killed after %g s: the GPU stays out", index,
                        self.timeout_s)
            return False
        if proc.returncode != 0:
            log.info("gpu=%d health check failed (exit %s): %s", index, proc.returncode,
                     err.decode(errors="replace").strip()[-300:])
            return False
        return True
