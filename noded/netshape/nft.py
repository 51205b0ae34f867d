"""Running the ``nft`` tool in the right network namespace, with cgroup v2 paths resolvable.

nft turns ``socket cgroupv2 level N "a/b"`` into a cgroup id by looking the path up under
``/sys/fs/cgroup``. On a cgroup-v2-only server that is the v2 hierarchy already. On a hybrid
host (v1 controllers at /sys/fs/cgroup/<controller>, v2 at /sys/fs/cgroup/unified) it is not,
so nft then runs in a private mount namespace (``unshare --mount``) where the v2 hierarchy is
mounted over /sys/fs/cgroup; nothing changes in the host's mount table. ``nsenter --net`` (not
``ip netns exec``, which remounts /sys) puts nft in the target network namespace.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noded.netshape.errors import NetShapeError

log = logging.getLogger("trellis.netshape")

_NETNS_DIR = "/run/netns"
_DEFAULT_CGROUP2 = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Cgroup2Mount:
    """Where the cgroup v2 hierarchy is mounted and which subtree of it the mount shows."""

    path: Path
    root: str = "/"


def parse_mountinfo_cgroup2(text: str) -> Cgroup2Mount | None:
    """The first cgroup2 mount in /proc/self/mountinfo text, or None."""
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        fstype = right.split()[0] if right.split() else ""
        if fstype == "cgroup2" and len(fields) >= 5:
            return Cgroup2Mount(path=Path(_unescape(fields[4])), root=_unescape(fields[3]))
    return None


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return field.encode().decode("unicode_escape") if "\\" in field else field


def find_cgroup2_mount() -> Cgroup2Mount:
    with open("/proc/self/mountinfo") as f:
        found = parse_mountinfo_cgroup2(f.read())
    if found is None:
        raise NetShapeError("no cgroup v2 hierarchy is mounted (looked in /proc/self/mountinfo)")
    return found


class NftRunner:
    """Runs nft scripts and listings in one network namespace (None: the daemon's own)."""

    def __init__(
        self, netns: str | None = None, cgroup2: Cgroup2Mount | None = None, timeout: float = 10.0
    ) -> None:
        nft = shutil.which("nft")
        if nft is None:
            raise NetShapeError("the nft tool is not installed (Debian/Ubuntu package: nftables)")
        if netns is not None and not os.path.exists(os.path.join(_NETNS_DIR, netns)):
            raise NetShapeError(f"network namespace {netns!r} does not exist")
        argv = [nft]
        if netns is not None:
            argv = ["nsenter", f"--net={_NETNS_DIR}/{netns}", *argv]
        if cgroup2 is not None and cgroup2.path != _DEFAULT_CGROUP2:
            argv = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'mount -t cgroup2 cgroup2 {_DEFAULT_CGROUP2} && exec "$@"',
                "sh",
                *argv,
            ]
        self.argv = argv
        self.netns = netns
        self.timeout = timeout

    def run(self, script: str, *, what: str) -> None:
        """Apply a script as one nft transaction (all of it or none of it)."""
        self._call(["-f", "-"], script, what)
        for line in script.strip().splitlines():
            log.info("nft netns=%s why=%s cmd=%r", self.netns or "-", what, line.strip())

    def list_json(self, *args: str) -> list[dict[str, Any]]:
        out = self._call(["-j", "list", *args], None, "list " + " ".join(args))
        try:
            data = json.loads(out)
        except json.JSONDecodeError as exc:
            raise NetShapeError(f"nft printed unreadable JSON for list {args}: {exc}") from exc
        return list(data.get("nftables", []))

    def table_exists(self, family: str, table: str) -> bool:
        for item in self.list_json("tables", family):
            t = item.get("table")
            if t and t.get("name") == table and t.get("family") == family:
                return True
        return False

    def _call(self, args: list[str], stdin: str | None, what: str) -> str:
        try:
            done = subprocess.run(
                [*self.argv, *args],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise NetShapeError(f"nft timed out after {self.timeout}s ({what})") from exc
        if done.returncode != 0:
            err = " ".join(done.stderr.split())[:500]
            raise NetShapeError(f"nft failed ({what}): {err or 'exit ' + str(done.returncode)}")
        return done.stdout
