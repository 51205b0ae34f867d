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


async def test_the_agent_resets_a_gpu_and_refuses_one_it_does_not_have() -> None:
    """reset_gpu through noded's command dispatch: the backend forgets the fault (its next
    health poll says so) and the ack says whether the node held one; an index the node
    does not have is refused with a sentence."""
    from typing import Any

    from noded.agent import NodeAgent
    from shared.protocol import encode_frame
    from tests.unit.agent_fakes import SentFrames

    class Runner:
        on_exited: Any = None
        parts: dict[str, Any] = {}

    backend = EmulatedGpuBackend(EmulatedGpuConfig(count=2, uuid_seed="agent"))
    try:
        agent = NodeAgent("http://127.0.0.1:1", lambda: None, Runner(), backend)  # type: ignore[arg-type]
        ws = SentFrames()
        agent.ws = ws  # type: ignore[assignment]
        backend.inject_fault(1, 79)
        for event in backend.poll_health():
            await agent._health(event)
        assert agent.unhealthy_gpus() == {1: "Xid 79 (GPU has fallen off the bus)"}
        await agent._dispatch(encode_frame("reset_gpu", 2, {"index": 1}))
        await agent._dispatch(encode_frame("reset_gpu", 4, {"index": 7}))
        replies = ws.replies()
        assert replies[2]["type"] == "ack" and replies[2]["body"] == {"recovered": True}
        assert replies[4]["type"] == "error" and replies[4]["body"]["code"] == "unknown_gpu"
        assert "GPU index 7 does not exist" in replies[4]["body"]["message"]
        [back] = backend.poll_health()
        assert back.healthy and back.index == 1 and back.reason == "recovered by operator"
        assert [f["body"]["xid"] for f in ws.frames if f["type"] == "gpu_health"] == [79]
    finally:
        backend.close()
