"""Slurm's --time and --signal syntax (shared/slurmtime.py) and what trellisctl submit makes
of --time, --signal and --grace: every form sbatch(1) lists, the formatter back, and one
sentence naming the value for anything malformed."""

from __future__ import annotations

import argparse

import pytest

from control.cli import build_parser, command_word
from control.submit import jobs_from_args, time_options
from control.usage import UsageError
from shared.model import SIGNAL_NAMES
from shared.slurmtime import (
    SignalSpec,
    format_signal,
    format_time,
    parse_signal,
    parse_time,
    signal_name,
)


@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 30 * 60),  # MM
    ("90", 90 * 60),  # minutes may exceed 59, as in Slurm
    ("5:30", 5 * 60 + 30),  # MM:SS
    ("0:05", 5),
    ("1:02:03", 3600 + 120 + 3),  # HH:MM:SS
    ("100:00:00", 100 * 3600),  # hours may exceed 23 without days
    ("2-12", 2 * 86400 + 12 * 3600),  # D-HH
    ("1-00:30", 86400 + 30 * 60),  # D-HH:MM
    ("3-04:05:06", 3 * 86400 + 4 * 3600 + 5 * 60 + 6),  # D-HH:MM:SS
    (" 10 ", 600),
])
def test_every_sbatch_form(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["0", "UNLIMITED", "infinite", "0:00", "0-0"])
def test_zero_and_unlimited_mean_no_limit(text: str) -> None:
    assert parse_time(text) is None


@pytest.mark.parametrize(("text", "says"), [
    ("", "Slurm's time forms"),
    ("abc", "Slurm's time forms"),
    ("1:2:3:4", "Slurm's time forms"),
    ("-5", "Slurm's time forms"),
    ("1.5", "Slurm's time forms"),
    ("1-", "Slurm's time forms"),
    ("1-2:3:4:5", "Slurm's time forms"),
    ("5:60", "60 seconds"),
    ("1:60:00", "60 minutes"),
    ("1-24", "24 hours"),
    ("1-00:00:61", "61 seconds"),
])
def test_malformed_times_name_the_value(text: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_time(text)
    message = str(caught.value)
    assert repr(text) in message and says in message and "\n" not in message


@pytest.mark.parametrize(("seconds", "text"), [
    (5, "0:00:05"), (3599, "0:59:59"), (3600, "1:00:00"), (86399, "23:59:59"),
    (86400, "1-00:00:00"), (3 * 86400 + 4 * 3600 + 5 * 60 + 6, "3-04:05:06"),
    (0.2, "0:00:01"), (None, "UNLIMITED"),
])
def test_format_back_to_slurms_form(seconds: float | None, text: str) -> None:
    assert format_time(seconds) == text
    if isinstance(seconds, int) and seconds:
        assert parse_time(text) == seconds  # round trip


@pytest.mark.parametrize(("text", "spec"), [
    ("USR1", SignalSpec("SIGUSR1", 60, False)),  # Slurm's default: 60 s before
    ("SIGUSR2@120", SignalSpec("SIGUSR2", 120, False)),
    ("usr1@0", SignalSpec("SIGUSR1", 0, False)),
    ("B:USR1@90", SignalSpec("SIGUSR1", 90, True)),
    ("R:TERM@5", SignalSpec("SIGTERM", 5, False)),
    ("RB:INT", SignalSpec("SIGINT", 60, True)),
    ("10@30", SignalSpec("SIGUSR1", 30, False)),  # a number (SIGUSR1 is 10 on Linux)
    ("15", SignalSpec("SIGTERM", 60, False)),
])
def test_signal_forms(text: str, spec: SignalSpec) -> None:
    assert parse_signal(text) == spec


@pytest.mark.parametrize(("text", "says"), [
    ("FOO@10", "not a signal a job may ask for"),
    ("SIGSEGV", "not a signal a job may ask for"),
    ("999", "not a signal number"),
    ("USR1@soon", "whole seconds"),
    ("USR1@-5", "whole seconds"),
    ("USR1@70000", "at most 65535"),
    ("X:USR1", "must be B or R"),
    ("@10", "names no signal"),
])
def test_bad_signals_name_the_value(text: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_signal(text)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_every_known_signal_has_a_name_form_and_formats_back() -> None:
    for name in SIGNAL_NAMES:
        assert signal_name(name[3:].lower()) == name
        spec = parse_signal(f"B:{name}@7")
        assert format_signal(spec) == f"B:{name[3:]}@7"
        assert parse_signal(format_signal(spec)) == spec


def parse(*words: str) -> argparse.Namespace:
    return build_parser(only=command_word(list(words))).parse_args(list(words))


def test_submit_options_become_spec_fields() -> None:
    args = parse("submit", "--gpus", "1", "--time", "1-02:00:00", "--signal", "B:USR1@300",
                 "--grace", "45", "--", "train")
    jobs, _ = jobs_from_args(args)
    assert jobs[0]["time_limit_s"] == 86400 + 7200
    assert jobs[0]["stop"] == {"warning": {"signal": "SIGUSR1", "seconds": 300,
                                           "batch_only": True}, "grace_s": 45.0}
    short = parse("submit", "-t", "5", "--cpus", "1", "--", "x")
    assert time_options(short) == {"time_limit_s": 300}
    assert time_options(parse("submit", "--", "x")) == {}


@pytest.mark.parametrize(("words", "says"), [
    (["--time", "1:2:3:4"], "--time: '1:2:3:4' is not one of Slurm's time forms"),
    (["--time", "UNLIMITED"], "a job cannot ask for no limit"),
    (["--time", "400-00:00:00"], "longer than the longest limit, 366-00:00:00"),
    (["--signal", "BOGUS@10"], "--signal: 'BOGUS' is not a signal a job may ask for"),
    (["--grace", "-1"], "--grace -1: must be 0 to 3600 seconds"),
    (["--grace", "4000"], "--grace 4000: must be 0 to 3600 seconds"),
])
def test_bad_submit_options_are_one_usage_sentence(words: list[str], says: str) -> None:
    args = parse("submit", *words, "--", "train")
    with pytest.raises(UsageError) as caught:
        jobs_from_args(args)
    assert says in str(caught.value) and "\n" not in str(caught.value)
