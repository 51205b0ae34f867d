"""The arithmetic of time limits (masterd/core/timelimits.py): deadlines from a start, what is
due when over many jobs, re-arming and disarming, the grace a stop gives and the maximum."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from masterd.core.timelimits import (
    STOP,
    WARN,
    Deadlines,
    LimitSchedule,
    deadlines,
    end_by_limit,
    grace_for,
    over_maximum,
    stop_reason,
)
from shared.model import JobState, StopRules, WarnSignal
from tests.unit.helpers import job


def test_deadlines_count_from_the_start() -> None:
    spec = job("a", time_limit_s=600, stop=StopRules(warning=WarnSignal("SIGUSR1", 60))).spec
    assert deadlines(spec, 1000.0) == Deadlines(warn_at=1540.0, stop_at=1600.0)
    assert deadlines(replace(spec, stop=StopRules()), 1000.0) == Deadlines(None, 1600.0)
    assert deadlines(replace(spec, time_limit_s=None), 1000.0) == Deadlines(None, None)
    # A warning asked for longer before the limit than the limit itself: at the start.
    early = replace(spec, stop=StopRules(warning=WarnSignal("SIGUSR1", 6000)))
    assert deadlines(early, 1000.0).warn_at == 1000.0


def test_end_by_limit() -> None:
    running = job("a", time_limit_s=100)
    running.state, running.start_time = JobState.RUNNING, 50.0
    assert end_by_limit(running, now=60.0) == 150.0
    assert end_by_limit(running, now=200.0) == 200.0  # past its limit, still stopping
    starting = job("b", time_limit_s=100)
    starting.state = JobState.STARTING
    assert end_by_limit(starting, now=60.0) == 160.0  # counts once it runs
    assert end_by_limit(job("c"), now=60.0) == math.inf


def test_grace_is_the_jobs_own_else_the_masters_capped() -> None:
    spec = job("a").spec
    assert grace_for(spec, stop_grace_s=10.0, max_grace_s=300.0) == 10.0
    assert grace_for(replace(spec, stop=StopRules(grace_s=60.0)), 10.0, 300.0) == 60.0
    # 0 is a grace too
    assert grace_for(replace(spec, stop=StopRules(grace_s=0.0)), 10.0, 300.0) == 0.0
    assert grace_for(replace(spec, stop=StopRules(grace_s=3000.0)), 10.0, 300.0) == 300.0
    assert grace_for(spec, stop_grace_s=30.0, max_grace_s=5.0) == 5.0


def test_over_the_maximum_is_a_sentence_in_slurms_form() -> None:
    spec = job("a", time_limit_s=3 * 86400).spec
    assert over_maximum(spec, 86400) == \
        "time limit 3-00:00:00 exceeds the maximum 1-00:00:00"
    assert over_maximum(spec, 0) is None  # no maximum
    assert over_maximum(spec, 3 * 86400) is None  # equal is allowed
    assert over_maximum(job("b").spec, 60) is None  # no limit: nothing to exceed
    assert stop_reason(spec) == "time limit 3-00:00:00 reached"


def test_schedule_gives_what_is_due_in_time_order() -> None:
    schedule = LimitSchedule()
    schedule.arm("a", Deadlines(warn_at=50.0, stop_at=100.0))
    schedule.arm("b", Deadlines(warn_at=None, stop_at=70.0))
    schedule.arm("c", Deadlines(None, None))  # no limit: never armed
    assert len(schedule) == 2 and schedule.armed("c") is None
    assert schedule.next_time() == 50.0
    assert schedule.pop_due(49.9) == []
    assert schedule.pop_due(75.0) == [("a", WARN), ("b", STOP)]
    assert schedule.warned("a") and schedule.armed("b") is None
    assert schedule.next_time() == 100.0
    assert schedule.pop_due(1e9) == [("a", STOP)]
    assert schedule.next_time() is None and len(schedule) == 0


def test_rearming_replaces_and_disarming_drops() -> None:
    schedule = LimitSchedule()
    schedule.arm("a", Deadlines(warn_at=50.0, stop_at=100.0))
    schedule.arm("a", Deadlines(warn_at=150.0, stop_at=200.0))  # the limit was raised
    assert schedule.pop_due(120.0) == []  # the old entries are stale
    assert schedule.next_time() == 150.0
    schedule.arm("a", Deadlines(warn_at=150.0, stop_at=200.0), warned=True)
    assert schedule.pop_due(199.0) == []  # warned already: no second warning
    schedule.disarm("a")
    assert schedule.pop_due(1e9) == [] and schedule.next_time() is None


@pytest.mark.parametrize("count", [1, 50])
def test_many_jobs_due_at_once_each_come_once(count: int) -> None:
    schedule = LimitSchedule()
    for i in range(count):
        schedule.arm(f"j{i}", Deadlines(warn_at=10.0, stop_at=10.0))
    due = schedule.pop_due(10.0)
    # Every warning before any stop of the same instant (a stop disarms its job).
    assert due == [(f"j{i}", WARN) for i in range(count)] + [(f"j{i}", STOP)
                                                              for i in range(count)]
    assert schedule.pop_due(10.0) == []


def test_a_default_above_the_maximum_is_refused_with_the_keys_named() -> None:
    from shared.config import ConfigError, MasterConfig, load_config

    with pytest.raises(ConfigError, match="default_time_limit_s \\(7200\\) exceeds "
                                          "max_time_limit_s \\(3600\\)"):
        load_config(MasterConfig, None, "master", default_time_limit_s=7200,
                    max_time_limit_s=3600)
    config = load_config(MasterConfig, None, "master", default_time_limit_s=600)
    assert (config.default_time_limit_s, config.max_time_limit_s, config.max_grace_s) == (
        600, 0, 120.0)
