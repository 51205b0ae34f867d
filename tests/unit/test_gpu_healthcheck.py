"""[gpu] health_check: an operator's command returns a GPU out of service to service when it
exits 0 (a real subprocess against the emulated backend's real health tracking)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig
from noded.gpu.healthcheck import PASSED, GpuHealthCheck


async def test_a_passing_check_returns_the_gpu_and_a_failing_one_keeps_it_out(
        tmp_path: Path) -> None:
    backend = EmulatedGpuBackend(EmulatedGpuConfig(count=2, uuid_seed="hc"))
    try:
        assert backend.inject_fault(1, 79)
        [event] = backend.poll_health()
        assert not event.healthy and event.xid == 79
        ok = tmp_path / "ok"
        seen = tmp_path / "seen"
        # Passes once the operator's condition holds; records what it was told.
        command = ["sh", "-c", f'echo "$1 $TRELLIS_GPU_INDEX $TRELLIS_GPU_UUID '
                               f'$TRELLIS_GPU_REASON" > {seen}; test -e {ok}', "check",
                   "{index}"]
        check = GpuHealthCheck(command, 0.05, 5.0, backend,
                               lambda: backend._health.unhealthy())
        assert not await check.check(1, "Xid 79 (GPU has fallen off the bus)")
        uuid = backend.inventory()[0][1].uuid
        assert seen.read_text().split(" ", 3) == ["1", "1", uuid,
                                                  "Xid 79 (GPU has fallen off the bus)\n"]
        stop = asyncio.Event()
        task = asyncio.ensure_future(check.run(stop))
        await asyncio.sleep(0.3)
        assert not backend._health.healthy(1)  # the check keeps failing: still out
        ok.touch()
        deadline = time.monotonic() + 10
        while not backend._health.healthy(1):
            assert time.monotonic() < deadline, "the GPU never came back"
            await asyncio.sleep(0.05)
        stop.set()
        await task
        [back] = backend.poll_health()
        assert back.healthy and back.index == 1 and back.reason == PASSED
        assert backend.sample()[1].healthy  # no longer "lost"
    finally:
        backend.close()


async def test_a_check_that_hangs_is_killed_and_fails(tmp_path: Path) -> None:
    backend = EmulatedGpuBackend(EmulatedGpuConfig(count=1, uuid_seed="hc2"))
    try:
        check = GpuHealthCheck(["sleep", "30"], 1.0, 0.3, backend, lambda: {})
        started = time.monotonic()
        assert not await check.check(0, "x")
        assert time.monotonic() - started < 10
        missing = GpuHealthCheck([str(tmp_path / "no-such-program")], 1.0, 1.0, backend,
                                 lambda: {})
        assert not await missing.check(0, "x")
    finally:
        backend.close()
