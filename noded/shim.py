"""The per-job shim: ``python -m noded.shim JOBDIR``.

noded starts one shim per job part. The shim joins the job's cgroups and CPU affinity *before*
the job exists (so no instant of the job runs unconfined), forks the job with the submitter's
identity, waits for it and writes its exit status durably to ``JOBDIR/exit.json``. Because
the shim, not noded, is the job's parent, jobs outlive a noded restart and their exit status
is not lost while noded is down.

``JOBDIR/launch.json`` holds: command, env, uid, gid, groups, workdir, cgroup_procs (files to
write our pid into), cpus, log_max_bytes (the job's output cap; 0: none), optionally
stdout_file, stderr_file and append_output (the job's own output files, copies of what goes
into its log: noded/outputfiles.py), and pty_fd for a job on a terminal (the slave side of its
pseudo-terminal, passed open: run_on_terminal).

The job's stdout and stderr are one pipe the shim relays into ``JOBDIR/output.log`` (splice(2):
the bytes never enter this process), so that the shim can cap the log: past
``log_max_bytes`` it writes one line saying so and discards the rest, and the job goes on
writing as before, never blocked and never killed for it. When the job's process ends the
shim moves what is left in the pipe and records the exit; a process the job left behind that
still writes then gets EPIPE (noded ends such leftovers with the job's cgroup).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import signal
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

PIPE_SIZE = 1 << 20  # the kernel's default pipe-max-size: fewer wake-ups per MiB relayed
STEP = 1 << 20  # bytes moved per splice
# After the job's process ended: how long what its leftovers still write is relayed.
DRAIN_S = 1.0
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def fail(jobdir: Path, message: str) -> int:
    write_atomic(jobdir / "exit.json",
                 {"exit_code": 127, "signal": None, "error": message, "time": time.time()})
    return 127


def run(jobdir: Path) -> int:
    spec = json.loads((jobdir / "launch.json").read_text())
    for procs in spec.get("cgroup_procs", []):
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            return fail(jobdir, f"cannot join cgroup {procs}: {exc.strerror}")
    cpus = spec.get("cpus") or []
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            return fail(jobdir, f"cannot pin to cores {cpus}: {exc.strerror}")
    # The shim must outlive signals aimed at the job, so it can record how the job ended.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if spec.get("pty_fd") is not None:
        return run_on_terminal(jobdir, spec, int(spec["pty_fd"]))
    # Not O_APPEND: splice(2) refuses to write to an append-only file; this is its only writer.
    log_fd = os.open(jobdir / "output.log", os.O_RDWR | os.O_CREAT, 0o640)
    uid, gid = spec["uid"], spec["gid"]
    if os.geteuid() == 0:
        os.fchown(log_fd, uid, gid)
    # The job's own output files (sbatch's --output/--error), tees of the log.
    from noded.outputfiles import open_outputs

    try:
        tee_out, tee_err = open_outputs(spec)
    except OSError as exc:
        os.close(log_fd)
        return fail(jobdir, exc.strerror or str(exc))
    out_read, out = os.pipe()  # the job's stdout (and stderr, unless it has a file of its own)
    os.set_inheritable(out_read, False)
    with contextlib.suppress(OSError):  # a smaller pipe is only slower
        fcntl.fcntl(out, F_SETPIPE_SZ, PIPE_SIZE)
    err_read, err = os.pipe() if tee_err >= 0 else (-1, -1)
    if err_read >= 0:
        os.set_inheritable(err_read, False)

    def stdio() -> None:  # in the job's process: its own group, stdout and stderr the pipes
        os.close(out_read)
        os.close(log_fd)
        for fd in (err_read, tee_out, tee_err):
            if fd >= 0:
                os.close(fd)
        os.setpgid(0, 0)
        os.dup2(out, 1)
        os.dup2(err if err >= 0 else out, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)

    pid, read_fd = _fork_job(spec, "cannot set up the job", stdio)
    os.close(out)
    if err >= 0:
        os.close(err)
    # Write the child's pid so noded can signal the job's process group (pgid == pid).
    write_atomic(jobdir / "child.json", {"pid": pid, "time": time.time()})
    error = _exec_error(read_fd)
    log = LogRelay(out_read, log_fd, int(spec.get("log_max_bytes") or 0), tee=tee_out,
                   more=[(err_read, tee_err)] if err_read >= 0 else [])
    log.run(pid)
    result: dict = {"log_bytes": log.written, "log_dropped": log.dropped}
    if log.error:
        result["log_error"] = log.error
    if log.tee_error:
        result["output_file_error"] = log.tee_error
    return _record_exit(jobdir, pid, error, result)


def run_on_terminal(jobdir: Path, spec: dict, slave: int) -> int:
    """``trellisctl run --pty``: the job runs on the pseudo-terminal noded allocated (its
    slave side is ``slave``, passed open), as the leader of a new session whose controlling
    terminal it is, as login(1) and sshd start a shell. noded keeps the master side and
    relays it (noded/relays.py); what the job writes goes to the terminal, not to the log.
    The job's process group is its session (pgid == pid), as for a batch job."""

    def stdio() -> None:  # in the job's process: a new session, the terminal its stdio
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        for fd in (0, 1, 2):
            os.dup2(slave, fd)
        if slave > 2:
            os.close(slave)

    pid, read_fd = _fork_job(spec, "cannot set up the job's terminal", stdio)
    os.close(slave)  # only the job holds the terminal: its end hangs the terminal up
    write_atomic(jobdir / "child.json", {"pid": pid, "time": time.time()})
    return _record_exit(jobdir, pid, _exec_error(read_fd), {"terminal": True})


