"""Slurm's node lists: ``gpu01,gpu07`` and ranges ``gpu[01-04,07]``, zero-padded as written.

Read by trellisctl (``--exclude``) and by the master (a partition's ``nodes``); the caller
names the option in the error, so a mistake reads as the user wrote it.
"""

from __future__ import annotations

import re

from shared.model import NAME_PATTERN


class HostlistError(ValueError):
    """A node list that does not parse; the message quotes it and says what is wrong."""


def expand(text: str, where: str) -> list[str]:
    """The names ``text`` lists, in order, without repeats."""
    names: list[str] = []
    for part in split_outside_brackets(text.strip()):
        if not part.strip():
            raise HostlistError(f"{where} {text!r}: an empty name between commas")
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", part)
        if match is None:
            names.append(part.strip())
            continue
        prefix, ranges, suffix = match.groups()
        for span in ranges.split(","):
            first, dash, last = span.partition("-")
            if not first.isdigit() or (dash and not last.isdigit()):
                raise HostlistError(f"{where} {text!r}: {span!r} in [...] is not N or N-M")
            low, high = int(first), int(last) if dash else int(first)
            if high < low or high - low >= 10_000:
                raise HostlistError(f"{where} {text!r}: range {span!r} is empty or too long")
            width = len(first)
            names += [f"{prefix}{i:0{width}d}{suffix}" for i in range(low, high + 1)]
    for name in names:
        if not re.fullmatch(NAME_PATTERN, name):
            raise HostlistError(f"{where} {text!r}: {name!r} is not a node name")
    if not names:
        raise HostlistError(f"{where}: names no node")
    return list(dict.fromkeys(names))


def split_outside_brackets(text: str) -> list[str]:
    """``a,b[1,2],c`` -> ``["a", "b[1,2]", "c"]``: commas inside [...] belong to a range."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts if text else []
