"""Registry credentials: the operator's, one file per registry host, never a job's.

``CREDENTIALS_DIR/HOST`` (``HOST`` as in the image reference, port included) holds one line
``user:password`` and must be mode 0600 (owned by noded's user): a file others can read is
refused, not used. For a pull the node writes podman's auth file (mode 0600) into the job's
directory, so the secret never appears on a command line.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path


class CredentialsError(Exception):
    """The operator's credentials file cannot be used; the message says why."""


def read_credentials(directory: Path, registry: str) -> tuple[str, str] | None:
    """The ``(user, password)`` for ``registry``, or None when the operator gave none."""
    if not registry or "/" in registry or registry.startswith("."):
        return None
    path = directory / registry
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CredentialsError(f"credentials file {path} cannot be read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise CredentialsError(f"credentials file {path} is mode {mode:04o}; it must be "
                                   "0600 (readable by its owner only) to be used")
        if info.st_uid != os.geteuid():
            raise CredentialsError(f"credentials file {path} is not owned by the node "
                                   f"daemon's user (uid {os.geteuid()})")
        text = os.read(fd, 65536).decode(errors="replace").strip()
    finally:
        os.close(fd)
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise CredentialsError(f"credentials file {path} must hold one line user:password")
    return user, password


def write_authfile(path: Path, registry: str, user: str, password: str) -> None:
    """podman's auth file (containers-auth.json) for one registry, mode 0600."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"auths": {registry: {"auth": token}}}, f)
