"""Logging set-up that reads well in a terminal and in journald.

Messages are one line per event in ``key=value`` style. A newline inside a message (a reason
string a node or a user sent, say) is escaped as ``\\n`` so it cannot forge a second log line.
Under journald, tracebacks are folded onto their event's line too, so every journal entry is a
whole event with its priority.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import IO

# journald reads a "<N>" syslog priority prefix on each stdout/stderr line.
_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


class EventFormatter(logging.Formatter):
    """Escapes line breaks in the message itself; tracebacks keep their lines (terminal)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        saved = record.message
        record.message = one_line(saved)
        try:
            return super().formatMessage(record)
        finally:
            record.message = saved


class JournalFormatter(EventFormatter):
    """No timestamp (journald adds its own), a priority prefix it maps to levels, and the whole
    event, traceback included, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        prio = _PRIORITY.get(record.levelno, 6)
        return f"<{prio}>{record.name}: {one_line(super().format(record))}"


def under_journald(stream: IO[str] | None = None) -> bool:
    """True when ``stream`` (default stderr) is connected to the journal.

    systemd sets ``JOURNAL_STREAM=DEV:INODE`` for a service whose output goes to the journal;
    comparing it with the stream's own device and inode tells an inherited variable (a child
    whose output was redirected to a file) from a real journal connection.
    """
    value = os.environ.get("JOURNAL_STREAM", "")
    if not value:
        return False
    stream = stream if stream is not None else sys.stderr
    try:
        dev, ino = (int(part) for part in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def setup_logging(level: str = "info", stream: IO[str] | None = None) -> None:
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    if under_journald(out):
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(
            EventFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(parse_level(level))


def set_level(level: str) -> None:
    """Change the level of every handler set up by :func:`setup_logging` (SIGHUP reload)."""
    logging.getLogger().setLevel(parse_level(level))


def parse_level(level: str) -> int:
    value = logging.getLevelName(level.upper())
    if not isinstance(value, int):
        raise ValueError(f"log level {level!r} is not one of debug, info, warning, error")
    return value
