"""trellisctl's usage error (exit status 2): bad options, arguments or input files."""

from __future__ import annotations


class UsageError(Exception):
    pass
