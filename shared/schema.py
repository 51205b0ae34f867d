"""Typed decoding of untrusted wire data into dataclasses.

Every message body is a dataclass; its type hints plus optional field metadata (``bounds``) are
the schema. Decoding walks the hints, so a schema is written once and cannot drift from the
data model. Errors name the offending field by its dotted path.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import operator
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

MAX_DEPTH = 16
MAX_STRING = 4096
MAX_LIST = 100_000
# An integer field without bounds of its own holds a signed 64-bit integer: what SQLite, the
# journal and every peer can store (msgpack alone would carry up to 2**64 - 1).
MIN_INT = -(1 << 63)
MAX_INT = (1 << 63) - 1


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


def decode(cls: type[T], data: Any, path: str = "") -> T:
    """Build ``cls`` (a dataclass) from msgpack-decoded ``data`` or raise :class:`SchemaError`."""
    return _decoder(cls, None)(data, path, 0)


Decoder = Callable[[Any, str, int], Any]


@cache
def _decoder(tp: Any, bounds: Bounds | None) -> Decoder:
    """Compile a decoder for ``tp`` once; every later decode of that type reuses it.

    Walking type hints per message costs more than the HTTP itself on a busy master, so the
    walk happens once per (type, bounds) and the result is a tree of closures.
    """
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union_decoder(tp, bounds)
    if tp is Any:
        return lambda data, path, depth: data
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass_decoder(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        by_value = {m.value: m for m in tp}
        allowed = ", ".join(map(str, by_value))

        def enum_(data: Any, path: str, depth: int) -> Any:
            try:
                return by_value[data]
            except (KeyError, TypeError):
                raise SchemaError(path, f"must be one of {allowed}, got {data!r}") from None

        return enum_
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        return _sequence_decoder(tp, origin, bounds)
    if origin in (dict, Mapping) or tp is dict:
        return _mapping_decoder(tp)
    if tp is bool:
        def bool_(data: Any, path: str, depth: int) -> Any:
            if data is not True and data is not False:
                raise SchemaError(path, f"must be true or false, got {_kind(data)}")
            return data

        return bool_
    if tp is int:
        lo, hi = _int_range(bounds)

        def int_(data: Any, path: str, depth: int) -> Any:
            if type(data) is not int:
                raise SchemaError(path, f"must be an integer, got {_kind(data)}")
            if not lo <= data <= hi:
                _range_error(data, data, path, lo, hi)
            return data

        return int_
    if tp is float:
        lo, hi = _range(bounds)

        def float_(data: Any, path: str, depth: int) -> Any:
            if type(data) not in (int, float):
                raise SchemaError(path, f"must be a number, got {_kind(data)}")
            value = float(data)
            if not math.isfinite(value):
                raise SchemaError(path, "must be a finite number")
            if not lo <= value <= hi:
                _range_error(value, data, path, lo, hi)
            return value

        return float_
    if tp is str:
        limit = bounds.max_len if bounds and bounds.max_len is not None else MAX_STRING
        regex = bounds.regex if bounds else None
        # Names, users and tenants recur in message after message: a string that passed
        # once passes again, without the pattern match.
        passed: set[str] = set()

        def str_(data: Any, path: str, depth: int) -> Any:
            if type(data) is not str:
                raise SchemaError(path, f"must be a string, got {_kind(data)}")
            if data in passed:
                return data
            if len(data) > limit:
                raise SchemaError(path, f"is {len(data)} characters long, at most {limit} "
                                  "allowed")
            if "\x00" in data:
                raise SchemaError(path, "must not contain NUL characters")
            if regex is not None:
                if not regex.fullmatch(data):
                    raise SchemaError(path, f"{data!r} does not match {bounds.pattern}")  # type: ignore[union-attr]
                if len(data) <= _PASSED_LENGTH:  # names, not documents: memory stays small
                    if len(passed) >= _PASSED_STRINGS:
                        passed.clear()
                    passed.add(data)
            return data

        return str_
    if tp is bytes:
        def bytes_(data: Any, path: str, depth: int) -> Any:
            if type(data) is not bytes:
                raise SchemaError(path, f"must be bytes, got {_kind(data)}")
            return data

        return bytes_
    raise TypeError(f"schema type {tp!r} is not supported")


def _union_decoder(tp: Any, bounds: Bounds | None) -> Decoder:
    args = get_args(tp)
    nullable = type(None) in args
    options = [_decoder(a, bounds) for a in args if a is not type(None)]

    def union(data: Any, path: str, depth: int) -> Any:
        if data is None and nullable:
            return None
        errors = []
        for option in options:
            try:
                return option(data, path, depth)
            except SchemaError as exc:
                errors.append(exc.reason)
        raise SchemaError(path, errors[0] if len(errors) == 1 else "; ".join(errors))

    return union


def _sequence_decoder(tp: Any, origin: Any, bounds: Bounds | None) -> Decoder:
    limit = bounds.max_len if bounds and bounds.max_len is not None else MAX_LIST
    args = get_args(tp)
    as_tuple = origin is tuple or tp is tuple
    if origin is tuple and args and args[-1] is not Ellipsis:
        items = [_decoder(a, None) for a in args]

        def fixed(data: Any, path: str, depth: int) -> Any:
            if type(data) not in (list, tuple):
                raise SchemaError(path, f"must be a list, got {_kind(data)}")
            if len(items) != len(data):
                raise SchemaError(path, f"must have exactly {len(items)} items")
            _depth(path, depth)
            return tuple(f(v, f"{path}[{i}]", depth + 1)
                         for i, (f, v) in enumerate(zip(items, data, strict=True)))

        return fixed
    item_type = args[0] if args else Any
    item = _decoder(item_type, bounds)
    item_paths = _PathCache(lambda path, i: f"{path}[{i}]")
    # Items that need no check beyond their type and size (a command line, say) are checked
    # in one pass; the per-item decoder runs only to name the item that failed.
    plain_str = item_type is str and (bounds is None or bounds.pattern is None)
    item_limit = bounds.max_len if bounds and bounds.max_len is not None else MAX_STRING

    def sequence(data: Any, path: str, depth: int) -> Any:
        if type(data) not in (list, tuple):
            raise SchemaError(path, f"must be a list, got {_kind(data)}")
        if len(data) > limit:
            raise SchemaError(path, f"has {len(data)} items, at most {limit} allowed")
        if depth > MAX_DEPTH:
            _depth(path, depth)
        if plain_str:
            for v in data:  # a loop, not all(): no generator per message
                if type(v) is not str or len(v) > item_limit or "\x00" in v:
                    break
            else:
                return tuple(data) if as_tuple else list(data)
        paths = item_paths.get(path, range(min(len(data), _CACHED_ITEMS)))
        out = [item(v, paths[i] if i < len(paths) else f"{path}[{i}]", depth + 1)
               for i, v in enumerate(data)]
        return tuple(out) if as_tuple else out

    return sequence


def _mapping_decoder(tp: Any) -> Decoder:
    kt, vt = get_args(tp) or (Any, Any)
    key, value = _decoder(kt, None), _decoder(vt, None)

    def mapping(data: Any, path: str, depth: int) -> Any:
        if type(data) is not dict:
            raise SchemaError(path, f"must be a map, got {_kind(data)}")
        if len(data) > MAX_LIST:
            raise SchemaError(path, f"has {len(data)} entries, at most {MAX_LIST} allowed")
        _depth(path, depth)
        return {key(k, f"{path}<key>", depth + 1): value(v, f"{path}.{k}", depth + 1)
                for k, v in data.items()}

    return mapping


def _dataclass_decoder(cls: type) -> Decoder:
    hints = get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    known = frozenset(f.name for f in fields)
    required = [f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    # Resolved lazily: a dataclass may refer to itself or to one defined later.
    spec_of = {f.name: (hints[f.name], f.metadata.get("bounds")) for f in fields}
    # Each field's decoder, resolved on first use: looking it up through _decoder's cache
    # hashes typing objects, which cost more than decoding the value itself.
    resolved: dict[str, Decoder] = {}
    build = _builder(cls)
    # Dotted paths of the fields under each parent path seen: formatting them per field and
    # per message cost more than most values' checks.
    field_paths = _PathCache(lambda path, name: f"{path}.{name}" if path else name)

    def dataclass_(data: Any, path: str, depth: int) -> Any:
        if type(data) is not dict:
            raise SchemaError(path, f"must be a map, got {_kind(data)}")
        if depth > MAX_DEPTH:
            _depth(path, depth)
        if not data.keys() <= known:
            data = _relocated(cls, data)  # fields that moved into a group, if any
            if not data.keys() <= known:
                unknown = [k for k in data if k not in known]
                shown = ", ".join(repr(k) for k in unknown[:3])
                raise SchemaError(path, f"unknown field(s) {shown}")
        paths = field_paths.get(path, known)
        for name in required:
            if name not in data:
                raise SchemaError(paths[name], "is required")
        kwargs = {}
        for name, value in data.items():
            field_decoder = resolved.get(name)
            if field_decoder is None:
                field_decoder = resolved[name] = _decoder(*spec_of[name])
            kwargs[name] = field_decoder(value, paths[name], depth + 1)
        try:
            return build(kwargs)
        except SchemaError as exc:
            raise SchemaError(f"{path}.{exc.field}" if path and exc.field else exc.field or path,
                              exc.reason) from None
        except (ValueError, TypeError) as exc:
            # __post_init__ checks that span several fields report through the same error type.
            raise SchemaError(path, str(exc)) from None

    return dataclass_


def _relocated(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the fields ``cls.__moved__`` names (an old top-level field -> the group
    it now lives in) filed under their group, so what was written before still decodes. A
    field given both ways keeps the group's value."""
    moved: Mapping[str, str] | None = getattr(cls, "__moved__", None)
    if not moved or not any(k in moved for k in data):
        return data
    out = {k: v for k, v in data.items() if k not in moved}
    copied: set[str] = set()
    for key, group in moved.items():
        if key not in data:
            continue
        nested = out.get(group)
        if nested is None:
            nested = {}
        elif not isinstance(nested, dict):
            continue  # the group itself is malformed: its own decoder says so
        elif group not in copied:
            nested = dict(nested)  # never change the caller's map
        copied.add(group)
        nested.setdefault(key, data[key])
        out[group] = nested
    return out


