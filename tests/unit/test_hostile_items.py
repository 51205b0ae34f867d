"""Small items from a hostile client (issue 38), each against a master in this process:
huge integers, booleans posing as numbers, GPUs a node does not have, duplicate inventory."""

from __future__ import annotations

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
from shared.protocol import ProtocolError, decode_frame, encode_rpc_request, pack
from shared.schema import SchemaError, bounded, decode, number

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
