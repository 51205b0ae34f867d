"""demo.harness turns SIGTERM/SIGINT into an exception that lets every clean-up run."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from demo.harness import Interrupted, exit_on_signals, run, scratch_dir, shielded


def _signal_self(sig: int = signal.SIGTERM) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(5)  # the handler raises long before this ends


def test_a_signal_raises_interrupted_runs_finally_and_restores_the_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(Interrupted) as stopped, exit_on_signals():
        try:
            _signal_self()
        finally:
            cleaned.append(True)
    assert cleaned == [True]
    assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.fixture
def sigint_handled() -> Iterator[None]:
    """SIGINT as an interactive run has it. A suite started as a background job of a
    non-interactive shell inherits it ignored, and exit_on_signals rightly leaves an
    inherited SIG_IGN alone (test_an_ignored_signal_stays_ignored): the Ctrl-C this test
    sends would then never arrive."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("sigint_handled")
def test_sigint_too_and_the_scratch_dir_goes() -> None:
    with pytest.raises(Interrupted) as stopped, exit_on_signals(), \
            scratch_dir("trellis-test-harness-") as root:
        (root / "state").write_text("x")
        _signal_self(signal.SIGINT)
    assert stopped.value.code == 128 + signal.SIGINT
    assert not root.exists()


def test_a_shielded_clean_up_finishes_before_the_signal_is_raised() -> None:
    steps = []
    with pytest.raises(Interrupted), exit_on_signals(), shielded():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        steps.append("after the signal")
    assert steps == ["after the signal"]


def test_a_second_signal_does_not_cut_the_clean_up_short() -> None:
    steps = []
    with pytest.raises(Interrupted), exit_on_signals():
        try:
            _signal_self()
        finally:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            steps.append("clean-up done")
    assert steps == ["clean-up done"]


def test_run_cancels_the_main_task_whose_clean_up_can_still_await() -> None:
    steps = []

    async def bench() -> None:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(5)
        finally:
            await asyncio.sleep(0.01)  # e.g. waiting for a job's shim to report
            steps.append("awaited in clean-up")

    started = time.monotonic()
    with pytest.raises(Interrupted), exit_on_signals():
        run(bench())
    assert steps == ["awaited in clean-up"]
    assert time.monotonic() - started < 2


def test_without_a_signal_nothing_changes() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    with exit_on_signals():
        assert run(answer()) == 42
    assert run(answer()) == 42  # outside exit_on_signals it is asyncio.run


def test_an_ignored_signal_stays_ignored() -> None:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with exit_on_signals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
