"""noded's side of image jobs: turns an image job's launch into the container launch, and
cleans up after it (container, CDI spec, the groups podman nested below the job's).

Hooks into JobRunner (noded/jobs.py): ``launch_wrappers`` (rewrite the shim's launch),
``cleanup_hooks`` and ``exit_reasons`` (the one sentence a failed launch left).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noded.batch import SCRIPT_NAME
from noded.cgroups.base import subgroups
from noded.containers import cdi
from noded.containers.launch import (
    CONTAINER_PIDFILE,
    ERROR_FILE,
    EXIT_LAUNCH_FAILED,
    METRICS_DIR,
)
from noded.containers.podman import Podman
from noded.usage.cgroupstat import JobGroups, Mounts
from shared.config import ContainersConfig
from shared.imageref import ImageRefError, parse_image

if TYPE_CHECKING:
    from noded.jobs import JobPart, JobRunner

log = logging.getLogger("trellis.node.containers")


class ContainerLauncher:
    def __init__(self, runner: JobRunner, config: ContainersConfig, state_dir: Path,
                 cdi_dir: Path = cdi.SPEC_DIR) -> None:
        self.runner = runner
        self.config = config
        storage = Path(config.storage_dir) if config.storage_dir else state_dir / "containers"
        self.podman = Podman(storage, config.runtime)
        self.cdi_dir = cdi_dir
        self.unavailable = Podman.available(config.runtime)
        if self.unavailable:
            log.warning("image jobs cannot run on this node: %s", self.unavailable)
        runner.launch_wrappers.append(self.wrap)
        runner.cleanup_hooks.append(self.cleanup)
        runner.exit_reasons.append(self.reason)
        runner.start_ready.append(self.running)

    @staticmethod
    def running(part: JobPart) -> bool:
        """An image job's start is acknowledged once its container's process runs (podman
        wrote its pidfile) or its launch failed; a host job needs nothing more."""
        if not part.prepare.spec.launch.image:
            return True
        return (part.dir / CONTAINER_PIDFILE).exists() or (part.dir / ERROR_FILE).exists()

    def _name(self, part: JobPart) -> str:
        return cdi.device_name(self.runner.node, part.job_id, part.restarts)

    def wrap(self, part: JobPart, launch: dict[str, Any]) -> dict[str, Any]:
        spec = part.prepare.spec
        if not spec.launch.image:
            return launch
        alloc = part.prepare.allocation
        name = self._name(part)
        for d in ("root", "tmp"):
            (self.podman.storage / d).mkdir(parents=True, exist_ok=True)
        scratch = part.dir / "scratch"
        scratch.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(scratch, launch["uid"], launch["gid"])
        # The host's PATH is not the image's: kept only if the job set it itself.
        env = {k: v for k, v in launch["env"].items()
               if k not in ("PATH", "PYTHONPATH") or k in spec.env}
        env["HOME"] = "/scratch"
        command = list(launch["command"])
        if spec.launch.script is not None:
            # The batch script noded wrote in the job's directory is not in the image: it is
            # copied into the scratch the container sees, and run from there.
            command = self._script_in_scratch(part, command, scratch, launch)
        # The container sees only its GPUs, numbered from 0 as CUDA enumerates them there.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(alloc.gpus)))
        env["TRELLIS_NODE_GPUS"] = ",".join(str(g) for g in alloc.gpus)
        # CUDA base images say NVIDIA_VISIBLE_DEVICES=all; an nvidia-container-toolkit OCI
        # hook on the node would then add every GPU. "void": the toolkit adds none (the CDI
        # spec below gives the job's).
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
        metrics_file = env.get("TRELLIS_METRICS_FILE", "")
        if metrics_file:  # the channel's directory is bound in; the variable follows it
            env["TRELLIS_METRICS_FILE"] = f"{METRICS_DIR}/{os.path.basename(metrics_file)}"
        devices: list[str] = []
        refused = ""
        try:
            if alloc.gpus:  # the backend's device files (GpuBackend.device_nodes)
                devices.append(cdi.write_spec(name, self.runner.gpus.device_nodes(),
                                              tuple(alloc.gpus), self.cdi_dir))
        except (OSError, KeyError, ValueError) as exc:
            # The launch fails with this sentence (the job's reason), as any bad input does.
            refused = f"the job's GPUs cannot be given to its container: {exc}"
        if os.geteuid() != 0:  # rootless podman would be another store, user and network
            refused = (f"node {self.runner.node} runs unprivileged; image jobs need noded "
                       "to run as root")
        try:
            registry = parse_image(spec.launch.image).registry
        except ImageRefError:
            registry = ""  # the launch names what is wrong with it
        cfg = {
            "node": self.runner.node, "name": name, "image": spec.launch.image,
            "storage": str(self.podman.storage), "runtime": self.config.runtime,
            "unavailable": self.unavailable, "refused": refused,
            "cache_max_bytes": int(self.config.cache_max_mb * (1 << 20)),
            "pull_timeout_s": self.config.pull_timeout_s,
            "pull_retries": self.config.pull_retries,
            "credentials_dir": self.config.credentials_dir,
            "tls_verify": registry not in self.config.insecure_registries,
            "allowed_mounts": list(self.config.allowed_mounts),
            "mounts": [[m.source, m.target, m.read_only] for m in spec.launch.mounts],
            "cgroup_parent": f"/{self.runner.cgroups_parent()}/{part.job_id}",
            "user": f"{launch['uid']}:{launch['gid']}", "root": launch["uid"] == 0,
            "scratch": str(scratch), "workdir": spec.workdir or "/scratch",
            "pidfile": str(part.dir / CONTAINER_PIDFILE),
            "command": command, "env": env, "devices": devices,
            "metrics_file": metrics_file,
            "metrics_dir": os.path.dirname(metrics_file) if metrics_file else "",
        }
        path = part.dir / "container.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the env
        with os.fdopen(fd, "w") as f:
            json.dump(cfg, f)
        # The shim runs the launch as root in the job's groups; the job's own processes run
        # as its user in the container (podman --user).
        return {**launch, "command": [sys.executable, "-m", "noded.containers.launch",
                                      str(part.dir)],
                "env": {"PATH": launch["env"].get("PATH", "/usr/bin:/bin"),
                        "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                "uid": 0, "gid": 0, "groups": [], "workdir": "/"}

    @staticmethod
    def _script_in_scratch(part: JobPart, command: list[str], scratch: Path,
                           launch: dict[str, Any]) -> list[str]:
        host_path = str(part.dir / SCRIPT_NAME)
        if host_path not in command:
            return command
        inside = scratch / SCRIPT_NAME
        shutil.copyfile(host_path, inside)
        os.chmod(inside, 0o700)
        if os.geteuid() == 0:
            os.chown(inside, launch["uid"], launch["gid"])
        return [f"/scratch/{SCRIPT_NAME}" if arg == host_path else arg for arg in command]

    def usage_groups(self, job_id: str, mounts: Mounts) -> JobGroups | None:
        """What the usage collector meters for a container job: the groups podman makes at
        the job's path in every hierarchy (runc moves the container there, out of the
        accounting group the shim joined). Their counters are hierarchical and keep what
        the removed container group used."""
        part = self.runner.parts.get(job_id)
        if part is None or not part.prepare.spec.launch.image:
            return None
        rel = Path(self.runner.cgroups_parent()) / job_id
        cpuacct, memory = mounts.v1.get("cpuacct"), mounts.v1.get("memory")
        return JobGroups(v2=mounts.v2 / rel if mounts.v2 is not None else None,
                         cpuacct=cpuacct / rel if cpuacct is not None else None,
                         memory=memory / rel if memory is not None else None)

    def reason(self, part: JobPart) -> str:
        if not part.prepare.spec.launch.image:
            return ""
        try:
            return str(json.loads((part.dir / ERROR_FILE).read_text())["reason"])
        except (OSError, ValueError, KeyError):
            pass
        if part.exit_code == EXIT_LAUNCH_FAILED:
            return ("the container runtime could not start the container (podman exit status "
                    "125); its message is in the job's log")
        if self._oom_killed(part):
            limit = part.prepare.allocation.memory_mib
            log.warning("job=%s container killed by the OOM killer memory_limit_mib=%d",
                        part.job_id, limit)
            return (f"out of memory: the kernel's OOM killer stopped it at its memory limit "
                    f"({limit} MiB)")
        return ""

    def _oom_killed(self, part: JobPart) -> bool:
        """The container's process died of SIGKILL (podman's status 137) after the job's
        memory group hit its limit. The OOM killer counts the kill in the group podman
        nested below the job's, which is gone with the container on cgroup v1 (v1 counts are
        not hierarchical; v2's memory.events are, and noded's own check sees them); the
        job's group still says its limit was hit (memory.failcnt)."""
        if part.exit_code != 137 or part.stopping:
            return False
        try:
            files = self.runner.cgroups.attach_files(part.job_id)
        except (LookupError, OSError, ValueError):
            return False
        for procs in files:
            failcnt = procs.parent / "memory.failcnt"
            with contextlib.suppress(OSError, ValueError):
                if int(failcnt.read_text()) > 0:
                    return True
        return False

    def cleanup(self, part: JobPart) -> None:
        if not part.prepare.spec.launch.image:
            return
        name = self._name(part)
        if part.shim_pid is not None and not self.unavailable:
            self._remove_container(name)
        cdi.remove_spec(name, self.cdi_dir)
        self._remove_nested_groups(part.job_id)

    def _remove_container(self, name: str) -> None:
        """``podman rm``: the container ended (its run not being --rm). Killed with the job
        at the end of its grace, conmon left no exit record, and the first ``rm`` only marks
        the container stopped ("container state improper"); the next one removes it."""
        for _attempt in range(3):
            try:
                done = subprocess.run(self.podman.argv("rm", "--force", "--ignore", "--time",
                                                       "0", name),
                                      capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("container %s not removed: %s", name, exc)
                return
            if done.returncode == 0:
                return
        log.warning("container %s not removed: %s", name, done.stderr.strip()[-300:])

    def _remove_nested_groups(self, job_id: str) -> None:
        """podman's cgroupfs manager makes the job's path in every v1 hierarchy, noded's or
        not: remove what it nested under the job's groups, and the job's path where noded
        has no group of its own (noded removes its own groups after this)."""
        parent = self.runner.cgroups_parent()
        managed = self._managed_roots(job_id)
        for root in cgroup_roots():
            top = root / parent / job_id
            if not top.is_dir():
                continue
            for sub in subgroups(top):
                with contextlib.suppress(OSError):
                    os.rmdir(sub)
            if root not in managed:
                with contextlib.suppress(OSError):
                    os.rmdir(top)
                with contextlib.suppress(OSError):  # the last job's: podman made it too
                    os.rmdir(top.parent)

    def _managed_roots(self, job_id: str) -> set[Path]:
        parent = self.runner.cgroups_parent()
        try:
            files = self.runner.cgroups.attach_files(job_id)
        except (LookupError, OSError, ValueError):
            return set()
        roots = set()
        for procs in files:
            group = procs.parent
            if group.name == job_id and group.parent.name == parent:
                roots.add(group.parent.parent)
        return roots


def cgroup_roots() -> list[Path]:
    """Every cgroup hierarchy's mount point (podman's cgroupfs manager uses them all, not only
    the controllers noded manages)."""
    roots = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
                roots.append(Path(fields[1]))
    return roots
