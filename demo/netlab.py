"""A private network of network namespaces on this machine, for cutting a master off.

One hub namespace holds a bridge; each site (a namespace of its own, or this machine's own
network, where the node daemons run) is joined to it by a veth pair and gets an address in a
private link-local /24 that no route of this machine uses. Nothing leaves it: there is no
route out, no forwarding, no NAT.

A site can be cut off two ways, both silent for everyone else (nobody is told; packets just
stop arriving, as when a host's link or its switch port dies):

- ``"link"``: its link goes down at the hub's end (the site sees its carrier go; the others'
  packets to it are dropped at the bridge);
- ``"drop"``: its bridge port is disabled: the link stays up on both ends and every frame,
  both ways, is dropped at the bridge (all its traffic dropped).

Everything is named ``trellis-test-<tag>-*`` (interfaces ``tl<tag>…``) and removed by
``close()`` (a ``with`` block does it on the way out, signals included under
``demo.harness.exit_on_signals``), processes left in a namespace being killed first.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import signal
import subprocess
import uuid
from dataclasses import dataclass, field

from demo.harness import shielded

CUTS = ("link", "drop")


class NetLabError(RuntimeError):
    """The network could not be built (the message says which command failed and why)."""


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise NetLabError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A 169.254.X.0/24 that no route of this machine overlaps (other runs included)."""
    used = []
    for word in _ip("-4", "route", "show", "table", "all").split():
        with contextlib.suppress(ValueError):
            used.append(ipaddress.ip_network(word, strict=False))
    for _ in range(200):
        net = ipaddress.ip_network(f"169.254.{random.randint(100, 250)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetLabError("no free 169.254.X.0/24 subnet for a private network")


@dataclass
class Site:
    name: str
    ns: str | None  # None: this machine's own namespace
    address: str
    port: str  # its veth end in the hub (a bridge port)
    local_if: str
    cut: str | None = None

    @property
    def wrapper(self) -> list[str]:
        """The command prefix that runs a program in this site's namespace."""
        return ["ip", "netns", "exec", self.ns] if self.ns else []


@dataclass
class NetLab:
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    sites: dict[str, Site] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    host_links: list[str] = field(default_factory=list)
    subnet: ipaddress.IPv4Network | None = None

    @property
    def hub(self) -> str:
        return f"trellis-test-{self.tag}-hub"

    def start(self) -> NetLab:
        self.subnet = _free_subnet()
        self._netns(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        return self

    def _netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def add(self, name: str, own_namespace: bool = True) -> Site:
        """A site joined to the hub: in a namespace of its own, or this machine itself."""
        assert self.subnet is not None, "start() first"
        n = len(self.sites) + 1
        ns = f"trellis-test-{self.tag}-{name}" if own_namespace else None
        local_if, port = f"tl{self.tag}{n}s", f"tl{self.tag}{n}p"
        address = str(self.subnet.network_address + n)
        if ns is not None:
            self._netns(ns)
            _ip("-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", local_if)
            _ip("-n", self.hub, "link", "set", local_if, "netns", ns)
        else:
            # Made here, its hub end moved into the hub: this machine keeps the other.
            _ip("link", "add", local_if, "type", "veth", "peer", "name", port)
            self.host_links.append(local_if)
            _ip("link", "set", port, "netns", self.hub)
        local = ["-n", ns] if ns is not None else []
        _ip(*local, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", local_if)
        _ip(*local, "link", "set", local_if, "up")
        _ip("-n", self.hub, "link", "set", port, "master", "br0")
        _ip("-n", self.hub, "link", "set", port, "up")
        site = Site(name, ns, address, port, local_if)
        self.sites[name] = site
        return site

    def cut(self, name: str, how: str) -> None:
        """Cut a site off (``"link"`` or ``"drop"``, see the module's text)."""
        site = self.sites[name]
        if how == "link":
            _ip("-n", self.hub, "link", "set", site.port, "down")
        elif how == "drop":
            self._bridge("link", "set", "dev", site.port, "state", "0")
        else:
            raise ValueError(f"unknown cut {how!r}: one of {', '.join(CUTS)}")
        site.cut = how

    def restore(self, name: str) -> None:
        site = self.sites[name]
        if site.cut == "link":
            _ip("-n", self.hub, "link", "set", site.port, "up")
        elif site.cut == "drop":
            self._bridge("link", "set", "dev", site.port, "state", "3")  # forwarding
        site.cut = None

    def _bridge(self, *args: str) -> None:
        done = subprocess.run(["ip", "netns", "exec", self.hub, "bridge", *args],
                              capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise NetLabError(f"bridge {' '.join(args)}: {done.stderr.strip()}")

    def close(self) -> None:
        """Kill what runs in the namespaces, delete them and this machine's veth ends."""
        with shielded():
            for ns in reversed(self.namespaces):
                for pid in _ip("netns", "pids", ns, check=False).split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGCONT)  # a frozen one, too
                        os.kill(int(pid), signal.SIGKILL)
                _ip("netns", "del", ns, check=False)
            for link in self.host_links:
                _ip("link", "del", link, check=False)
            self.namespaces, self.host_links = [], []

    def __enter__(self) -> NetLab:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
