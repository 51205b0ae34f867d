"""Small items from a hostile client (issue 38), each against a master in this process:
huge integers, booleans posing as numbers, GPUs a node does not have, duplicate inventory."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from masterd.api.app import GATE_KEY
from masterd.main import MasterDaemon
from shared.config import MasterConfig, load_config
from shared.protocol import ProtocolError, decode_frame, encode_frame, encode_rpc_request, pack
from shared.schema import SchemaError, bounded, decode, encode, number
from tests.unit.helpers import inventory

INT64_MAX = 2**63 - 1


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[MasterDaemon]:
    cfg = tmp_path / "master.toml"
    cfg.write_text(f'[master]\nlisten_host = "127.0.0.1"\nlisten_port = 0\n'
                   f'state_dir = "{tmp_path / "state"}"\n')
    d = MasterDaemon(load_config(MasterConfig, cfg, "master"), str(cfg))
    await d.start()
    yield d
    if d.runner is not None and not d.runner.app[GATE_KEY].closed:
        await d.close()


def url(d: MasterDaemon) -> str:
    assert d.runner is not None
    host, port = d.runner.addresses[0][:2]
    return f"http://{host}:{port}"


async def post(d: MasterDaemon, body: bytes) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(url(d) + "/v1/rpc", data=body) as r:
        return r.status, msgpack.unpackb(await r.read())


async def rpc(d: MasterDaemon, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return await post(d, encode_rpc_request(method, params))


# -- integers past 64 bits ---------------------------------------------------------------------

@pytest.mark.parametrize("after", [2**63, 2**64 - 1])
async def test_events_after_past_int64_is_invalid_params(daemon: MasterDaemon,
                                                         after: int) -> None:
    status, reply = await rpc(daemon, "events", {"after": after})
    assert status == 400, reply
    assert reply["error"]["code"] == "invalid_params"
    assert reply["error"]["message"] == (
        f"params.after: must be at most {INT64_MAX}, got {after}")
    # The largest 64-bit cursor is a cursor like any other: nothing after it.
    status, reply = await rpc(daemon, "events", {"after": INT64_MAX})
    assert status == 200 and reply["result"] == {"events": [], "last": INT64_MAX}


async def test_logs_offset_limit_is_stated(daemon: MasterDaemon) -> None:
    status, reply = await rpc(daemon, "logs", {"id": "j", "offsets": {"n1": INT64_MAX}})
    assert status == 400 and reply["error"]["code"] == "invalid_params"
    message = reply["error"]["message"]
    assert "at least 0" not in message, message
    assert f"from 0 to {1 << 62}, got {INT64_MAX}" in message, message
    status, reply = await rpc(daemon, "logs", {"id": "j", "offsets": {"n1": -1}})
    assert status == 400 and f"from 0 to {1 << 62}, got -1" in reply["error"]["message"]
    # The limit itself passes the parameters (the job does not exist).
    status, reply = await rpc(daemon, "logs", {"id": "j", "offsets": {"n1": 1 << 62}})
    assert status == 404 and reply["error"]["code"] == "unknown_job"


# -- the protocol version ----------------------------------------------------------------------

@pytest.mark.parametrize("version", [True, 1.0])
async def test_rpc_version_must_be_the_integer_1(daemon: MasterDaemon, version: Any) -> None:
    status, reply = await post(daemon, pack({"v": version, "id": 1, "method": "ping",
                                             "params": {}}))
    assert status == 400 and reply["error"]["code"] == "bad_version"
    assert repr(version) in reply["error"]["message"]


@pytest.mark.parametrize("version", [True, 1.0])
def test_frame_version_must_be_the_integer_1(version: Any) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_frame(pack({"v": version, "type": "gpu_util", "id": 1, "body": {}}))
    assert caught.value.code == "bad_version"
    assert decode_frame(pack({"v": 1, "type": "x", "id": 1, "body": {}})).type == "x"


# -- the schema's range errors -----------------------------------------------------------------

@dataclass(frozen=True)
class Ranges:
    count: int = bounded(0, min=0, max=1_000_000)
    share: float = bounded(0.0, min=0, max=1e6)
    fine: float = bounded(0.0, min=0.1, max=0.7)
    free: int = 0


@pytest.mark.parametrize(("data", "message"), [
    ({"count": 1_000_001}, "count: must be at most 1000000, got 1000001"),
    ({"count": -1}, "count: must be at least 0, got -1"),
    ({"share": 1_000_001}, "share: must be at most 1000000, got 1000001"),
    ({"share": 1000000.5}, "share: must be at most 1000000, got 1000000.5"),
    ({"fine": 0.7000000000000001}, "fine: must be at most 0.7, got 0.7000000000000001"),
    ({"fine": 0.09999999}, "fine: must be at least 0.1, got 0.09999999"),
    ({"free": 2**63}, f"free: must be at most {INT64_MAX}, got {2**63}"),
    ({"free": -(2**63) - 1}, f"free: must be at least {-(2**63)}, got {-(2**63) - 1}"),
])
def test_range_errors_print_exact_numbers(data: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError) as caught:
        decode(Ranges, data)
    assert str(caught.value) == message


def test_unbounded_integers_hold_64_bits() -> None:
    assert decode(Ranges, {"free": INT64_MAX}).free == INT64_MAX
    assert decode(Ranges, {"free": -(2**63)}).free == -(2**63)
    assert number(1e20) == "1e+20" and number(2.5) == "2.5" and number(3) == "3"


# -- the node channel --------------------------------------------------------------------------

async def node_replies(d: MasterDaemon, frames: list[bytes]) -> list[dict[str, Any]]:
    """Send ``frames`` on one node connection; the master's answer to each, in order."""
    replies: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as s, s.ws_connect(url(d) + "/v1/node") as ws:
        for frame in frames:
            await ws.send_bytes(frame)
            while True:
                msg = await ws.receive(timeout=5)
                assert msg.type == aiohttp.WSMsgType.BINARY, msg
                reply = msgpack.unpackb(msg.data)
                if reply["type"] in ("ack", "error"):
                    replies.append(reply)
                    break
    return replies


