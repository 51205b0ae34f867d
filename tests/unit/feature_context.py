"""A feature context without a master, for testing one feature on its own.

The journal (a real SQLite file and writer process), the scheduling core, the events and the
task supervisor are the real ones; the job and node actions only record what the feature
asked for, so a test can see it and decide what happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Preempt
from masterd.core.scheduler import SchedulingCore
from masterd.journal.journal import Journal
from masterd.journal.store import Store
from masterd.runtime.context import (
    CoreView,
    FeatureContext,
    JobActions,
    JournalPort,
    NodeCommands,
    Workers,
)
from masterd.runtime.events import MasterEvents
from masterd.runtime.tasks import TaskSupervisor
from shared.config import MasterConfig
from shared.model import Job, JobSpec, Placement


@dataclass
class Recorded:
    """What a feature asked the master to do."""

    submitted: list[tuple[JobSpec, str | None]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    preempted: list[Preempt] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    passes: int = 0
    sent: list[tuple[str, str, Any]] = field(default_factory=list)


class FeatureHarness:
    def __init__(self, state: Path, now: float = 1000.0,
                 core: SchedulingCore | None = None) -> None:
        self.now = now
        self.store = Store(state / "master.db")
        self.journal = Journal(self.store)
        self.core = core or SchedulingCore(FifoPolicy())
        self.config = MasterConfig(state_dir=str(state))
        self.recorded = Recorded()
        self.tasks = TaskSupervisor()
        self.events = MasterEvents()
        self.ctx = FeatureContext(
            clock=lambda: self.now,
            config=lambda: self.config,
            journal=JournalPort(self.journal, self.store),
            core=CoreView(self.core),
            request_pass=self._request_pass,
            jobs=JobActions(
                check_user=lambda user: None, submit=self._submit, cancel=self._cancel,
                preempt=self._preempt, drop_queued=self.recorded.dropped.append,
                launch_placed=self._launch_placed, cores_changed=self.core.cores_changed,
                cancel_restored=lambda job_id, reason: self.recorded.cancelled.append(job_id),
                annotate=self._annotate, post_phase=self.core.enter_post_phase),
            nodes=NodeCommands(send=self._send, status=lambda node: "ready"),
            tasks=self.tasks,
            events=self.events,
            workers=Workers(),
        )

    def _annotate(self, job_id: str, values: Mapping[str, float]) -> bool:
        job = self.core.jobs.get(job_id)
        if job is None:
            return False
        job.annotations.update(values)
        return True

    def _request_pass(self) -> None:
        self.recorded.passes += 1

    async def _submit(self, spec: JobSpec, job_id: str | None = None) -> Job:
        self.recorded.submitted.append((spec, job_id))
        job = Job(id=job_id or f"{spec.name}-{len(self.recorded.submitted)}", spec=spec,
                  submit_time=self.now)
        self.core.submit(job)
        return job

    async def _cancel(self, job_id: str) -> Job:
        self.recorded.cancelled.append(job_id)
        self.core.cancel(job_id, self.now)
        return self.core.jobs[job_id]

    def _preempt(self, decision: Preempt) -> bool:
        self.recorded.preempted.append(decision)
        return True

    def _launch_placed(self, spec: JobSpec, placement: Placement, prefix: str,
                       reason: str) -> Job:
        raise ValueError("this harness launches nothing")

    async def _send(self, node: str, type_: str, body: Any) -> dict[str, Any]:
        self.recorded.sent.append((node, type_, body))
        return {}

    async def close(self) -> None:
        await self.tasks.close()
        await self.ctx.workers.close()
        self.journal.close()
        self.store.close()
