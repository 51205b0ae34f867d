"""YAML for ``-o yaml``: the master's replies are plain data (maps, lists, strings, numbers,
booleans, nil), so a small block-style emitter covers them without a YAML library.

Strings are written plain only when no YAML 1.1 or 1.2 reader could take them for anything
else (they start with a letter or ``_`` and are not a word like ``yes``, ``off`` or
``null``); every other string is double-quoted with escapes. Map keys come sorted, as in
``-o json``.
"""

from __future__ import annotations

import math
import re

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
# Words YAML 1.1 (PyYAML and others) reads as booleans or null.
_RESERVED = frozenset({"y", "yes", "n", "no", "true", "false", "on", "off", "null", "nan",
                       "inf"})
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


def dump(value: Any) -> str:
    """One YAML document (without the ``---`` marker), ending in a newline."""
    lines: list[str] = []
    _node(value, 0, lines)
    return "\n".join(lines) + "\n"


def _node(value: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict) and value:
        for key in sorted(value, key=str):
            item = value[key]
            head = f"{pad}{scalar(str(key))}:"
            if _is_block(item):
                out.append(head)
                _node(item, indent + 2, out)
            else:
                out.append(f"{head} {scalar(item)}")
    elif isinstance(value, list | tuple) and value:
        for item in value:
            if _is_block(item):
                # The item at the next indent, its first line's indent turned into "- ".
                start = len(out)
                _node(item, indent + 2, out)
                out[start] = f"{pad}- {out[start][indent + 2:]}"
            else:
                out.append(f"{pad}- {scalar(item)}")
    else:
        out.append(f"{pad}{scalar(value)}")


def _is_block(value: Any) -> bool:
    return isinstance(value, dict | list | tuple) and bool(value)


def scalar(value: Any) -> str:
    """A value written inline: a scalar, or an empty map or list."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _RESERVED:
        return text
    return _quoted(text)


def _float(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    # YAML 1.1 readers need a dot in the mantissa to see a float ("1e-05" reads as text).
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + e + exponent


def _quoted(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or 0x7F <= code <= 0x9F or code in (0x2028, 0x2029, 0xFEFF) \
                or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