def _builder(cls: type) -> Callable[[dict[str, Any]], Any]:
    """``cls(**kwargs)``, for a plain dataclass without calling its generated ``__init__``.

    A frozen dataclass's ``__init__`` sets every field through ``object.__setattr__``, the
    two dozen of a job spec included when a submission names seven: that took twice as long
    as decoding the seven. Setting the given fields (and default factories) and running
    ``__post_init__`` builds an equal object of the same size. A class whose ``__init__``
    could do more (its own ``__init__`` or ``__new__``, slots, init-only or ``init=False``
    fields, a custom ``__setattr__``, descriptors named like fields, defaults that are not
    class attributes) is built the ordinary way.
    """
    def ordinary(kwargs: dict[str, Any]) -> Any:
        return cls(**kwargs)

    params = getattr(cls, "__dataclass_params__", None)
    fields = dataclasses.fields(cls)
    declared = getattr(cls, "__dataclass_fields__", {})
    if (params is None or not params.init or "__slots__" in cls.__dict__
            or cls.__new__ is not object.__new__
            or not (params.frozen or cls.__setattr__ is object.__setattr__)
            or len(declared) != len(fields)  # init-only (InitVar) or class variables
            or any(not f.init for f in fields)
            or any(hasattr(type(getattr(cls, f.name, None)), "__set__") for f in fields)):
        return ordinary
    # A field left at its plain default is not set on the instance at all: @dataclass
    # makes that default the class attribute of the same name, which reads then find (as
    # they would a value __init__ stored). Only given values and default factories are set.
    if any(getattr(cls, f.name, dataclasses.MISSING) is not f.default for f in fields
           if f.default is not dataclasses.MISSING):
        return ordinary
    factories = [(f.name, f.default_factory) for f in fields
                 if f.default_factory is not dataclasses.MISSING]
    post_init = getattr(cls, "__post_init__", None)
    new = object.__new__
    set_attr = object.__setattr__
    # CPython shares one key table among a class's instances, laid out by the first one
    # built. Setting every field on a throwaway instance, in declaration order, lays it out
    # as __init__ would: then instances that set only some fields, in any order, and
    # instances built by __init__ all stay compact.
    probe = new(cls)
    for f in fields:
        set_attr(probe, f.name, None)
    del probe

    def build(kwargs: dict[str, Any]) -> Any:
        # kwargs hold every required field: the decoder refused the data otherwise.
        obj = new(cls)
        for name, value in kwargs.items():
            set_attr(obj, name, value)
        for name, factory in factories:
            if name not in kwargs:
                set_attr(obj, name, factory())
        if post_init is not None:
            post_init(obj)
        return obj

    return build


