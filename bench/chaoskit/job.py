"""The soak's job: it writes its own evidence, which only the checker reads.

    python job.py EVIDENCE_DIR SECONDS EXIT_CODE [--pty]

Each part (one incarnation of a job on one node rank) appends JSON lines to its own file
``EVIDENCE_DIR/<job>.r<restarts>.n<rank>.<pid>``: ``start`` (with the node, pid, when the
kernel created the process (``spawned``: the part's start) and whether
another live part of the same job and rank held the job's lock: an overlap the kernel
proves), ``warned`` for each warning signal, ``term`` when asked to stop, and ``end`` with the
exit code it is about to exit with. While it runs it touches the file every
``HEARTBEAT_S``: a part killed with SIGKILL leaves no end line, and its last heartbeat says
until when it surely lived. The job's identity comes from the variables the node sets
(TRELLIS_JOB_ID, TRELLIS_RESTART_COUNT, TRELLIS_NODE, NODE_RANK): nothing else of Trellis.
Standard library only: it runs as the job's user, outside the project's environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time

HEARTBEAT_S = 0.25


def spawned_at() -> float:
    """When the kernel created this process (its fork, before any exec and before this
    interpreter started), as wall-clock time: the moment the part came to be, whatever
    this program's own start-up took. /proc/self/stat's starttime counts clock ticks since
    boot; CLOCK_BOOTTIME is that same clock now."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat(5)
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    return time.time() - age


def main(argv: list[str]) -> int:
    evidence, seconds, code = argv[0], float(argv[1]), int(argv[2])
    pty = "--pty" in argv[3:]
    job = os.environ.get("TRELLIS_JOB_ID", "unknown")
    restarts = int(os.environ.get("TRELLIS_RESTART_COUNT", "0") or 0)
    rank = int(os.environ.get("NODE_RANK", "0") or 0)
    node = os.environ.get("TRELLIS_NODE", "")
    path = os.path.join(evidence, f"{job}.r{restarts}.n{rank}.{os.getpid()}")
    lock = os.open(os.path.join(evidence, f"{job}.n{rank}.lock"),
                   os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        overlap = False
    except BlockingIOError:
        overlap = True  # another part of this job and rank is alive right now

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the part's whole life

    def record(event: str, **more: object) -> None:
        out.write(json.dumps({"ev": event, "t": time.time(), **more}) + "\n")
        out.flush()
        os.fsync(out.fileno())

    record("start", job=job, restarts=restarts, rank=rank, node=node, pid=os.getpid(),
           overlap=overlap, spawned=spawned_at())
    stopping: list[int] = []

    def on_term(signum: int, _frame: object) -> None:
        record("term", signal=signum)
        stopping.append(signum)

    def on_warning(signum: int, _frame: object) -> None:
        record("warned", signal=signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    signal.signal(signal.SIGUSR1, on_warning)
    if pty:
        # An interactive session: the client types "exit N" (through the relay) and the job
        # exits with N, as a shell would.
        print("chaos-ready", flush=True)
        os.set_blocking(0, False)
        typed = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stopping:
        os.utime(path)
        if pty:
            with contextlib.suppress(BlockingIOError, OSError):
                typed += os.read(0, 1024) or b""
            if b"\n" in typed or b"\r" in typed:
                line = typed.replace(b"\r", b"\n").split(b"\n")[0].decode(errors="replace")
                words = line.split()
                if len(words) == 2 and words[0] == "exit" and words[1].isdigit():
                    code = int(words[1])
                    break
                typed = b""
        time.sleep(HEARTBEAT_S)
    if stopping:
        code = 128 + stopping[0]
    record("end", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
