"""Jobs' output on the node: the tail's offset, chunked reads and long polls (noded/joblogs.py),
the shim's cap (noded/shim.py) and the retention sweep, on temporary directories."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from noded.joblogs import LogReader, tail_offset
from noded.jobs import JobRefused
from shared.messages import MAX_LOG_CHUNK, LogData, ReadLog
from shared.schema import SchemaError, decode

ROOT = Path(__file__).resolve().parents[2]


def reference_tail(data: bytes, lines: int) -> int:
    """The offset of the last ``lines`` lines, by splitting the whole file."""
    if lines <= 0:
        return len(data)
    parts = data.splitlines(keepends=True)
    return len(data) - sum(len(p) for p in parts[-lines:]) if parts else 0


def tail_of(tmp_path: Path, data: bytes, lines: int, block: int) -> int:
    path = tmp_path / "out.log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return tail_offset(fd, len(data), lines, block=block)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("data", "lines", "expected"), [
    (b"", 3, 0),
    (b"a\nb\nc\n", 0, 6),
    (b"a\nb\nc\n", 1, 4),
    (b"a\nb\nc\n", 2, 2),
    (b"a\nb\nc\n", 3, 0),
    (b"a\nb\nc\n", 10, 0),
    (b"a\nb\nc", 1, 4),  # a last line without its newline is a line
    (b"a\nb\nc", 2, 2),
    (b"\n\n\n", 2, 1),  # empty lines are lines
    (b"only one line without newline", 1, 0),
])
def test_tail_offset_examples(tmp_path: Path, data: bytes, lines: int, expected: int) -> None:
    for block in (1, 2, 3, 64 * 1024):
        assert tail_of(tmp_path, data, lines, block) == expected, block


def test_tail_offset_agrees_with_splitting_across_block_boundaries(tmp_path: Path) -> None:
    rng = random.Random(7)
    for _ in range(200):
        data = b"".join(rng.choice([b"\n", b"x", b"yy", b"zzzzzzz\n", b"\n\n"])
                        for _ in range(rng.randint(0, 60)))
        lines = rng.randint(0, 12)
        block = rng.choice([1, 2, 5, 16, 1024])
        assert tail_of(tmp_path, data, lines, block) == reference_tail(data, lines), (
            data, lines, block)


def test_tail_offset_reads_only_bounded_blocks(tmp_path: Path) -> None:
    """A tail of a large log reads the blocks holding its lines, not the log."""
    path = tmp_path / "big.log"
    line = b"x" * 99 + b"\n"
    path.write_bytes(line * 50_000)  # 5 MB
    reads: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real(fd, n, offset)

    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread = counting  # type: ignore[assignment]
        offset = tail_offset(fd, 5_000_000, 10, block=4096)
    finally:
        os.pread = real  # type: ignore[assignment]
        os.close(fd)
    assert offset == 5_000_000 - 10 * len(line)
    assert sum(reads) <= 4096 + 1 and max(reads) <= 4096


# -- reads ------------------------------------------------------------------------------------
@dataclass
class Part:
    job_id: str
    state: str


@dataclass
class FakeRunner:
    """What LogReader uses of a JobRunner: its directories and parts."""

    root: Path
    node: str = "n1"
    parts: dict[str, Part] = field(default_factory=dict)
    cleanup_hooks: list[Any] = field(default_factory=list)

    @property
    def dir(self) -> Path:
        return self.root / "jobs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def running(self, job_id: str, data: bytes = b"") -> Path:
        (self.dir / job_id).mkdir(parents=True, exist_ok=True)
        path = self.dir / job_id / "output.log"
        path.write_bytes(data)
        self.parts[job_id] = Part(job_id, "running")
        return path

    def exit(self, job_id: str) -> None:
        part = self.parts[job_id]
        part.state = "exited"
        for hook in self.cleanup_hooks:
            hook(part)

    def forget(self, job_id: str) -> Path:
        self.parts.pop(job_id, None)
        self.logs.mkdir(exist_ok=True)
        kept = self.logs / f"{job_id}.log"
        os.replace(self.dir / job_id / "output.log", kept)
        return kept


def read(reader: LogReader, **kw: Any) -> LogData:
    return asyncio.run(reader.read(ReadLog(**kw)))


def test_reads_chunks_from_an_offset_and_says_when_a_part_is_done(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    reader = LogReader(runner)  # type: ignore[arg-type]
    runner.running("j1", b"line one\nline two\n")
    first = read(reader, job_id="j1", max_bytes=5)
    assert (first.data, first.offset, first.size, first.done) == (b"line ", 0, 18, False)
    rest = read(reader, job_id="j1", offset=5)
    assert (rest.data, rest.offset, rest.done) == (b"one\nline two\n", 5, False)
    # At the end of a running part's log: nothing, and not done (more may come).
    at_end = read(reader, job_id="j1", offset=18)
    assert (at_end.data, at_end.done) == (b"", False)
    runner.exit("j1")
    assert read(reader, job_id="j1", offset=18).done
    assert not read(reader, job_id="j1", offset=0, max_bytes=4).done  # not yet at its end
    # Forgotten: the log moved to the logs directory and reads the same.
    runner.forget("j1")
    moved = read(reader, job_id="j1", tail=1)
    assert (moved.data, moved.offset, moved.done) == (b"line two\n", 9, True)


def test_a_job_without_output_here_is_refused_unless_the_master_placed_it(
        tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    reader = LogReader(runner)  # type: ignore[arg-type]
    with pytest.raises(JobRefused) as err:
        read(reader, job_id="nothing")
    assert err.value.code == "no_output"
    assert "node n1 has no output of job nothing" in err.value.message
    # Placed here by the master but not started yet: empty, more to come.
    pending = read(reader, job_id="nothing", pending=True)
    assert (pending.data, pending.size, pending.done) == (b"", 0, False)
    # A prepared part (its shim not started, so no file yet) is the same.
    runner.parts["prep"] = Part("prep", "prepared")
    assert read(reader, job_id="prep").done is False


def test_a_chunk_never_exceeds_the_frame_budget(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    reader = LogReader(runner)  # type: ignore[arg-type]
    runner.running("big", os.urandom(MAX_LOG_CHUNK + 12345))
    chunk = read(reader, job_id="big")
    assert len(chunk.data) == MAX_LOG_CHUNK
    with pytest.raises(SchemaError):
        decode(ReadLog, {"job_id": "big", "max_bytes": MAX_LOG_CHUNK + 1})
    with pytest.raises(SchemaError):  # a node's answer is checked as strictly
        decode(LogData, {"data": b"x" * (MAX_LOG_CHUNK + 1), "offset": 0, "size": 1 << 30})
    with pytest.raises(SchemaError):
        decode(LogData, {"data": b"abc", "offset": 5, "size": 6})


def test_a_waiting_read_returns_as_soon_as_output_grows(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    reader = LogReader(runner)  # type: ignore[arg-type]
    path = runner.running("slow", b"first\n")

    async def scenario() -> tuple[LogData, float]:
        started = time.monotonic()
        waiting = asyncio.ensure_future(reader.read(ReadLog(job_id="slow", offset=6,
                                                            wait_s=20)))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # nothing new: it waits
        with open(path, "ab") as f:
            f.write(b"second\n")
        chunk = await asyncio.wait_for(waiting, 10)
        return chunk, time.monotonic() - started

    chunk, took = asyncio.run(scenario())
    assert (chunk.data, chunk.offset, chunk.done) == (b"second\n", 6, False)
    assert took < 5  # woken by the growth, not by the 20 s wait


def test_a_waiting_read_ends_when_the_part_ends_and_when_its_wait_is_over(
        tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    reader = LogReader(runner)  # type: ignore[arg-type]
    runner.running("ends", b"all\n")

    async def scenario() -> tuple[LogData, LogData, float]:
        started = time.monotonic()
        short = await reader.read(ReadLog(job_id="ends", offset=4, wait_s=0.3))
        waited = time.monotonic() - started
        waiting = asyncio.ensure_future(reader.read(ReadLog(job_id="ends", offset=4,
                                                            wait_s=20)))
        await asyncio.sleep(0.2)
        runner.exit("ends")
        return short, await asyncio.wait_for(waiting, 5), waited

    short, final, waited = asyncio.run(scenario())
    assert (short.data, short.done) == (b"", False) and 0.25 <= waited < 5
    assert (final.data, final.done) == (b"", True)
    assert not reader._ended  # no waiter left behind


def test_wait_only_reads_answer_the_size_once_it_grew(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    reader = LogReader(runner)  # type: ignore[arg-type]
    runner.running("w", b"12345")
    grown = read(reader, job_id="w", offset=2, max_bytes=0, wait_s=5)
    assert (grown.data, grown.offset, grown.size) == (b"", 2, 5)


def test_too_many_concurrent_reads_are_refused(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    reader = LogReader(runner)  # type: ignore[arg-type]
    runner.running("busy", b"")
    reader.active = 64
    with pytest.raises(JobRefused) as err:
        read(reader, job_id="busy")
    assert err.value.code == "busy"


# -- retention --------------------------------------------------------------------------------
def test_sweep_removes_logs_older_than_the_retention(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    now = 1_000_000.0
    reader = LogReader(runner, retention_s=3600, clock=lambda: now)  # type: ignore[arg-type]
    runner.logs.mkdir()
    for name, age in (("old", 7200), ("edge", 3599), ("new", 10)):
        path = runner.logs / f"{name}.log"
        path.write_text(name)
        os.utime(path, (now - age, now - age))
    (runner.logs / "notes.txt").write_text("not a log")
    os.utime(runner.logs / "notes.txt", (0, 0))
    running = runner.running("running", b"x")  # a running part's log is never swept
    os.utime(running, (0, 0))
    assert reader.sweep() == ["old"]
    assert sorted(p.name for p in runner.logs.iterdir()) == ["edge.log", "new.log",
                                                             "notes.txt"]
    assert running.exists()
    keep_all = LogReader(runner, retention_s=0, clock=lambda: now + 1e9)  # type: ignore[arg-type]
    assert keep_all.sweep() == []


def test_the_periodic_sweep_runs_until_stopped(tmp_path: Path) -> None:
    runner = FakeRunner(tmp_path)
    reader = LogReader(runner, retention_s=1.0)  # type: ignore[arg-type]
    runner.logs.mkdir()
    old = runner.logs / "old.log"
    old.write_text("x")
    os.utime(old, (time.time() - 60, time.time() - 60))

    async def scenario() -> None:
        stop = asyncio.Event()
        sweeping = asyncio.ensure_future(reader.run_sweeps(stop))
        deadline = time.monotonic() + 10
        while old.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(sweeping, 5)

    asyncio.run(scenario())
    assert not old.exists()


# -- the shim's cap ---------------------------------------------------------------------------
def run_shim(tmp_path: Path, script: str, cap: int) -> tuple[dict[str, Any], bytes]:
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    (jobdir / "launch.json").write_text(json.dumps({
        "command": ["sh", "-c", script], "env": {"PATH": "/usr/bin:/bin"},
        "uid": os.getuid(), "gid": os.getgid(), "workdir": str(tmp_path), "cpus": [],
        "log_max_bytes": cap}))
    subprocess.run([sys.executable, "-m", "noded.shim", str(jobdir)], cwd=ROOT, timeout=60,
                   check=True)
    return (json.loads((jobdir / "exit.json").read_text()),
            (jobdir / "output.log").read_bytes())


def test_the_shim_caps_the_log_and_the_job_runs_on(tmp_path: Path) -> None:
    # 3 MB of lines against a 1 MiB cap; the job goes on past the cap and exits 3.
    script = ("i=0; while [ $i -lt 30 ]; do head -c 100000 /dev/zero | tr '\\0' 'x'; echo; "
              "i=$((i+1)); done; echo finished >&2; exit 3")
    result, log = run_shim(tmp_path, script, 1 << 20)
    assert result["exit_code"] == 3  # ran to its end: never blocked or killed
    assert result["log_bytes"] == 1 << 20
    assert result["log_bytes"] + result["log_dropped"] == 30 * 100_001 + len(b"finished\n")
    body, _, note = log.rpartition(b"\n[trellis] ")
    assert len(body) == 1 << 20
    assert note.startswith(b"this job's output reached the node's log cap of 1 MiB")
    assert note.endswith(b"the job keeps running\n") and note.count(b"\n") == 1
    assert b"finished" not in log


def test_the_shim_without_a_cap_keeps_everything_in_order(tmp_path: Path) -> None:
    result, log = run_shim(tmp_path, "seq 1 20000; echo err >&2; seq 20001 20010", 0)
    assert result["exit_code"] == 0 and result["log_dropped"] == 0
    numbers = log.decode().split()
    assert numbers[:20000] == [str(i) for i in range(1, 20001)]
    assert numbers[-10:] == [str(i) for i in range(20001, 20011)] and "err" in numbers


def test_the_shim_records_the_exit_while_a_leftover_holds_the_output_open(
        tmp_path: Path) -> None:
    started = time.monotonic()
    pidfile = tmp_path / "leftover.pid"
    try:
        result, log = run_shim(tmp_path, f"sleep 30 & echo $! > {pidfile}; echo main; exit 5",
                               0)
        assert result["exit_code"] == 5 and log == b"main\n"
        assert time.monotonic() - started < 15
    finally:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_a_log_that_cannot_be_written_drops_output_and_the_exit_is_still_recorded() -> None:
    """/dev/full answers every write with ENOSPC, as a full disk does: the relay drops the
    rest (the job never blocks on its pipe) and says why in the exit record."""
    from noded.shim import LogRelay

    read_end, write_end = os.pipe()
    full = os.open("/dev/full", os.O_RDWR)
    relay = LogRelay(read_end, full, cap=0)
    os.write(write_end, b"x" * 50_000)  # less than a pipe holds: no reader yet
    os.close(write_end)
    relay.run(os.getpid())  # no child: the relay ends at end of file
    # (A failed splice may already have taken bytes from the pipe: at most all are dropped.)
    assert relay.error and relay.written == 0 and relay.dropped <= 50_000


def test_a_read_that_times_out_leaves_no_stale_fd_and_a_later_exit_is_seen(
        tmp_path: Path) -> None:
    """A followed log whose wait ran out closed its inotify fd while the fd was still
    registered with the event loop: the waiter then died with "Invalid file descriptor: -1",
    the closed number stayed in the selector's map, and when the kernel gave that number to a
    shim's pidfd, the part's exit was never seen (a job left running forever)."""
    from noded.jobs import _wait_pid

    runner = FakeRunner(tmp_path)
    reader = LogReader(runner)  # type: ignore[arg-type]
    runner.running("followed", b"line\n")
    errors: list[dict[str, Any]] = []

    async def scenario() -> tuple[set[int], float]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        before = set(loop._selector.get_map())  # type: ignore[attr-defined]
        chunk = await reader.read(ReadLog(job_id="followed", offset=5, wait_s=0.2))
        assert chunk.data == b""
        await asyncio.sleep(0)  # the cancelled waiters finish their cleanup
        stale = set(loop._selector.get_map()) - before  # type: ignore[attr-defined]
        # A child's exit, its pidfd very likely on the number the watch just gave back.
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        started = time.monotonic()
        await asyncio.wait_for(_wait_pid(child.pid, child), 30)
        return stale, time.monotonic() - started

    stale, took = asyncio.run(scenario())
    assert stale == set()
    assert errors == []
    # Seen by the loop's notification, not by the backstop poll five seconds later.
    assert took < 4.5


def test_an_exit_is_seen_even_when_another_watcher_left_its_fd_number_registered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The backstop: whatever another watcher in the daemon does wrong with its own fd (here:
    closes it while registered, the old inotify bug), a part's exit is still seen."""
    import noded.jobs

    monkeypatch.setattr(noded.jobs, "_EXIT_BACKSTOP_S", 0.2)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        loop.add_reader(r, lambda: None)
        os.close(r)  # wrong on purpose: still in the selector's map
        os.close(w)
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        await asyncio.wait_for(noded.jobs._wait_pid(child.pid, child), 20)
        assert child.returncode == 0

    asyncio.run(scenario())
