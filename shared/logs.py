"""Logging set-up that reads well in a terminal and in journald."""

from __future__ import annotations

import logging
import os
import sys

# journald reads a "<N>" syslog priority prefix on each stdout/stderr line.
_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


class JournalFormatter(logging.Formatter):
    """No timestamp (journald adds its own), a priority prefix it maps to levels."""

    def format(self, record: logging.LogRecord) -> str:
        prio = _PRIORITY.get(record.levelno, 6)
        return f"<{prio}>{record.name}: {super().format(record)}"


def under_journald() -> bool:
    return bool(os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"))


def setup_logging(level: str = "info", stream=None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    if under_journald():
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(parse_level(level))


def parse_level(level: str) -> int:
    value = logging.getLevelName(level.upper())
    if not isinstance(value, int):
        raise ValueError(f"log level {level!r} is not one of debug, info, warning, error")
    return value
