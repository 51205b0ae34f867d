"""msgpack framing for every Trellis conversation.

Two shapes travel on the wire:

* node channel (WebSocket, both directions): ``{"v": 1, "type": str, "id": int, "body": map}``;
  a reply carries the request's ``id`` and type ``"ack"`` or ``"error"``.
* RPC (HTTP POST of one msgpack map): request ``{"v": 1, "id": any, "method": str,
  "params": map}``, response ``{"v": 1, "id": same, "result": any}`` or
  ``{"v": 1, "id": same, "error": {"code": str, "message": str, "detail"?: map}}``.

Every frame is size-limited before it is parsed and msgpack's own limits cap nesting and
string sizes, so a hostile frame costs at most ``MAX_FRAME`` bytes of work.
"""

from __future__ import annotations

from collections import namedtuple

import msgpack

# This module is on trellisctl's start-up path, where ``typing`` (and the slow class
# creation of typing.NamedTuple) is not: named tuples come from collections, and typing is
# imported for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20  # 1 MiB: a node inventory of 1,024 GPUs fits many times over
MAX_METHOD = 64
MAX_NESTING = 32  # containers inside containers; real messages use fewer than 8
MAX_MESSAGE = 2000  # characters of an error message sent back
MAX_ID = 128


class ProtocolError(Exception):
    """A request that cannot be served; ``code`` is machine-readable, the message is a sentence
    for a human and names what was wrong. ``detail`` (optional) is machine-readable data the
    error body carries beside them (e.g. which jobs of a batch were refused)."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes, *, max_size: int = MAX_FRAME) -> Any:
    if len(data) > max_size:
        raise ProtocolError(
            "frame_too_large", f"frame of {len(data)} bytes exceeds the {max_size}-byte limit"
        )
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=max_size,
            max_bin_len=max_size,
            max_array_len=100_000,
            max_map_len=100_000,
            max_ext_len=0,
        )
    except msgpack.StackError:
        raise ProtocolError("too_deep", "frame is nested too deeply to parse") from None
    except ProtocolError:
        raise
    except (ValueError, msgpack.ExtraData, msgpack.FormatError) as exc:
        raise ProtocolError("bad_frame", f"frame is not valid msgpack: {exc}") from None
    except Exception as exc:  # msgpack raises assorted types on hostile input
        raise ProtocolError("bad_frame", f"frame is not valid msgpack: {exc}") from None
    check_nesting(obj)
    return obj


def check_nesting(obj: Any, limit: int = MAX_NESTING) -> None:
    """Refuse data nested deeper than ``limit``: deep values break ``repr`` and recursive code
    later (Python's recursion limit), so they are stopped at the door. Iterative, O(size).

    Exact type tests suffice: msgpack decodes maps and arrays to plain dicts and lists.
    """
    if type(obj) is not dict and type(obj) is not list:
        return
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise ProtocolError("too_deep", f"frame is nested deeper than {limit} levels")
        for child in (value.values() if type(value) is dict else value):
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))


def _check_version(obj: dict[str, Any]) -> None:
    version = obj.get("v")
    # The exact type: True and 1.0 equal 1 in Python, but are not the version number.
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(
            "bad_version",
            f"protocol version {version!r} is not supported (this side speaks "
            f"{PROTOCOL_VERSION})",
        )


# -- node channel -----------------------------------------------------------------------------


class Frame(namedtuple("Frame", "type id body")):
    # A named tuple, not a dataclass: dataclasses imports inspect, which would cost
    # trellisctl a third of a simple command's imports.
    __slots__ = ()
    type: str
    id: int
    body: dict[str, Any]


def encode_frame(type_: str, id_: int, body: dict[str, Any]) -> bytes:
    return pack({"v": PROTOCOL_VERSION, "type": type_, "id": id_, "body": body})


def decode_frame(data: bytes) -> Frame:
    obj = unpack(data)
    if not isinstance(obj, dict):
        raise ProtocolError("bad_frame", "frame must be a msgpack map")
    _check_version(obj)
    type_, id_, body = obj.get("type"), obj.get("id"), obj.get("body", {})
    if not isinstance(type_, str) or not type_:
        raise ProtocolError("bad_frame", "frame field 'type' must be a non-empty string")
    if isinstance(id_, bool) or not isinstance(id_, int) or not 0 <= id_ < 2**63:
        raise ProtocolError("bad_frame", "frame field 'id' must be a non-negative integer")
    if not isinstance(body, dict):
        raise ProtocolError("bad_frame", "frame field 'body' must be a map")
    return Frame(type_, id_, body)


def error_body(code: str, message: str, detail: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    if len(message) > MAX_MESSAGE:  # messages quote bad input: keep the echo bounded
        message = message[:MAX_MESSAGE - 20] + f"... ({len(message)} chars)"
    body: dict[str, Any] = {"code": code, "message": message}
    if detail is not None:
        body["detail"] = detail
    return body


# -- RPC --------------------------------------------------------------------------------------


class RpcRequest(namedtuple("RpcRequest", "id method params")):
    # A named tuple, not a frozen dataclass: built per request, and a frozen dataclass's
    # __init__ pays a setattr call per field.
    __slots__ = ()
    id: Any
    method: str
    params: dict[str, Any]


def decode_rpc_request(data: bytes) -> RpcRequest:
    obj = unpack(data)
    if not isinstance(obj, dict):
        raise ProtocolError("bad_request", "request must be a msgpack map")
    _check_version(obj)
    method, params, id_ = obj.get("method"), obj.get("params", {}), obj.get("id")
    if not isinstance(method, str) or not method:
        raise ProtocolError("bad_request", "request field 'method' must be a non-empty string")
    if not isinstance(params, dict):
        raise ProtocolError("bad_request", "request field 'params' must be a map")
    if len(method) > MAX_METHOD:
        raise ProtocolError("bad_request", f"request field 'method' is {len(method)} characters "
                            f"long, at most {MAX_METHOD} allowed")
    if not (id_ is None or isinstance(id_, int | str)) or isinstance(id_, bool):
        raise ProtocolError("bad_request", "request field 'id' must be an integer or a string")
    if isinstance(id_, str) and len(id_) > MAX_ID:
        # The id is echoed in the reply: a long one would be an amplifier.
        raise ProtocolError("bad_request", f"request field 'id' is {len(id_)} characters long, "
                            f"at most {MAX_ID} allowed")
    return RpcRequest(id_, method, params)


def encode_rpc_request(method: str, params: dict[str, Any], id_: Any = None) -> bytes:
    return pack({"v": PROTOCOL_VERSION, "id": id_, "method": method, "params": params})


def encode_rpc_result(id_: Any, result: Any) -> bytes:
    return pack({"v": PROTOCOL_VERSION, "id": id_, "result": result})


def encode_rpc_error(id_: Any, code: str, message: str,
                     detail: dict[str, Any] | None = None) -> bytes:
    return pack({"v": PROTOCOL_VERSION, "id": id_, "error": error_body(code, message, detail)})
