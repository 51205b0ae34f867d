"""The node's metrics channel: what a job writes, what reaches the master, what is refused."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from noded.metrics_channel import (
    MAX_LINE,
    MAX_NAMES,
    MAX_READ,
    METRICS_ENV,
    JobTail,
    MetricsChannel,
)


def tail(tmp_path: Path) -> JobTail:
    return JobTail("job-1", tmp_path / "metrics", None)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def drained(t: JobTail) -> dict[str, tuple[float, float, int]]:
    t.read()
    return {m.name: (m.value, m.last, m.count) for m in t.drain()}


def test_lines_are_aggregated_per_name_and_partial_lines_wait(tmp_path: Path) -> None:
    t = tail(tmp_path)
    assert drained(t) == {}  # no file yet
    append(t.path, b"samples_per_sec 10\nsamples_per_sec 20\nloss 0.5\nsamples_per")
    assert drained(t) == {"samples_per_sec": (15.0, 20.0, 2), "loss": (0.5, 0.5, 1)}
    assert drained(t) == {}  # nothing new
    append(t.path, b"_sec 30\n")
    assert drained(t) == {"samples_per_sec": (30.0, 30.0, 1)}
    assert t.bad_lines == 0


@pytest.mark.parametrize("line", [
    b"samples_per_sec nan", b"samples_per_sec inf", b"samples_per_sec -1",
    b"samples_per_sec 1e400", b"samples_per_sec 1e16", b"Samples 3", b"samples_per_sec",
    b"samples_per_sec 1 2", b"9samples 1", b"\xff\xfe 1", b"samples_per_sec 1..2",
    b"a" * 40 + b" 1", b"samples_per_sec 0x10",
])
def test_malformed_lines_are_skipped_and_counted(tmp_path: Path, line: bytes) -> None:
    t = tail(tmp_path)
    append(t.path, line + b"\nsamples_per_sec 5\n")
    assert drained(t) == {"samples_per_sec": (5.0, 5.0, 1)}
    assert t.bad_lines == 1


def test_an_over_long_line_is_dropped_even_across_reads(tmp_path: Path) -> None:
    t = tail(tmp_path)
    append(t.path, b"samples_per_sec 1" + b"0" * MAX_LINE)
    assert drained(t) == {}
    append(t.path, b"000\nsamples_per_sec 4\n")
    assert drained(t) == {"samples_per_sec": (4.0, 4.0, 1)}
    assert t.bad_lines == 1


def test_truncated_or_replaced_files_are_read_from_their_start(tmp_path: Path) -> None:
    t = tail(tmp_path)
    append(t.path, b"samples_per_sec 1\n" * 10)
    drained(t)
    t.path.write_bytes(b"samples_per_sec 2\n")  # truncated and rewritten
    assert drained(t) == {"samples_per_sec": (2.0, 2.0, 1)}
    fresh = tmp_path / "new"
    fresh.write_bytes(b"samples_per_sec 3\nsamples_per_sec 3\n" * 2)
    os.replace(fresh, t.path)
    assert drained(t) == {"samples_per_sec": (3.0, 3.0, 4)}


def test_a_flood_is_read_in_bounded_slices_keeping_the_newest(tmp_path: Path) -> None:
    t = tail(tmp_path)
    append(t.path, b"samples_per_sec 7\n" * 100_000 + b"samples_per_sec 99\n")
    got = drained(t)
    value, last, count = got["samples_per_sec"]
    assert value >= 7.0
    assert last == 99.0 and count <= MAX_READ // len(b"samples_per_sec 7\n") + 1
    assert t.offset == t.path.stat().st_size


def test_symlinks_fifos_and_foreign_files_are_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"samples_per_sec 666\n")
    t = tail(tmp_path)
    t.path.symlink_to(secret)
    assert drained(t) == {}
    t.path.unlink()
    os.mkfifo(t.path)  # opening it for reading must not block the daemon
    assert drained(t) == {}
    t.path.unlink()
    t.path.write_bytes(b"samples_per_sec 1\n")
    if os.geteuid() == 0:
        os.chown(t.path, 12345, -1)  # not the job's user nor the daemon's
        owned = JobTail("job-1", t.path, 54321)
        assert drained(owned) == {}


def test_at_most_max_names_per_job(tmp_path: Path) -> None:
    t = tail(tmp_path)
    append(t.path, b"".join(b"m%d 1\n" % i for i in range(MAX_NAMES + 5)))
    assert len(drained(t)) == MAX_NAMES
    assert t.bad_lines == 5


def test_channel_makes_private_directories_and_forgets_ended_jobs(tmp_path: Path) -> None:
    running = {"job-1"}
    sent: list[tuple[str, dict]] = []

    async def send(type_: str, body: dict) -> None:
        sent.append((type_, body))

    channel = MetricsChannel(tmp_path / "metrics", send, running.__contains__, 0.05)
    assert stat.S_IMODE((tmp_path / "metrics").stat().st_mode) == 0o711
    env = channel.job_env("job-1", os.getuid())
    path = Path(env[METRICS_ENV])
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    append(path, b"samples_per_sec 12\n")
    events = channel.poll()
    assert [(e.job_id, e.name, e.value) for e in events] == [("job-1", "samples_per_sec", 12.0)]

    # A job not yet seen running keeps its directory for a few polls (it is starting).
    channel.job_env("job-2", os.getuid())
    channel.poll()
    assert (tmp_path / "metrics" / "job-2").is_dir()
    for _ in range(4):
        channel.poll()
    assert not (tmp_path / "metrics" / "job-2").exists()

    # The last lines of an ended job are still relayed, then its directory goes.
    append(path, b"samples_per_sec 13\n")
    running.clear()
    assert [e.value for e in channel.poll()] == [13.0]
    assert not path.parent.exists() and "job-1" not in channel.tails

    # A restarted job starts clean.
    running.add("job-1")
    path = Path(channel.job_env("job-1", os.getuid())[METRICS_ENV])
    append(path, b"samples_per_sec 1\n")
    channel.job_env("job-1", os.getuid())
    assert not path.exists()

    async def relay() -> None:
        stop = asyncio.Event()
        append(path, b"samples_per_sec 2\n")
        task = asyncio.get_running_loop().create_task(channel.run(stop))
        for _ in range(100):
            if sent:
                break
            await asyncio.sleep(0.02)
        stop.set()
        await task

    asyncio.run(relay())
    assert sent[0][0] == "job_metric" and sent[0][1]["value"] == 2.0


def test_adopt_after_a_restart_keeps_running_jobs_and_cleans_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "metrics"

    async def send(type_: str, body: dict) -> None:
        pass

    first = MetricsChannel(root, send, lambda _: True)
    for job_id in ("alive", "gone"):
        first.job_env(job_id, os.getuid())
    append(root / "alive" / "metrics", b"samples_per_sec 3\n")
    (root / "not a job").mkdir()
    second = MetricsChannel(root, send, {"alive"}.__contains__)
    second.adopt()
    assert set(second.tails) == {"alive"} and not (root / "gone").exists()
    assert [e.value for e in second.poll()] == [3.0]


def test_the_preemption_notice_is_written_only_to_a_plain_file_of_its_own(
        tmp_path: Path) -> None:
    """The root daemon writes into a directory the job's user owns: not through a symbolic
    link, nor into a file the user hard-linked there (someone else's file)."""
    async def send(_: str, __: dict) -> None:
        return None

    channel = MetricsChannel(tmp_path / "metrics", send, lambda _: True)
    env = channel.job_env("victim")
    notice = Path(env["TRELLIS_PREEMPTED_FILE"])
    assert not notice.exists()  # absent until a preemption
    notice.write_text("stale text that is longer than the reason\n")
    channel.note_preempted("victim", "for job prod-1 of priority class production")
    assert notice.read_text() == "for job prod-1 of priority class production\n"
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    notice.unlink()
    os.link(precious, notice)  # a hard link: two names
    channel.note_preempted("victim", "again")
    assert precious.read_text() == "keep me\n"
    notice.unlink()
    notice.symlink_to(precious)
    channel.note_preempted("victim", "again")
    assert precious.read_text() == "keep me\n"
