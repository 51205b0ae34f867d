"""Slurm's output file patterns (sbatch's ``--output``/``--error``): checked at submission,
filled in on the node.

``%j`` the job id, ``%x`` its name, ``%A`` its array's id (the job id outside an array), ``%a``
its index in the array (``0`` outside one), ``%u`` the user, ``%N`` the node's name, ``%%`` a
``%``. A number between ``%`` and the letter pads with zeros as in Slurm (``%3a`` -> ``007``).
Slurm's ``%J``, ``%s``, ``%t``, ``%n`` and ``%b`` name job steps and tasks, which Trellis does
not have; they are refused like any unknown pattern, with one sentence that names it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LETTERS = "jxAauN"
_TOKEN = re.compile(r"%(\d{0,4})(.?)", re.DOTALL)
_STEP_LETTERS = {"J": "the job step id", "s": "the step id", "t": "the task id",
                 "n": "the node's rank in the step", "b": "the array index modulo 10"}


@dataclass(frozen=True)
class PatternFields:
    """What a pattern is filled in with, on the node that writes the file."""

    job_id: str
    name: str
    user: str
    node: str
    array_id: str | None = None
    array_index: int | None = None


def check_pattern(text: str, what: str = "output") -> None:
    """Raise ValueError (one sentence naming it) for a pattern this module cannot fill in."""
    if not text:
        raise ValueError(f"the {what} file pattern is empty")
    if "\0" in text:
        raise ValueError(f"the {what} file pattern {text!r} holds a NUL byte")
    for match in _TOKEN.finditer(text):
        width, letter = match.groups()
        if letter == "%" and not width:
            continue
        if not letter:
            raise ValueError(f"the {what} file pattern {text!r} ends in a lone '%' (write "
                             "'%%' for a percent sign)")
        if letter in LETTERS:
            continue
        shown = f"%{width}{letter}"
        if letter in _STEP_LETTERS:
            raise ValueError(f"the {what} file pattern {text!r} uses {shown} "
                             f"({_STEP_LETTERS[letter]}), which Trellis does not have; use "
                             "%j %x %A %a %u %N or %%")
        raise ValueError(f"the {what} file pattern {text!r} uses {shown}, an unknown pattern; "
                         "use %j %x %A %a %u %N or %%")


def expand(text: str, fields: PatternFields) -> str:
    """The pattern filled in (it must have passed :func:`check_pattern`)."""
    in_array = fields.array_id is not None and fields.array_index is not None
    values = {
        "j": fields.job_id,
        "x": fields.name,
        "A": fields.array_id if in_array else fields.job_id,
        "a": str(fields.array_index) if in_array else "0",
        "u": fields.user,
        "N": fields.node,
    }

    def fill(match: re.Match[str]) -> str:
        width, letter = match.groups()
        if letter == "%":
            return "%"
        value = values[letter]
        return value.zfill(int(width)) if width and value.isdigit() else value

    return _TOKEN.sub(fill, text)
