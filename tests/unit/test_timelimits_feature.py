"""The time-limit feature (masterd/features/timelimits.py) on a real core, journal and events,
with recording node and job actions: the default written at submission, the time_limit gate
and its opening by an update or a new maximum, the warning and the stop at their times, a
re-arm on update and on restore (a limit already past stops at once, a journalled warning is
not sent twice), and a disarm when the job ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from masterd.core.scheduler import Transition
from masterd.features.timelimits import TimeLimits
from shared.messages import SignalJob
from shared.model import Job, JobState, StopRules, WaitReason, WarnSignal
from tests.unit.feature_context import FeatureHarness
from tests.unit.helpers import inventory, job


class Harness(FeatureHarness):
    """The shared harness with the two job actions this feature uses: set_gate is the
    core's, stop ends the job in the core and records the call."""

    def __init__(self, state: Path) -> None:
        super().__init__(state)
        self.stops: list[tuple[str, JobState, str]] = []
        self.seq = 0
        self.ctx = replace(self.ctx, jobs=replace(self.ctx.jobs, set_gate=self.core.set_gate,
                                                  stop=self._stop))
        self.core.node_up(inventory("n1", gpus=4))
        self.core.node_up(inventory("n2", gpus=4))

    async def _stop(self, job_id: str, end_as: JobState, reason: str) -> Job:
        self.stops.append((job_id, end_as, reason))
        self.core.stop(job_id, end_as, reason, self.now)
        return self.core.jobs[job_id]

    def journal_job(self, new: Job) -> None:
        """Its row in the journal (events are filed under a job's row)."""
        self.seq += 1
        self.store.insert_jobs([(self.seq, new)])

    async def run(self, new: Job) -> Job:
        """Submit a job, place it and let every part start at ``now``; tell the feature."""
        self.journal_job(new)
        self.core.submit(new)
        self.events.job_submitted.emit(new)
        self.core.schedule(self.now)
        transition = None
        for node in list(new.node_states):
            transition = self.core.node_started(new.id, node, self.now) or transition
        assert transition is not None and new.state is JobState.RUNNING
        await self.events.job_transition.emit(new, transition)
        return new

    async def settle(self) -> None:
        """Let the feature's background tasks (warnings, stops, journal writes) finish; its
        timer task, which sleeps until the next deadline, is left alone."""
        for _ in range(3):
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()
                       and t.get_name() != "timelimits"]
            if pending:
                await asyncio.wait(pending, timeout=5)
            await asyncio.sleep(0)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        await harness.close()


def warned_events(h: Harness, job_id: str) -> list[dict]:
    return [e.detail for e in h.store.events(job_id) if e.kind == "warned"]


async def test_the_default_is_written_into_a_spec_without_a_limit(h: Harness) -> None:
    feature = TimeLimits(h.ctx)
    spec = job("a").spec
    assert h.events.spec_defaults(spec) is spec  # no default configured: the same spec
    h.config = replace(h.config, default_time_limit_s=3600)
    assert h.events.spec_defaults(spec).time_limit_s == 3600
    own = replace(spec, time_limit_s=60)
    assert h.events.spec_defaults(own) is own  # a job's own limit stands
    assert feature.with_default(own) is own


async def test_over_the_maximum_waits_until_updated_or_the_maximum_rises(h: Harness) -> None:
    TimeLimits(h.ctx)
    h.config = replace(h.config, max_time_limit_s=86400)
    long = job("long", time_limit_s=3 * 86400, t=1.0)
    short = job("short", time_limit_s=600, t=2.0)
    for new in (long, short):
        h.core.submit(new)
        h.events.job_submitted.emit(new)
    assert long.wait == WaitReason.TIME_LIMIT.value
    assert long.reason == "time limit 3-00:00:00 exceeds the maximum 1-00:00:00"
    assert [j.id for j in h.core.queue()] == ["short"] and "long" in h.core.blocked()
    assert short.wait == "" and not short.gates

    # trellisctl update --time lowers it (wt-deps replaces the spec and emits job_updated).
    before = long.spec
    long.spec = replace(before, time_limit_s=86400)
    passes = h.recorded.passes
    h.events.job_updated.emit(long, before)
    assert long.wait == "" and long.reason == "" and "long" not in h.core.blocked()
    assert [j.id for j in h.core.queue()] == ["long", "short"]  # its place by submission
    assert h.recorded.passes == passes + 1

    # Raised again above the maximum: it waits again; a larger maximum (SIGHUP) frees it.
    before = long.spec
    long.spec = replace(before, time_limit_s=2 * 86400)
    h.events.job_updated.emit(long, before)
    assert long.wait == WaitReason.TIME_LIMIT.value
    h.config = replace(h.config, max_time_limit_s=2 * 86400)
    h.events.config_changed.emit()
    assert long.wait == "" and [j.id for j in h.core.queue()] == ["long", "short"]
    h.config = replace(h.config, max_time_limit_s=3600)  # lowered: both wait now
    h.events.config_changed.emit()
    assert {j.id for j in h.core.queue()} == {"short"} and long.wait == "time_limit"


