"""The journal's writer process: every SQLite write of the master, in its own process.

The master's event loop and a writer *thread* shared one GIL, and the sqlite3 module gives
the GIL up around every statement: with the loop busy, each BEGIN, INSERT and COMMIT of a
group commit then waited for the loop to let go, so a commit that takes 0.4 ms alone took
3 ms inside a loaded master (docs/performance.md). In a process of its own the writer never
waits for the loop, and the loop pays only for a pipe write per batch.

The master (masterd.journal.journal.Journal) talks to it over two pipes, in frames of a 4-byte
length and a pickle. Master to writer, one frame per batch (what one loop turn issued), a list of
operations:

- ``("i", id, job_row, event_row)``: insert a submitted job (rows from store.new_job_rows);
- ``("u", id, job_rows, event_rows)``: job state changes and events (store.update_rows);
- ``("c", id, pickled (fn, args), None)``: run ``fn(store, *args)`` (a read, or a write to
  another table); ``fn`` must be importable by name, as pickle sends it.

Writer to master: ``"ready"`` once the store is open, then one frame per group it
finished, ``(commits, [(id, error or None, result), ...])``, so the master can count the
transactions it paid for. Whatever the master wrote while a transaction ran is read in one
go and becomes the next batch: that is the group commit. Calls are barriers; between two,
submissions are written first (an update can only be about a job already acknowledged),
then updates, exactly as they were issued.

The writer stops when the master closes its end (after writing everything it read), and is
killed with the master (PR_SET_PDEATHSIG), so a master killed with -9 cannot leave a writer
committing behind the back of the master restarted after it. A lock on ``<db>.writer`` keeps
a second writer waiting until the first has gone.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import logging
import os
import pickle
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from masterd.journal.backends import open_store
from masterd.journal.store import NewJobRows, Store, StoreError
from shared.logs import set_level, setup_logging

log = logging.getLogger("trellis.master.journal")

_LENGTH = 4
_MAX_FRAME = 1 << 30
_PR_SET_PDEATHSIG = 1
# The variable a PostgreSQL writer finds its database URL in (see Journal).
STORE_ENV = "TRELLIS_JOURNAL_STORE"

Outcome = tuple[int, BaseException | None, Any]
Send = Callable[[int, list[Outcome]], None]  # (transactions committed, outcomes)


def frame_header(size: int) -> bytes:
    return size.to_bytes(_LENGTH, "big")


def frame(payload: bytes) -> bytes:
    return frame_header(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into the payloads of length-prefixed frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads ``data`` completes (the rest waits for the next call)."""
        self._buf += data
        frames = []
        start = 0
        while len(self._buf) - start >= _LENGTH:
            size = int.from_bytes(self._buf[start:start + _LENGTH], "big")
            if size > _MAX_FRAME:
                raise ValueError(f"journal frame of {size} bytes is over the limit")
            end = start + _LENGTH + size
            if len(self._buf) < end:
                break
            frames.append(bytes(self._buf[start + _LENGTH:end]))
            start = end
        del self._buf[:start]
        return frames

    @property
    def partial(self) -> bool:
        return bool(self._buf)


def portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a StoreError that says what it was."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return StoreError(f"the store failed: {type(error).__name__}: {error}")
    return error


