"""Slurm's time and signal syntax, shared by trellisctl, the master and (later) Slurm scripts.

``--time`` (sbatch(1)): ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
``D-HH:MM:SS``; ``0``, ``UNLIMITED`` and ``INFINITE`` mean no limit. Slurm rounds a limit
with seconds up to whole minutes; Trellis keeps the seconds (a limit of ``0:30`` is 30 s).

``--signal`` (sbatch(1)): ``[{R|B}:]SIG[@SECONDS]``, SIG a name with or without ``SIG``
(any case) or a number; without ``@`` the signal comes 60 s before the limit, as in Slurm.
``B:`` signals only the job's leader process (the batch shell), not its children; ``R:``
(Slurm: do not signal on a reservation's end) changes nothing here, Trellis has no
reservations that end jobs.

Every parser raises ValueError with one sentence that names the value.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass

from shared.model import SIGNAL_NAMES, WarnSignal

UNLIMITED_WORDS = frozenset({"unlimited", "infinite"})
DEFAULT_WARNING_S = 60  # Slurm's --signal default when @SECONDS is absent
MAX_WARNING_S = 65535  # Slurm's largest sig_time
_NUMBER = r"\d{1,9}"
_TIME_RE = re.compile(
    rf"(?:(?P<days>{_NUMBER})-(?P<dh>{_NUMBER})(?::(?P<dm>{_NUMBER})(?::(?P<ds>{_NUMBER}))?)?"
    rf"|(?P<a>{_NUMBER})(?::(?P<b>{_NUMBER})(?::(?P<c>{_NUMBER}))?)?)")
FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def parse_time(text: str) -> int | None:
    """Seconds of a Slurm time limit, or None for no limit (``0``, ``UNLIMITED``)."""
    raw = text.strip()
    if raw.lower() in UNLIMITED_WORDS:
        return None
    match = _TIME_RE.fullmatch(raw)
    if match is None:
        raise ValueError(f"{text!r} is not one of Slurm's time forms {FORMS}")
    parts = match.groupdict()
    if parts["days"] is not None:
        days, hours = int(parts["days"]), int(parts["dh"])
        minutes, seconds = int(parts["dm"] or 0), int(parts["ds"] or 0)
        _check_clock(text, hours, 24, "hours")
        _check_clock(text, minutes, 60, "minutes")
        _check_clock(text, seconds, 60, "seconds")
    elif parts["c"] is not None:  # HH:MM:SS
        days, hours, minutes, seconds = 0, int(parts["a"]), int(parts["b"]), int(parts["c"])
        _check_clock(text, minutes, 60, "minutes")
        _check_clock(text, seconds, 60, "seconds")
    else:  # MM or MM:SS: minutes may be any number, as in Slurm
        days, hours = 0, 0
        minutes, seconds = int(parts["a"]), int(parts["b"] or 0)
        if parts["b"] is not None:
            _check_clock(text, seconds, 60, "seconds")
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return total or None  # Slurm: a limit of 0 means none


def _check_clock(text: str, value: int, bound: int, what: str) -> None:
    if value >= bound:
        raise ValueError(f"{text!r} has {value} {what}; at most {bound - 1} there")


def format_time(seconds: float | None) -> str:
    """``D-HH:MM:SS`` (``H:MM:SS`` under a day), Slurm's way of printing a limit;
    ``UNLIMITED`` for None. Fractions of a second are rounded up."""
    if seconds is None:
        return "UNLIMITED"
    total = max(0, -int(-seconds // 1))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}"


@dataclass(frozen=True)
class SignalSpec:
    """A parsed ``--signal``: the signal's name (``SIGUSR1``), how many seconds before the
    limit, and whether only the batch shell (the job's leader process) gets it."""

    signal: str
    seconds: int = DEFAULT_WARNING_S
    batch_only: bool = False


def signal_name(text: str) -> str:
    """``SIGUSR1`` for ``USR1``, ``sigusr1``, ``SIGUSR1`` or ``10``; one of SIGNAL_NAMES."""
    raw = text.strip()
    if raw.isdigit():
        try:
            name = _signal.Signals(int(raw)).name
        except ValueError:
            raise ValueError(f"{text!r} is not a signal number of this system") from None
    else:
        name = raw.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
    if name not in SIGNAL_NAMES:
        raise ValueError(f"{text!r} is not a signal a job may ask for; known: "
                         + ", ".join(n[3:] for n in SIGNAL_NAMES))
    return name


def parse_signal(text: str) -> SignalSpec:
    """Slurm's ``--signal [{R|B}:]SIG[@SECONDS]``."""
    raw = text.strip()
    batch_only = False
    flags, colon, rest = raw.partition(":")
    if colon:
        if flags.upper() not in ("B", "R", "RB", "BR"):
            raise ValueError(f"{text!r}: the prefix before ':' must be B or R")
        batch_only = "B" in flags.upper()
        raw = rest
    name_text, at, seconds_text = raw.partition("@")
    if not name_text:
        raise ValueError(f"{text!r} names no signal")
    name = signal_name(name_text)
    seconds = DEFAULT_WARNING_S
    if at:
        if not seconds_text.strip().isdigit():
            raise ValueError(f"{text!r}: the time after '@' must be whole seconds")
        seconds = int(seconds_text)
        if seconds > MAX_WARNING_S:
            raise ValueError(f"{text!r}: at most {MAX_WARNING_S} seconds before the limit")
    return SignalSpec(name, seconds, batch_only)


def format_signal(spec: SignalSpec | WarnSignal) -> str:
    """Back to ``[B:]SIG@SECONDS`` (the name without ``SIG``, as Slurm prints it)."""
    return f"{'B:' if spec.batch_only else ''}{spec.signal[3:]}@{spec.seconds}"


MAX_TIME_LIMIT_S = 366 * 86400  # JobSpec.time_limit_s's bound


def parse_time_limit(text: str) -> int:
    """A limit a job asks for (``submit --time``, ``update --time``): seconds in one of
    :func:`parse_time`'s forms, neither "no limit" nor beyond :data:`MAX_TIME_LIMIT_S`."""
    seconds = parse_time(text)
    if seconds is None:
        raise ValueError(f"{text!r} means no time limit, and a job cannot ask for no limit; "
                         "leave the option out for the master's default (default_time_limit_s)")
    if seconds > MAX_TIME_LIMIT_S:
        raise ValueError(f"{text!r} ({format_time(seconds)}) is longer than the longest limit, "
                         f"{format_time(MAX_TIME_LIMIT_S)}")
    return seconds
