"""control.failover: several master URLs, the call reaches the one that leads (following a
standby's not_leader, passing over a master that refuses connections), and trellisctl takes
a comma-separated --master."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack
import pytest

from control.client import RpcError
from control.failover import FailoverClient, connect, split_urls
from demo.cluster import free_port


def serve(reply: dict) -> tuple[ThreadingHTTPServer, list[str]]:
    calls: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = msgpack.unpackb(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(body["method"])
            data = msgpack.packb({"v": 1, "id": body["id"], **reply})
            self.send_response(503 if "error" in reply else 200)
            self.send_header("Content-Type", "application/msgpack")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, calls


@pytest.fixture
def masters() -> Iterator[tuple[str, str, list[str], list[str]]]:
    leader, leader_calls = serve({"result": {"pong": True}})
    leader_url = f"http://127.0.0.1:{leader.server_address[1]}"
    standby, standby_calls = serve({"error": {
        "code": "not_leader", "message": f"this master is a standby; the leader is at "
        f"{leader_url}", "detail": {"leader": leader_url}}})
    standby_url = f"http://127.0.0.1:{standby.server_address[1]}"
    try:
        yield leader_url, standby_url, leader_calls, standby_calls
    finally:
        leader.shutdown()
        standby.shutdown()


def test_a_standby_sends_the_call_to_the_leader(masters) -> None:  # type: ignore[no-untyped-def]
    leader_url, standby_url, leader_calls, standby_calls = masters
    refused = f"http://127.0.0.1:{free_port()}"
    client = FailoverClient([refused, standby_url, leader_url], timeout=5)
    assert client.call("submit", {"job": {}, "id": "j1"}) == {"pong": True}
    assert leader_calls == ["submit"] and standby_calls == ["submit"]
    assert client.url == leader_url + "/v1/rpc"  # remembered for the next call
    assert client.call("jobs") == {"pong": True}
    assert standby_calls == ["submit"]


def test_no_leader_is_unreachable_within_the_timeout(masters) -> None:  # type: ignore[no-untyped-def]
    _, standby_url, _, _ = masters
    client = FailoverClient([standby_url, f"http://127.0.0.1:{free_port()}"], timeout=0.5)
    with pytest.raises(Exception, match=r"no master leads|cannot reach"):
        client.call("ping")


def test_other_errors_are_the_callers(masters) -> None:  # type: ignore[no-untyped-def]
    leader, failing_calls = serve({"error": {"code": "duplicate_job", "message": "taken"}})
    try:
        url = f"http://127.0.0.1:{leader.server_address[1]}"
        with pytest.raises(RpcError, match="duplicate_job"):
            FailoverClient([url, masters[0]], timeout=5).call("submit", {"id": "x"})
        assert failing_calls == ["submit"]
    finally:
        leader.shutdown()


def test_urls_and_trellisctl(masters, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    leader_url, standby_url, _, _ = masters
    assert split_urls(" http://a:1/ ,http://b:2,http://a:1") == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="no master URL"):
        split_urls(" , ")
    assert not isinstance(connect("http://a:1"), FailoverClient)
    import control.cli as cli

    monkeypatch.delenv("TRELLIS_TOKEN_FILE", raising=False)
    words = ["--master", f"{standby_url},{leader_url}", "jobs"]
    args = cli.build_parser(only=cli.command_word(words)).parse_args(words)
    client = cli.make_client(args)
    assert isinstance(client, FailoverClient)
    assert client.call("jobs") == {"pong": True}


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A master that is frozen: its kernel accepts connections (the listen backlog) and
    nothing ever answers."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_a_silent_master_costs_one_attempt_and_is_passed_over(  # type: ignore[no-untyped-def]
        masters, silent_url: str) -> None:
    import time

    leader_url, _, leader_calls, _ = masters
    # A standby that still names the silent leader (its lease has not expired yet).
    standby, standby_calls = serve({"error": {
        "code": "not_leader", "message": "standby", "detail": {"leader": silent_url}}})
    try:
        standby_url = f"http://127.0.0.1:{standby.server_address[1]}"
        client = FailoverClient([silent_url, standby_url, leader_url], timeout=20,
                                attempt_timeout=0.5)
        started = time.monotonic()
        assert client.call("jobs") == {"pong": True}
        # One attempt on the silent master, not one per time the standby names it.
        assert time.monotonic() - started < 0.5 + 1.0
        assert standby_calls == ["jobs"] and leader_calls == ["jobs"]
        # A submission with its own id may be resent: bounded the same way.
        client._current = 0
        started = time.monotonic()
        assert client.call("submit", {"job": {}, "id": "j1"}) == {"pong": True}
        assert time.monotonic() - started < 0.5 + 1.0
    finally:
        standby.shutdown()


def test_a_write_that_cannot_be_resent_keeps_the_whole_timeout(  # type: ignore[no-untyped-def]
        masters, silent_url: str) -> None:
    import time

    from control.client import Unreachable

    leader_url, _, leader_calls, _ = masters
    client = FailoverClient([silent_url, leader_url], timeout=1.5, attempt_timeout=0.2)
    started = time.monotonic()
    with pytest.raises(Unreachable, match="timed out"):
        client.call("cancel", {"job_id": "j1"})  # it may have been done: not resent
    assert time.monotonic() - started >= 1.4
    assert leader_calls == []
