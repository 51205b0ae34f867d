"""Leadership of the masters that share one PostgreSQL database: the lock, the lease row, the
epoch, and the fence that makes the database itself refuse a deposed leader's writes.

Exactly one master leads: the one holding a session-level advisory lock (``LOCK_KEY``) on a
dedicated connection. The lock alone is not enough, for two reasons, and the lease row and
the fence cover them:

1. A leader whose host is cut off keeps its lock: PostgreSQL releases a session lock only
   when it notices the session is gone, which on a silent network takes as long as TCP's
   keepalives or retransmissions (minutes, with the server's defaults). So the leader renews
   ``trellis_lease.renewed_at`` (server time) every ``retry_s``; a standby that finds it older
   than ``lease_s`` terminates the holder's backend (``pg_terminate_backend``, allowed to the
   same database role) and takes the lock. The leader itself stops scheduling once a renewal
   has not succeeded for ``renew_deadline_s`` (< ``lease_s``), before any standby may act.
   These are kube-scheduler's leader-election defaults: lease 15 s, renew 10 s, retry 2 s.

2. A deposed leader may still have writes on the wire: a transaction sent just before the
   link went down arrives when it comes back, from a journal writer whose own connection
   never failed. The **epoch** fences it. Every takeover increments ``trellis_lease.epoch``
   (in the same transaction that records the new holder); each master sets the epoch it
   won on every connection it writes with (``SET trellis.epoch``), and a statement-level
   trigger on every journal table (``trellis_fence``) compares the two inside the writing
   transaction, taking a share lock on the lease row. A write from an older epoch is refused
   with SQLSTATE ``TRF01``. The share lock orders the two: a takeover's increment waits for
   every write transaction that passed the check to commit (those were the old leader's, and
   the new leader reads the state after them), and any transaction that checks after the
   increment is refused. A write from an old epoch can therefore never land after the new
   leader has read the journal.

These functions are synchronous and take a psycopg connection in autocommit mode; the
master runs them on its election thread (masterd.service.leader), never on its event loop.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

# "trellis" in ASCII: the advisory lock every master of one database contends for.
LOCK_KEY = 0x7472656C6C6973
# Taken (per transaction) around schema changes, so two masters never create tables at once.
SCHEMA_LOCK_KEY = 0x7472656C6C6974
FENCED_SQLSTATE = "TRF01"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS trellis_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL,
    holder TEXT NOT NULL,
    url TEXT NOT NULL,
    holder_pid INTEGER NOT NULL,
    taken_at TIMESTAMPTZ NOT NULL,
    renewed_at TIMESTAMPTZ NOT NULL,
    takeovers BIGINT NOT NULL DEFAULT 0
);
CREATE OR REPLACE FUNCTION trellis_fence() RETURNS trigger LANGUAGE plpgsql AS $fence$
DECLARE
    mine text := current_setting('trellis.epoch', true);
    leader bigint;
BEGIN
    SELECT epoch INTO leader FROM trellis_lease WHERE id = 1 FOR SHARE;
    IF leader IS NULL OR coalesce(mine, '') = '' OR mine::bigint <> leader THEN
        RAISE EXCEPTION 'fenced: this master writes with epoch %, the leader''s epoch is %',
            coalesce(nullif(mine, ''), 'none'), coalesce(leader::text, 'none')
            USING ERRCODE = '{FENCED_SQLSTATE}';
    END IF;
    RETURN NULL;
END
$fence$;
"""

# Journal tables without the fence trigger (every table but the lease row's own).
_UNFENCED = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname <> 'trellis_lease'
  AND NOT EXISTS (SELECT 1 FROM pg_trigger t
                  WHERE t.tgrelid = c.oid AND t.tgname = 'trellis_fence')
"""


@dataclass(frozen=True)
class Lease:
    epoch: int
    holder: str
    url: str
    holder_pid: int
    age_s: float  # since the last renewal, by the server's clock
    takeovers: int


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def ensure_schema(conn: Any) -> None:
    """The lease table and the fence function (idempotent; serialised between masters)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
        conn.execute(SCHEMA)


def fence_tables(conn: Any) -> list[str]:
    """Put the fence trigger on every journal table that lacks it (new feature tables
    included); inside the caller's schema transaction. Returns the tables fenced now."""
    names = [row[0] for row in conn.execute(_UNFENCED).fetchall()]
    for name in names:
        conn.execute(
            f'CREATE TRIGGER trellis_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON '
            f'"{name}" FOR EACH STATEMENT EXECUTE FUNCTION trellis_fence()')
    return names


def try_lock(conn: Any) -> bool:
    """Take the leader's advisory lock if nobody holds it (never waits)."""
    return bool(conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()[0])


def take_over(conn: Any, holder: str, url: str, lock_timeout_s: float = 1.0) -> Lease:
    """With the advisory lock held: bump the epoch and record this master as the holder.

    The increment waits for the old leader's write transactions that passed the fence (they
    hold a share lock on the row). One that never finishes, because its master is cut off
    mid-transaction, is ended: its backend is terminated after ``lock_timeout_s``.
    """
    while True:
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{int(lock_timeout_s * 1000)}ms'")
                row = conn.execute(
                    "INSERT INTO trellis_lease AS l (id, epoch, holder, url, holder_pid, "
                    "taken_at, renewed_at, takeovers) VALUES (1, 1, %s, %s, pg_backend_pid(), "
                    "clock_timestamp(), clock_timestamp(), 0) ON CONFLICT (id) DO UPDATE SET "
                    "epoch = l.epoch + 1, holder = excluded.holder, url = excluded.url, "
                    "holder_pid = excluded.holder_pid, taken_at = excluded.taken_at, "
                    "renewed_at = excluded.renewed_at, takeovers = l.takeovers + 1 "
                    "RETURNING epoch, holder, url, holder_pid, 0.0, takeovers",
                    (holder, url)).fetchone()
            return Lease(int(row[0]), row[1], row[2], int(row[3]), 0.0, int(row[5]))
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks WHERE relation = "
                "'trellis_lease'::regclass AND pid <> pg_backend_pid()")


def renew(conn: Any, epoch: int) -> bool:
    """Renew the lease; False when this master no longer holds it (a newer epoch, or
    another backend recorded as the holder)."""
    row = conn.execute(
        "UPDATE trellis_lease SET renewed_at = clock_timestamp() WHERE id = 1 AND epoch = %s "
        "AND holder_pid = pg_backend_pid() RETURNING 1", (epoch,)).fetchone()
    return row is not None


def read(conn: Any) -> Lease | None:
    row = conn.execute(
        "SELECT epoch, holder, url, holder_pid, "
        "EXTRACT(EPOCH FROM clock_timestamp() - renewed_at)::float8, takeovers "
        "FROM trellis_lease WHERE id = 1").fetchone()
    if row is None:
        return None
    return Lease(int(row[0]), row[1], row[2], int(row[3]), float(row[4]), int(row[5]))


def end_stale_holder(conn: Any, lease: Lease) -> bool:
    """Terminate the backend that still holds the advisory lock for a leader whose lease
    expired (its host went silent). True when one was terminated."""
    row = conn.execute(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks WHERE locktype = 'advisory' "
        "AND granted AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1 "
        "AND pid = %s",
        ((LOCK_KEY >> 32) & 0xFFFFFFFF, LOCK_KEY & 0xFFFFFFFF, lease.holder_pid)).fetchone()
    return bool(row and row[0])
