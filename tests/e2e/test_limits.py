"""Slow senders, connection floods, deep and hostile names against a real master and noded.

(test_hostile_input.py covers malformed frames and oversized bodies; this file covers time,
connection counts, nesting and names that would become paths.)
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import msgpack
import pytest
from aiohttp import web

from control.client import RpcError, Unreachable
from demo.cluster import LocalCluster, default_job_user
from shared.model import JobSpec, NodeAllocation
from shared.protocol import MAX_NESTING, encode_frame, encode_rpc_request, pack
from shared.schema import encode
from tests.unit.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 1.0
CAP = 12


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("trellis-test-limits"), nodes=0,
                           prefix="trellis-test-limits",
                           extra_master={"request_timeout_s": TIMEOUT,
                                         "hello_timeout_s": TIMEOUT,
                                         "max_connections_per_ip": CAP})
    cluster.start_master()
    yield cluster
    cluster.close()


def connect(cluster: LocalCluster) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", cluster.port), timeout=10)
    return sock


def read_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def trickle(sock: socket.socket, data: bytes, interval: float, stop: threading.Event) -> None:
    """Send ``data`` a byte every ``interval`` seconds: the pace is the point (a slow sender
    the master must cut off), not a wait for anything."""
    for byte in data:
        if stop.is_set():
            return
        try:
            sock.send(bytes([byte]))
        except OSError:
            return
        time.sleep(interval)


def msgpack_body(http: bytes) -> dict:
    return msgpack.unpackb(http.split(b"\r\n\r\n", 1)[1])


def ping_served(cluster: LocalCluster) -> bool:
    """One ping; False if the master refused the connection for want of a slot."""
    try:
        return bool(cluster.client(timeout=5).call("ping")["version"])
    except RpcError as exc:
        if exc.code == "too_many_connections":
            return False
        raise
    except Unreachable:  # refused and closed before the reply could be read
        return False


def ping_ms(cluster: LocalCluster) -> float:
    t0 = time.perf_counter()
    assert cluster.client(timeout=5).call("ping")["version"]
    return (time.perf_counter() - t0) * 1000


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_slow_sender_is_cut_off_without_blocking_others(master: LocalCluster,
                                                        phase: str) -> None:
    body = encode_rpc_request("ping", {}, 1)
    head = (f"POST /v1/rpc HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    stop = threading.Event()
    slow = [connect(master) for _ in range(4)]
    threads = []
    for sock in slow:
        if phase == "headers":
            data = head + body
        else:
            sock.sendall(head)  # headers at once, then the body a byte at a time
            data = body
        t = threading.Thread(target=trickle, args=(sock, data, 0.15, stop), daemon=True)
        t.start()
        threads.append(t)
    try:
        t0 = time.monotonic()
        # Everyone else is served at once while the slow senders dribble.
        assert max(ping_ms(master) for _ in range(5)) < 1000
        replies = [read_all(sock, TIMEOUT + 4) for sock in slow]
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        for sock in slow:
            sock.close()
    assert elapsed < TIMEOUT + 4
    for reply in replies:
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        err = msgpack_body(reply)["error"]
        assert err["code"] == "request_timeout" and "did not arrive within" in err["message"]
    assert ping_ms(master) < 1000


def test_silent_connection_is_closed(master: LocalCluster) -> None:
    sock = connect(master)
    try:
        reply = read_all(sock, TIMEOUT + 3)
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 408")


def test_connections_per_address_are_capped(master: LocalCluster) -> None:
    held = []
    try:
        # Keep-alive connections that finished a request sit idle and still count.
        for _ in range(CAP):
            sock = connect(master)
            body = encode_rpc_request("ping", {}, 1)
            sock.sendall(b"POST /v1/rpc HTTP/1.1\r\nHost: x\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            sock.settimeout(5)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            held.append(sock)
        extra = connect(master)
        reply = read_all(extra, 3)
        extra.close()
        assert reply.startswith(b"HTTP/1.1 503"), reply[:100]
        err = msgpack_body(reply)["error"]
        assert err["code"] == "too_many_connections"
        assert f"at most {CAP} are allowed per address" in err["message"]
    finally:
        for sock in held:
            sock.close()
    # Slots are given back when connections close (the master sees each close a little later).
    wait_for(lambda: ping_served(master), what="a connection slot to be given back")
    assert ping_ms(master) < 1000


async def _ws(cluster: LocalCluster, frames: list[bytes], trickle_last: bool = False,
              wait: float = 5.0) -> tuple[list, float]:
    replies: list = []
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as s, s.ws_connect(cluster.url + "/v1/node",
                                                          heartbeat=None) as ws:
        for frame in frames:
            await ws.send_bytes(frame)
        if trickle_last:
            # A frame header promising 100 bytes, then nothing more: a half-sent frame.
            writer = ws._writer.transport  # type: ignore[attr-defined]
            writer.write(bytes([0x82, 0x80 | 100, 1, 2, 3, 4]) + b"\x00" * 10)
        deadline = t0 + wait
        while time.monotonic() < deadline:
            msg = await ws.receive(timeout=deadline - time.monotonic())
            if msg.type != aiohttp.WSMsgType.BINARY:
                replies.append(("closed", ws.close_code))
                break
            replies.append(msgpack.unpackb(msg.data))
    return replies, time.monotonic() - t0


def _hello(name: str) -> bytes:
    inv = {"name": name, "hostname": "h", "address": "127.0.0.1", "memory_mib": 1}
    return encode_frame("hello", 1, {"inventory": inv})


def test_node_that_never_says_hello_is_dropped(master: LocalCluster) -> None:
    replies, elapsed = asyncio.run(_ws(master, []))
    assert replies == [("closed", 1008)]
    assert elapsed < TIMEOUT + 2


def test_half_sent_node_frame_is_cut_off(master: LocalCluster) -> None:
    replies, elapsed = asyncio.run(_ws(master, [_hello("trellis-test-slow")],
                                       trickle_last=True))
    assert replies[0]["type"] == "ack"
    assert replies[-1][0] == "closed"
    assert elapsed < TIMEOUT + 3


def deep(levels: int) -> object:
    value: object = "x"
    for _ in range(levels):
        value = [value]
    return value


BAD_UTF8 = b"\xa4\xff\xfe/."  # msgpack str of 4 bytes that are not UTF-8


@pytest.mark.parametrize(
    ("params", "code", "fragment"),
    [
        ({"id": ".."}, "invalid_params", "job id '..' is not a valid name"),
        ({"id": "a/b"}, "invalid_params", "job id 'a/b' is not a valid name"),
        ({"id": "a\x00b"}, "invalid_params", "id: must not contain NUL"),
        ({"id": "x" * 300}, "invalid_params", "at most 256 allowed"),
        ({"job": {"tenant": "../../etc"}}, "invalid_params", "job.tenant"),
        ({"job": {"tenant": "t" * 100_000}}, "invalid_params", "at most 4096 allowed"),
        ({"job": {"name": "-x"}}, "invalid_params", "job.name"),
        ({"job": {"env": {"A": deep(8)}}}, "invalid_params", "job.env.A: must be a string"),
        ({"job": {"qos": deep(MAX_NESTING + 5)}}, "too_deep", "deeper than"),
    ],
)
def test_hostile_submissions(master: LocalCluster, params: dict, code: str,
                             fragment: str) -> None:
    job = {"name": "ok", "command": ["true"], "user": default_job_user(), "kind": "cpu"}
    job.update(params.pop("job", {}))
    body = encode_rpc_request("submit", {"job": job, **params}, 7)
    status, reply = asyncio.run(_post(master, body))
    assert status in (400, 413), reply
    assert reply["error"]["code"] == code
    assert fragment in reply["error"]["message"]
    assert len(reply["error"]["message"]) <= 2000
    assert master.client().call("jobs")["jobs"] == []


def test_nesting_beyond_the_parser_stack(master: LocalCluster) -> None:
    body = _raw_rpc("submit", b"\x81\xa3job" + b"\x91" * 5000 + b"\x01")
    status, reply = asyncio.run(_post(master, body))
    assert status == 400 and reply["error"]["code"] == "too_deep"
    assert "nested too deeply" in reply["error"]["message"]


async def _post(cluster: LocalCluster, body: bytes) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(cluster.url + "/v1/rpc", data=body) as r:
        return r.status, msgpack.unpackb(await r.read())


def _raw_rpc(method: str, params_bytes: bytes, id_: bytes = b"\x01") -> bytes:
    """A request map whose params are given as raw msgpack (to smuggle non-UTF-8 strings)."""
    return (b"\x84\xa1v\x01\xa2id" + id_ + b"\xa6method" + pack(method) + b"\xa6params"
            + params_bytes)


@pytest.mark.parametrize(
    "body",
    [
        _raw_rpc("job", b"\x81\xa2id" + BAD_UTF8),
        _raw_rpc("drain", b"\x81\xa4node" + BAD_UTF8),
        _raw_rpc("jobs", b"\x81\xa6tenant" + BAD_UTF8),
        _raw_rpc("ping", b"\x80", id_=BAD_UTF8),
        b"\x84\xa1v\x01\xa2id\x01\xa6method" + BAD_UTF8 + b"\xa6params\x80",
        _raw_rpc("job", b"\x81" + BAD_UTF8 + b"\x01"),  # a non-UTF-8 map key
    ],
)
def test_non_utf8_strings_are_refused(master: LocalCluster, body: bytes) -> None:
    status, reply = asyncio.run(_post(master, body))
    assert status == 400
    assert reply["error"]["code"] == "bad_frame"
    assert "utf-8" in reply["error"]["message"]


@pytest.mark.parametrize(
    ("request_map", "fragment"),
    [
        ({"v": 1, "id": "i" * 200, "method": "ping"}, "'id' is 200 characters long"),
        ({"v": 1, "id": 1, "method": "m" * 100_000}, "'method' is 100000 characters long"),
    ],
)
def test_request_envelope_limits(master: LocalCluster, request_map: dict,
                                 fragment: str) -> None:
    status, reply = asyncio.run(_post(master, pack(request_map)))
    assert status == 400 and reply["error"]["code"] == "bad_request"
    assert fragment in reply["error"]["message"]
    assert reply["id"] is None


@pytest.mark.parametrize(
    ("frame", "fragment"),
    [
        (encode_frame("hello", 1, {"inventory": {"name": "..", "hostname": "h",
                                                 "address": "a"}}), "inventory.name"),
        (encode_frame("hello", 1, {"inventory": {"name": "n/../x", "hostname": "h",
                                                 "address": "a"}}), "inventory.name"),
        (encode_frame("hello", 1, {"inventory": {"name": "n" * 5000, "hostname": "h",
                                                 "address": "a"}}), "at most 4096"),
        (b"\x84\xa1v\x01\xa4type\xa5hello\xa2id\x01\xa4body\x81\xa9inventory\x83\xa4name"
         + BAD_UTF8 + b"\xa8hostname\xa1h\xa7address\xa1a", "utf-8"),
        (encode_frame("hello", 1, {"inventory": deep(100)}), "deeper than"),
    ],
)
def test_hostile_node_names(master: LocalCluster, frame: bytes, fragment: str) -> None:
    replies, _ = asyncio.run(_ws(master, [frame], wait=2))
    assert replies and replies[0]["type"] == "error", replies
    assert fragment in replies[0]["body"]["message"]
    names = [n["name"] for n in master.client().call("nodes")["nodes"]]
    assert all(".." not in n and "/" not in n for n in names)


def test_master_logged_no_traceback(master: LocalCluster) -> None:
    """Runs after the tests above on the same master: all of that was handled, not crashed."""
    log = master.log("master")
    assert "Traceback" not in log and "Error handling request" not in log, log
    assert "request not received within" in log  # the slow senders were logged


# -- noded facing a hostile master ------------------------------------------------------------


class FakeMaster:
    """A master that sends noded whatever a test wants and records the replies."""

    def __init__(self) -> None:
        self.replies: asyncio.Queue[dict] = asyncio.Queue()
        self.ws: web.WebSocketResponse | None = None
        self.hello = asyncio.Event()

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=1 << 20)
        await ws.prepare(request)
        self.ws = ws
        async for msg in ws:
            frame = msgpack.unpackb(msg.data)
            if frame["type"] == "hello":
                await ws.send_bytes(encode_frame("ack", frame["id"], {}))
                self.hello.set()
            elif frame["type"] in ("ack", "error"):
                await self.replies.put(frame)
        return ws


@pytest.mark.parametrize("bad_id", ["..", "../../etc", "a/b", "a\x00b", "x" * 300, BAD_UTF8])
async def test_noded_refuses_hostile_job_names(tmp_path: Path, bad_id: str | bytes) -> None:
    fake = FakeMaster()
    app = web.Application()
    app.router.add_get("/v1/node", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state = tmp_path / "node"
    cfg = tmp_path / "n.toml"
    cfg.write_text(f'[node]\nname = "trellis-test-victim"\nmaster_url = '
                   f'"http://127.0.0.1:{port}"\nstate_dir = "{state}"\n'
                   f'cgroup_mode = "affinity"\n[gpu]\ncount = 1\n')
    proc = subprocess.Popen([sys.executable, "-m", "noded.main", "-c", str(cfg)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        await asyncio.wait_for(fake.hello.wait(), 20)
        spec = encode(JobSpec(name="j", command=("true",), user=default_job_user(), gpus=1))
        alloc = encode(NodeAllocation(node="trellis-test-victim", gpus=(0,), cpus=(0,)))
        if isinstance(bad_id, bytes):
            body = (b"\x83\xa6job_id" + bad_id + b"\xa4spec" + pack(spec) + b"\xaaallocation"
                    + pack(alloc))
            frame = b"\x84\xa1v\x01\xa4type\xabprepare_job\xa2id\x02\xa4body" + body
        else:
            frame = encode_frame("prepare_job", 2, {"job_id": bad_id, "spec": spec,
                                                    "allocation": alloc})
        assert fake.ws is not None
        await fake.ws.send_bytes(frame)
        if isinstance(bad_id, bytes):
            # An unparseable command has no trustworthy id: noded logs it and stays up.
            await fake.ws.send_bytes(encode_frame("forget_job", 4, {"job_id": "fine"}))
        reply = await asyncio.wait_for(fake.replies.get(), 10)
        if isinstance(bad_id, bytes):
            assert reply["type"] == "ack" and reply["id"] == 4
        else:
            assert reply["type"] == "error" and reply["id"] == 2
            assert reply["body"]["code"] == "invalid_message"
            assert "job_id" in reply["body"]["message"]
        assert proc.poll() is None
        jobs = state / "jobs"
        assert not jobs.exists() or list(jobs.iterdir()) == []
        assert {p.name for p in tmp_path.iterdir()} <= {"node", "n.toml"}
    finally:
        proc.terminate()
        proc.wait(10)
        await runner.cleanup()
