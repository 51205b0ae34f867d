"""Which device files a job may open: the GPU device fence's rules, independent of the kernel
interface that enforces them.

A node's GPU device files (``noded.gpu.devices.GpuDeviceNodes``) fall under a few character
majors: NVIDIA's 195 (``/dev/nvidiaN``, ``/dev/nvidiactl``) and the dynamically numbered
``nvidia-uvm`` major. Those majors are *fenced*: a job may read or write a device of a fenced
major only if it is one of the job's own GPUs or, for a job holding any GPU, one of the control
files. Every other device (``/dev/null``, terminals, disks...) is left to whatever rules already
apply. Only read and write are fenced, not ``mknod``: creating a node needs CAP_MKNOD anyway,
opening it is what the fence refuses, and leaving mknod alone keeps the rules a container
runtime writes below the job's group (runc's default ``c *:* m``) within what the job's group
allows (cgroup v1 refuses a child rule its parent's rules overlap).

The two kernel interfaces need the rules in opposite shapes:

* cgroup v1's ``devices`` controller starts from "allow all" and can only add exceptions that
  deny; it cannot carve an allowed hole into a denied range. So :func:`v1_deny_lines` lists
  what to deny: the whole fenced major when the job holds nothing on it, else each known
  device of that major the job does not hold.
* a cgroup v2 device program decides per access, so it is an allowlist inside the fenced
  majors (``noded.cgroups.bpfdev`` compiles it): stricter, a minor nobody described (a GPU
  added later, ``nvidia-modeset``) is refused too.
"""

from __future__ import annotations

from dataclasses import dataclass

from noded.gpu.devices import DeviceNode, GpuDeviceNodes

# The largest device major and minor the kernel's dev_t encodes (12 and 20 bits).
MAX_MAJOR = (1 << 12) - 1
MAX_MINOR = (1 << 20) - 1


@dataclass(frozen=True)
class DeviceRules:
    """The fence of one job's group: inside ``fenced_majors`` (character devices) only
    ``allowed`` may be read or written; ``denied`` are the known devices refused."""

    fenced_majors: tuple[int, ...]
    allowed: tuple[tuple[int, int], ...]  # (major, minor)
    denied: tuple[tuple[int, int], ...]  # (major, minor): known devices the job must not open

    def __post_init__(self) -> None:
        for major in self.fenced_majors:
            _check_number(major, MAX_MAJOR, "device major")
        for major, minor in self.allowed + self.denied:
            _check_number(major, MAX_MAJOR, "device major")
            _check_number(minor, MAX_MINOR, "device minor")
            if major not in self.fenced_majors:
                raise ValueError(f"device {major}:{minor} is not on a fenced major")
        overlap = set(self.allowed) & set(self.denied)
        if overlap:
            major, minor = sorted(overlap)[0]
            raise ValueError(f"device {major}:{minor} is both allowed and denied")

    def permits(self, major: int, minor: int) -> bool:
        """Whether a job under these rules may open character device ``major:minor``: the
        v2 program's decision, and what the v1 lines amount to for every *known* device."""
        return major not in self.fenced_majors or (major, minor) in self.allowed

    @property
    def empty(self) -> bool:
        """Nothing is fenced (the backend knows no GPU device files)."""
        return not self.fenced_majors


def _check_number(value: int, limit: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ValueError(f"{what} must be an integer in 0..{limit}, got {value!r}")


def _key(node: DeviceNode) -> tuple[int, int]:
    return (node.major, node.minor)


def job_rules(nodes: GpuDeviceNodes, gpus: tuple[int, ...]) -> DeviceRules:
    """The rules for a job holding ``gpus`` (indices) on a node whose device files are
    ``nodes``. Raises KeyError when a GPU of the job has no known device file: such a job
    could not be given its GPU, and must not start as if it had been."""
    every = list(nodes.gpus.values()) + list(nodes.control)
    majors = tuple(sorted({n.major for n in every}))
    allowed = {_key(n) for n in nodes.for_job(tuple(gpus))}
    denied = {_key(n) for n in every} - allowed
    return DeviceRules(majors, tuple(sorted(allowed)), tuple(sorted(denied)))


def v1_deny_lines(rules: DeviceRules) -> list[str]:
    """The lines to write, one per write, to a v1 group's ``devices.deny``."""
    lines = []
    for major in rules.fenced_majors:
        if not any(m == major for m, _ in rules.allowed):
            lines.append(f"c {major}:* rw")
            continue
        lines += [f"c {m}:{n} rw" for m, n in rules.denied if m == major]
    return lines
