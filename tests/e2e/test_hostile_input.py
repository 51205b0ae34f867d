"""Malformed, oversized and out-of-order input to a real master: clear errors, no harm done."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import msgpack
import pytest

from demo.cluster import LocalCluster, default_job_user
from shared.model import NodeInventory
from shared.protocol import MAX_FRAME, encode_frame, encode_rpc_request, pack
from shared.schema import encode


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("trellis-test-hostile"), nodes=0,
                           prefix="trellis-test-hostile")
    cluster.start_master()
    yield cluster
    cluster.close()


async def rpc_raw(url: str, body: bytes) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/rpc", data=body) as r:
        return r.status, msgpack.unpackb(await r.read())


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"\xc1garbage", 400, "bad_frame"),
        (pack([1, 2, 3]), 400, "bad_request"),
        (pack({"v": 2, "method": "ping"}), 400, "bad_version"),
        (encode_rpc_request("launch_missiles", {}), 404, "unknown_method"),
        (encode_rpc_request("submit", {"job": {"name": "x"}}), 400, "invalid_params"),
        (encode_rpc_request("submit", {"job": 5}), 400, "invalid_params"),
        (encode_rpc_request("job", {"id": 7}), 400, "invalid_params"),
        (encode_rpc_request("job", {"id": "nope"}), 404, "unknown_job"),
        (b"\x00" * (MAX_FRAME + 10), 413, "frame_too_large"),
    ],
)
def test_rpc_errors_have_code_and_sentence(master: LocalCluster, body: bytes, status: int,
                                           code: str) -> None:
    got_status, reply = asyncio.run(rpc_raw(master.url, body))
    assert got_status == status
    assert reply["error"]["code"] == code
    assert len(reply["error"]["message"]) > 10
    assert master.client().call("ping")["version"]


async def node_exchange(url: str, frames: list[bytes], wait: float = 2.0) -> list:
    replies: list = []
    async with aiohttp.ClientSession() as s, s.ws_connect(url + "/v1/node") as ws:
        for frame in frames:
            await ws.send_bytes(frame)
        deadline = time.monotonic() + wait
        while len(replies) < len(frames) and time.monotonic() < deadline:
            try:
                msg = await ws.receive(timeout=deadline - time.monotonic())
            except TimeoutError:
                break
            if msg.type != aiohttp.WSMsgType.BINARY:
                replies.append(("closed", ws.close_code))
                break
            replies.append(msgpack.unpackb(msg.data))
    return replies


def inv(name: str) -> dict:
    return encode(NodeInventory(name=name, hostname="h", address="127.0.0.1", memory_mib=1))


def test_node_channel_rejects_bad_frames_one_by_one(master: LocalCluster) -> None:
    frames = [
        b"\xc1",  # not msgpack
        pack({"v": 1, "type": "job_started", "id": 1, "body": {"job_id": "a", "pid": 1}}),
        encode_frame("hello", 2, {"inventory": {**inv("n"), "name": "../etc"}}),
        encode_frame("reboot_now", 3, {}),
    ]
    replies = asyncio.run(node_exchange(master.url, frames))
    assert [r["type"] for r in replies] == ["error"] * 4
    codes = [r["body"]["code"] for r in replies]
    assert codes == ["bad_frame", "not_registered", "invalid_message", "unknown_type"]
    assert "inventory.name" in replies[2]["body"]["message"]


def test_oversized_node_frame_closes_only_that_connection(master: LocalCluster) -> None:
    replies = asyncio.run(node_exchange(master.url, [b"\x00" * (MAX_FRAME + 1)]))
    assert replies == [("closed", 1009)]
    # A well-behaved node still registers afterwards.
    ok = asyncio.run(node_exchange(master.url, [encode_frame("hello", 1, {"inventory":
                                                                          inv("good")})]))
    assert ok[0]["type"] == "ack"
    assert any(n["name"] == "good" for n in master.client().call("nodes")["nodes"])


def test_garbage_does_not_lose_accepted_jobs(master: LocalCluster, tmp_path: Path) -> None:
    asyncio.run(node_exchange(master.url, [encode_frame("hello", 1, {"inventory": {
        **inv("keeper"), "gpus": [{"index": 0, "uuid": "G0", "model": "A100",
                                   "memory_mib": 1}]}})], wait=0.5))
    client = master.client()
    job = client.call("submit", {"job": {"name": "keep", "command": ["true"],
                                         "user": default_job_user(), "gpus": 1}})["job"]
    asyncio.run(node_exchange(master.url, [b"\xc1" * 100, pack({"v": 1})]))
    asyncio.run(rpc_raw(master.url, b"\x93\x01"))
    assert client.call("job", {"id": job["id"]})["job"]["id"] == job["id"]
