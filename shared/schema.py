"""Typed decoding of untrusted wire data into dataclasses.

Every message body is a dataclass; its type hints plus optional field metadata (``bounds``) are
the schema. Decoding walks the hints, so a schema is written once and cannot drift from the
data model. Errors name the offending field by its dotted path.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

MAX_DEPTH = 16
MAX_STRING = 4096
MAX_LIST = 100_000


class SchemaError(ValueError):
    """Wire data does not match the schema; ``field`` is the dotted path that failed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.reason = message


@dataclass(frozen=True)
class Bounds:
    """Constraints on one field beyond its Python type."""

    min: float | None = None
    max: float | None = None
    max_len: int | None = None
    pattern: str | None = None

    @property
    def regex(self) -> re.Pattern[str] | None:
        return _compiled(self.pattern) if self.pattern else None


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    min: float | None = None,
    max: float | None = None,
    max_len: int | None = None,
    pattern: str | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field carrying :class:`Bounds` for :func:`decode`."""
    meta = {"bounds": Bounds(min=min, max=max, max_len=max_len, pattern=pattern)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def decode(cls: type[T], data: Any, path: str = "") -> T:
    """Build ``cls`` (a dataclass) from msgpack-decoded ``data`` or raise :class:`SchemaError`."""
    return _decode(cls, data, path, None, 0)


def _decode(tp: Any, data: Any, path: str, bounds: Bounds | None, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise SchemaError(path, f"nested deeper than {MAX_DEPTH} levels")
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _decode(arg, data, path, bounds, depth)
            except SchemaError as exc:
                errors.append(exc.reason)
        raise SchemaError(path, errors[0] if len(errors) == 1 else "; ".join(errors))
    if tp is Any:
        return data
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _decode_dataclass(tp, data, path, depth)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        allowed = [m.value for m in tp]
        if data not in allowed:
            raise SchemaError(path, f"must be one of {', '.join(map(str, allowed))}, got {data!r}")
        return tp(data)
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        if not isinstance(data, list | tuple):
            raise SchemaError(path, f"must be a list, got {_kind(data)}")
        limit = bounds.max_len if bounds and bounds.max_len is not None else MAX_LIST
        if len(data) > limit:
            raise SchemaError(path, f"has {len(data)} items, at most {limit} allowed")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(data):
                raise SchemaError(path, f"must have exactly {len(args)} items")
            return tuple(
                _decode(a, v, f"{path}[{i}]", None, depth + 1)
                for i, (a, v) in enumerate(zip(args, data, strict=True))
            )
        item = args[0] if args else Any
        items = [_decode(item, v, f"{path}[{i}]", bounds, depth + 1) for i, v in enumerate(data)]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(data, dict):
            raise SchemaError(path, f"must be a map, got {_kind(data)}")
        if len(data) > MAX_LIST:
            raise SchemaError(path, f"has {len(data)} entries, at most {MAX_LIST} allowed")
        kt, vt = get_args(tp) or (Any, Any)
        return {
            _decode(kt, k, f"{path}<key>", None, depth + 1): _decode(
                vt, v, f"{path}.{k}", None, depth + 1
            )
            for k, v in data.items()
        }
    if tp is bool:
        if not isinstance(data, bool):
            raise SchemaError(path, f"must be true or false, got {_kind(data)}")
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise SchemaError(path, f"must be an integer, got {_kind(data)}")
        _check_range(data, path, bounds)
        return data
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise SchemaError(path, f"must be a number, got {_kind(data)}")
        value = float(data)
        if value != value or value in (float("inf"), float("-inf")):
            raise SchemaError(path, "must be a finite number")
        _check_range(value, path, bounds)
        return value
    if tp is str:
        if not isinstance(data, str):
            raise SchemaError(path, f"must be a string, got {_kind(data)}")
        limit = bounds.max_len if bounds and bounds.max_len is not None else MAX_STRING
        if len(data) > limit:
            raise SchemaError(path, f"is {len(data)} characters long, at most {limit} allowed")
        if "\x00" in data:
            raise SchemaError(path, "must not contain NUL characters")
        regex = bounds.regex if bounds else None
        if regex is not None and not regex.fullmatch(data):
            raise SchemaError(path, f"{data!r} does not match {bounds.pattern}")  # type: ignore[union-attr]
        return data
    if tp is bytes:
        if not isinstance(data, bytes):
            raise SchemaError(path, f"must be bytes, got {_kind(data)}")
        return data
    raise TypeError(f"schema type {tp!r} at {path or '<root>'} is not supported")


def _decode_dataclass(cls: type, data: Any, path: str, depth: int) -> Any:
    if not isinstance(data, dict):
        raise SchemaError(path, f"must be a map, got {_kind(data)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        shown = ", ".join(repr(k) for k in unknown[:3])
        raise SchemaError(path, f"unknown field(s) {shown}")
    kwargs = {}
    for name, field in fields.items():
        sub = f"{path}.{name}" if path else name
        if name not in data:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise SchemaError(sub, "is required")
            continue
        bounds = field.metadata.get("bounds")
        kwargs[name] = _decode(hints[name], data[name], sub, bounds, depth + 1)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        # __post_init__ checks that span several fields report through the same error type.
        if isinstance(exc, SchemaError):
            raise SchemaError(f"{path}.{exc.field}" if path and exc.field else exc.field or path,
                              exc.reason) from None
        raise SchemaError(path, str(exc)) from None


def _check_range(value: float, path: str, bounds: Bounds | None) -> None:
    if bounds is None:
        return
    if bounds.min is not None and value < bounds.min:
        raise SchemaError(path, f"must be at least {bounds.min:g}, got {value:g}")
    if bounds.max is not None and value > bounds.max:
        raise SchemaError(path, f"must be at most {bounds.max:g}, got {value:g}")


def _kind(data: Any) -> str:
    if data is None:
        return "nil"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        bytes: "bytes",
        list: "a list",
        tuple: "a list",
        dict: "a map",
    }.get(type(data), type(data).__name__)


def encode(obj: Any) -> Any:
    """Turn dataclasses/enums/tuples into plain msgpack-able values (the inverse of decode)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {encode(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, frozenset | set):
        return sorted(encode(v) for v in obj)
    return obj