_CACHED_PATHS = 256  # parent paths remembered per decoder (a list's items each have one)
_CACHED_ITEMS = 32  # item paths remembered per list path
_PASSED_STRINGS = 4096  # strings remembered per patterned field as having matched
_PASSED_LENGTH = 256  # ... if at most this long


class _PathCache:
    """Child paths per parent path, made by ``make(parent, key)`` once per parent."""

    def __init__(self, make: Callable[[str, Any], str]) -> None:
        self._make = make
        self._by_parent: dict[str, Any] = {}

    def get(self, parent: str, keys: Any) -> Any:
        """A mapping (or list, for a range of indices) from each of ``keys`` to its path.
        Only the first parents seen are kept: paths under list items are endless."""
        paths = self._by_parent.get(parent)
        if paths is None or len(paths) < len(keys):
            make = self._make
            if isinstance(keys, range):
                paths = [make(parent, i) for i in keys]
            else:
                paths = {key: make(parent, key) for key in keys}
            if len(self._by_parent) < _CACHED_PATHS or parent in self._by_parent:
                self._by_parent[parent] = paths
        return paths


def _depth(path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise SchemaError(path, f"nested deeper than {MAX_DEPTH} levels")


def _range(bounds: Bounds | None) -> tuple[float, float]:
    """The closed interval ``bounds`` allows (infinite ends where it sets none)."""
    lo = bounds.min if bounds is not None and bounds.min is not None else -math.inf
    hi = bounds.max if bounds is not None and bounds.max is not None else math.inf
    return lo, hi


def _int_range(bounds: Bounds | None) -> tuple[float, float]:
    """The closed interval an integer field allows: its bounds, within 64 bits."""
    lo, hi = _range(bounds)
    return max(lo, MIN_INT), min(hi, MAX_INT)


def _range_error(value: float, sent: Any, path: str, lo: float, hi: float) -> None:
    """Raise the error for ``value`` (as decoded; ``sent`` as it came) outside [lo, hi]."""
    if value < lo:
        raise SchemaError(path, f"must be at least {number(lo)}, got {number(sent)}")
    raise SchemaError(path, f"must be at most {number(hi)}, got {number(sent)}")


def number(value: float) -> str:
    """A number as an error message shows it: exactly. Integers in full (``%g`` showed
    1000001 as 1e+06), whole floats as integers while they are exact, other floats as
    ``repr`` (the shortest text that reads back as the same float)."""
    if type(value) is float and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value) if type(value) is float else str(value)


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


