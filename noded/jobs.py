"""Job parts on this node: prepare, start through the shim, stop, watch exits, re-adopt.

Everything a job part needs to survive a noded restart lives in ``STATE/jobs/JOB/``:
``prepare.json`` (what the master asked for), ``launch.json`` (what the shim runs),
``shim.json`` (shim pid and start time), ``child.json`` (the job's pid = process group),
``exit.json`` (written by the shim when the job ends), ``fenced.json`` (the node stopped the
part on its own, cut off from every master: noded/selffence.py), ``output.log`` (moved to
``STATE/logs/JOB.log`` when the master forgets the job; see noded/joblogs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import pwd
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from noded.batch import launch_fields
from noded.cgroups import CgroupError, CgroupManager, GroupBusyError, GroupLimits
from noded.gpu.base import GpuBackend
from noded.gpufence import GpuFence
from noded.shim import write_atomic
from noded.terminals import Terminals
from shared.messages import JobReport, PrepareJob, StalePart, StartJob
from shared.model import JobSpec, check_name
from shared.nodelease import LeasedPart
from shared.schema import decode, encode

log = logging.getLogger("trellis.node.jobs")

# How long a start waits for the shim to fork the job's process before it is acknowledged.
FORK_WAIT_S = 10.0
# A part's cgroup whose killed processes have not left it yet: tries and the pause between.
GROUP_REMOVE_TRIES = 50
GROUP_REMOVE_RETRY_S = 0.2

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class JobRefused(Exception):
    """A command about a job this node will not carry out; ``code`` goes on the wire."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class JobPart:
    job_id: str
    prepare: PrepareJob
    dir: Path
    state: str = "prepared"  # prepared | running | exited
    shim_pid: int | None = None
    shim_ctime: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    reason: str = ""  # why it exited, when the kernel says (the OOM killer)
    stopping: bool = False
    # Why the node stopped it on its own, cut off from every master ("" if it did not).
    fenced: str = ""
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def restarts(self) -> int:
        """The part's incarnation (with the job id): the restart count it was prepared for."""
        return self.prepare.restarts

    def report(self) -> JobReport:
        return JobReport(job_id=self.job_id, state=self.state, pid=self.shim_pid,
                         exit_code=self.exit_code, signal=self.signal, restarts=self.restarts,
                         fenced=bool(self.fenced), reason=(self.reason or self.fenced)[:512],
                         gpus=tuple(self.prepare.allocation.gpus))

    def leased(self) -> LeasedPart:
        """The part as the node lease sees it (shared/nodelease.py)."""
        return LeasedPart(job_id=self.job_id, restarts=self.restarts,
                          requeue_if_lost=self.prepare.requeue_if_lost,
                          grace_s=self.prepare.grace_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class JobRunner:
    def __init__(
        self,
        node: str,
        state_dir: Path,
        cgroups: CgroupManager,
        gpus: GpuBackend,
        allow_root_jobs: bool = False,
        allowed_users: tuple[str, ...] = (),
        numa_of: dict[int, int] | None = None,
        on_exited: Callable[[JobPart], Awaitable[None]] | None = None,
        log_max_bytes: int = 0,
        slurm_env: str = "requested",
    ) -> None:
        self.node = node
        self.dir = state_dir / "jobs"
        self.logs = state_dir / "logs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cgroups = cgroups
        self.gpus = gpus
        self.allow_root_jobs = allow_root_jobs
        self.allowed_users = allowed_users
        self.numa_of = numa_of or {}
        self.on_exited = on_exited
        # Told when a part of an older incarnation is stopped or dropped because the master
        # asked for a newer one (the agent reports it as a stale_part event).
        self.on_stale: Callable[[StalePart], None] | None = None
        # The shim caps each part's output at this many bytes (0: no cap); see noded/shim.py.
        self.log_max_bytes = log_max_bytes
        # Which jobs also see Slurm's variable names ([jobs] slurm_env; noded/batch.py).
        self.slurm_env = slurm_env
        self.parts: dict[str, JobPart] = {}
        # More channels a job gets in its environment, e.g. the metrics channel:
        # (job id, owner uid) -> variables.
        self.env_providers: list[Callable[[str, int], dict[str, str]]] = []
        # More groups the shim joins before exec (usage accounting): job id -> procs files.
        self.attach_providers: list[Callable[[str], list[Path]]] = []
        # Called as a part's processes are gone and before its groups are removed (the last
        # reading of what it used): part -> None.
        self.cleanup_hooks: list[Callable[[JobPart], None]] = []
        # The GPU device fence each job's group gets before the job starts (noded/gpufence.py).
        self.gpu_fence: GpuFence | None = None
        # Rewrite a part's launch before the shim runs it (an image job runs its container
        # launch instead: noded/containers): (part, launch) -> launch.
        self.launch_wrappers: list[Callable[[JobPart, dict[str, Any]], dict[str, Any]]] = []
        # Why a part ended, asked before the kernel's OOM count (a container launch that
        # failed): part -> sentence, "" when the hook has nothing to say.
        self.exit_reasons: list[Callable[[JobPart], str]] = []
        # Whether a started part's own process runs yet, beyond the shim's fork (an image
        # job's container, which podman starts later): part -> bool. until_forked waits for
        # every one of them before a start is acknowledged.
        self.start_ready: list[Callable[[JobPart], bool]] = []
        # The master sides of the pseudo-terminals of jobs run with launch.pty.
        self.terminals = Terminals()
        self.cleanup_hooks.append(lambda part: self.terminals.close(part.job_id))

    # -- commands ------------------------------------------------------------------------
    def _identity(self, user: str) -> pwd.struct_passwd:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise JobRefused("unknown_user", f"Unix user {user!r} does not exist on "
                             f"node {self.node}") from None
        if entry.pw_uid == 0 and not self.allow_root_jobs:
            raise JobRefused("user_refused", f"node {self.node} does not run jobs as root")
        if self.allowed_users and user not in self.allowed_users:
            raise JobRefused("user_refused", f"user {user!r} is not allowed on {self.node}")
        if os.geteuid() != 0 and entry.pw_uid != os.geteuid():
            raise JobRefused(
                "user_refused",
                f"node {self.node} runs unprivileged and can only start jobs as "
                f"{pwd.getpwuid(os.geteuid()).pw_name}, not {user!r}",
            )
        return entry

    def prepare(self, cmd: PrepareJob) -> dict[str, Any]:
        job_id = check_name(cmd.job_id, "job id")
        existing = self.parts.get(job_id)
        if existing is not None and existing.restarts != cmd.restarts:
            self._supersede(existing, cmd)  # raises while an older part still runs
            existing = self.parts.get(job_id)
        if existing is not None:
            if existing.state == "prepared":
                return {"port": (existing.prepare.node_rank == 0 and self._port(existing)) or 0}
            raise JobRefused("job_exists", f"job {job_id} is already {existing.state} here")
        if cmd.allocation.node != self.node:
            raise JobRefused("wrong_node", f"allocation is for {cmd.allocation.node}, "
                             f"this is {self.node}")
        self._identity(cmd.spec.user)
        busy_gpus = {g for p in self.parts.values() if p.state != "exited"
                     for g in p.prepare.allocation.gpus}
        clash = busy_gpus & set(cmd.allocation.gpus)
        # A shared allocation joins GPUs on purpose: the master shares a GPU only where its
        # accounting allows (fractional jobs; a GPU lent by a job saving its model).
        if clash and not cmd.allocation.shared:
            raise JobRefused("gpus_busy", f"GPUs {sorted(clash)} are in use on {self.node}")
        jobdir = self.dir / job_id
        if jobdir.exists():  # left from an earlier attempt the master already settled
            shutil.rmtree(jobdir)
        jobdir.mkdir()
        limits = self._group_limits(cmd)
        try:
            self.cgroups.create(job_id, limits)
        except (OSError, ValueError) as exc:
            shutil.rmtree(jobdir, ignore_errors=True)
            raise JobRefused("cgroup_failed", f"cannot create the job's cgroup: {exc}") from exc
        self._fence(job_id, cmd, jobdir)
        part = JobPart(job_id, cmd, jobdir)
        port = free_port() if cmd.node_rank == 0 else 0
        write_atomic(jobdir / "prepare.json", {"prepare": encode(cmd), "port": port})
        self.parts[job_id] = part
        log.info("job=%s prepared gpus=%s cpus=%s", job_id, list(cmd.allocation.gpus),
                 list(cmd.allocation.cpus))
        return {"port": port}

    def _fence(self, job_id: str, cmd: PrepareJob, jobdir: Path) -> None:
        """Fence the new group from the GPUs the job was not given; on failure nothing of the
        part is left (its group included) and the prepare is refused."""
        if self.gpu_fence is None:
            return
        try:
            self.gpu_fence.apply(job_id, tuple(cmd.allocation.gpus))
        except (OSError, ValueError, LookupError, RuntimeError) as exc:
            with contextlib.suppress(OSError, ValueError, LookupError, RuntimeError):
                self.cgroups.remove(job_id)
            shutil.rmtree(jobdir, ignore_errors=True)
            raise JobRefused("gpu_fence_failed", f"cannot fence job {job_id} from the GPUs "
                             f"it was not given on {self.node}: {exc}") from exc

    def _supersede(self, part: JobPart, cmd: PrepareJob) -> None:
        """The master asks for incarnation ``cmd.restarts`` of a job this node holds a part
        of in another incarnation. A newer one wins: the older part is dropped (prepared),
        stopped (running: the prepare is refused until it has exited) or its unrecorded
        exit reported once more and forgotten. An older one is refused."""
        job_id, old, new = part.job_id, part.restarts, cmd.restarts
        if new < old:
            raise JobRefused("stale_incarnation", f"job {job_id} incarnation {new} is older "
                             f"than incarnation {old} on node {self.node}; not prepared")
        reason = (f"incarnation {old} of job {job_id} is stale: the master asked node "
                  f"{self.node} for incarnation {new}")
        if part.state == "prepared":
            self.stop(job_id, 0.0, reason)
            self._report_stale(part, new, reason)
            return
        if part.state == "exited":
            # The master never recorded this exit (it forgets what it recorded): tell it
            # once more, then make room for the new part.
            log.info("job=%s incarnation %d exited unrecorded; forgotten for incarnation %d",
                     job_id, old, new)
            if self.on_exited is not None:
                asyncio.get_running_loop().create_task(self.on_exited(part))
            self.forget(job_id)
            return
        if not part.stopping:
            self.stop(job_id, part.prepare.grace_s, reason)
            self._report_stale(part, new, reason)
        raise JobRefused("stale_part_stopping", f"job {job_id} incarnation {new} cannot be "
                         f"prepared on node {self.node} yet: its incarnation {old} still runs "
                         "here and is being stopped")

    def _report_stale(self, part: JobPart, newer: int, reason: str) -> None:
        log.warning("job=%s incarnation=%d stale (%s part); master asked for incarnation %d",
                    part.job_id, part.restarts, part.state, newer)
        if self.on_stale is not None:
            self.on_stale(StalePart(job_id=part.job_id, restarts=part.restarts, newer=newer,
                                    state="prepared" if part.state == "prepared"
                                    else "running", reason=reason[:512]))

    def _group_limits(self, cmd: PrepareJob) -> GroupLimits:
        # A GPU job given no dedicated cores shares the cores this node offers (an empty
        # cpuset could run nothing).
        cpus = tuple(cmd.allocation.cpus) or tuple(sorted(self.numa_of))
        mems = sorted({self.numa_of.get(c, 0) for c in cpus}) or [0]
        return GroupLimits(
            cpus=cpus,
            mems=tuple(mems),
            memory_bytes=cmd.allocation.memory_mib * 1024 * 1024 or None,
        )

    def _repin(self, part: JobPart) -> None:
        """Re-apply a re-adopted part's confinement from its allocation: whatever drifted while
        noded was down (a group rewritten or lost, a process re-pinned) is put back."""
        try:
            self.cgroups.create(part.job_id, self._group_limits(part.prepare))
            if self.gpu_fence is not None:
                self.gpu_fence.apply(part.job_id, tuple(part.prepare.allocation.gpus))
            members = set(self.cgroups.pids(part.job_id))
            for pid in _job_processes(part):
                if pid not in members:
                    with contextlib.suppress(ProcessLookupError):
                        self.cgroups.add_pid(part.job_id, pid)
            cpus = part.prepare.allocation.cpus
            if cpus:
                # The shim pinned the job by affinity too; a cgroup that did not change leaves
                # a drifted affinity alone, so set it again on every process of the job.
                for pid in _job_processes(part):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.sched_setaffinity(pid, cpus)
        except (OSError, ValueError, LookupError, RuntimeError) as exc:
            log.warning("job=%s pinning not re-applied: %s", part.job_id, exc)

    def _port(self, part: JobPart) -> int:
        try:
            return int(json.loads((part.dir / "prepare.json").read_text()).get("port", 0))
        except (OSError, ValueError):
            return 0

    def start(self, cmd: StartJob) -> dict[str, Any]:
        part = self.parts.get(cmd.job_id)
        if part is None:
            raise JobRefused("not_prepared", f"job {cmd.job_id} was not prepared on {self.node}")
        if part.restarts != cmd.restarts:
            raise JobRefused("stale_incarnation", f"job {cmd.job_id} incarnation "
                             f"{cmd.restarts} is not the one prepared on {self.node} "
                             f"(incarnation {part.restarts}); not started")
        if part.state != "prepared":
            return {"pid": part.shim_pid}  # a repeated start is harmless
        spec, alloc = part.prepare.spec, part.prepare.allocation
        entry = self._identity(spec.user)
        env = self._environment(part, spec, entry, cmd)
        launch = {
            "command": list(spec.command),
            "env": env,
            "uid": entry.pw_uid,
            "gid": entry.pw_gid,
            "groups": os.getgrouplist(entry.pw_name, entry.pw_gid) if os.geteuid() == 0 else [],
            # A service account's home often does not exist (nobody: /nonexistent).
            "workdir": spec.workdir or (entry.pw_dir if os.path.isdir(entry.pw_dir) else "/"),
            "cgroup_procs": [str(p) for p in self.cgroups.attach_files(part.job_id)]
            + [str(p) for provide in self.attach_providers for p in provide(part.job_id)],
            "cpus": list(alloc.cpus),
            "log_max_bytes": self.log_max_bytes,
        }
        try:  # a batch script, output files, Slurm's variables (noded/batch.py)
            launch.update(launch_fields(part.dir, part.prepare, part.job_id, self.node,
                                        entry.pw_uid, entry.pw_gid, env, launch["workdir"],
                                        self.slurm_env))
        except (OSError, ValueError) as exc:
            raise JobRefused("launch_failed", f"cannot set up job {part.job_id}'s batch "
                             f"script on {self.node}: {exc}") from exc
        for wrap in self.launch_wrappers:
            launch = wrap(part, launch)
        slave = -1
        if spec.launch.pty:  # trellisctl run --pty: the shim gets the terminal's slave side
            slave = self.terminals.allocate(part.job_id, entry.pw_uid, entry.pw_gid)
            launch["pty_fd"] = slave
        try:
            write_atomic(part.dir / "launch.json", launch)
            popen = subprocess.Popen(
                [sys.executable, "-m", "noded.shim", str(part.dir)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True, pass_fds=(slave,) if slave >= 0 else (),
                cwd="/", env={"PATH": DEFAULT_PATH, "PYTHONPATH": _package_root()},
            )
        except BaseException:
            self.terminals.close(part.job_id)
            raise
        finally:
            if slave >= 0:
                os.close(slave)
        part.popen = popen
        part.shim_pid = popen.pid
        part.shim_ctime = _ctime(popen.pid)
        part.state = "running"
        if self.cgroups.kind == "affinity":
            self.cgroups.add_pid(part.job_id, popen.pid)
        write_atomic(part.dir / "shim.json", {"pid": popen.pid, "ctime": part.shim_ctime})
        self.gpus.job_started(part.job_id, tuple(alloc.gpus), (popen.pid,))
        part.watcher = asyncio.get_running_loop().create_task(self._watch(part))
        log.info("job=%s started shim_pid=%d user=%s", part.job_id, popen.pid, spec.user)
        return {"pid": popen.pid}

    def _environment(self, part: JobPart, spec: JobSpec, entry: pwd.struct_passwd,
                     cmd: StartJob) -> dict[str, str]:
        alloc, prep = part.prepare.allocation, part.prepare
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": entry.pw_dir,
            "USER": entry.pw_name,
            "LOGNAME": entry.pw_name,
            "LANG": "C.UTF-8",
        }
        env.update(spec.env)
        env.update({
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in alloc.gpus),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            # torch.distributed's env:// rendezvous, one process per node; a script that
            # wants one process per GPU runs torchrun with NNODES/NODE_RANK/NPROC_PER_NODE.
            "MASTER_ADDR": cmd.master_addr,
            "MASTER_PORT": str(cmd.master_port),
            "WORLD_SIZE": str(prep.nnodes),
            "RANK": str(prep.node_rank),
            "LOCAL_RANK": "0",
            "NNODES": str(prep.nnodes),
            "NODE_RANK": str(prep.node_rank),
            "NPROC_PER_NODE": str(max(1, len(alloc.gpus))),
            "OMP_NUM_THREADS": str(max(1, len(alloc.cpus))),
            "TRELLIS_JOB_ID": part.job_id,
            # Times the job was requeued after a failure: 0 on its first run.
            "TRELLIS_RESTART_COUNT": str(prep.restarts),
            "TRELLIS_NODE": self.node,
            "TRELLIS_CPUS": ",".join(str(c) for c in alloc.cpus),
        })
        # The GPU backend may hand the job a channel of its own (the emulation's progress file).
        env.update(self.gpus.job_env(part.job_id, entry.pw_uid))
        for provide in self.env_providers:
            env.update(provide(part.job_id, entry.pw_uid))
        return env

    def leased_parts(self) -> list[LeasedPart]:
        """The running parts the node lease may stop: not being stopped already."""
        return [p.leased() for p in self.parts.values()
                if p.state == "running" and not p.stopping and not p.fenced]

    def fence(self, job_id: str, grace_s: float, reason: str) -> bool:
        """Stop a running part on the node's own authority (its lease ran out), recording
        why first, in memory and in the part's directory (a noded restart still reports it
        ``fenced``). False if the part no longer runs."""
        part = self.parts.get(job_id)
        if part is None or part.state != "running" or part.fenced:
            return False
        try:
            write_atomic(part.dir / "fenced.json", {"reason": reason})
        except OSError as exc:  # stopping it matters more than the record
            log.error("job=%s fence not recorded: %s", job_id, exc)
        part.fenced = reason
        log.warning("job=%s stopped by this node: %s", job_id, reason)
        self.stop(job_id, grace_s, reason)
        return True

    def cgroups_parent(self) -> str:
        """The name of the group the node's job groups live under (``cgroup_parent``)."""
        return str(getattr(self.cgroups, "parent", "trellis"))

    async def until_forked(self, job_id: str, timeout_s: float = FORK_WAIT_S) -> None:
        """Until the part's shim has forked the job's process (child.json written), the shim
        has ended, or ``timeout_s``. The start is acknowledged only then: a stop that came
        between the shim's spawn and its fork found no process group to signal, the job ran
        on until the grace's SIGKILL, and started after the master had acknowledged a
        cancel that was waiting for this start."""
        deadline = time.monotonic() + timeout_s
        while True:
            part = self.parts.get(job_id)
            if part is None or part.state != "running" \
                    or (part.popen is not None and part.popen.poll() is not None) \
                    or (part.dir / "exit.json").exists():
                return
            if _child_pid(part.dir) is not None and all(ready(part)
                                                         for ready in self.start_ready):
                return
            if time.monotonic() > deadline:
                log.warning("job=%s shim has not forked the job after %.0f s; acknowledging "
                            "the start anyway", job_id, timeout_s)
                return
            await asyncio.sleep(0.005)

    def is_running(self, job_id: str) -> bool:
        part = self.parts.get(job_id)
        return part is not None and part.state == "running"

    def stop(self, job_id: str, grace_s: float, reason: str,
             restarts: int | None = None, warning: str | None = None,
             before: Callable[[], None] | None = None) -> None:
        """Stop a part (``restarts``: only that incarnation or an older one; a newer part
        of the job is left alone): ``warning`` (default SIGTERM) at once, SIGKILL after
        ``grace_s`` if it still runs. ``before`` runs just before the first signal, once per
        part: a stop sent again (the master does when a start is reported late) must not
        redo it (the preemption notice, rewritten while the job reads it, read empty)."""
        part = self.parts.get(job_id)
        if part is None or part.state == "exited":
            return
        if restarts is not None and part.restarts > restarts:
            log.info("job=%s stop of incarnation %d ignored: incarnation %d runs here",
                     job_id, restarts, part.restarts)
            return
        if part.state == "prepared":
            self._cleanup(part)
            del self.parts[job_id]
            shutil.rmtree(part.dir, ignore_errors=True)
            log.info("job=%s dropped before start: %s", job_id, reason)
            return
        if part.stopping:
            return
        part.stopping = True
        log.info("job=%s stopping grace=%.1fs reason=%s", job_id, grace_s, reason)
        if before is not None:
            before()
        if part.prepare.spec.launch.pty:
            # A job on a terminal is stopped as a hung-up terminal stops a session: an
            # interactive shell ignores SIGTERM, not SIGHUP.
            self._signal(part, signal.SIGHUP)
        # A preempted job's own --signal (e.g. SIGUSR1 to checkpoint) instead of SIGTERM.
        self._signal(part, signal.Signals[warning] if warning else signal.SIGTERM)
        asyncio.get_running_loop().call_later(grace_s, self._kill, part)

    def _kill(self, part: JobPart) -> None:
        if part.state == "running":
            log.warning("job=%s did not stop within its grace period; killing", part.job_id)
            self._signal(part, signal.SIGKILL)

    def _signal(self, part: JobPart, sig: int) -> None:
        pgid = _child_pid(part.dir)
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        if sig == signal.SIGKILL:
            # Processes that left the job's process group are still in its cgroup; spare the
            # shim, which must live to record the exit.
            for pid in self.cgroups.pids(part.job_id):
                if pid != part.shim_pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)

    def send_signal(self, job_id: str, name: str, leader_only: bool = False,
                    restarts: int | None = None) -> bool:
        """Send signal ``name`` (SIGUSR1, ...) to a running part: its whole process group,
        or only its leader process (Slurm's --signal B:). False if it no longer runs (or
        is not incarnation ``restarts``)."""
        part = self.parts.get(job_id)
        if part is None or part.state != "running":
            return False
        if restarts is not None and part.restarts != restarts:
            return False
        sig = signal.Signals[name]
        pgid = _child_pid(part.dir)
        if pgid is None:
            return False
        try:
            if leader_only:
                os.kill(pgid, sig)
            else:
                os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        log.info("job=%s sent %s to %s", job_id, name,
                 "its leader process" if leader_only else "its process group")
        return True

    def forget(self, job_id: str, restarts: int | None = None) -> None:
        """Drop an exited part's state (``restarts``: only if the exit recorded was of that
        incarnation or a newer one)."""
        part = self.parts.get(job_id)
        if part is not None and part.state != "exited":
            return  # only exited parts may be forgotten
        if part is not None and restarts is not None and part.restarts > restarts:
            return  # the master recorded an older incarnation's exit, not this one's
        self.parts.pop(job_id, None)
        # The job's output outlives its state: users read it after the job has ended.
        output = self.dir / job_id / "output.log"
        if output.exists():
            self._keep_log(job_id, output)
        shutil.rmtree(self.dir / job_id, ignore_errors=True)

    def _keep_log(self, job_id: str, output: Path) -> None:
        """Move a forgotten part's output into the log directory, which may be a disk of its
        own (a rename cannot cross it: copied then) and may be full (the output is then
        dropped with a warning: forgetting a part must never fail on its log)."""
        kept = self.logs / f"{job_id}.log"
        try:
            self.logs.mkdir(exist_ok=True)
            try:
                os.replace(output, kept)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.copyfile(output, kept)
            # Its retention (log_retention_h, noded/joblogs.py) counts from now, its end.
            os.utime(kept)
        except OSError as exc:
            log.warning("job=%s output not kept in %s: %s", job_id, self.logs, exc)
            with contextlib.suppress(OSError):
                kept.unlink()

    def reports(self) -> list[JobReport]:
        return [p.report() for p in self.parts.values()]

    # -- exits ---------------------------------------------------------------------------
    async def _watch(self, part: JobPart) -> None:
        assert part.shim_pid is not None
        await _wait_pid(part.shim_pid, part.popen)
        try:
            self._collect(part)
        except Exception:  # whatever went wrong collecting it, the exit is still reported
            log.exception("job=%s collecting the exit failed; reporting it as recorded",
                          part.job_id)
            part.state = "exited"
        if self.on_exited is not None:
            await self.on_exited(part)

    def _collect(self, part: JobPart) -> None:
        try:
            result = json.loads((part.dir / "exit.json").read_text())
        except (OSError, ValueError):
            result = {"exit_code": None, "signal": signal.SIGKILL,
                      "error": "the job's shim died without recording an exit status"}
        part.state = "exited"
        part.exit_code = result.get("exit_code")
        part.signal = result.get("signal")
        part.error = result.get("error")
        # The shim's own error (the job could not be started: an output file it may not
        # write, a program that is not there) says more than the exit code 127.
        part.reason = self._exit_reason(part) or part.fenced or (part.error or "")
        self._cleanup(part)
        log.info("job=%s exited code=%s signal=%s%s", part.job_id, part.exit_code, part.signal,
                 f" error={part.error!r}" if part.error else "")

    def _exit_reason(self, part: JobPart) -> str:
        """Why the part ended, when the kernel knows better than its exit status: killed by
        the OOM killer at its memory limit (read before the group is removed)."""
        for explain in self.exit_reasons:
            try:
                reason = explain(part)
            except Exception:  # a hook must never lose the exit itself
                log.exception("job=%s exit reason hook failed", part.job_id)
                continue
            if reason:
                return reason
        try:
            kills = self.cgroups.oom_kills(part.job_id)
        except (OSError, ValueError) as exc:
            log.debug("job=%s OOM count unreadable: %s", part.job_id, exc)
            return ""
        if not kills:
            return ""
        limit = part.prepare.allocation.memory_mib
        log.warning("job=%s killed by the OOM killer kills=%d memory_limit_mib=%d",
                    part.job_id, kills, limit)
        return (f"out of memory: the kernel's OOM killer stopped it at its memory limit "
                f"({limit} MiB)")

    def _cleanup(self, part: JobPart) -> None:
        for hook in self.cleanup_hooks:
            try:
                hook(part)
            except Exception:  # a hook must never keep a job's groups from going
                log.exception("job=%s cleanup hook failed", part.job_id)
        self.gpus.job_ended(part.job_id)
        self._remove_group(part.job_id, GROUP_REMOVE_TRIES)

    def _remove_group(self, job_id: str, tries: int) -> None:
        """Kill what is left in a part's cgroup and remove the group. Processes just killed
        may not have left the group yet (a container's conmon, a job's stray children): the
        removal is tried again a little later, from the loop, never by blocking it, and a
        failure is logged, never raised (the part's exit must still be reported)."""
        try:
            if self.cgroups.pids(job_id):
                self.cgroups.signal_all(job_id, signal.SIGKILL)
            self.cgroups.remove(job_id)
            return
        except LookupError:
            # Removed already: a part that exited before a noded restart is collected again
            # when it is re-adopted (its exit still to be reported).
            log.debug("job=%s cgroup already removed", job_id)
            return
        except GroupBusyError as exc:
            problem: Exception = exc
        except (OSError, ValueError, CgroupError) as exc:
            log.warning("job=%s cgroup cleanup failed: %s", job_id, exc)
            return
        if tries <= 1 or (job_id in self.parts and self.parts[job_id].state == "running"):
            log.warning("job=%s cgroup not removed: %s", job_id, problem)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a tool, a test): nothing to retry from
            log.warning("job=%s cgroup not removed: %s", job_id, problem)
            return
        loop.call_later(GROUP_REMOVE_RETRY_S, self._remove_group, job_id, tries - 1)

    # -- restart -------------------------------------------------------------------------
    def adopt(self) -> None:
        """Re-adopt job parts a previous noded left running (or exited while it was down)."""
        for jobdir in sorted(self.dir.iterdir()):
            try:
                check_name(jobdir.name, "job id")
                saved = json.loads((jobdir / "prepare.json").read_text())
                prepare = decode(PrepareJob, saved["prepare"])
            except (OSError, ValueError, KeyError) as exc:
                self._drop_unfinished(jobdir, exc)
                continue
            part = JobPart(jobdir.name, prepare, jobdir)
            self.parts[part.job_id] = part
            fenced = _read_json(jobdir / "fenced.json")
            if fenced is not None:
                part.fenced = str(fenced.get("reason", "")) or "stopped by this node"
            shim = _read_json(jobdir / "shim.json")
            if shim is None:
                continue  # prepared, never started
            part.shim_pid, part.shim_ctime = shim["pid"], shim.get("ctime")
            if (jobdir / "exit.json").exists() or not _alive(part.shim_pid, part.shim_ctime):
                self._collect(part)
                continue
            part.state = "running"
            alloc = prepare.allocation
            self._repin(part)
            try:
                self.gpus.job_started(part.job_id, tuple(alloc.gpus), (part.shim_pid,))
            except ValueError as exc:
                # The node came back with fewer GPUs: keep the part (it still runs, it is
                # reported), and the master, which placed it, stops it (a failed part).
                log.warning("job=%s re-adopted on GPUs this node no longer has: %s",
                            part.job_id, exc)
            part.watcher = asyncio.get_running_loop().create_task(self._watch(part))
            log.info("job=%s re-adopted shim_pid=%d cpus=%s", part.job_id, part.shim_pid,
                     list(alloc.cpus))
            if part.fenced:
                # Stopped on this node's own authority before the restart, whose SIGKILL
                # timer went with it: stop it again (its grace counts from now).
                self.stop(part.job_id, prepare.grace_s, part.fenced)

    def _drop_unfinished(self, jobdir: Path, problem: Exception) -> None:
        """A job directory without a readable prepare.json: noded died while preparing the
        part (prepare.json is its last step, so the prepare was never acknowledged and the
        master does not count the part). Its cgroup and directory go, unless a shim ever
        ran there (then it is left, and said: nothing of a job is removed on a guess).
        Found by the chaos soak: such a group stayed behind forever."""
        started = (jobdir / "shim.json").exists() or (jobdir / "child.json").exists()
        try:
            check_name(jobdir.name, "job id")
        except ValueError:
            started = True  # not a job's directory: not ours to remove
        if started:
            log.warning("ignoring unreadable job state %s: %s", jobdir, problem)
            return
        log.warning("job=%s dropping a part whose prepare was cut short (%s)", jobdir.name,
                    problem)
        self._remove_group(jobdir.name, GROUP_REMOVE_TRIES)
        shutil.rmtree(jobdir, ignore_errors=True)

    async def shutdown(self) -> None:
        """noded is stopping: leave jobs running (their shims keep them), stop watching."""
        for part in self.parts.values():
            if part.watcher is not None:
                part.watcher.cancel()


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _child_pid(jobdir: Path) -> int | None:
    data = _read_json(jobdir / "child.json")
    return int(data["pid"]) if data else None


