"""bench/rpc.py's CPU meter charges each phase only the CPU its own processes used in it."""

from __future__ import annotations

import time

import psutil

from bench.rpc import CpuMeter


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_each_phase_gets_the_cpu_spent_in_it_per_request() -> None:
    meter = CpuMeter({"client": psutil.Process()})
    for _ in range(2):  # summed over slices, as the bench alternates them
        with meter.phase("busy", "client"):
            _spin(0.15)
        with meter.phase("waiting", "client"):
            time.sleep(0.15)
    cpu, idle, steal = meter.report({"busy": 100, "waiting": 100})
    # 0.3 s of CPU over 100 requests: 3,000 us each (less what the clock ticks round off).
    assert 2_500 <= cpu["busy"]["client"] <= 4_500
    assert cpu["waiting"]["client"] < 500
    assert set(idle) == {"busy", "waiting"}
    assert set(steal) == {"busy", "waiting"}
    assert all(0.0 <= share <= 100.0 for share in (*idle.values(), *steal.values()))


def test_a_phase_with_no_requests_has_no_cpu_per_request() -> None:
    meter = CpuMeter({"client": psutil.Process()})
    with meter.phase("empty", "client"):
        _spin(0.02)
    cpu, idle, _ = meter.report({"empty": 0})
    assert cpu["empty"] == {"client": None}
    assert 0.0 <= idle["empty"] <= 100.0