def _fork_job(spec: dict, step: str, stdio: Callable[[], None]) -> tuple[int, int]:
    """Fork the job's process: it takes the default signal dispositions back, runs ``stdio``
    (its file descriptors, group or session), then becomes the job's user and executes its
    command. A failure on the way is written, as one sentence (``step``: why, for a failure
    in ``stdio``), on a pipe whose read end is returned with the pid (read by _exec_error)."""
    read_fd, write_fd = os.pipe()  # carries an exec failure back to the shim
    os.set_inheritable(write_fd, False)
    pid = os.fork()
    if pid == 0:  # the job
        try:
            os.close(read_fd)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            stdio()
            _become_and_exec(spec)
        except _Step as failed:
            os.write(write_fd, str(failed).encode()[:512])
        except OSError as exc:
            os.write(write_fd, f"{step}: {exc.strerror or exc}".encode()[:512])
        os._exit(127)
    os.close(write_fd)
    return pid, read_fd


class _Step(Exception):
    """A step of starting the job that failed, as the sentence the job's reason gets."""


def _become_and_exec(spec: dict) -> None:
    """In the forked child, its stdio set: become the job's user, enter its working
    directory and execute its command (never returns; a failed step raises _Step)."""
    uid, gid = spec["uid"], spec["gid"]
    try:
        if os.geteuid() == 0 and uid != 0:
            os.setgroups(spec.get("groups", []))
            os.setgid(gid)
            os.setuid(uid)
    except OSError as exc:
        raise _Step(f"cannot become user {uid}: {exc.strerror or exc}") from None
    workdir = spec.get("workdir") or "/"
    try:
        os.chdir(workdir)
    except OSError as exc:
        raise _Step(f"cannot enter the working directory {workdir}: "
                    f"{exc.strerror or exc}") from None
    command = spec["command"]
    try:
        os.execvpe(command[0], command, spec["env"])
    except OSError as exc:
        raise _Step(f"cannot execute {command[0]}: {exc.strerror or exc}") from None


def _exec_error(read_fd: int) -> bytes:
    """What the child wrote on the exec-failure pipe (nothing once it executed the job)."""
    error = b""
    while chunk := os.read(read_fd, 512):
        error += chunk
    os.close(read_fd)
    return error


