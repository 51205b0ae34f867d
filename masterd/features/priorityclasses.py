"""Priority classes (shared/priorityclasses.py) in the master.

* The configuration's classes are installed in the scheduling core: the queue's first
  key, and the preemption stage (masterd/core/preemption.py) while a class may preempt.
  SIGHUP installs the new ones.
* At submission a job naming an unknown class is refused in one sentence
  (``invalid_priority_class``); one naming none gets the default class, written into its
  spec (``trellisctl show`` reports it). A client may not pick a class above the default:
  choosing who is preempted is an admin's (or the configured default's) business.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from masterd.core.scheduler import JobError
from masterd.runtime.caller import caller, is_admin
from masterd.runtime.context import FeatureContext
from shared.model import JobSpec, JobState
from shared.priorityclasses import ClassTable

log = logging.getLogger("trellis.master.priorityclasses")


class PriorityClasses:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.table = ClassTable.of(ctx.config().priority_classes)
        ctx.jobs.set_priority_classes(self.table)
        events = ctx.events
        events.submitting.subscribe(self.check)
        events.spec_defaults.provide(self.with_class)
        events.config_changed.subscribe(self.reconfigured)

    def check(self, spec: JobSpec) -> None:
        name = spec.priority_class
        if name is None:
            return
        if not self.table.enabled:
            raise JobError("invalid_priority_class", f"job {spec.name}: this cluster has no "
                           "priority classes; submit without --priority-class")
        if name not in self.table:
            raise JobError("invalid_priority_class", f"job {spec.name}: no priority class "
                           f"{name!r} (classes: {', '.join(self.table.classes)})")
        who = caller()
        default = self.table.of_job(None)
        ceiling = default.priority if default is not None else 0
        if who is not None and not is_admin(who) and self.table[name].priority > ceiling:
            raise JobError("forbidden", f"job {spec.name}: priority class {name!r} is above "
                           "the default; only an admin may submit in it")

    def with_class(self, spec: JobSpec) -> JobSpec:
        if spec.priority_class is None and self.table.default is not None:
            return replace(spec, priority_class=self.table.default)
        return spec

    def reconfigured(self) -> None:
        table = ClassTable.of(self.ctx.config().priority_classes)
        if table == self.table:
            return
        self.table = table
        self.ctx.jobs.set_priority_classes(table)
        log.info("priority classes reconfigured: %s",
                 ", ".join(f"{c.name}={c.priority}" for c in table.classes.values()) or "none")
        self.ctx.request_pass()

    def listing(self) -> list[dict[str, Any]]:
        """Each class with its rules and its jobs now (``trellisctl priority-classes``)."""
        rows = {c.name: {"name": c.name, "priority": c.priority, "default": c.default,
                         "preempts": list(c.preempts), "within_account": c.within_account,
                         "min_runtime_s": c.min_runtime_s,
                         "preempt_grace_s": c.preempt_grace_s, "queued": 0, "running": 0}
                for c in sorted(self.table.classes.values(), key=lambda c: -c.priority)}
        for job in self.ctx.core.jobs.values():  # queued, gated ones too
            if job.state is not JobState.QUEUED:
                continue
            found = self.table.of_job(job.spec.priority_class)
            if found is not None:
                rows[found.name]["queued"] += 1
        for job in self.ctx.core.active_jobs().values():
            found = self.table.of_job(job.spec.priority_class)
            if found is not None:
                rows[found.name]["running"] += 1
        return list(rows.values())
