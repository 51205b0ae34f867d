"""The master's journal: a SQLite file in WAL mode.

A submission is committed (fsync'd) before it is acknowledged; every decision and state change
is appended to the event log and the job row updated, so a restarted master resumes with the
same queue and the same running jobs. While the master runs, every write goes through
:class:`masterd.journal.journal.Journal` to one writer process: writes are serialised in the order
they were issued, and concurrent submissions are group-committed (one fsync for a whole
burst).
"""

from __future__ import annotations

import functools
import json
import logging
import operator
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from shared.model import Job, JobSpec, JobState, NodeAllocation, NodeInventory, Placement
from shared.protocol import pack, unpack
from shared.schema import decode, encode

log = logging.getLogger("trellis.store")
T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    spec BLOB NOT NULL,
    state TEXT NOT NULL,
    submit_time REAL NOT NULL,
    data BLOB NOT NULL
);
-- By state, newest last: a restart reads the active jobs and only the newest ended ones
-- (Store.restore_jobs), each an index range instead of a scan of every job ever run.
CREATE INDEX IF NOT EXISTS jobs_state_seq ON jobs(state, seq);
DROP INDEX IF EXISTS jobs_state;
-- job_seq: the seq of the job an event is about. A job's events are found through it
-- rather than through job_id: ids sort in no useful order, so an index on them took every
-- event into a random leaf page (two of the pages a submission dirtied), where job_seq
-- grows with submissions and a new job's events land on the index's last page.
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    job_id TEXT,
    node TEXT,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    job_seq INTEGER
);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    inventory BLOB NOT NULL,
    drained INTEGER NOT NULL DEFAULT 0,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


_ACTIVE_STATES = tuple(s.value for s in JobState if not s.terminal)
_ENDED_STATES = tuple(s.value for s in JobState if s.terminal)


class StoreError(RuntimeError):
    """The journal could not record something (disk full, read-only, corrupt)."""


class Fenced(StoreError):
    """The database refused a write from a master whose leadership has ended (its epoch is
    older than the leader's; see masterd.journal.pgstore)."""


class DuplicateKey(sqlite3.IntegrityError):
    """A unique key is taken, on any backend. A subclass of sqlite3's error, so the master
    tells a duplicate job id from other failures by one type whatever the store."""


@dataclass(frozen=True)
class EventRow:
    seq: int
    time: float
    job_id: str | None
    node: str | None
    kind: str
    detail: dict[str, Any]


# The scalar parts of a job's row data, in one getter.
_SCALARS = ("start_time", "end_time", "exit_code", "signal", "reason", "attempts",
            "requeue_priority", "stopping", "start_failures", "held", "wait", "end_as",
            "restarts")
_scalars_of = operator.attrgetter(*_SCALARS)


def _job_data(job: Job, placement: dict[str, Any] | None = None) -> bytes:
    """``placement``: the job's placement already encoded (see masterd.journal.wire), if known."""
    if placement is None and job.placement:
        placement = encode(job.placement)
    if placement is None and not job.node_states:
        # Every job waiting in the queue has one of a handful of these (a submission's is
        # the same for all); packing it each time cost 12k of a submission's 508k
        # instructions (bench/rpc_cost.py's method).
        return _unplaced_job_data(*_scalars_of(job))
    return _pack_job_data(placement, job.node_states, _scalars_of(job))


def _pack_job_data(placement: dict[str, Any] | None, node_states: dict[str, str],
                   scalars: tuple[Any, ...]) -> bytes:
    return pack({"placement": placement, "node_states": node_states,
                 **dict(zip(_SCALARS, scalars, strict=True))})


@functools.lru_cache(maxsize=256, typed=True)  # typed: True and 1 must not share bytes
def _unplaced_job_data(*scalars: Any) -> bytes:
    return _pack_job_data(None, {}, scalars)


def _job_from_row(row: sqlite3.Row) -> Job:
    spec = decode(JobSpec, unpack(row["spec"]))
    data = unpack(row["data"])
    placement = None
    if data.get("placement"):
        placement = Placement(
            tuple(decode(NodeAllocation, a) for a in data["placement"]["allocations"])
        )
    return Job(
        id=row["id"],
        spec=spec,
        submit_time=row["submit_time"],
        state=JobState(row["state"]),
        placement=placement,
        start_time=data.get("start_time"),
        end_time=data.get("end_time"),
        exit_code=data.get("exit_code"),
        signal=data.get("signal"),
        reason=data.get("reason", ""),
        attempts=data.get("attempts", 0),
        node_states=dict(data.get("node_states") or {}),
        requeue_priority=data.get("requeue_priority", 0),
        stopping=data.get("stopping", False),
        start_failures=data.get("start_failures", 0),
        held=data.get("held", ""),
        wait=data.get("wait", ""),
        end_as=data.get("end_as", ""),
        restarts=data.get("restarts", 0),
    )


