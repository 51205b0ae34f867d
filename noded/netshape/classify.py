"""Putting each job's packets into its HTB class.

HTB looks at ``skb->priority`` before any tc filter: when it equals one of its leaf class ids
(``7e1:10``), the packet goes straight to that class. Both classifiers below set that field with
one nftables rule on the output hook, in a table they own (``inet trellis_netshape`` by
default), so no tc filter module is needed (this kernel, like many, lacks ``cls_cgroup`` and
``cls_fw``; ``nft`` and HTB are everywhere).

cgroup v2 (:class:`CgroupV2Classifier`, the default; works on v2-only servers and on hybrid
hosts whose v2 hierarchy is at /sys/fs/cgroup/unified)::

    socket cgroupv2 level L "trellis/job-7" meta priority set 7e1:10

matches packets whose socket was created by a process inside that cgroup (or below it). The job
is given either as its cgroup or as pids, whose cgroups are read from /proc/<pid>/cgroup; the
classifier never moves processes. A socket belongs to the cgroup its creator was in when it
created it, so the job must be in its own cgroup before it opens connections (the job launcher
must place it there before exec). Processes in the root cgroup are refused: matching the root would
classify every packet on the host.

cgroup v1 (:class:`NetClsClassifier`, for hosts with a net_cls hierarchy)::

    meta cgroup 0x07e10010 meta priority set 7e1:10

The classifier makes a net_cls cgroup per job, writes the class id to ``net_cls.classid`` and
moves the job's pids there. The kernel re-tags the existing sockets of moved processes, so
connections opened before classification are covered too. One rule per kind serves all jobs.
(With ``cls_cgroup`` built, a tc ``cgroup`` filter could read the same classid directly; the
nftables rule works whether or not it is.)

Both rules can be restricted to the shaped interface (``oifname``), so marking never changes
the priority of packets leaving through other interfaces.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

from noded.netshape.errors import NetShapeError
from noded.netshape.htb import fmt_handle
from noded.netshape.nft import Cgroup2Mount, NftRunner, find_cgroup2_mount
from shared.kernelfs import KernelWriteError, KernelWriter
from shared.model import is_valid_name

log = logging.getLogger("trellis.netshape")

JobNetKind = Literal["gpu", "cpu"]
JobTarget = Sequence[int] | str | os.PathLike[str]
KINDS: tuple[JobNetKind, ...] = ("gpu", "cpu")
DEFAULT_TABLE = "trellis_netshape"
_FAMILY = "inet"
_CHAIN = "output"
_COMPONENT_RE = re.compile(r"[A-Za-z0-9_.:@+-]{1,255}")
_TABLE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


class JobClassifier(Protocol):
    """Puts a job's traffic into the gpu or cpu class, and takes it out again."""

    def classify(self, job_id: str, pids_or_cgroup: JobTarget, kind: JobNetKind) -> None: ...

    def unclassify(self, job_id: str) -> bool: ...

    def jobs(self) -> dict[str, JobNetKind]: ...

    def close(self) -> None: ...


def parse_proc_cgroup_v2(text: str) -> str | None:
    """The v2 path ("0::/a/b") from /proc/<pid>/cgroup text, or None when absent."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def check_cgroup_path(path: str) -> list[str]:
    """Components of a cgroup v2 hierarchy path, refusing the root and unsafe names."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise NetShapeError(
            "refusing to classify the root cgroup: it holds every process on the host; "
            "put the job in its own cgroup first"
        )
    for part in parts:
        if part in (".", "..") or not _COMPONENT_RE.fullmatch(part):
            raise NetShapeError(
                f"cgroup path {path!r} has an unsupported component {part!r} "
                "(allowed: letters, digits, '_', '.', ':', '@', '+', '-')"
            )
    return parts


