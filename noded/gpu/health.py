"""Sticky per-GPU health shared by both backends, so both filter Xids and report alike.

A GPU taken out of service stays out until someone recovers it explicitly: an Xid that took a
GPU down says nothing about whether the next job will survive on it. Only transitions become
events (healthy -> unhealthy, unhealthy -> healthy); a second fault on a GPU already out of
service is logged, not re-reported, because the master re-plans on events.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from noded.gpu.base import APPLICATION_XIDS, GpuHealthEvent, xid_reason

log = logging.getLogger("trellis.gpu.health")


class HealthTracker:
    """Thread-safe: the daemon polls health from a thread while sampling from its loop."""

    def __init__(self, uuids: Sequence[str], ignored_xids: frozenset[int] = APPLICATION_XIDS):
        self._uuids = list(uuids)
        self.ignored_xids = frozenset(ignored_xids)
        self._cond = threading.Condition()
        self._unhealthy: dict[int, str] = {}
        self._pending: list[GpuHealthEvent] = []
        self._closed = False

    def set_uuids(self, uuids: Sequence[str]) -> None:
        with self._cond:
            self._uuids = list(uuids)

    def _uuid(self, index: int) -> str:
        return self._uuids[index] if 0 <= index < len(self._uuids) else ""

    def xid(self, index: int, xid: int) -> bool:
        """Record an Xid on GPU ``index``; returns whether it took the GPU out of service."""
        if xid in self.ignored_xids:
            log.info("gpu_xid_ignored index=%d xid=%d reason=%r why=application-error",
                     index, xid, xid_reason(xid))
            return False
        return self.mark_unhealthy(index, xid_reason(xid), xid=xid)

    def mark_unhealthy(self, index: int, reason: str, *, announce: bool = True,
                       xid: int | None = None) -> bool:
        """Take GPU ``index`` out of service; ``announce=False`` records it without an event
        (for state found at start-up, which the inventory already carries)."""
        with self._cond:
            if index in self._unhealthy:
                first = self._unhealthy[index]
                # A lost GPU is re-discovered on every sample; only news is worth a warning.
                level = logging.DEBUG if first == reason else logging.WARNING
                log.log(level, "gpu_fault_again index=%d reason=%r first=%r", index, reason, first)
                return False
            self._unhealthy[index] = reason
            if announce:
                self._pending.append(GpuHealthEvent(index, self._uuid(index), False, reason,
                                                    xid))
                self._cond.notify_all()
        log.error("gpu_unhealthy index=%d uuid=%s reason=%r", index, self._uuid(index), reason)
        return True

    def recover(self, index: int, reason: str) -> bool:
        with self._cond:
            if self._unhealthy.pop(index, None) is None:
                return False
            self._pending.append(GpuHealthEvent(index, self._uuid(index), True, reason))
            self._cond.notify_all()
        log.warning("gpu_recovered index=%d uuid=%s reason=%r", index, self._uuid(index), reason)
        return True

    def healthy(self, index: int) -> bool:
        with self._cond:
            return index not in self._unhealthy

    def reason(self, index: int) -> str | None:
        with self._cond:
            return self._unhealthy.get(index)

    def unhealthy(self) -> dict[int, str]:
        with self._cond:
            return dict(self._unhealthy)

    def has_pending(self) -> bool:
        with self._cond:
            return bool(self._pending)

    def take(self, timeout_s: float = 0.0) -> list[GpuHealthEvent]:
        """Pending events, waiting up to ``timeout_s`` for the first one (0: do not wait)."""
        with self._cond:
            if timeout_s > 0 and not self._pending and not self._closed:
                self._cond.wait_for(lambda: self._pending or self._closed, timeout_s)
            events, self._pending = self._pending, []
            return events

    def close(self) -> None:
        """Wake any thread blocked in :meth:`take` so the daemon can shut down promptly."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
