"""Slurm's time-limit syntax (``--time``), to seconds and back.

``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS`` (Slurm's forms; a bare
number is minutes). Kept minimal: ``trellisctl update --time`` uses it, and the time-limit
work reads the same syntax for ``submit --time``.
"""

from __future__ import annotations

MAX_SECONDS = 366 * 86400  # JobSpec.time_limit_s's bound


class TimeError(ValueError):
    """A time limit that cannot be read; the message is one sentence naming why."""


def parse_time_limit(text: str) -> int:
    """Seconds of a Slurm time limit; refuses zero, negatives and anything malformed."""
    raw = text.strip()
    days = 0
    rest = raw
    with_hours = True
    if "-" in raw:
        day_text, _, rest = raw.partition("-")
        days = _number(day_text, raw)
        parts = [_number(p, raw) for p in rest.split(":")]
        if len(parts) > 3:
            raise TimeError(f"time {text!r}: expected D-HH[:MM[:SS]]")
        hours, minutes, seconds = [*parts, 0, 0][:3]
    else:
        parts = [_number(p, raw) for p in rest.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
            with_hours = False
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
            with_hours = False
        elif len(parts) == 3:
            hours, minutes, seconds = parts
        else:
            raise TimeError(f"time {text!r}: expected MM, MM:SS, HH:MM:SS or D-HH:MM:SS")
    if seconds > 59 or (with_hours and minutes > 59):
        raise TimeError(f"time {text!r}: minutes and seconds must be below 60")
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise TimeError(f"time {text!r}: a time limit must be more than zero")
    if total > MAX_SECONDS:
        raise TimeError(f"time {text!r}: at most 366 days")
    return total


def _number(part: str, whole: str) -> int:
    part = part.strip()
    if not part.isdigit():
        raise TimeError(f"time {whole!r}: {part!r} is not a whole number (forms: MM, MM:SS, "
                        "HH:MM:SS, D-HH:MM:SS)")
    return int(part)


def format_seconds(seconds: float) -> str:
    """``[D-]HH:MM:SS`` as Slurm prints a time limit."""
    total = int(seconds)
    days, rem = divmod(total, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
