"""Leader election for masters that share a PostgreSQL journal.

The lock, lease and epoch fence live in the database (masterd.journal.lease explains why
each is needed); this module runs the protocol. Its database work happens on a thread of its
own, with a blocking connection that is used for nothing else (the advisory lock belongs to
that session): the event loop never waits for the database, and a database that stops
answering cannot stall the loop. The thread reports to the loop with
``call_soon_threadsafe``.

Timing follows kube-scheduler's leader election (``lease_s`` 15 s, ``renew_deadline_s`` 10 s,
``retry_s`` 2 s): every ``retry_s`` a standby tries the lock, and ends the session of a leader
whose lease is older than ``lease_s``; a leader renews every ``retry_s`` and, on the loop's
own clock, gives up once no renewal has succeeded for ``renew_deadline_s`` (a renewal that
hangs on a dead link counts as failed). A leader whose lock connection fails gives up at
once. Giving up is final for the process: the master stops scheduling and exits, and its
supervisor (systemd's ``Restart=``) starts it again as a standby, as kube-scheduler does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from masterd.journal import lease
from masterd.journal.lease import Lease

log = logging.getLogger("trellis.master.leader")


@dataclass
class Leadership:
    """What this master knows of the leadership (for /metrics, a standby's answers, logs).

    A master on SQLite is the only one: it leads from the start, at the epoch its restore
    takes (one more than its previous start's, masterd.journal.epochs).
    """

    leader: bool = True
    epoch: int = 0
    # Times this process took the leadership over (from a previous leader or a fresh one).
    takeovers: int = 0
    # The leader's advertised URL, as a standby last read it from the lease.
    leader_url: str | None = None


@dataclass(frozen=True)
class ElectionTiming:
    lease_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0


class Elector:
    """Contends for the leadership of the database at ``url`` on behalf of the master
    advertised at ``advertise_url``; calls ``on_elected(lease)`` once it leads and
    ``on_lost(reason)`` once it no longer does (both on ``loop``)."""

    def __init__(self, url: str, advertise_url: str, timing: ElectionTiming,
                 loop: asyncio.AbstractEventLoop, on_elected: Callable[[Lease], None],
                 on_lost: Callable[[str], None], holder: str | None = None) -> None:
        self.url = url
        self.advertise_url = advertise_url
        self.timing = timing
        self.holder = holder or lease.holder_name()
        self.state = Leadership(leader=False)
        self._loop = loop
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._last_renewal = 0.0  # monotonic time a successful renewal was sent
        self._watchdog: asyncio.TimerHandle | None = None
        self._lost = False

    # -- loop side ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trellis-elector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop contending (and, if leading, let the lock go with the connection)."""
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _elected(self, won: Lease, sent: float) -> None:
        self.state.leader = True
        self.state.epoch = won.epoch
        self.state.takeovers += 1
        self.state.leader_url = self.advertise_url
        self._last_renewal = sent
        log.info("leadership taken epoch=%d holder=%s url=%s takeovers_total=%d", won.epoch,
                 self.holder, self.advertise_url, won.takeovers)
        self._arm_watchdog()
        self._on_elected(won)

    def _renewed(self, sent: float) -> None:
        self._last_renewal = max(self._last_renewal, sent)

    def _saw(self, current: Lease) -> None:
        if current.url != self.state.leader_url:
            log.info("leader url=%s epoch=%d holder=%s", current.url, current.epoch,
                     current.holder)
        self.state.leader_url = current.url
        self.state.epoch = current.epoch

    def _arm_watchdog(self) -> None:
        self._watchdog = self._loop.call_later(self.timing.retry_s / 4, self._check_deadline)

    def _check_deadline(self) -> None:
        if self._lost:
            return
        silent = time.monotonic() - self._last_renewal
        if silent > self.timing.renew_deadline_s:
            self._lose(f"the lease was not renewed for {silent:.1f} s "
                       f"(renew_deadline_s={self.timing.renew_deadline_s:g})")
            return
        self._arm_watchdog()

    def _lose(self, reason: str) -> None:
        if self._lost:
            return
        self._lost = True
        self.state.leader = False
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.cancel()
        log.error("leadership lost epoch=%d reason=%s", self.state.epoch, reason)
        self._on_lost(reason)

    def _to_loop(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody to tell
            self._loop.call_soon_threadsafe(fn, *args)

    # -- election thread --------------------------------------------------------------------
    def _run(self) -> None:
        from masterd.journal.pgstore import connect

        leading = False
        epoch = 0
        while not self._stop.is_set():
            try:
                if self._conn is None:
                    self._conn = connect(self.url, "trellis-master-lock",
                                         self.timing.renew_deadline_s)
                    lease.ensure_schema(self._conn)
                conn = self._conn
                if leading:
                    sent = time.monotonic()
                    if not lease.renew(conn, epoch):
                        self._to_loop(self._lose, "another master holds the lease")
                        return
                    self._to_loop(self._renewed, sent)
                elif lease.try_lock(conn):
                    sent = time.monotonic()
                    won = lease.take_over(conn, self.holder, self.advertise_url)
                    leading, epoch = True, won.epoch
                    self._to_loop(self._elected, won, sent)
                else:
                    current = lease.read(conn)
                    if current is not None:
                        self._to_loop(self._saw, current)
                        if current.age_s > self.timing.lease_s and \
                                lease.end_stale_holder(conn, current):
                            log.warning("leader holder=%s epoch=%d silent for %.1f s "
                                        "(lease_s=%g): its session was ended", current.holder,
                                        current.epoch, current.age_s, self.timing.lease_s)
                            continue  # its lock is free now: try at once
            except Exception as exc:
                if self._stop.is_set():
                    return
                if leading:
                    self._to_loop(self._lose, f"the database connection failed: {exc}")
                    return
                log.warning("leader election: database unavailable (%s); retrying in %g s",
                            str(exc).strip().splitlines()[0] if str(exc).strip() else
                            type(exc).__name__, self.timing.retry_s)
                with contextlib.suppress(Exception):
                    if self._conn is not None:
                        self._conn.close()
                self._conn = None
            self._stop.wait(self.timing.retry_s)
