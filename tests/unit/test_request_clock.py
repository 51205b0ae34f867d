"""The connection guard's request clock finds request boundaries however bytes arrive."""

from __future__ import annotations

from masterd.api.limits import _RequestClock

BODY = b"\x84" + b"x" * 150
REQUEST = (b"POST /v1/rpc HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
           b"Content-Type: application/msgpack\r\ncOnTeNt-LeNgTh:  %d \r\n\r\n" % len(BODY)
           ) + BODY
GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def test_whole_request_in_one_chunk() -> None:
    clock = _RequestClock()
    clock.feed(REQUEST)
    assert clock.completed == 1 and not clock.partial


def test_every_split_point() -> None:
    clock = _RequestClock()
    for cut in range(1, len(REQUEST)):
        clock.feed(REQUEST[:cut])
        assert clock.partial
        clock.feed(REQUEST[cut:])
        assert not clock.partial
    assert clock.completed == len(REQUEST) - 1


def test_pipelined_and_trailing_partial_requests() -> None:
    clock = _RequestClock()
    clock.feed(REQUEST + GET + REQUEST)
    assert clock.completed == 3 and not clock.partial
    clock.feed(REQUEST + REQUEST[:20])
    assert clock.completed == 4 and clock.partial
    clock.feed(REQUEST[20:-5])
    assert clock.completed == 4 and clock.partial
    clock.feed(REQUEST[-5:] + GET)
    assert clock.completed == 6 and not clock.partial


def test_body_arriving_after_its_head() -> None:
    clock = _RequestClock()
    head_end = REQUEST.index(b"\r\n\r\n") + 4
    clock.feed(REQUEST[:head_end])
    assert clock.partial and clock.completed == 0
    clock.feed(BODY[:50])
    clock.feed(BODY[50:])
    assert clock.completed == 1 and not clock.partial
