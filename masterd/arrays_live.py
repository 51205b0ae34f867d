"""SODA's multi-array pools in the live master (§V-C): the pools view and periodic re-sizing.

Array sizes "come from configuration and history": every ``[master] array_resize_interval_s``
the master collects the demand of the jobs that ended in the last ``array_history_days``
(else the policy's ``history_days``), re-derives the sizes with :func:`resize` (within the
configured bounds) and hands them to the policy. A change is journalled as an
``arrays_resized`` event with the sizes before and after; jobs already running keep their
resources, and borrowers of a shrunk array are preempted by the usual rules when an owner
needs the units back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from masterd.core.arrays.policy import ArrayPolicy
from masterd.core.arrays.resize import DemandRecord, demand_of, resize
from masterd.core.profiling import unwrap
from masterd.core.scheduler import JobError

if TYPE_CHECKING:
    from masterd.service import Master

log = logging.getLogger("trellis.master.arrays")


class ArraysLive:
    def __init__(self, master: Master) -> None:
        self.master = master
        self.last_resize: dict[str, Any] | None = None  # the latest re-sizing pass
        self.last_change: dict[str, Any] | None = None  # the latest one that changed sizes

    def policy(self) -> ArrayPolicy | None:
        base = unwrap(self.master.core.policy)
        return base if isinstance(base, ArrayPolicy) else None

    def _require(self) -> ArrayPolicy:
        policy = self.policy()
        if policy is None:
            raise JobError(
                "not_supported",
                f"pools exist only under the soda-arrays policy; this master runs "
                f"{self.master.core.policy.name!r} (set [master] policy = \"soda-arrays\")",
            )
        return policy

    def sizes(self, policy: ArrayPolicy) -> dict[str, int]:
        snapshot = self.master.core.snapshot()
        return {s.name: s.size for s in policy.summary(snapshot, ())}

    def summary(self) -> dict[str, Any]:
        policy = self._require()
        core = self.master.core
        arrays = [dataclasses.asdict(s) for s in policy.summary(core.snapshot(), core.queue())]
        return {
            "arrays": arrays,
            "history_days": self.history_days(policy),
            "resize_interval_s": self.master.config.array_resize_interval_s,
            "last_resize": self.last_resize,
            "last_change": self.last_change,
        }

    def history_days(self, policy: ArrayPolicy) -> float:
        configured = self.master.config.array_history_days
        return configured if configured is not None else policy.config.history_days

    # -- re-sizing -------------------------------------------------------------------------
    def start(self) -> None:
        interval = self.master.config.array_resize_interval_s
        if self.policy() is not None and interval > 0:
            self.master._spawn(self._every(interval))

    async def _every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.resize_now()
            except Exception:  # a bad pass must not end the periodic task
                log.exception("array re-sizing failed")

    def history(self, since: float) -> list[DemandRecord]:
        records = []
        for job in self.master.core.jobs.values():
            if job.end_time is None or job.end_time < since:
                continue
            record = demand_of(job)
            if record is not None:
                records.append(record)
        return records

    async def resize_now(self) -> dict[str, Any]:
        """Re-derive array sizes from recent demand; returns what changed."""
        policy = self._require()
        now = self.master.clock()
        config = dataclasses.replace(policy.config, history_days=self.history_days(policy))
        records = self.history(now - config.history_days * 86_400.0)
        new = resize(config, records, now)
        before = self.sizes(policy)
        changed = new != policy.config
        if changed:
            policy.reconfigure(new)
        after = self.sizes(policy)
        result = {"time": now, "jobs": len(records), "changed": after != before,
                  "before": before, "after": after}
        self.last_resize = result
        if after != before:
            self.last_change = result
            await self.master._persist([], [(now, None, None, "arrays_resized", {
                "jobs": len(records), "before": before, "after": after})])
            log.info("arrays_resized jobs=%d sizes=%s", len(records),
                     ",".join(f"{k}={v}" for k, v in after.items()))
            self.master.request_pass()
        else:
            log.debug("arrays_resize_unchanged jobs=%d", len(records))
        return result
