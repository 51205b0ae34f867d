"""Fuzzing a real master: malformed msgpack, wrong types and random values on both endpoints.

Every case must be answered within a timeout with a clear error (code and message) or a
result, never a 500 or a traceback; the master must stay up and keep answering correctly.
The case counts are printed (run with ``-s`` to see them). Cases are derandomised so CI is
reproducible; set TRELLIS_FUZZ_RANDOM=1 to explore new ones.
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
from hypothesis import strategies as st

from demo.cluster import LocalCluster, default_job_user
from shared.messages import NODE_EVENTS
from shared.model import CpuCore, GpuInfo, NodeInventory
from shared.protocol import MAX_FRAME, ProtocolError, decode_frame, encode_frame
from shared.schema import encode

REPLY_TIMEOUT = 5.0
RPC_CASES = int(os.environ.get("TRELLIS_FUZZ_RPC_CASES", "1500"))
NODE_CASES = int(os.environ.get("TRELLIS_FUZZ_NODE_CASES", "1000"))
FUZZ_SETTINGS = dict(
    deadline=None, database=None,
    derandomize=os.environ.get("TRELLIS_FUZZ_RANDOM") != "1",
    suppress_health_check=list(HealthCheck),
)
METHODS = ["ping", "submit", "cancel", "jobs", "job", "nodes", "drain", "undrain", "place",
           "x" * 70, ""]
NODE_NAME = "trellis-test-fuzz-n"
PROBE_ID = 2**62 + 1  # fuzzed ids stay below 2**41
PROBE = encode_frame("gpu_util", PROBE_ID, {"index": 0, "utilization_pct": 1.0, "band": "idle"})

# -- strategies -------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.binary(max_size=40), st.sampled_from(["..", "/", "a/../b", "\x00", "x" * 300, ""]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=20)


def valid_job() -> dict[str, Any]:
    return {"name": "fuzz", "command": ["true"], "user": default_job_user(), "kind": "cpu",
            "cpus": 1}


JOB_FIELDS = ["name", "command", "user", "kind", "tenant", "qos", "gpus", "gpu_model", "cpus",
              "memory_mib", "env", "workdir", "model_type", "batch", "iterations", "deadline",
              "max_nodes", "pipelined_input", "unknown_field"]


@st.composite
def mutated_job(draw: st.DrawFn) -> dict[str, Any]:
    job = valid_job()
    for key in draw(st.lists(st.sampled_from(JOB_FIELDS), max_size=3)):
        if draw(st.booleans()):
            job[key] = draw(values)
        else:
            job.pop(key, None)
    return job


@st.composite
def rpc_params(draw: st.DrawFn, method: str) -> Any:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(values)
    if method == "submit":
        params: dict[str, Any] = {"job": draw(mutated_job())}
        if draw(st.booleans()):
            params["id"] = draw(st.one_of(st.text(max_size=70), values))
        return params
    keys = {"cancel": "id", "job": "id", "drain": "node", "undrain": "node"}
    if method in keys:
        return {keys[method]: draw(st.one_of(st.text(max_size=80), values))}
    if method == "jobs":
        return draw(st.dictionaries(st.sampled_from(["state", "tenant", "node", "limit", "x"]),
                                    values, max_size=3))
    return draw(st.dictionaries(st.text(max_size=8), values, max_size=3))


@st.composite
def rpc_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:
        return msgpack.packb(draw(values), use_bin_type=draw(st.booleans()))
    method = draw(st.sampled_from(METHODS))
    envelope: dict[Any, Any] = {"v": 1, "id": draw(st.one_of(st.integers(0, 2**40),
                                                             st.text(max_size=20))),
                                "method": method, "params": draw(rpc_params(method))}
    if kind == 2:
        key = draw(st.sampled_from(["v", "id", "method", "params"]))
        envelope[key] = draw(values)
    body = msgpack.packb(envelope, use_bin_type=True)
    if kind == 3 and body:  # truncated or corrupted
        cut = draw(st.integers(0, len(body) - 1))
        body = body[:cut] + draw(st.binary(max_size=3))
    return body


def inventory(name: str = NODE_NAME) -> dict[str, Any]:
    return encode(NodeInventory(
        name=name, hostname="fuzz", address="127.0.0.1", memory_mib=4096,
        gpus=(GpuInfo(index=0, uuid="GPU-fuzz", model="A100-SXM4-40GB", memory_mib=40960),),
        cpus=(CpuCore(id=0), CpuCore(id=1))))


@st.composite
def node_frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:
        return msgpack.packb(draw(values), use_bin_type=True)
    type_ = draw(st.sampled_from([*NODE_EVENTS, "ack", "error", "prepare_job", "bogus"]))
    if type_ == "hello":
        inv = inventory()
        for key in draw(st.lists(st.sampled_from([*list(inv), "extra"]), max_size=2)):
            inv[key] = draw(values)
        body: Any = {"inventory": inv, "jobs": draw(st.one_of(
            st.just([]), st.lists(st.fixed_dictionaries({
                "job_id": st.one_of(st.text(max_size=70), values),
                "state": st.sampled_from(["prepared", "running", "exited", "bogus"]),
                "exit_code": st.one_of(st.none(), st.integers(-300, 300))}), max_size=3),
            values))}
    elif type_ in ("job_started", "job_exited"):
        body = {"job_id": draw(st.one_of(st.sampled_from(["fuzz-1", "nope", ".."]),
                                         st.text(max_size=70), values)),
                "pid": draw(st.one_of(st.integers(-5, 2**40), values)),
                "exit_code": draw(st.one_of(st.none(), st.integers(-300, 300), values))}
        if type_ == "job_exited":
            body.pop("pid")
    elif type_ == "gpu_util":
        body = {"index": draw(st.one_of(st.integers(-5, 2000), values)),
                "utilization_pct": draw(st.one_of(st.floats(), values)),
                "band": draw(st.one_of(st.sampled_from(["idle", "high", "x"]), values))}
    else:
        body = draw(st.one_of(st.dictionaries(st.text(max_size=10), values, max_size=4),
                              values))
    frame: dict[Any, Any] = {"v": 1, "type": type_, "id": draw(st.integers(0, 2**40) | values),
                             "body": body}
    if draw(st.integers(0, 5)) == 0:
        frame[draw(st.sampled_from(["v", "type", "id", "body"]))] = draw(values)
    return msgpack.packb(frame, use_bin_type=True)


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
        await self.ws.send_bytes(encode_frame("hello", 1, {"inventory": inventory()}))
        reply = await self._reply()
        assert reply is not None and reply["type"] == "ack", reply

    async def _reply(self) -> dict | None:
        assert self.ws is not None
        while True:
            if self.ws.closed:
                return None
            msg = await self.ws.receive(timeout=REPLY_TIMEOUT)
            if msg.type != aiohttp.WSMsgType.BINARY:
                return None
            frame = msgpack.unpackb(msg.data)
            if frame["type"] in ("ack", "error"):
                return frame
            # A command from the master (it placed a fuzz job here): refuse it, like a node
            # whose GPUs are busy.
            await self.ws.send_bytes(encode_frame("error", frame["id"], {
                "code": "gpus_busy", "message": "fuzz node refuses every command"}))

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
    counts = {"rpc": 0, "rpc_errors": 0, "node": 0, "node_errors": 0, "node_closes": 0}
    slowest = [0.0]
    rpc = RpcDriver(master.port)
    node = NodeDriver(master.url)

    @settings(max_examples=RPC_CASES, **FUZZ_SETTINGS)
    @given(rpc_bodies())
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
            counts["node_closes"] += 1
            return
        try:
            parsed = decode_frame(frame)
            expected = 0 if parsed.type in ("ack", "error") else 1
        except ProtocolError:
            expected = 1
        assert len(replies) == expected, (replies, frame)
        for reply in replies:
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
    finally:
        node.close()
    elapsed = time.monotonic() - started
    print(f"\nfuzz: {counts} in {elapsed:.1f} s, slowest reply {slowest[0] * 1000:.0f} ms")
    assert counts["rpc"] >= RPC_CASES * 0.9 and counts["node"] >= NODE_CASES * 0.9
    assert slowest[0] < REPLY_TIMEOUT
    # Still alive, still correct.
    assert master.master is not None and master.master.running
    client = master.client()
    assert client.call("ping")["version"]
    job = client.call("submit", {"job": valid_job(), "id": "after-fuzz"})["job"]
    assert client.call("job", {"id": "after-fuzz"})["job"]["id"] == job["id"]
    log = Path(master.root / "master.log").read_text(errors="replace")
    assert "Traceback" not in log, log[log.find("Traceback") - 2000:][:6000]