def _job_processes(part: JobPart) -> list[int]:
    """The job's processes (its process group and their descendants), not the shim."""
    pgid = _child_pid(part.dir)
    if pgid is None:
        return []
    found: list[int] = []
    try:
        leader = psutil.Process(pgid)
        found = [leader.pid, *(c.pid for c in leader.children(recursive=True))]
    except psutil.Error:
        pass
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if proc.pid not in found and os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
    return found


def _ctime(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(pid: int, ctime: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        if ctime is not None and abs(proc.create_time() - ctime) > 0.01:
            return False  # the pid was reused by another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# How often _wait_pid polls a pidfd itself, beside the event loop's notification.
_EXIT_BACKSTOP_S = 5.0


async def _wait_pid(pid: int, popen: subprocess.Popen[bytes] | None) -> None:
    """Wait for a process to end, child or not: pidfd readability is the exit notification."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        fd = -1
    if fd >= 0:
        done = loop.create_future()
        loop.add_reader(fd, lambda: done.done() or done.set_result(None))
        try:
            # The loop's reader is the notification; a direct poll of the pidfd now and then
            # is the backstop, so that no mishandled fd elsewhere in the daemon (a watcher
            # that closed its own fd while registered, see noded/joblogs.py) can lose an exit.
            while not done.done():
                await asyncio.wait({done}, timeout=_EXIT_BACKSTOP_S)
                if not done.done() and select.select([fd], [], [], 0)[0]:
                    log.warning("pid=%d exit seen by the backstop poll, not the event loop",
                                pid)
                    break
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    if popen is not None:
        popen.wait()  # reap our own child
    else:
        while _alive(pid, None):  # pidfd unavailable: a non-child we cannot reap
            await asyncio.sleep(0.2)