def _check_job(job_id: str) -> str:
    if not is_valid_name(job_id):
        raise NetShapeError(
            f"job id {job_id!r} is not a valid name: use 1-63 letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return job_id


def _check_kind(kind: str, classids: Mapping[str, int]) -> int:
    if kind not in KINDS:
        raise NetShapeError(f"job traffic kind must be 'gpu' or 'cpu', got {kind!r}")
    return classids[kind]


def _check_pids(pids: Sequence[int]) -> list[int]:
    out = []
    for pid in pids:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise NetShapeError(f"pid {pid!r} is not a positive integer")
        out.append(pid)
    if not out:
        raise NetShapeError("no pids given")
    return out


def _check_classids(classids: Mapping[str, int]) -> dict[str, int]:
    out = {}
    for kind in KINDS:
        value = classids.get(kind)
        if not isinstance(value, int) or not 0 < value < 1 << 32:
            raise NetShapeError(f"classids[{kind!r}] must be a tc class id, got {value!r}")
        out[kind] = value
    return out


def render_header(table: str) -> str:
    """nft commands creating the classifier's table and output chain ('add' is idempotent)."""
    # Mangle priority: before any later filter could drop the packet, and the conventional
    # place for rewriting packet metadata.
    return (
        f"add table {_FAMILY} {table}\n"
        f"add chain {_FAMILY} {table} {_CHAIN} "
        "{ type filter hook output priority mangle; policy accept; }\n"
    )


def render_rule(table: str, ifname: str | None, match: str, classid: int, comment: str) -> str:
    """One nft rule giving matching packets the HTB class id as their priority."""
    oif = f'oifname "{ifname}" ' if ifname else ""
    return (
        f"add rule {_FAMILY} {table} {_CHAIN} {oif}{match} "
        f'meta priority set {fmt_handle(classid)} comment "{comment}"\n'
    )


class _RuleTable:
    """The nft table a classifier owns: one output chain, rules found again by comment."""

    def __init__(self, runner: NftRunner, table: str, ifname: str | None) -> None:
        if not _TABLE_RE.fullmatch(table):
            raise NetShapeError(f"nft table name {table!r} is not valid")
        if ifname is not None and not re.fullmatch(r"[^/\s:\"]{1,15}", ifname):
            raise NetShapeError(f"interface name {ifname!r} is not valid")
        self.runner = runner
        self.table = table
        self.ifname = ifname

    def header(self) -> str:
        return render_header(self.table)

    def rule(self, match: str, classid: int, comment: str) -> str:
        return render_rule(self.table, self.ifname, match, classid, comment)

    def delete(self, handles: Sequence[int]) -> str:
        return "".join(f"delete rule {_FAMILY} {self.table} {_CHAIN} handle {h}\n" for h in handles)

    def handles(self, comment: str) -> list[int]:
        if not self.runner.table_exists(_FAMILY, self.table):
            return []
        found = []
        for item in self.runner.list_json("chain", _FAMILY, self.table, _CHAIN):
            rule = item.get("rule")
            if rule and rule.get("comment") == comment:
                found.append(int(rule["handle"]))
        return found

    def drop(self, what: str) -> bool:
        if not self.runner.table_exists(_FAMILY, self.table):
            return False
        self.runner.run(f"delete table {_FAMILY} {self.table}\n", what=what)
        return True


class CgroupV2Classifier:
    """Classifies by cgroup v2 membership (``socket cgroupv2``); see the module docstring."""

    def __init__(
        self,
        classids: Mapping[str, int],
        *,
        netns: str | None = None,
        ifname: str | None = None,
        table: str = DEFAULT_TABLE,
        cgroup2: Cgroup2Mount | None = None,
        proc: Path = Path("/proc"),
    ) -> None:
        self.classids = _check_classids(classids)
        self.cgroup2 = cgroup2 or find_cgroup2_mount()
        self.proc = proc
        self.rules = _RuleTable(NftRunner(netns, self.cgroup2), table, ifname)
        self._jobs: dict[str, JobNetKind] = {}
        # The table is ours alone: rules left by a run that died are stale.
        if self.rules.drop(what="stale rules from an earlier run"):
            log.warning("netshape dropped stale nft table=%s netns=%s", table, netns or "-")

    def jobs(self) -> dict[str, JobNetKind]:
        return dict(self._jobs)

    def classify(self, job_id: str, pids_or_cgroup: JobTarget, kind: JobNetKind) -> None:
        comment = f"trellis job={_check_job(job_id)}"
        classid = _check_kind(kind, self.classids)
        paths = self.resolve(pids_or_cgroup)
        script = self.rules.header() + self.rules.delete(self.rules.handles(comment))
        for path in paths:
            parts = check_cgroup_path(path)
            match = f'socket cgroupv2 level {len(parts)} "{"/".join(parts)}"'
            script += self.rules.rule(match, classid, comment)
        self.rules.runner.run(script, what=f"classify job={job_id} kind={kind}")
        self._jobs[job_id] = kind
        log.info("netshape classified job=%s kind=%s cgroups=%s", job_id, kind, ",".join(paths))

    def unclassify(self, job_id: str) -> bool:
        comment = f"trellis job={_check_job(job_id)}"
        handles = self.rules.handles(comment)
        if handles:
            self.rules.runner.run(self.rules.delete(handles), what=f"unclassify job={job_id}")
        known = self._jobs.pop(job_id, None) is not None
        if handles or known:
            log.info("netshape unclassified job=%s rules=%d", job_id, len(handles))
        return bool(handles)

    def close(self) -> None:
        for job_id in list(self._jobs):
            self._jobs.pop(job_id)
        self.rules.drop(what="classifier closed")

    def resolve(self, target: JobTarget) -> list[str]:
        """Hierarchy paths ("/a/b") for a cgroup given by path or for the cgroups of pids."""
        if isinstance(target, str | os.PathLike):
            return [self._hierarchy_path(os.fspath(target))]
        paths = set()
        for pid in _check_pids(target):
            try:
                text = (self.proc / str(pid) / "cgroup").read_text()
            except FileNotFoundError:
                raise NetShapeError(f"process {pid} does not exist") from None
            path = parse_proc_cgroup_v2(text)
            if path is None:
                raise NetShapeError(f"process {pid} has no cgroup v2 membership")
            if path == "/":
                raise NetShapeError(
                    f"process {pid} is in the root cgroup v2; put the job in its own cgroup "
                    "before classifying it"
                )
            check_cgroup_path(path)
            paths.add(path)
        return sorted(paths)

    def _hierarchy_path(self, given: str) -> str:
        mount = str(self.cgroup2.path)
        root = self.cgroup2.root.rstrip("/")
        if os.path.isabs(given) and (given == mount or given.startswith(mount + "/")):
            hierarchy = root + (given[len(mount) :] or "/")  # a filesystem path
        else:
            hierarchy = "/" + given.strip("/")  # a hierarchy path, as in /proc/<pid>/cgroup
        parts = check_cgroup_path(hierarchy)
        if root and not hierarchy.startswith(root + "/"):
            raise NetShapeError(f"cgroup {given!r} is outside the mounted v2 subtree {root!r}")
        fs_path = Path(mount, *[p for p in hierarchy[len(root) :].split("/") if p])
        if not fs_path.is_dir():
            raise NetShapeError(f"cgroup {given!r} does not exist (looked for {fs_path})")
        return "/" + "/".join(parts)


class NetClsClassifier:
    """Classifies by cgroup v1 net_cls class id (``meta cgroup``); see the module docstring."""

    def __init__(
        self,
        classids: Mapping[str, int],
        mount: Path,
        *,
        netns: str | None = None,
        ifname: str | None = None,
        table: str = DEFAULT_TABLE,
        prefix: str = "trellis-net-",
    ) -> None:
        self.classids = _check_classids(classids)
        self.mount = Path(os.path.abspath(mount))
        if not (self.mount / "net_cls.classid").is_file():
            raise NetShapeError(f"{self.mount} is not a cgroup v1 net_cls hierarchy")
        if not re.fullmatch(r"[A-Za-z0-9_-]{0,32}", prefix):
            raise NetShapeError(f"cgroup name prefix {prefix!r} is not valid")
        self.prefix = prefix
        self.writer = KernelWriter([self.mount], log)
        self.rules = _RuleTable(NftRunner(netns, None), table, ifname)
        self._jobs: dict[str, JobNetKind] = {}
        self._kind_rules = False
        if self.rules.drop(what="stale rules from an earlier run"):
            log.warning("netshape dropped stale nft table=%s netns=%s", table, netns or "-")
        for stale in sorted(self.mount.glob(f"{prefix}*")):
            if stale.is_dir() and is_valid_name(stale.name[len(prefix) :]):
                self._release(stale, what="stale job cgroup from an earlier run")

    def jobs(self) -> dict[str, JobNetKind]:
        return dict(self._jobs)

    def classify(self, job_id: str, pids_or_cgroup: JobTarget, kind: JobNetKind) -> None:
        _check_job(job_id)
        classid = _check_kind(kind, self.classids)
        if isinstance(pids_or_cgroup, str | os.PathLike):
            raise NetShapeError(
                "the net_cls classifier takes the job's pids (it makes the job's net_cls "
                "cgroup itself)"
            )
        pids = _check_pids(pids_or_cgroup)
        if not self._kind_rules:
            script = self.rules.header()
            for k, cid in self.classids.items():
                script += self.rules.rule(f"meta cgroup {cid:#010x}", cid, f"trellis kind={k}")
            self.rules.runner.run(script, what="net_cls kind rules")
            self._kind_rules = True
        group = self.mount / f"{self.prefix}{job_id}"
        try:
            self.writer.mkdir(group, what=f"net_cls cgroup for job={job_id}")
            self.writer.write(
                group / "net_cls.classid", str(classid), what=f"job={job_id} kind={kind}"
            )
            for pid in pids:
                self.writer.write(
                    group / "cgroup.procs", str(pid), what=f"job={job_id}", compare=False
                )
        except KernelWriteError as exc:
            raise NetShapeError(f"classifying job {job_id}: {exc}") from exc
        self._jobs[job_id] = kind
        log.info("netshape classified job=%s kind=%s pids=%s", job_id, kind, pids)

    def unclassify(self, job_id: str) -> bool:
        group = self.mount / f"{self.prefix}{_check_job(job_id)}"
        self._jobs.pop(job_id, None)
        if not group.is_dir():
            return False
        self._release(group, what=f"unclassify job={job_id}")
        log.info("netshape unclassified job=%s", job_id)
        return True

    def close(self) -> None:
        for job_id in list(self._jobs):
            self.unclassify(job_id)
        self.rules.drop(what="classifier closed")
        self._kind_rules = False

    def _release(self, group: Path, *, what: str) -> None:
        # Moving a task back to the root resets its sockets' classid to 0 (unclassified).
        for _attempt in range(3):
            pids = [p for p in (group / "cgroup.procs").read_text().split() if p]
            for pid in pids:
                with contextlib.suppress(KernelWriteError):  # it exited meanwhile
                    self.writer.write(self.mount / "cgroup.procs", pid, what=what, compare=False)
            try:
                self.writer.rmdir(group, what=what)
                return
            except OSError:
                continue  # a child forked while we moved its parent; go again
        raise NetShapeError(f"could not empty and remove {group}")