async def test_warning_then_timeout_at_their_times(h: Harness) -> None:
    feature = TimeLimits(h.ctx)
    running = await h.run(job("train", gpus=6, time_limit_s=600,
                              stop=StopRules(warning=WarnSignal("SIGUSR1", 60, batch_only=True))))
    assert len(running.node_states) == 2  # two parts: both are warned
    assert feature.schedule.next_time() == h.now + 540

    h.now += 539
    feature._fire()
    await h.settle()
    assert h.recorded.sent == [] and h.stops == []

    h.now += 1
    feature._fire()
    await h.settle()
    assert sorted(h.recorded.sent, key=lambda s: s[0]) == [
        (node, "signal_job", SignalJob(job_id="train", signal="SIGUSR1", leader_only=True,
                                        restarts=0))
        for node in ("n1", "n2")]
    assert warned_events(h, "train") == [{"signal": "SIGUSR1", "seconds": 60,
                                           "nodes": ["n1", "n2"]}]
    assert h.stops == []

    h.now += 60
    feature._fire()
    await h.settle()
    assert h.stops == [("train", JobState.TIMEOUT, "time limit 0:10:00 reached")]
    assert running.stopping and running.end_as == "timeout"
    assert len(h.recorded.sent) == 2 and feature.schedule.next_time() is None

    # Its parts exit (SIGTERM): the core ends it in timeout, and the feature lets it go.
    transition = None
    for node in ("n1", "n2"):
        transition, _ = h.core.node_exited("train", node, None, 15, h.now)
    assert transition is not None and transition.state is JobState.TIMEOUT
    h.events.job_ended.emit(running)
    assert running.state is JobState.TIMEOUT and len(feature.schedule) == 0


async def test_the_timer_really_fires(h: Harness) -> None:
    """The real asyncio timer (not _fire by hand) on the wall clock: a 1-second limit stops
    the job about a second after it started."""
    h.now = time.time()
    h.ctx = replace(h.ctx, clock=time.time)
    TimeLimits(h.ctx)
    await h.run(job("quick", time_limit_s=1))
    started = time.monotonic()
    deadline = time.monotonic() + 10
    while not h.stops and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert h.stops and h.stops[0][:2] == ("quick", JobState.TIMEOUT)
    assert 0.5 < time.monotonic() - started < 5


async def test_a_job_that_ends_first_is_disarmed_and_a_stopping_job_is_left(h: Harness) -> None:
    feature = TimeLimits(h.ctx)
    done = await h.run(job("done", time_limit_s=100))
    cancelled = await h.run(job("cancelled", time_limit_s=100))
    transition, _ = h.core.node_exited("done", "n1", 0, None, h.now + 10)
    assert transition is not None and transition.state is JobState.FINISHED
    h.events.job_ended.emit(done)
    assert feature.schedule.armed("done") is None
    h.core.cancel("cancelled", h.now)  # being cancelled when its limit comes
    h.now += 100
    feature._fire()
    await h.settle()
    assert h.stops == [] and cancelled.end_as == "cancelled"


async def test_an_update_rearms_a_running_job(h: Harness) -> None:
    feature = TimeLimits(h.ctx)
    start = h.now
    running = await h.run(job("long", time_limit_s=600,
                              stop=StopRules(warning=WarnSignal("SIGUSR2", 100))))
    h.now += 550  # warned at 500
    feature._fire()
    await h.settle()
    assert len(h.recorded.sent) == 1
    before = running.spec
    running.spec = replace(before, time_limit_s=3600)
    h.events.job_updated.emit(running, before)
    assert feature.schedule.armed("long").stop_at == start + 3600
    h.now = start + 3500  # the new warning time: warned again before the new limit
    feature._fire()
    await h.settle()
    assert len(h.recorded.sent) == 2 and h.stops == []
    h.now = start + 3600
    feature._fire()
    await h.settle()
    assert h.stops == [("long", JobState.TIMEOUT, "time limit 1:00:00 reached")]


async def test_restore_rearms_from_the_journalled_start(h: Harness) -> None:
    """After a restart the limit counts from the journalled start: a limit already past stops
    the job at once, and a warning in the journal is not sent again."""
    late = job("late", time_limit_s=60, stop=StopRules(warning=WarnSignal("SIGUSR1", 30)))
    ok = job("ok", time_limit_s=3600, stop=StopRules(warning=WarnSignal("SIGUSR1", 30)))
    over = job("over", time_limit_s=7200)
    h.config = replace(h.config, max_time_limit_s=3600)
    for restored, start in ((late, h.now - 100), (ok, h.now - 3580)):
        restored.state, restored.start_time = JobState.RUNNING, start
        restored.node_states = {"n1": "running"}
        h.journal_job(restored)
        h.core.restore(restored)
    h.journal_job(over)
    h.core.restore(over)
    h.store.update_jobs([], [(h.now - 10, "ok", None, "warned",
                              {"signal": "SIGUSR1", "seconds": 30, "nodes": ["n1"]})])
    feature = TimeLimits(h.ctx)
    h.events.restored.emit()
    assert over.wait == "time_limit"
    assert feature.schedule.armed("ok").stop_at == h.now + 20
    assert feature.schedule.warned("ok")  # journalled: not sent twice
    assert not feature.schedule.warned("late")
    feature._fire()
    await h.settle()
    assert h.stops == [("late", JobState.TIMEOUT, "time limit 0:01:00 reached")]
    # "late" was warned (never journalled) and stopped at once; "ok" was not warned again.
    assert [s[2].job_id for s in h.recorded.sent] == ["late"]


async def test_a_requeued_job_is_disarmed(h: Harness) -> None:
    feature = TimeLimits(h.ctx)
    running = await h.run(job("pre", time_limit_s=100))
    running.state = JobState.QUEUED
    await h.events.job_transition.emit(running, Transition("pre", JobState.QUEUED, "preempted"))
    assert feature.schedule.armed("pre") is None

