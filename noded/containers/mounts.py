"""A job's declared mounts against the node's ``[containers] allowed_mounts`` prefixes."""

from __future__ import annotations

import os
import stat

from shared.model import Mount


class MountRefused(Exception):
    """A mount the node will not give a container; the message names it and why."""


def check_mounts(mounts: tuple[Mount, ...], allowed: tuple[str, ...]) -> list[str]:
    """podman ``--volume`` values for ``mounts``, or MountRefused for the first bad one. The
    source is resolved (symlinks followed) before the prefix check, so a link cannot lead out
    of an allowed tree; devices are never mounted, whatever the prefix."""
    volumes = []
    for m in mounts:
        if not m.source.startswith("/") or not m.target.startswith("/"):
            raise MountRefused(f"mount {m.source}:{m.target}: both paths must be absolute")
        if ":" in m.source or ":" in m.target or "," in m.source or "," in m.target:
            raise MountRefused(f"mount {m.source}:{m.target}: paths may not contain ':' or ','")
        real = os.path.realpath(m.source)
        try:
            info = os.stat(real)
        except OSError as exc:
            raise MountRefused(f"mount source {m.source} cannot be used: {exc.strerror}") from None
        if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) or real.startswith("/dev/"):
            raise MountRefused(f"mount source {m.source} is a device; devices are never "
                               "mounted into a container (GPUs come with the job's allocation)")
        if not any(real == p.rstrip("/") or real.startswith(p.rstrip("/") + "/")
                   for p in allowed):
            raise MountRefused(
                f"mount source {m.source} is outside the prefixes this node allows "
                f"({', '.join(allowed) or 'none: [containers] allowed_mounts is empty'})")
        volumes.append(f"{real}:{m.target}:{'ro' if m.read_only else 'rw'},nodev,nosuid")
    return volumes
