"""The CLI's HTTP/1.1 transport against a real socket server that answers in each way HTTP
allows (length, chunked, to the close, interim 100), and in ways it does not."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from control.client import MasterClient, RpcError, Unreachable
from control.transport import BadUrl, HttpError, post, split_url
from shared.protocol import encode_rpc_error, encode_rpc_result


class OneShot:
    """Accepts connections on loopback; answers each request with ``reply`` (raw bytes) and
    remembers the request it read."""

    def __init__(self, reply: bytes, close: bool = True, delay_s: float = 0.0) -> None:
        self.reply = reply
        self.close = close
        self.delay_s = delay_s
        self.requests: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.1)  # accept() wakes up to see stop (a close does not wake it)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(5)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + body)
                if self.delay_s:
                    self.stop.wait(self.delay_s)
                conn.sendall(self.reply)
                if not self.close:
                    self.stop.wait(5)

    def shutdown(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def serve() -> Iterator:
    servers: list[OneShot] = []

    def make(reply: bytes, **kw: object) -> OneShot:
        server = OneShot(reply, **kw)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.shutdown()


def test_split_url() -> None:
    assert split_url("http://10.0.0.1:7400") == split_url("http://10.0.0.1:7400/")
    url = split_url("https://[::1]:9/base/")
    assert (url.scheme, url.host, url.port, url.path, url.authority) == (
        "https", "::1", 9, "/base/", "[::1]:9")
    assert split_url("HTTP://master").port == 80
    for bad, message in (("master:7400", "must start with http"), ("ftp://x", "must start"),
                         ("http://", "names no host"), ("http://x:99999", "not 1-65535"),
                         ("http://x:ab", "not 1-65535"), ("http://u@x", "expected http"),
                         ("http://[::1", "brackets")):
        with pytest.raises(BadUrl, match=message):
            split_url(bad)


def test_length_chunked_and_close_delimited_bodies(serve) -> None:  # type: ignore[no-untyped-def]
    body = encode_rpc_result(1, {"ok": True})
    replies = [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % 3 + body[:3] + b"\r\n" + b"%x;ext=1\r\n" % (len(body) - 3) + body[3:]
        + b"\r\n0\r\nX-Trailer: y\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Type: application/msgpack\r\n\r\n" + body,
    ]
    for raw in replies:
        server = serve(raw)
        client = MasterClient(f"http://127.0.0.1:{server.port}/", timeout=5)
        assert client.call("ping", {"x": 1}) == {"ok": True}
        request = server.requests[-1]
        assert request.startswith(b"POST /v1/rpc HTTP/1.1\r\n")
        assert b"Content-Type: application/msgpack" in request


def test_error_replies_become_rpc_errors(serve) -> None:  # type: ignore[no-untyped-def]
    body = encode_rpc_error(1, "batch_refused", "2 refused", {"refused": [{"index": 1}]})
    server = serve(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    with pytest.raises(RpcError) as err:
        MasterClient(f"http://127.0.0.1:{server.port}", timeout=5).call("submit_many")
    assert (err.value.code, err.value.detail) == ("batch_refused", {"refused": [{"index": 1}]})
    server = serve(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(RpcError, match="http_error: HTTP 502"):
        MasterClient(f"http://127.0.0.1:{server.port}", timeout=5).call("ping")


@pytest.mark.parametrize("raw", [
    b"",  # closed without a word
    b"SSH-2.0-OpenSSH_9.2\r\n\r\n",  # not HTTP
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # ends early
    b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
])
def test_what_is_not_http_is_unreachable(serve, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    server = serve(raw)
    with pytest.raises(Unreachable, match="cannot reach the master"):
        MasterClient(f"http://127.0.0.1:{server.port}", timeout=5).call("ping")


def test_a_silent_server_times_out(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(b"HTTP/1.1 200 OK\r\n", close=False)  # headers never end
    with pytest.raises(Unreachable, match="timed out"):
        MasterClient(f"http://127.0.0.1:{server.port}", timeout=0.5).call("ping")


def test_reply_size_is_capped(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 999999\r\n\r\n")
    with pytest.raises(HttpError, match="over the 1000-byte limit"):
        post(split_url(f"http://127.0.0.1:{server.port}"), "/v1/rpc", b"", {}, 5, None, 1000)


def test_refused_connection_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(Unreachable, match="cannot reach the master"):
            MasterClient(f"http://127.0.0.1:{port}", timeout=2).call("ping")