class Writer:
    """Runs batches of operations on the store; ``send`` takes each group's outcomes."""

    def __init__(self, store: Store, send: Send) -> None:
        self.store = store
        self._send = send

    def process(self, ops: list[tuple[Any, ...]]) -> None:
        inserts: list[tuple[Any, ...]] = []
        updates: list[tuple[Any, ...]] = []
        for op in ops:
            if op[0] == "i":
                inserts.append(op)
            elif op[0] == "u":
                updates.append(op)
            else:
                self._flush(inserts, updates)
                inserts, updates = [], []
                self._send(0, [self._call(op)])
        self._flush(inserts, updates)

    def _flush(self, inserts: list[tuple[Any, ...]], updates: list[tuple[Any, ...]]) -> None:
        if inserts:
            self._guarded(self._insert, inserts)
        if updates:
            self._guarded(self._update, updates)

    def _guarded(self, step: Any, ops: list[tuple[Any, ...]]) -> None:
        try:
            commits, outcomes = step(ops)
        except Exception as exc:  # a bug here must fail its callers, not hang them
            log.exception("journal batch failed unexpectedly")
            commits, outcomes = 0, [(op[1], portable(exc), None) for op in ops]
        self._send(commits, outcomes)

    def _call(self, op: tuple[Any, ...]) -> Outcome:
        _, op_id, call, _ = op
        try:
            fn, args = pickle.loads(call)
            return op_id, None, fn(self.store, *args)
        except Exception as exc:  # handed to the awaiting coroutine, never lost here
            return op_id, portable(exc), None

    def _insert(self, ops: list[tuple[Any, ...]]) -> tuple[int, list[Outcome]]:
        try:
            self.store.insert_rows([NewJobRows(op[2], op[3]) for op in ops])
        except Exception:
            # One bad row must not sink its neighbours: retry one by one to find it.
            outcomes: list[Outcome] = []
            committed = 0
            for op in ops:
                try:
                    self.store.insert_rows([NewJobRows(op[2], op[3])])
                except Exception as exc:
                    outcomes.append((op[1], portable(exc), None))
                else:
                    outcomes.append((op[1], None, None))
                    committed += 1
            return committed, outcomes
        return 1, [(op[1], None, None) for op in ops]

    def _update(self, ops: list[tuple[Any, ...]]) -> tuple[int, list[Outcome]]:
        job_rows = [row for op in ops for row in op[2]]
        event_rows = [row for op in ops for row in op[3]]
        try:
            self.store.apply_updates(job_rows, event_rows)
        except Exception as exc:
            error = portable(exc)
            return 0, [(op[1], error, None) for op in ops]
        return 1, [(op[1], None, None) for op in ops]


def set_log_level(store: Store, level: str) -> None:
    """A journal call: the master's log level changed (SIGHUP reload)."""
    set_level(level)


def _send_to(fd: int) -> Send:
    def send(commits: int, outcomes: list[Outcome]) -> None:
        try:
            payload = pickle.dumps((commits, outcomes), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # a result that cannot travel: its caller gets an error instead
            payload = pickle.dumps((commits, [
                (op_id, exc, None) if exc is not None else
                (op_id, StoreError("the store's answer could not be sent back"), None)
                for op_id, exc, _ in outcomes]))
        _write_all(fd, frame(payload))
    return send


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _die_with_parent(parent: int) -> None:
    # Not on Linux this fails, and the end of input when the master dies still stops us.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the master died before the line above took effect
        sys.exit(1)


def serve(store: Store, in_fd: int, out_fd: int) -> None:
    send = _send_to(out_fd)
    writer = Writer(store, send)
    reader = FrameReader()
    while True:
        data = os.read(in_fd, 1 << 20)  # whatever the master wrote meanwhile: one batch
        if not data:
            if reader.partial:
                log.error("the master closed the journal pipe in the middle of an operation")
            return
        ops = [op for payload in reader.feed(data) for op in pickle.loads(payload)]
        if ops:
            writer.process(ops)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trellis-journal-writer",
                                description="the master's journal writer (started by it)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", help="the SQLite file")
    where.add_argument("--store-env", help="environment variable holding the database URL")
    p.add_argument("--epoch", type=int, help="the leadership epoch writes carry (PostgreSQL)")
    p.add_argument("--in-fd", type=int, required=True)
    p.add_argument("--out-fd", type=int, required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    _die_with_parent(args.parent)
    lock = None
    if args.db is not None:
        db = Path(args.db)
        # Held until exit: a writer still finishing for a master that died keeps the next
        # one from starting (the master waits for "ready"). A PostgreSQL journal has the
        # epoch fence instead (masterd.journal.lease).
        lock = open(db.with_name(db.name + ".writer"), "a")  # noqa: SIM115
        fcntl.flock(lock, fcntl.LOCK_EX)
        location = args.db
    else:
        location = os.environ.get(args.store_env, "")
    try:
        store: Store = open_store(location, args.epoch, migrate=False,
                                  application_name="trellis-journal-writer")
    except StoreError as exc:
        log.error("journal writer cannot start: %s", exc)
        return 1
    try:
        _write_all(args.out_fd, frame(pickle.dumps("ready")))
        serve(store, args.in_fd, args.out_fd)
    except BrokenPipeError:
        log.error("journal writer: the master went away")
        return 1
    finally:
        store.close()
        if lock is not None:
            lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