_SCALARS = frozenset({str, int, float, bool, type(None), bytes})


@cache
def _field_getter(cls: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]] | None:
    """A dataclass's field names and one getter for all their values (None: not a
    dataclass), looked up once per class."""
    if not dataclasses.is_dataclass(cls):
        return None
    names = tuple(f.name for f in dataclasses.fields(cls))
    if not names:
        return names, lambda obj: ()
    if len(names) == 1:
        only = operator.attrgetter(names[0])
        return names, lambda obj: (only(obj),)
    return names, operator.attrgetter(*names)


def encode(obj: Any) -> Any:
    """Turn dataclasses/enums/tuples into plain msgpack-able values (the inverse of decode).

    Scalars (most leaves) are passed through inline, without a call per value: on the
    master's hot path a job spec is encoded per submission and per node command.
    """
    kind = type(obj)
    if kind in _SCALARS:
        return obj
    fields = _field_getter(kind)
    if fields is not None:
        names, values = fields[0], fields[1](obj)
        return {name: value if type(value) in _SCALARS else encode(value)
                for name, value in zip(names, values, strict=True)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [v if type(v) in _SCALARS else encode(v) for v in obj]
    if isinstance(obj, dict):
        return {encode(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, frozenset | set):
        return sorted(encode(v) for v in obj)
    return obj
