"""Log lines: one per event, journald's priority prefix only when really under journald."""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path

import pytest

from noded.main import NodeField
from shared.logs import (
    EventFormatter,
    JournalFormatter,
    parse_level,
    set_level,
    setup_logging,
    under_journald,
)


def record(msg: str, *args: object, level: int = logging.INFO,
           exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom\nsecond line")
        except RuntimeError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("trellis.test", level, __file__, 1, msg, args, exc_info)


def test_journal_lines_have_priority_and_no_timestamp() -> None:
    f = JournalFormatter("%(message)s")
    assert f.format(record("job=%s started", "a-1")) == "<6>trellis.test: job=a-1 started"
    assert f.format(record("x", level=logging.WARNING)).startswith("<4>")
    assert f.format(record("x", level=logging.DEBUG)).startswith("<7>")


def test_journal_folds_a_traceback_into_its_event_line() -> None:
    line = JournalFormatter("%(message)s").format(record("rpc failed", level=logging.ERROR,
                                                        exc=True))
    assert "\n" not in line
    assert line.startswith("<3>trellis.test: rpc failed\\nTraceback")
    assert "RuntimeError: boom\\nsecond line" in line


def test_message_newlines_cannot_forge_a_line() -> None:
    f = EventFormatter("%(levelname)s %(message)s")
    text = f.format(record("reason=%s", "bad\nINFO job=x finished"))
    assert text == "INFO reason=bad\\nINFO job=x finished"
    # In a terminal a traceback keeps its lines; the message line itself stays one line.
    text = f.format(record("a\nb", level=logging.ERROR, exc=True))
    assert text.startswith("ERROR a\\nb\nTraceback")


def test_under_journald_compares_the_stream_itself(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "stream"
    other = tmp_path / "other"
    with open(target, "w") as stream, open(other, "w") as elsewhere:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert under_journald(stream)
        # Inherited by a process whose output went elsewhere: not the journal.
        assert not under_journald(elsewhere)
        assert not under_journald(io.StringIO())
        monkeypatch.setenv("JOURNAL_STREAM", "garbage")
        assert not under_journald(stream)
        monkeypatch.delenv("JOURNAL_STREAM")
        monkeypatch.setenv("INVOCATION_ID", "0123")  # a service, but output not to journald
        assert not under_journald(stream)


def test_setup_logging_picks_the_format(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        with open(tmp_path / "journal", "w") as stream:
            st = os.fstat(stream.fileno())
            monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
            setup_logging("info", stream)
            logging.getLogger("trellis.x").info("node=%s up", "n1")
            logging.getLogger("trellis.x").debug("hidden")
            set_level("debug")
            logging.getLogger("trellis.x").debug("shown")
        lines = (tmp_path / "journal").read_text().splitlines()
        assert lines == ["<6>trellis.x: node=n1 up", "<7>trellis.x: shown"]
        monkeypatch.delenv("JOURNAL_STREAM")
        with open(tmp_path / "term", "w") as stream:
            setup_logging("info", stream)
            logging.getLogger("trellis.x").warning("job=%s lost", "j1")
        line = (tmp_path / "term").read_text()
        stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
        assert re.fullmatch(stamp + r" WARNING trellis\.x: job=j1 lost\n", line)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def test_bad_level_is_named() -> None:
    with pytest.raises(ValueError, match="log level 'loud' is not one of"):
        parse_level("loud")


def test_node_field_is_added_once() -> None:
    f = NodeField("gpu-01")
    r = record("job=%s started", "a")
    f.filter(r)
    assert r.getMessage() == "node=gpu-01 job=a started"
    r = record("node=%s gpu=%d healthy", "gpu-01", 2)
    f.filter(r)
    assert r.getMessage() == "node=gpu-01 gpu=2 healthy"
