"""Does a container get its GPUs and nothing else? For tests and bench/container_start.py.

``fake_gpu_nodes`` makes character devices with NVIDIA's major number (195) in a scratch
directory (what an emulated node's ``device_nodes()`` describes: the driver is absent, so
opening one gives ENXIO, never data). ``probe`` runs the real container launch
(noded/containers/launch.py: podman + runc, the CDI spec noded writes) for a job given some
of them, and the container tries to open every GPU device file, its own and the others',
at /dev and at their host paths, and to mknod the others. Everything it makes (job dir, CDI
spec, container, cgroups) is removed after.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from noded.cgroups.base import subgroups
from noded.containers import cdi
from noded.containers.launcher import cgroup_roots
from noded.containers.podman import Podman
from noded.gpu.devices import NVIDIA_MAJOR, NVIDIACTL_MINOR, DeviceNode, GpuDeviceNodes


def fake_gpu_nodes(directory: Path, count: int) -> GpuDeviceNodes:
    directory.mkdir(parents=True, exist_ok=True)
    gpus = {}
    for i in range(count):
        path = directory / f"nvidia{i}"
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
        gpus[i] = DeviceNode(str(path), NVIDIA_MAJOR, i)
    ctl = directory / "nvidiactl"
    os.mknod(ctl, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, NVIDIACTL_MINOR))
    return GpuDeviceNodes(gpus=gpus, control=(DeviceNode(str(ctl), NVIDIA_MAJOR,
                                                         NVIDIACTL_MINOR),))


@dataclass
class ProbeResult:
    present: list[str]  # /dev/nvidia* files the container sees
    opened: dict[str, str]  # path -> "ok" or the error the open gave
    mknod: dict[str, str]  # the other GPUs' device numbers -> "ok" or the error
    output: str
    exit_code: int

    def escapes(self, given: tuple[int, ...], nodes: GpuDeviceNodes) -> tuple[int, int]:
        """(attempts, escapes) at the GPUs the job was not given."""
        others = [n for i, n in nodes.gpus.items() if i not in given]
        paths = [p for n in others for p in (n.path, f"/dev/{os.path.basename(n.path)}")]
        attempts = len(paths) + len(self.mknod)
        escapes = sum(1 for p in paths if self.opened.get(p) == "ok")
        escapes += sum(1 for v in self.mknod.values() if v == "ok")
        return attempts, escapes


def _script(nodes: GpuDeviceNodes, given: tuple[int, ...]) -> str:
    paths = [p for n in nodes.gpus.values()
             for p in (n.path, f"/dev/{os.path.basename(n.path)}")] + ["/dev/nvidiactl"]
    lines = ["for f in /dev/nvidia*; do [ -e \"$f\" ] && echo \"present $f\"; done"]
    for p in paths:
        lines.append(f"if cat {p} >/dev/null 2>/tmp/e; then echo 'open {p} ok'; "
                     f"else echo \"open {p} $(cat /tmp/e)\"; fi")
    for i, n in nodes.gpus.items():
        if i not in given:
            lines.append(f"if mknod /tmp/g{i} c {n.major} {n.minor} 2>/tmp/e; then "
                         f"echo 'mknod {i} ok'; else echo \"mknod {i} $(cat /tmp/e)\"; fi")
    return "\n".join(lines)


def probe(storage: Path, image: str, nodes: GpuDeviceNodes, given: tuple[int, ...],
          insecure: bool = True, workdir: Path | None = None) -> ProbeResult:
    tag = f"trellis-test-gpu-{uuid.uuid4().hex[:8]}"
    jobdir = (workdir or storage) / tag
    jobdir.mkdir(parents=True)
    (jobdir / "scratch").mkdir()
    os.chown(jobdir / "scratch", 65534, 65534)
    podman = Podman(storage)
    for d in ("root", "tmp"):
        (storage / d).mkdir(parents=True, exist_ok=True)
    device = cdi.write_spec(tag, nodes, given)
    cfg = {
        "node": "probe", "name": tag, "image": image, "storage": str(storage),
        "runtime": "runc", "unavailable": "", "cache_max_bytes": 1 << 40,
        "pull_timeout_s": 120, "pull_retries": 0, "credentials_dir": str(jobdir / "none"),
        "tls_verify": not insecure, "allowed_mounts": [], "mounts": [],
        "cgroup_parent": f"/{tag}", "user": "65534:65534", "root": False,
        "scratch": str(jobdir / "scratch"), "workdir": "/scratch",
        "command": ["/bin/sh", "-c", _script(nodes, given)], "env": {"HOME": "/scratch"},
        "devices": [device],
    }
    (jobdir / "container.json").write_text(json.dumps(cfg))
    try:
        done = subprocess.run([sys.executable, "-m", "noded.containers.launch", str(jobdir)],
                              capture_output=True, text=True, timeout=180,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                   "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    finally:
        subprocess.run(podman.argv("rm", "--force", "--ignore", "--time", "0", tag),
                       capture_output=True, timeout=60)
        cdi.remove_spec(tag)
        _remove_groups(tag)
        subprocess.run(["rm", "-rf", str(jobdir)], check=False)
    out = done.stdout + done.stderr
    present, opened, made = [], {}, {}
    for line in out.splitlines():
        words = line.split(" ", 2)
        if words[0] == "present" and len(words) > 1:
            present.append(words[1])
        elif words[0] == "open" and len(words) == 3:
            opened[words[1]] = "ok" if words[2] == "ok" else words[2]
        elif words[0] == "mknod" and len(words) == 3:
            made[words[1]] = "ok" if words[2] == "ok" else words[2]
    return ProbeResult(present, opened, made, out, done.returncode)


def _remove_groups(tag: str) -> None:
    for root in cgroup_roots():
        top = root / tag
        if top.is_dir():
            for group in [*subgroups(top), top]:
                with contextlib.suppress(OSError):
                    os.rmdir(group)
