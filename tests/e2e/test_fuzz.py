"""Fuzzing a real master: malformed msgpack, wrong types and random values on both endpoints.

Every case must be answered within a timeout with a clear error (code and message) or a
result, never a 500 or a traceback; the master must stay up and keep answering correctly.
The case counts are printed (run with ``-s`` to see them). Cases are derandomised so CI is
reproducible; set TRELLIS_FUZZ_RANDOM=1 to explore new ones.

The strategies (tests/fuzzcases.py: every RPC method's parameters and every node event,
near-valid and random) are those of bench/fuzz.py, which runs 100,000 cases and more; this is
the short version CI runs.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings

from demo.cluster import LocalCluster, default_job_user
from shared.protocol import MAX_FRAME, decode_frame, encode_frame
from tests.fuzzcases import (
    PROBE_BODY,
    PROBE_ID,
    expected_replies,
    hellos,
    inventory,
    node_frames,
    rpc_bodies,
    rpc_schemas,
    submit_after_fuzz,
)

REPLY_TIMEOUT = 5.0
RPC_CASES = int(os.environ.get("TRELLIS_FUZZ_RPC_CASES", "1500"))
NODE_CASES = int(os.environ.get("TRELLIS_FUZZ_NODE_CASES", "1000"))
HELLO_CASES = int(os.environ.get("TRELLIS_FUZZ_HELLO_CASES", "150"))
FUZZ_SETTINGS = dict(
    deadline=None, database=None,
    derandomize=os.environ.get("TRELLIS_FUZZ_RANDOM") != "1",
    suppress_health_check=list(HealthCheck),
)
NODE_NAME = "trellis-test-fuzz-n0"
PROBE = encode_frame("gpu_util", PROBE_ID, PROBE_BODY)


# -- drivers ----------------------------------------------------------------------------------


class RpcDriver:
    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes) -> tuple[int, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                       timeout=REPLY_TIMEOUT)
            try:
                self.conn.request("POST", "/v1/rpc", body=body,
                                  headers={"Content-Type": "application/msgpack"})
                response = self.conn.getresponse()
                data = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return response.status, data
            except (ConnectionError, http.client.RemoteDisconnected,
                    http.client.BadStatusLine) as exc:
                # A keep-alive connection the server closed between cases: one retry.
                self.conn.close()
                self.conn = None
                if attempt:
                    raise AssertionError(f"the master dropped the request: {exc}") from None
        raise AssertionError("unreachable")


class NodeDriver:
    """One WebSocket in a background loop; reconnects (with hello) when the master closes it."""

    def __init__(self, url: str) -> None:
        self.url = url + "/v1/node"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.closes = 0

    def run(self, coro: Any) -> Any:
        async def bounded() -> Any:
            return await asyncio.wait_for(coro, REPLY_TIMEOUT * 2)

        return asyncio.run_coroutine_threadsafe(bounded(), self.loop).result()

    async def _connect(self) -> None:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(self.url, max_msg_size=MAX_FRAME,
                                                heartbeat=None)
        await self.ws.send_bytes(encode_frame("hello", 1, {"inventory": inventory(NODE_NAME)}))
        reply = await self._reply()
        assert reply is not None and reply["type"] == "ack", reply

    async def _reply(self, ws: aiohttp.ClientWebSocketResponse | None = None) -> dict | None:
        ws = ws or self.ws
        assert ws is not None
        while True:
            if ws.closed:
                return None
            msg = await ws.receive(timeout=REPLY_TIMEOUT)
            if msg.type != aiohttp.WSMsgType.BINARY:
                return None
            frame = msgpack.unpackb(msg.data)
            if frame["type"] in ("ack", "error"):
                return frame
            # A command from the master (it placed a fuzz job here): refuse it, like a node
            # whose GPUs are busy.
            await ws.send_bytes(encode_frame("error", frame["id"], {
                "code": "gpus_busy", "message": "fuzz node refuses every command"}))

    async def _first_frame(self, frame: bytes) -> dict | None:
        """A new connection whose first frame is ``frame`` (a fuzzed hello): the master's
        answer (None: it closed the connection)."""
        assert self.session is not None
        ws = await self.session.ws_connect(self.url, max_msg_size=MAX_FRAME, heartbeat=None)
        try:
            await ws.send_bytes(frame)
            return await self._reply(ws)
        except ConnectionError:
            return None
        finally:
            await ws.close()

    def first_frame(self, frame: bytes) -> dict | None:
        return self.run(self._first_frame(frame))

    async def _exchange(self, frame: bytes) -> list[dict] | None:
        """Send the fuzz frame, then a probe event; every reply up to the probe's ack is the
        fuzz frame's (the master answers a connection's frames in order)."""
        if self.ws is None or self.ws.closed or self.ws._writer.transport.is_closing():
            await self._connect()
        assert self.ws is not None
        try:
            await self.ws.send_bytes(frame)
            await self.ws.send_bytes(PROBE)
        except ConnectionError:  # closed by the master after this or the previous frame
            self.closes += 1
            return None
        replies = []
        while True:
            reply = await self._reply()
            if reply is None:
                self.closes += 1
                return None
            if reply["id"] == PROBE_ID:
                assert reply["type"] == "ack", reply
                return replies
            replies.append(reply)

    def exchange(self, frame: bytes) -> list[dict] | None:
        return self.run(self._exchange(frame))

    def close(self) -> None:
        async def shutdown() -> None:
            if self.ws is not None:
                await self.ws.close()
            if self.session is not None:
                await self.session.close()

        self.run(shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("trellis-test-fuzz"), nodes=0,
                           prefix="trellis-test-fuzz",
                           extra_master={"command_timeout_s": 1})
    cluster.start_master()
    yield cluster
    cluster.close()


def check_rpc_reply(status: int, data: bytes) -> dict:
    assert status != 500, data
    reply = msgpack.unpackb(data)
    assert isinstance(reply, dict) and reply.get("v") == 1
    if "error" in reply:
        err = reply["error"]
        assert isinstance(err["code"], str) and err["code"] and err["code"] != "internal"
        assert isinstance(err["message"], str) and len(err["message"]) > 5
        assert 400 <= status < 500 or err["code"] == "store_unavailable"
    else:
        assert status == 200 and "result" in reply
    return reply


def test_fuzz_rpc_and_node_endpoints(master: LocalCluster) -> None:
    counts = {"rpc": 0, "rpc_errors": 0, "node": 0, "node_errors": 0, "node_closes": 0,
              "hello": 0}
    slowest = [0.0]
    rpc = RpcDriver(master.port)
    node = NodeDriver(master.url)
    # Every method's parameter schema, from a master's method table.
    schemas = rpc_schemas(master.root / "schemas")

    @settings(max_examples=RPC_CASES, **FUZZ_SETTINGS)
    @given(rpc_bodies(schemas, default_job_user()))
    def fuzz_rpc(body: bytes) -> None:
        t0 = time.monotonic()
        status, data = rpc.post(body)
        slowest[0] = max(slowest[0], time.monotonic() - t0)
        reply = check_rpc_reply(status, data)
        counts["rpc"] += 1
        counts["rpc_errors"] += "error" in reply

    @settings(max_examples=NODE_CASES, **FUZZ_SETTINGS)
    @given(node_frames())
    def fuzz_node(frame: bytes) -> None:
        t0 = time.monotonic()
        replies = node.exchange(frame)
        slowest[0] = max(slowest[0], time.monotonic() - t0)
        counts["node"] += 1
        if replies is None:
            # The master closes a session only for a frame over the limit (refused unread).
            assert len(frame) > MAX_FRAME, frame[:2000]
            counts["node_closes"] += 1
            return
        assert len(replies) == expected_replies(frame, decode_frame), (replies, frame)
        for reply in replies:
            check_node_reply(reply)

    @settings(max_examples=HELLO_CASES, **FUZZ_SETTINGS)
    @given(hellos())
    def fuzz_hello(frame: bytes) -> None:
        t0 = time.monotonic()
        reply = node.first_frame(frame)
        slowest[0] = max(slowest[0], time.monotonic() - t0)
        counts["hello"] += 1
        if reply is None:
            assert len(frame) > MAX_FRAME, frame[:2000]
            return
        check_node_reply(reply)

    def check_node_reply(reply: dict) -> None:
        assert reply["type"] in ("ack", "error")
        if reply["type"] == "error":
            body = reply["body"]
            assert body["code"] and body["code"] != "internal", body
            assert isinstance(body["message"], str) and len(body["message"]) > 5
            counts["node_errors"] += 1

    started = time.monotonic()
    try:
        # Register the fuzz node first so some fuzzed submissions are placed and launched.
        node.run(node._connect())
        fuzz_rpc()
        fuzz_node()
        fuzz_hello()
    finally:
        node.close()
    elapsed = time.monotonic() - started
    print(f"\nfuzz: {counts} in {elapsed:.1f} s, slowest reply {slowest[0] * 1000:.0f} ms")
    assert counts["rpc"] >= RPC_CASES * 0.9 and counts["node"] >= NODE_CASES * 0.9
    assert counts["hello"] >= HELLO_CASES * 0.9
    assert slowest[0] < REPLY_TIMEOUT
    # Still alive, still correct.
    assert master.master is not None and master.master.running
    client = master.client()
    assert client.call("ping")["version"]
    job = submit_after_fuzz(client, default_job_user())
    assert client.call("job", {"id": "after-fuzz"})["job"]["id"] == job["id"]
    log = Path(master.root / "master.log").read_text(errors="replace")
    assert "Traceback" not in log, log[log.find("Traceback") - 2000:][:6000]
