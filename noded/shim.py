"""The per-job shim: ``python -m noded.shim JOBDIR``.

noded starts one shim per job part. The shim joins the job's cgroups and CPU affinity *before*
the job exists (so no instant of the job runs unconfined), forks the job with the submitter's
identity, waits for it and writes its exit status durably to ``JOBDIR/exit.json``. Because
the shim, not noded, is the job's parent, jobs outlive a noded restart and their exit status
is not lost while noded is down.

``JOBDIR/launch.json`` holds: command, env, uid, gid, groups, workdir, cgroup_procs (files to
write our pid into), cpus.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


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
    out = os.open(jobdir / "output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    uid, gid = spec["uid"], spec["gid"]
    if os.geteuid() == 0:
        os.fchown(out, uid, gid)
    read_fd, write_fd = os.pipe()  # carries an exec failure back to the shim
    os.set_inheritable(write_fd, False)
    pid = os.fork()
    if pid == 0:  # the job
        step = "cannot set up the job"
        try:
            os.close(read_fd)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.setpgid(0, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            if os.geteuid() == 0 and uid != 0:
                os.setgroups(spec.get("groups", []))
                os.setgid(gid)
                os.setuid(uid)
            step = f"cannot enter the working directory {spec.get('workdir') or '/'}"
            os.chdir(spec.get("workdir") or "/")
            command = spec["command"]
            step = f"cannot execute {command[0]}"
            os.execvpe(command[0], command, spec["env"])
        except OSError as exc:
            os.write(write_fd, f"{step}: {exc.strerror or exc}".encode()[:512])
        os._exit(127)
    os.close(write_fd)
    os.close(out)
    # Write the child's pid so noded can signal the job's process group (pgid == pid).
    write_atomic(jobdir / "child.json", {"pid": pid, "time": time.time()})
    error = b""
    while chunk := os.read(read_fd, 512):
        error += chunk
    os.close(read_fd)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    result: dict = {"time": time.time()}
    if os.WIFSIGNALED(status):
        result.update(exit_code=None, signal=os.WTERMSIG(status))
    else:
        result.update(exit_code=os.WEXITSTATUS(status), signal=None)
    if error:
        result["error"] = error.decode(errors="replace")
    write_atomic(jobdir / "exit.json", result)
    return 0


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m noded.shim JOBDIR", file=sys.stderr)
        return 2
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
