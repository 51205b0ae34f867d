"""The node's half of the node lease: stop the parts the master would requeue elsewhere once
no master has been heard from for too long (shared/nodelease.py decides which and when).

The agent tells :class:`SelfFence` the terms each hello's ack carries (``learn``) and every
frame it receives from a master that acked its hello (``heard``): data, pings and pongs
alike, so an idle session still renews the lease at every heartbeat. A loop (``run``) stops
each part that falls due (JobRunner.fence: SIGTERM, SIGKILL after the part's grace, recorded
in the part's directory); the part is reported ``fenced`` when the node reconnects.

The terms and the last contact are kept in ``STATE/master_lease`` (rewritten at most every
few seconds while contact lasts, and when it is learned): a noded restarted while cut off
counts the silence from the last contact recorded, not from its own start, so its parts are
still stopped in time. The file holds wall-clock time (monotonic time does not survive a
reboot); converting it back assumes the clock was not set back meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from noded.jobs import JobRunner
from noded.shim import write_atomic
from shared.nodelease import LeaseTerms, due, fence_reason, next_due, part_grace
from shared.schema import SchemaError, decode, encode

log = logging.getLogger("trellis.node.selffence")

LEASE_FILE = "master_lease"
# The last contact is written down at most this often while it lasts (a restart loses at
# most this much of it, and the lease then runs out this much early: the safe side).
PERSIST_S = 5.0
# The loop looks again at least this often (a part launched meanwhile, a clock step).
CHECK_S = 1.0


class SelfFence:
    def __init__(self, node: str, runner: JobRunner, state_dir: Path | None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        """``state_dir`` None: nothing is kept across restarts (an agent in a test)."""
        self.node = node
        self.runner = runner
        self.path = state_dir / LEASE_FILE if state_dir is not None else None
        self.clock = clock
        self.wall = wall
        self.terms: LeaseTerms | None = None
        # When a leading master was last heard from (``clock`` time); None: never.
        self.heard_at: float | None = None
        self._persisted_at: float | None = None  # the heard_at last written down
        self.fenced: list[tuple[str, int, str]] = []  # (job, restarts, reason), newest last
        self._wake: asyncio.Event | None = None
        self._load()

    # -- what the agent tells it ------------------------------------------------------------
    def learn(self, terms: LeaseTerms | None) -> None:
        """A master acked our hello with these terms (None: it declares no node lost)."""
        if terms != self.terms:
            log.info("node lease: %s", "none (node_lost_s 0)" if terms is None else
                     f"node_lost_s={terms.node_lost_s:g} margin_s={terms.margin_s:g} "
                     f"max_grace_s={terms.max_grace_s:g}")
        self.terms = terms
        self.heard()
        self._persist()
        if self._wake is not None:
            self._wake.set()

    def heard(self) -> None:
        """A frame came from a master that acked our hello: the lease is renewed."""
        self.heard_at = self.clock()

    def silent_s(self) -> float | None:
        """Seconds since a master was last heard from (None: never)."""
        return None if self.heard_at is None else max(0.0, self.clock() - self.heard_at)

    # -- the decision, applied ----------------------------------------------------------------
    def check(self) -> list[str]:
        """Stop every part that is due now; the job ids stopped."""
        now = self.clock()
        terms = self.terms
        stopped = []
        for part in due(self.runner.leased_parts(), terms, self.heard_at, now):
            assert terms is not None and self.heard_at is not None
            reason = fence_reason(self.node, now - self.heard_at, part, terms)
            if self.runner.fence(part.job_id, part_grace(part, terms), reason):
                self.fenced.append((part.job_id, part.restarts, reason))
                del self.fenced[:-1000]  # the newest are enough for the logs and metrics
                stopped.append(part.job_id)
        return stopped

    async def run(self, stop: asyncio.Event) -> None:
        """Stop parts as they fall due, until ``stop`` is set."""
        self._wake = asyncio.Event()
        while not stop.is_set():
            try:
                self.check()
            except Exception:  # never let one failure end the lease for every part
                log.exception("node lease check failed")
            if self.heard_at is not None and (
                    self._persisted_at is None or self.heard_at - self._persisted_at
                    >= PERSIST_S):
                self._persist()
            wait = CHECK_S
            upcoming = next_due(self.runner.leased_parts(), self.terms, self.heard_at)
            if upcoming is not None:
                wait = min(wait, max(0.05, upcoming - self.clock()))
            self._wake.clear()
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            try:
                await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*waits, return_exceptions=True)

    # -- kept across restarts -----------------------------------------------------------------
    def _persist(self) -> None:
        if self.path is None:
            return
        heard = self.heard_at
        data = {"terms": None if self.terms is None else encode(self.terms),
                "heard": None if heard is None else self.wall() - (self.clock() - heard)}
        try:
            write_atomic(self.path, data)
        except OSError as exc:
            # The lease still works in memory; only a restart would count from its start.
            log.warning("node lease not recorded in %s: %s", self.path, exc)
            return
        self._persisted_at = heard

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error("node lease file %s unreadable (%s); no lease until a master is heard",
                      self.path, exc)
            return
        try:
            raw = data.get("terms") if isinstance(data, dict) else None
            self.terms = None if raw is None else decode(LeaseTerms, raw, "terms")
            heard = data.get("heard")
            if isinstance(heard, int | float) and not isinstance(heard, bool):
                # Wall clock to this process's clock; never in the future.
                ago = max(0.0, self.wall() - float(heard))
                self.heard_at = self.clock() - ago
                self._persisted_at = self.heard_at
        except SchemaError as exc:
            log.error("node lease file %s holds no lease (%s); none until a master is heard",
                      self.path, exc)
            self.terms = None
            return
        if self.terms is not None and self.heard_at is not None:
            log.info("node lease kept from before the restart: last contact %.0f s ago",
                     self.clock() - self.heard_at)
