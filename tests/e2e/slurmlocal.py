"""A real Slurm (Debian's 22.05: munged, slurmctld, slurmd) on loopback, for side-by-side
tests of batch scripts (tests/e2e/test_slurm_side_by_side.py).

Everything lives in one ``trellis-test-`` directory: munge's own key and socket, the
slurm.conf, the controller's state and the node's spool. One node, named after the directory,
at 127.0.0.1 (its NodeHostname is this host's, so one slurmd serves it without Slurm's
multiple-slurmd build), CPUs only (no GRES: the machine has no GPUs), private ports, no
cgroups (proctrack/linuxproc, task/none), time limits enforced within seconds (OverTimeLimit
0, KillWait 2). Every daemon runs in the foreground as our child and is killed at
:meth:`LocalSlurm.stop`, even when start-up fails half way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "srun")
CPUS = 4


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None
            and not os.path.exists(f"/usr/sbin/{b}")]


def _ports(count: int) -> list[int]:
    """Free TCP ports on loopback (bound then released, as the rest of the suite does)."""
    found: list[int] = []
    holders = []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        holders.append(s)
        found.append(s.getsockname()[1])
    for s in holders:
        s.close()
    return found


class LocalSlurm:
    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = name  # the node's and the cluster's name
        self.conf = root / "slurm.conf"
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment the Slurm commands (sbatch, scontrol) need to find this Slurm."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRELLIS_"))}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def _spawn(self, label: str, argv: list[str]) -> None:
        with open(self.root / f"{label}.out", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=self.env)
        self.procs.append((label, proc))

    def start(self, timeout: float = 60.0) -> None:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.socket = munge / "munge.socket"
        self._spawn("munged", [
            "munged", "--foreground", "--force", f"--key-file={key}",
            f"--socket={self.socket}", f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"])
        self._wait("munged's socket", lambda: self.socket.exists(), timeout)
        for sub in ("state", "spool"):
            (self.root / sub).mkdir(mode=0o755)
        ctld, slurmd, srun_low = _ports(3)
        host = socket.gethostname().split(".")[0]
        self.conf.write_text("\n".join([
            f"ClusterName={self.name.replace('-', '')[:40].lower()}",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"SlurmctldPort={ctld}", f"SlurmdPort={slurmd}",
            f"SrunPortRange={srun_low}-{srun_low + 20}" if srun_low < 65000 else "",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            # A job whose dependency can never hold is cancelled, as Trellis does.
            "DependencyParameters=kill_invalid_depend",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MpiDefault=none",
            "ReturnToService=2", "SlurmdParameters=config_overrides",
            "KillWait=2", "OverTimeLimit=0", "InactiveLimit=0", "MinJobAge=600",
            "MessageTimeout=5", "SlurmdTimeout=30", "SlurmctldTimeout=30",
            f"NodeName={self.name} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={CPUS} "
            "RealMemory=1000 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.name} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait("the Slurm node to be idle", self._idle, timeout)

    def _idle(self) -> bool:
        for label, proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{label} exited with {proc.returncode}: "
                                   f"{self.log_tail(label)}")
        out = self.scontrol("show", "node", self.name, check=False)
        return "State=IDLE" in out

    def log_tail(self, label: str) -> str:
        for path in (self.root / f"{label}.log", self.root / f"{label}.out"):
            if path.exists() and path.stat().st_size:
                return path.read_text(errors="replace")[-3000:]
        return ""

    def _wait(self, what: str, check, timeout: float) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}: "
                                   f"{self.log_tail('slurmctld')}{self.log_tail('slurmd')}")
            time.sleep(0.2)

    def scontrol(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(["scontrol", *args], capture_output=True, text=True, env=self.env,
                           timeout=30)
        if check and r.returncode:
            raise RuntimeError(f"scontrol {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def sbatch(self, script: Path, *args: str, cwd: Path, options: tuple[str, ...] = ()
               ) -> str:
        """Submit; the job id."""
        r = subprocess.run(["sbatch", "--parsable", *options, str(script), *args],
                           capture_output=True, text=True, env=self.env, cwd=cwd, timeout=30)
        if r.returncode:
            raise RuntimeError(f"sbatch {script.name}: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (of the first record: an array's first task)."""
        out = self.scontrol("show", "job", "-o", job_id, check=False)
        fields: dict[str, str] = {}
        for word in out.splitlines()[0].split() if out.strip() else []:
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def jobs(self, job_id: str) -> list[dict[str, str]]:
        """Every record of ``scontrol show job`` for an id (an array's tasks)."""
        out = self.scontrol("show", "job", "-o", job_id, check=False)
        records = []
        for line in out.splitlines():
            fields: dict[str, str] = {}
            for word in line.split():
                key, _, value = word.partition("=")
                fields.setdefault(key, value)
            records.append(fields)
        return records

    def stop(self) -> None:
        """Cancel every job, stop the daemons, and end any process of a job or step that
        outlived them (they carry this Slurm's SLURM_CONF in their environment)."""
        if any(label == "slurmctld" and p.poll() is None for label, p in self.procs):
            subprocess.run(["scancel", "--full", "--user", "root"], env=self.env,
                           capture_output=True, timeout=30)
            subprocess.run(["scancel", "--full", "--user", "nobody"], env=self.env,
                           capture_output=True, timeout=30)
        self._stop_daemons()
        import psutil

        for proc in psutil.process_iter(["pid", "environ"]):
            env = proc.info.get("environ") or {}
            if env.get("SLURM_CONF") == str(self.conf) and proc.pid != os.getpid():
                with contextlib.suppress(psutil.Error):
                    proc.kill()

    def _stop_daemons(self) -> None:
        for _label, proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        self.procs.clear()