def hello(name: str = "n1", gpus: int = 2, cpus: int = 2, **changes: Any) -> bytes:
    inv = encode(inventory(name, gpus=gpus, cpus=cpus, numa=1))
    inv.update(changes)
    return encode_frame("hello", 1, {"inventory": inv})


async def test_gpu_health_for_a_gpu_the_node_lacks_is_refused(daemon: MasterDaemon) -> None:
    assert daemon.master is not None
    bad = encode_frame("gpu_health", 3, {"index": 7, "healthy": False})
    util = encode_frame("gpu_util", 5, {"index": 9, "utilization_pct": 1.0, "band": "idle"})
    good = encode_frame("gpu_health", 7, {"index": 1, "healthy": True})
    replies = await node_replies(daemon, [hello(), bad, util, good])
    assert [r["type"] for r in replies] == ["ack", "error", "error", "ack"], replies
    for reply, index in ((replies[1], 7), (replies[2], 9)):
        assert reply["body"]["code"] == "unknown_gpu"
        assert f"no GPU {index}" in reply["body"]["message"], reply
        assert "GPUs 0, 1" in reply["body"]["message"], reply
    # Nothing was recorded about GPU 7: no fault held, no journal row.
    assert daemon.master.features.gpufaults.of("n1", 7) is None
    _, reply = await rpc(daemon, "events", {})
    assert not [e for e in reply["result"]["events"] if e["kind"] in ("gpu_fault", "gpu_health")
                and e["detail"].get("gpu") == 7]


async def test_gpu_health_from_a_node_without_gpus_is_refused(daemon: MasterDaemon) -> None:
    replies = await node_replies(daemon, [
        hello("cpu1", gpus=0), encode_frame("gpu_health", 3, {"index": 0, "healthy": False})])
    assert [r["type"] for r in replies] == ["ack", "error"]
    assert "has no GPU 0 (its hello listed no GPUs)" in replies[1]["body"]["message"]


@pytest.mark.parametrize(("field", "duplicate", "sentence"), [
    ("gpus", 1, "hello: inventory.gpus lists GPU index 1 twice"),
    ("cpus", 0, "hello: inventory.cpus lists CPU id 0 twice"),
])
async def test_hello_with_a_duplicate_index_is_refused(daemon: MasterDaemon, field: str,
                                                       duplicate: int, sentence: str) -> None:
    assert daemon.master is not None
    inv = encode(inventory("dup", gpus=2, cpus=2, numa=1))
    inv[field] = [*inv[field], dict(inv[field][duplicate])]
    replies = await node_replies(daemon, [encode_frame("hello", 1, {"inventory": inv})])
    assert replies[0]["type"] == "error", replies
    assert replies[0]["body"]["code"] == "invalid_message"
    assert replies[0]["body"]["message"] == sentence
    await asyncio.sleep(0)
    assert daemon.master.core.cluster.node("dup") is None


# -- load_models names a file on the master's host --------------------------------------------

def test_model_database_paths_that_never_end_are_refused(tmp_path: Path) -> None:
    from masterd.core.genie.modeldb import ModelDB, ModelDBError

    fifo = tmp_path / "models.json"
    os.mkfifo(fifo)  # opening it for reading blocked until a writer came
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")  # reading it never ended
    for path, message in ((fifo, "not a regular file"), (zero, "not a regular file"),
                          (Path("/dev/zero"), r"use a \.json or \.toml")):
        with pytest.raises(ModelDBError, match=message):
            ModelDB.load(path)
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate((64 << 20) + 1)
    with pytest.raises(ModelDBError, match="larger than 64 MiB"):
        ModelDB.load(big)


async def test_load_models_from_dev_zero_is_refused(daemon: MasterDaemon, tmp_path: Path
                                                    ) -> None:
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    status, reply = await asyncio.wait_for(rpc(daemon, "load_models", {"path": str(zero)}), 10)
    assert status == 400 and "not a regular file" in reply["error"]["message"], reply