def _record_exit(jobdir: Path, pid: int, error: bytes, result: dict) -> int:
    """Wait for the job's process and write how it ended (exit.json, read by noded)."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    result = {"time": time.time(), **result}
    if os.WIFSIGNALED(status):
        result.update(exit_code=None, signal=os.WTERMSIG(status))
    else:
        result.update(exit_code=os.WEXITSTATUS(status), signal=None)
    if error:
        result["error"] = error.decode(errors="replace")
    write_atomic(jobdir / "exit.json", result)
    return 0


class LogRelay:
    """Moves the job's output from its pipe into its log, up to ``cap`` bytes (0: no cap).

    ``tee``: a file that gets a copy of what the pipe gave the log (the job's output file,
    noded/outputfiles.py); ``more``: other pipes (and their tees) relayed into the same log,
    e.g. the job's stderr when it has a file of its own."""

    def __init__(self, pipe: int, log_fd: int, cap: int, tee: int = -1,
                 more: list[tuple[int, int]] | None = None) -> None:
        from noded.outputfiles import Tee

        self.pipe = pipe
        self.log_fd = log_fd
        self.cap = cap
        self.written = os.lseek(log_fd, 0, os.SEEK_END)
        self.dropped = 0
        self.error = ""  # why the log stopped taking output early, if it did
        self._splice = hasattr(os, "splice")
        self._sink = -1  # /dev/null, once output is dropped
        # Each pipe with its tee (a Tee of fd -1 copies nowhere).
        self.sources: list[tuple[int, Tee]] = [(pipe, Tee(tee))] + [
            (p, Tee(t)) for p, t in (more or [])]
        self._tee = self.sources[0][1]
        for p, _ in self.sources:
            os.set_blocking(p, False)

    @property
    def tee_error(self) -> str:
        return "; ".join(t.error for _, t in self.sources if t.error)

    def run(self, pid: int) -> None:
        """Relay until every writer closed every pipe (stdout, and stderr when it has a file
        of its own), or the job's process ended and what it left in the pipes (and its
        leftovers wrote within DRAIN_S) is moved. Each pipe is pumped in turn while it has
        data, closed at its end of file."""
        poller = select.poll()
        open_pipes = {p: tee for p, tee in self.sources}
        for p in open_pipes:
            poller.register(p, select.POLLIN)
        try:
            exited = os.pidfd_open(pid)
        except (AttributeError, OSError):
            exited = -1
        if exited >= 0:
            poller.register(exited, select.POLLIN)
        deadline = None
        try:
            while open_pipes:
                timeout = None
                if deadline is not None:
                    timeout = max(0, int((deadline - time.monotonic()) * 1000))
                try:
                    events = poller.poll(timeout)
                except InterruptedError:
                    continue
                if exited >= 0 and any(fd == exited for fd, _ in events):
                    poller.unregister(exited)
                    os.close(exited)
                    exited = -1
                    deadline = time.monotonic() + DRAIN_S
                for p, tee in list(open_pipes.items()):
                    self.pipe, self._tee = p, tee
                    if self.pump():
                        poller.unregister(p)
                        os.close(p)
                        del open_pipes[p]
                if deadline is not None and time.monotonic() >= deadline:
                    return
        finally:
            if exited >= 0:
                os.close(exited)
            for p in open_pipes:
                os.close(p)
            self._close()

    def _close(self) -> None:
        os.close(self.log_fd)
        if self._sink >= 0:
            os.close(self._sink)
        for _, tee in self.sources:
            tee.close()

    def pump(self) -> bool:
        """Move everything the pipe holds now; True at end of file (no writer left)."""
        while True:
            try:
                if self.error or (self.cap and self.written >= self.cap):
                    moved = self._discard()
                else:
                    step = STEP if not self.cap else min(STEP, self.cap - self.written)
                    moved = self._move(step)
                    self._tee.copy(self.log_fd, self.written, moved)
                    self.written += moved
                    if moved and self.cap and self.written >= self.cap:
                        self._mark_cap()
            except BlockingIOError:
                return False
            except OSError as exc:
                if self.error:  # even dropping failed: nothing more to try
                    raise
                # The log cannot take more (disk full, quota, I/O error): the job must not
                # notice, and the shim must live to record its exit, so the rest is dropped.
                self.error = exc.strerror or str(exc)
                continue
            if moved == 0:
                return True

    def _move(self, step: int) -> int:
        if self._splice:
            try:
                return os.splice(self.pipe, self.log_fd, step, flags=os.SPLICE_F_MOVE
                                 | os.SPLICE_F_NONBLOCK)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                self._splice = False  # a filesystem without splice: copy instead
        data = os.read(self.pipe, step)
        view = memoryview(data)
        while view:
            view = view[os.write(self.log_fd, view):]
        return len(data)

    def _discard(self) -> int:
        if self._sink < 0:
            self._sink = os.open(os.devnull, os.O_WRONLY)
        if self._splice:
            moved = os.splice(self.pipe, self._sink, STEP, flags=os.SPLICE_F_MOVE
                              | os.SPLICE_F_NONBLOCK)
        else:
            moved = len(os.read(self.pipe, STEP))
        self.dropped += moved
        return moved

    def _mark_cap(self) -> None:
        """One line at the cap, on a line of its own, saying what happens to the rest."""
        last = os.pread(self.log_fd, 1, self.written - 1)
        lead = b"" if last == b"\n" else b"\n"
        mib = self.cap / (1 << 20)
        note = (f"[trellis] this job's output reached the node's log cap of {mib:g} MiB "
                "(log_max_mb); the rest is dropped, the job keeps running\n").encode()
        with contextlib.suppress(OSError):  # a full disk drops the note too
            os.write(self.log_fd, lead + note)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m noded.shim JOBDIR", file=sys.stderr)
        return 2
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
