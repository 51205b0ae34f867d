"""The emulated driver's fault directory: an Xid dropped there (write_fault) is raised on
the next health poll, with its number on the event; application Xids are filtered as on
NVML; a malformed drop is logged and removed."""

from __future__ import annotations

from pathlib import Path

from noded.gpu.emulated import EmulatedGpuBackend, EmulatedGpuConfig, write_fault


def test_dropped_faults_are_raised_once_with_their_xid(tmp_path: Path) -> None:
    faults = tmp_path / "gpu-faults"
    backend = EmulatedGpuBackend(EmulatedGpuConfig(count=3, uuid_seed="fd",
                                                   fault_dir=str(faults)))
    try:
        assert backend.poll_health() == []  # no directory yet: nothing
        write_fault(faults, 0, 13)  # an application's: ignored
        write_fault(faults, 1, 48)
        write_fault(faults, 2, 79)
        (faults / "junk.xid").write_text("not a fault")
        (faults / "wrong.xid").write_text("9 79\n")  # no GPU 9 here
        events = backend.poll_health()
        assert [(e.index, e.healthy, e.xid) for e in events] == [(1, False, 48),
                                                                 (2, False, 79)]
        assert events[1].reason == "Xid 79 (GPU has fallen off the bus)"
        assert list(faults.iterdir()) == []  # every drop consumed, the bad ones too
        assert backend.poll_health() == []
        samples = backend.sample()
        assert samples[0].healthy and not samples[1].healthy and not samples[2].healthy
    finally:
        backend.close()
