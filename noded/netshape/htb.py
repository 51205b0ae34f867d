"""HTB bandwidth partition on one NIC, through pyroute2 (SODA §V-E).

Hierarchy installed on ``ifname`` (major handle ``7e1`` unless told otherwise)::

    root qdisc htb 7e1:  default 7e1:30
      class 7e1:1   rate = ceil = link
        class 7e1:10  "gpu"    rate = gpu_share * link, ceil = link
        class 7e1:20  "cpu"    rate = cpu_share * link, ceil = link
        class 7e1:30  "other"  rate = what is left (at least 1% of link), ceil = link

Unclassified traffic goes to "other", not to "gpu": a job the classifier missed must not inherit
the GPU guarantee, the daemon's own control traffic must not be squeezed into the CPU share, and
the byte counters then show how much traffic nobody claimed. With the default 75/25 split the
leftover is 0, so "other" gets the 1% floor; its guarantee only matters when it is busy, and it
borrows idle bandwidth up to the link rate like the others.

Every class may borrow up to the link rate (ceil = link), so a class alone on the link gets all
of it; the shares are what each is guaranteed when all compete. Quanta are proportional to the
rates so that leftover bandwidth is also shared in the same ratio.

Restoring: before replacing the root qdisc the shaper records it. A kernel default root qdisc
(handle 0: pfifo_fast, noqueue, mq, fq_codel... per device and sysctl) comes back by itself when
our root is deleted. An administrator's root qdisc (non-zero handle) is re-created from its
recorded kind and options; its children, if it had any, are not (noded logs a warning then).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWQDISC, TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from noded.netshape.errors import NetShapeError

log = logging.getLogger("trellis.netshape")

DEFAULT_MAJOR = 0x7E1
CLASS_MINORS = {"gpu": 0x10, "cpu": 0x20, "other": 0x30}
_PARENT_MINOR = 0x1
_OTHER_FLOOR = 0.01  # share of the link "other" is guaranteed even when gpu+cpu take all of it
_MAX_QUANTUM = 200_000  # bytes; the kernel warns above this
_MIN_QUANTUM = 1_600  # bytes; at least one full-size frame per round
_IFNAME_RE = re.compile(r"[^/\s:]{1,15}")
_NETNS_DIR = "/run/netns"


def handle(major: int, minor: int) -> int:
    return (major << 16) | minor


def fmt_handle(value: int) -> str:
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


@dataclass(frozen=True)
class HtbClass:
    """One HTB class to install: rates in bit/s, quantum and burst in bytes."""

    name: str
    classid: int
    parent: int
    rate_bit: int
    ceil_bit: int
    quantum: int
    burst: int


@dataclass(frozen=True)
class RootQdisc:
    """What sits at the root of an interface: enough to put it back."""

    kind: str
    handle: int
    options: Any = None  # the dumped TCA_OPTIONS nla, replayed verbatim on restore

    @property
    def kernel_default(self) -> bool:
        # The kernel attaches its defaults with handle 0; anything an admin adds has a handle.
        return self.handle == 0


def validate_shares(gpu_share: float, cpu_share: float) -> None:
    for what, share in (("gpu_share", gpu_share), ("cpu_share", cpu_share)):
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise NetShapeError(f"{what} must be a number in (0, 1], got {share!r}")
        if not 0.0 < float(share) <= 1.0:
            raise NetShapeError(f"{what} must be in (0, 1], got {share}")
    if gpu_share + cpu_share > 1.0 + 1e-9:
        raise NetShapeError(
            f"gpu_share + cpu_share must be at most 1, got {gpu_share} + {cpu_share} = "
            f"{gpu_share + cpu_share:g}"
        )


def plan_classes(
    link_mbit: int, gpu_share: float, cpu_share: float, major: int = DEFAULT_MAJOR
) -> list[HtbClass]:
    """The classes for a link, parent first. Pure: validated inputs in, plan out."""
    if isinstance(link_mbit, bool) or not isinstance(link_mbit, int) or link_mbit <= 0:
        raise NetShapeError(f"link_mbit must be a positive integer, got {link_mbit!r}")
    validate_shares(gpu_share, cpu_share)
    link_bit = link_mbit * 1_000_000
    shares = {
        "gpu": gpu_share,
        "cpu": cpu_share,
        "other": max(1.0 - gpu_share - cpu_share, _OTHER_FLOOR),
    }
    rates = {name: max(int(link_bit * share), 8_000) for name, share in shares.items()}
    top = max(rates.values())
    # One quantum budget scaled by rate keeps the borrowing ratio equal to the guarantee ratio.
    budget = min(_MAX_QUANTUM, max(_MIN_QUANTUM, link_bit // 8 // 50))
    parent = handle(major, _PARENT_MINOR)
    plan = [
        HtbClass("root", parent, handle(major, 0), link_bit, link_bit, budget, _burst(link_bit))
    ]
    for name, minor in CLASS_MINORS.items():
        plan.append(
            HtbClass(
                name=name,
                classid=handle(major, minor),
                parent=parent,
                rate_bit=rates[name],
                ceil_bit=link_bit,
                quantum=max(_MIN_QUANTUM, budget * rates[name] // top),
                burst=_burst(rates[name]),
            )
        )
    return plan


def _burst(rate_bit: int) -> int:
    # About 1 ms at the class rate, never below one frame: small enough to keep the split
    # tight over tens of milliseconds, large enough not to cap the rate at high speeds.
    return max(rate_bit // 8 // 1000, _MIN_QUANTUM)


class TrafficShaper:
    """Installs, inspects and removes the HTB partition on one interface."""

    def __init__(
        self,
        ifname: str,
        link_mbit: int,
        gpu_share: float = 0.75,
        cpu_share: float = 0.25,
        netns: str | None = None,
        *,
        major: int = DEFAULT_MAJOR,
    ) -> None:
        if not isinstance(ifname, str) or not _IFNAME_RE.fullmatch(ifname):
            raise NetShapeError(f"interface name {ifname!r} is not a valid Linux ifname")
        if netns is not None:
            if not isinstance(netns, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", netns):
                raise NetShapeError(f"network namespace name {netns!r} is not valid")
            if not os.path.exists(os.path.join(_NETNS_DIR, netns)):
                raise NetShapeError(f"network namespace {netns!r} does not exist")
        if not 1 <= major <= 0xFFFE:
            raise NetShapeError(f"qdisc major handle {major:#x} out of range 1..0xfffe")
        self.ifname = ifname
        self.link_mbit = link_mbit
        self.gpu_share = gpu_share
        self.cpu_share = cpu_share
        self.netns = netns
        self.major = major
        self.plan = plan_classes(link_mbit, gpu_share, cpu_share, major)
        self._original: RootQdisc | None = None
        # pyroute2 drives its netlink socket with an asyncio loop; one of the standard
        # library's, of this shaper's own: noded installs uvloop, whose loops cannot open
        # netlink sockets, and a loop already running in the caller's thread cannot be used.
        self._loop = asyncio.SelectorEventLoop()
        with self._ipr() as ipr:
            self._index(ipr)  # fail now, clearly, if the interface is not there

    # -- public API ------------------------------------------------------------------------

    def classid(self, kind: str) -> int:
        """The HTB class id for "gpu", "cpu" or "other" (what a classifier marks packets with)."""
        try:
            return handle(self.major, CLASS_MINORS[kind])
        except KeyError:
            raise NetShapeError(
                f"unknown traffic class {kind!r}; expected one of {sorted(CLASS_MINORS)}"
            ) from None

    @property
    def original_qdisc(self) -> RootQdisc | None:
        """The root qdisc recorded by the last install() that replaced it."""
        return self._original

    @property
    def installed(self) -> bool:
        with self._ipr() as ipr:
            return self._is_ours(self._root(ipr, self._index(ipr)))

    def root_qdisc(self) -> RootQdisc:
        with self._ipr() as ipr:
            return self._root(ipr, self._index(ipr))

    def install(self) -> bool:
        """Install (or converge to) the partition; returns whether the root qdisc was replaced."""
        with self._ipr() as ipr:
            idx = self._index(ipr)
            current = self._root(ipr, idx)
            replaced = False
            if not self._is_ours(current):
                self._original = current
                self._tc(
                    ipr,
                    "replace",
                    "htb",
                    index=idx,
                    handle=handle(self.major, 0),
                    parent=TC_H_ROOT,
                    default=self.classid("other"),
                )
                replaced = True
                log.info(
                    "netshape installed ifname=%s netns=%s link_mbit=%d gpu_share=%g "
                    "cpu_share=%g replaced=%s:%s",
                    self.ifname,
                    self.netns or "-",
                    self.link_mbit,
                    self.gpu_share,
                    self.cpu_share,
                    current.kind,
                    fmt_handle(current.handle),
                )
            elif self._original is None:
                # Left by an earlier run that did not get to clean up: what was there before is
                # unknown, so the kernel default is what remove() will leave.
                log.warning(
                    "netshape found its own root qdisc already on ifname=%s; original unknown, "
                    "remove() will leave the kernel default",
                    self.ifname,
                )
            try:
                for cls in self.plan:
                    self._tc(
                        ipr,
                        "replace-class",
                        "htb",
                        index=idx,
                        handle=cls.classid,
                        parent=cls.parent,
                        rate=f"{cls.rate_bit}bit",
                        ceil=f"{cls.ceil_bit}bit",
                        quantum=cls.quantum,
                        burst=cls.burst,
                        cburst=_burst(cls.ceil_bit),
                    )
                    log.debug(
                        "netshape class ifname=%s class=%s classid=%s rate_bit=%d ceil_bit=%d",
                        self.ifname,
                        cls.name,
                        fmt_handle(cls.classid),
                        cls.rate_bit,
                        cls.ceil_bit,
                    )
            except NetShapeError:
                # A root htb without its classes would pass every packet unshaped through
                # the direct queue: put the interface back the way it was instead.
                self._rollback(ipr, idx)
                raise
            return replaced

    def remove(self) -> bool:
        """Remove the partition and put the original root qdisc back; False if none was there."""
        with self._ipr() as ipr:
            try:
                idx = self._index(ipr)
            except NetShapeError:
                log.warning("netshape remove: ifname=%s is gone; nothing to restore", self.ifname)
                self._original = None
                return False
            current = self._root(ipr, idx)
            if not self._is_ours(current):
                return False
            self._teardown(ipr, idx)
            now = self._root(ipr, idx)
            log.info(
                "netshape removed ifname=%s netns=%s root=%s:%s",
                self.ifname,
                self.netns or "-",
                now.kind,
                fmt_handle(now.handle),
            )
            return True

    def _rollback(self, ipr: IPRoute, idx: int) -> None:
        try:
            self._teardown(ipr, idx)
        except NetShapeError as exc:
            log.error("netshape rollback failed ifname=%s: %s", self.ifname, exc)
            return
        log.warning("netshape install rolled back ifname=%s", self.ifname)

    def _teardown(self, ipr: IPRoute, idx: int) -> None:
        """Delete our root qdisc and put the recorded original back."""
        self._tc(ipr, "del", index=idx, handle=handle(self.major, 0), parent=TC_H_ROOT)
        original, self._original = self._original, None
        if original is None:
            return  # the kernel default is back; nothing better is known
        if not original.kernel_default:
            self._restore(ipr, idx, original)
        now = self._root(ipr, idx)
        if now.kind != original.kind:
            log.warning(
                "netshape restore mismatch ifname=%s expected=%s found=%s",
                self.ifname,
                original.kind,
                now.kind,
            )

    def class_bytes(self) -> dict[str, int]:
        """Bytes sent so far by each leaf class ({} when the partition is not installed)."""
        names = {cls.classid: cls.name for cls in self.plan if cls.name != "root"}
        with self._ipr() as ipr:
            idx = self._index(ipr)
            if not self._is_ours(self._root(ipr, idx)):
                return {}
            out: dict[str, int] = {}
            for msg in ipr.get_classes(index=idx):
                name = names.get(msg["handle"])
                if name is None or msg.get_attr("TCA_KIND") != "htb":
                    continue
                stats2 = msg.get_attr("TCA_STATS2")
                basic = stats2.get_attr("TCA_STATS_BASIC") if stats2 else None
                if basic is not None:
                    out[name] = int(basic["bytes"])
                else:
                    out[name] = int(msg.get_attr("TCA_STATS")["bytes"])
            return out

    # -- internals -------------------------------------------------------------------------

    def _ipr(self) -> IPRoute:
        if self.netns is None:
            return IPRoute(use_event_loop=self._loop)
        if not os.path.exists(os.path.join(_NETNS_DIR, self.netns)):
            raise NetShapeError(f"network namespace {self.netns!r} does not exist")
        # flags=0: never create the namespace as a side effect of looking into it.
        return IPRoute(netns=self.netns, flags=0, use_event_loop=self._loop)

    def close(self) -> None:
        """Release the shaper's event loop (the partition, if installed, stays)."""
        self._loop.close()

    def _index(self, ipr: IPRoute) -> int:
        found = ipr.link_lookup(ifname=self.ifname)
        if not found:
            where = f" in network namespace {self.netns!r}" if self.netns else ""
            raise NetShapeError(f"interface {self.ifname!r} does not exist{where}")
        return int(found[0])

    def _root(self, ipr: IPRoute, idx: int) -> RootQdisc:
        for msg in ipr.get_qdiscs(index=idx):
            if msg["parent"] == TC_H_ROOT:
                return RootQdisc(
                    kind=msg.get_attr("TCA_KIND"),
                    handle=msg["handle"],
                    options=msg.get_attr("TCA_OPTIONS"),
                )
        return RootQdisc(kind="noop", handle=0)

    def _is_ours(self, root: RootQdisc) -> bool:
        return root.kind == "htb" and root.handle == handle(self.major, 0)

    def _tc(self, ipr: IPRoute, command: str, kind: str | None = None, **kwargs: Any) -> None:
        try:
            ipr.tc(command, kind, **kwargs)
        except NetlinkError as exc:
            what = kwargs.get("handle")
            raise NetShapeError(
                f"tc {command} {kind or ''} {fmt_handle(what) if isinstance(what, int) else ''}"
                f" on {self.ifname} failed: {os.strerror(exc.code)} (errno {exc.code})"
            ) from exc

    def _restore(self, ipr: IPRoute, idx: int, original: RootQdisc) -> None:
        # Replay the dumped kind and options verbatim: pyroute2's tc() would rebuild options
        # from keyword defaults, losing the administrator's parameters.
        msg = tcmsg()
        msg["family"] = 0
        msg["index"] = idx
        msg["handle"] = original.handle
        msg["parent"] = TC_H_ROOT
        msg["attrs"] = [("TCA_KIND", original.kind)]
        if original.options is not None:
            msg["attrs"].append(("TCA_OPTIONS", original.options))
        msg["header"]["type"] = RTM_NEWQDISC
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
        try:
            ipr.nlm_request_batch([msg])
        except NetlinkError as exc:
            log.warning(
                "netshape could not restore root qdisc ifname=%s kind=%s handle=%s: %s; "
                "the kernel default is in place",
                self.ifname,
                original.kind,
                fmt_handle(original.handle),
                os.strerror(exc.code),
            )
            return
        log.info(
            "netshape restored root qdisc ifname=%s kind=%s handle=%s (children not restored)",
            self.ifname,
            original.kind,
            fmt_handle(original.handle),
        )