def update_rows(jobs: Iterable[Job], events: Iterable[tuple],
                placement_of: Callable[[Job], dict[str, Any] | None] | None = None,
                ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Encode job updates and events now, on the caller's thread: the Job objects keep
    changing on the event loop while a write waits for the journal writer. ``placement_of``
    returns a job's encoded placement from a cache (masterd.journal.wire) instead of encoding it."""
    return (
        [(job.state.value,
          _job_data(job, placement_of(job) if placement_of is not None else None), job.id)
         for job in jobs],
        event_rows(events),
    )


EVENTS_INSERT = "INSERT INTO events (time, job_id, node, kind, detail, job_seq)"


def _index_events_by_job_seq(db: sqlite3.Connection) -> None:
    """A journal from before events had job_seq: fill it in, index it, drop the index on
    job_id. One transaction, so a master stopped halfway finds the old journal again."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(events)")}
    if "job_seq" not in columns:
        db.execute("ALTER TABLE events ADD COLUMN job_seq INTEGER")
        filled = db.execute(
            "UPDATE events SET job_seq = (SELECT seq FROM jobs WHERE jobs.id = events.job_id) "
            "WHERE job_id IS NOT NULL").rowcount
        log.info("journal: %d events now indexed by their job's seq", filled)
    db.execute("CREATE INDEX IF NOT EXISTS events_job_seq ON events(job_seq)")
    db.execute("DROP INDEX IF EXISTS events_job")


# An event row whose job_seq the statement looks up from the job id the row repeats.
_EVENT_LOOKING_UP_SEQ = "(?,?,?,?,?,(SELECT seq FROM jobs WHERE id=?))"


def insert_events(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Rows from :func:`event_rows`, each stored with its job's seq (NULL for an event about
    a job the journal does not have)."""
    insert_many(db, EVENTS_INSERT, [(*row, row[1]) for row in rows], _EVENT_LOOKING_UP_SEQ)


def event_rows(events: Iterable[tuple]) -> list[tuple[Any, ...]]:
    """Rows for :data:`EVENTS_INSERT` from (time, job, node, kind, detail) tuples."""
    return [(t, job_id, node, kind, json.dumps(detail, default=str))
            for t, job_id, node, kind, detail in events]


class NewJobRows(NamedTuple):
    job: tuple[Any, ...]
    event: tuple[Any, ...]


def new_job_rows(seq: int, job: Job, spec: dict[str, Any] | None = None) -> NewJobRows:
    """``spec``: the job's spec already encoded (see masterd.journal.wire), if known."""
    return NewJobRows(
        job=(job.id, seq, pack(spec if spec is not None else encode(job.spec)),
             job.state.value, job.submit_time,
             _job_data(job)),
        event=(job.submit_time, job.id, None, "submitted", _tenant_detail(job.spec.tenant),
               seq),
    )


@functools.lru_cache(maxsize=1024)
def _tenant_detail(tenant: str) -> str:
    """The submitted event's detail, the same for every job of a tenant."""
    return json.dumps({"tenant": tenant})


# A batch goes to SQLite as one statement per table rather than one step per row: fewer
# statements, fewer trips through the sqlite3 module (which gives up and retakes the GIL
# around each); when the writer was a thread beside the busy event loop every retake waited
# for it. Statements of every batch size up to _MAX_ROWS stay in the connection's statement
# cache (STATEMENT_CACHE).
_MAX_ROWS = 256
STATEMENT_CACHE = 1024  # 4 statement shapes x up to 256 sizes
_UPDATE_FROM = sqlite3.sqlite_version_info >= (3, 33, 0)


def _slices(rows: list[tuple[Any, ...]], cap: int = _MAX_ROWS
            ) -> Iterator[list[tuple[Any, ...]]]:
    """Consecutive slices of at most ``cap`` rows (one for any batch up to ``cap``)."""
    for start in range(0, len(rows), cap):
        yield rows[start:start + cap]


def _rows_per_statement(db: sqlite3.Connection, columns: int) -> int:
    """How many rows' values fit one statement (SQLite before 3.32 allows only 999
    variables), at most _MAX_ROWS."""
    return max(1, min(_MAX_ROWS, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // columns))


def insert_many(db: sqlite3.Connection, head: str, rows: list[tuple[Any, ...]],
                one: str | None = None) -> None:
    """``head`` is ``INSERT INTO table (columns)``; ``one`` is a row's VALUES term, by
    default one placeholder per value (every row has one value per placeholder)."""
    if not rows:
        return
    if one is None:
        one = "(" + ",".join("?" * len(rows[0])) + ")"
    for part in _slices(rows, _rows_per_statement(db, len(rows[0]))):
        db.execute(f"{head} VALUES {','.join([one] * len(part))}",
                   [value for row in part for value in row])


def update_jobs_many(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Rows of (state, data, id); a job updated twice in one batch keeps its last row."""
    if not _UPDATE_FROM:  # SQLite before 3.33 has no UPDATE ... FROM
        db.executemany("UPDATE jobs SET state=?, data=? WHERE id=?", rows)
        return
    latest = list({row[2]: row for row in rows}.values())
    for part in _slices(latest, _rows_per_statement(db, 3)):
        values = ",".join(["(?,?,?)"] * len(part))
        db.execute(f"UPDATE jobs SET state=v.column1, data=v.column2 FROM (VALUES {values}) "
                   "AS v WHERE jobs.id=v.column3",
                   [value for row in part for value in row])


# A job's events: by the events_job_seq index; the id check keeps another job's events out
# even if two jobs ever shared a seq.
_OF_JOB = "job_seq = (SELECT seq FROM jobs WHERE id = ?) AND job_id = ?"


class Store:
    """Synchronous access to the journal. While the master runs, only the journal's writer
    process (masterd.journal.writer) writes; the master's own connection reads."""

    backend = "sqlite"
    # The leader's epoch its writes carry (PostgreSQL, masterd.journal.pgstore); SQLite has
    # one master and no epochs.
    epoch: int | None = None

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # Each connection stays on the thread that opened it (the writer's, or the
            # master's loop for reads), so sqlite3's same-thread check stays on.
            self.db = sqlite3.connect(path, isolation_level=None,
                                      cached_statements=STATEMENT_CACHE)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk before we acknowledge, even across a power cut.
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute("PRAGMA busy_timeout=5000")
            self.db.executescript(SCHEMA)
            if not self.db.execute("SELECT 1 FROM sqlite_master WHERE type='index' "
                                   "AND name='events_job_seq'").fetchone():
                self._tx(_index_events_by_job_seq, self.db)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store at {path}: {exc}") from exc

    @property
    def location(self) -> str:
        """What the journal writer opens (masterd.journal.backends.open_store)."""
        return str(self.path)

    def close(self) -> None:
        self.db.close()

    def transaction(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` inside one write transaction (for tables other modules own)."""
        return self._tx(fn, *args)

    def _tx(self, fn, *args):  # type: ignore[no-untyped-def]
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(*args)
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
            return result
        except sqlite3.OperationalError as exc:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            if "full" in str(exc).lower():
                raise StoreError("the master's disk is full; nothing was recorded") from exc
            raise StoreError(f"the store could not record the change: {exc}") from exc

    # -- jobs ----------------------------------------------------------------------------
    def next_seq(self) -> int:
        # Per state, MAX(seq) is one index lookup; over the whole table it is a scan.
        top = 0
        for state in JobState:
            row = self.db.execute("SELECT MAX(seq) FROM jobs WHERE state=?",
                                  (state.value,)).fetchone()
            if row[0] is not None:
                top = max(top, int(row[0]))
        return top + 1

    def insert_jobs(self, jobs: Iterable[tuple[int, Job]]) -> None:
        """Insert new jobs atomically; any duplicate id aborts the whole batch."""
        self.insert_rows([new_job_rows(seq, job) for seq, job in jobs])

    def insert_rows(self, rows: list[NewJobRows]) -> None:
        """Insert rows made by :func:`new_job_rows`: only C-level sqlite work, so the store
        thread barely competes with the event loop for the GIL."""

        def run() -> None:
            insert_many(self.db, "INSERT INTO jobs (id, seq, spec, state, submit_time, data)",
                        [r.job for r in rows])
            # new_job_rows gives each event its job's seq: no lookup.
            insert_many(self.db, EVENTS_INSERT, [r.event for r in rows])

        self._tx(run)

    def job_exists(self, job_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM jobs WHERE id=?", (job_id,)).fetchone() is not None

    def update_jobs(self, jobs: Iterable[Job], events: Iterable[tuple] = ()) -> None:
        """Persist the current state of jobs plus event rows (time, job, node, kind, detail)."""
        self.apply_updates(*update_rows(jobs, events))

    def update_spec(self, job: Job, events: Iterable[tuple] = ()) -> None:
        """Replace a job's spec (trellisctl update changed it) with its row and events."""
        spec = pack(encode(job.spec))
        rows = update_rows([job], events)

        def run() -> None:
            self.db.execute("UPDATE jobs SET spec=? WHERE id=?", (spec, job.id))
            update_jobs_many(self.db, rows[0])
            insert_events(self.db, rows[1])

        self._tx(run)

    def apply_updates(self, job_rows: list[tuple[Any, ...]],
                      event_rows: list[tuple[Any, ...]]) -> None:
        """Rows made by :func:`update_rows`, many callers' worth in one transaction."""

        def run() -> None:
            update_jobs_many(self.db, job_rows)
            insert_events(self.db, event_rows)

        self._tx(run)

    def load_jobs(self) -> list[Job]:
        """Every job ever journalled, in submission order (tests and tools; the master
        restores with :meth:`restore_jobs`)."""
        rows = self.db.execute("SELECT * FROM jobs ORDER BY seq").fetchall()
        return [_job_from_row(r) for r in rows]

    def restore_jobs(self, ended: int) -> list[Job]:
        """What a restarting master loads: every queued, starting or running job plus the
        ``ended`` newest (by seq) finished, failed or cancelled ones, in seq order."""
        rows: list[sqlite3.Row] = []
        for state in _ACTIVE_STATES:
            rows += self.db.execute("SELECT * FROM jobs WHERE state=?", (state,)).fetchall()
        newest: list[sqlite3.Row] = []
        if ended > 0:
            # One index range per state, then the newest of their union.
            for state in _ENDED_STATES:
                newest += self.db.execute(
                    "SELECT * FROM jobs WHERE state=? ORDER BY seq DESC LIMIT ?",
                    (state, ended)).fetchall()
            newest.sort(key=lambda r: r["seq"], reverse=True)
        rows += newest[:ended]
        rows.sort(key=lambda r: r["seq"])
        return [_job_from_row(r) for r in rows]

    def load_job(self, job_id: str) -> Job | None:
        """One job as journalled (for jobs the master no longer keeps in memory)."""
        row = self.db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return _job_from_row(row) if row is not None else None

    def ended_jobs(self, submitted_since: float) -> list[Job]:
        """Ended jobs submitted at or after ``submitted_since``, newest first per state.

        Walks each state's index backwards by seq (submission order) and stops at the first
        older submission, so the cost is the window's jobs, not every job ever run.
        """
        jobs: list[Job] = []
        for state in _ENDED_STATES:
            cursor = self.db.execute(
                "SELECT * FROM jobs WHERE state=? ORDER BY seq DESC", (state,))
            for row in cursor:
                if row["submit_time"] < submitted_since:
                    break
                jobs.append(_job_from_row(row))
        return jobs

    def events(
        self, job_id: str | None = None, after: int = 0, limit: int = 1000
    ) -> list[EventRow]:
        if job_id is None:
            rows = self.db.execute(
                "SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            ).fetchall()
        else:
            rows = self.db.execute(
                f"SELECT * FROM events WHERE {_OF_JOB} AND seq > ? ORDER BY seq LIMIT ?",
                (job_id, job_id, after, limit),
            ).fetchall()
        return [
            EventRow(r["seq"], r["time"], r["job_id"], r["node"], r["kind"],
                     json.loads(r["detail"]))
            for r in rows
        ]

    def events_tail(self, job_id: str | None, n: int) -> list[EventRow]:
        """The newest ``n`` rows, oldest first: find the row just before them, read from there."""
        where, args = (f"WHERE {_OF_JOB} ", (job_id, job_id)) if job_id is not None else ("", ())
        row = self.db.execute(
            f"SELECT seq FROM events {where}ORDER BY seq DESC LIMIT 1 OFFSET ?", (*args, n)
        ).fetchone()
        return self.events(job_id, int(row[0]) if row else 0, n)

    # -- nodes ---------------------------------------------------------------------------
    def save_node(self, inventory: NodeInventory, drained: bool, last_seen: float) -> None:
        def run() -> None:
            self.db.execute(
                "INSERT INTO nodes (name, inventory, drained, last_seen) VALUES (?,?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET inventory=excluded.inventory, "
                "drained=excluded.drained, last_seen=excluded.last_seen",
                (inventory.name, pack(encode(inventory)), int(drained), last_seen),
            )

        self._tx(run)

    def load_nodes(self) -> list[tuple[NodeInventory, bool, float]]:
        rows = self.db.execute("SELECT * FROM nodes ORDER BY name").fetchall()
        return [
            (decode(NodeInventory, unpack(r["inventory"])), bool(r["drained"]), r["last_seen"])
            for r in rows
        ]
