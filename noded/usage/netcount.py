"""Bytes a job sent and received, from counters the kernel keeps for its cgroup.

One nftables table of ours (``inet trellis_usage``) has an output and an input chain; each job
gets a counting rule in each, ``socket cgroupv2 level L "<the job's v2 group>" counter``. A
socket belongs to the v2 group its creating process was in, so the job must be in its group
before it opens connections (the shim joins it before exec). The input rule matches packets
delivered to the job's sockets (nftables looks the socket up), so replies to connections the
job opened and connections it accepted are both counted. Counters are cumulative: they are read
when a report is due, not every sample. ``noded.netshape.nft.NftRunner`` runs nft with the v2
hierarchy resolvable on hybrid hosts.
"""

from __future__ import annotations

import logging
import re

from noded.netshape.errors import NetShapeError
from noded.netshape.nft import Cgroup2Mount, NftRunner
from shared.model import check_name

log = logging.getLogger("trellis.node.usage")

_FAMILY = "inet"
_TABLE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_PATH_RE = re.compile(r"[A-Za-z0-9_.:@+-]{1,255}")
_CHAINS = {"tx": "output", "rx": "input"}


class NetCounters:
    def __init__(self, cgroup2: Cgroup2Mount, table: str = "trellis_usage",
                 netns: str | None = None) -> None:
        if not _TABLE_RE.fullmatch(table):
            raise NetShapeError(f"nft table name {table!r} is not valid")
        self.table = table
        self.runner = NftRunner(netns, cgroup2)
        # Rules of a run that died count nothing anyone reads: start clean.
        if self.runner.table_exists(_FAMILY, table):
            self.runner.run(f"delete table {_FAMILY} {table}\n", what="stale usage counters")
        header = f"add table {_FAMILY} {table}\n"
        for hook in _CHAINS.values():
            header += (f"add chain {_FAMILY} {table} {hook} "
                       f"{{ type filter hook {hook} priority filter; policy accept; }}\n")
        self.runner.run(header, what="usage counters")
        self._jobs: dict[str, str] = {}

    def watch(self, job_id: str, v2_path: str) -> None:
        """Count the sockets of the v2 group ``v2_path`` ("/a/b") as job ``job_id``'s."""
        check_name(job_id, "job id")
        parts = [p for p in v2_path.split("/") if p]
        if not parts or not all(_PATH_RE.fullmatch(p) for p in parts):
            raise NetShapeError(f"cgroup path {v2_path!r} is not one the counters can match")
        match = f'socket cgroupv2 level {len(parts)} "{"/".join(parts)}"'
        script = ""
        for what, hook in _CHAINS.items():
            script += (f"add rule {_FAMILY} {self.table} {hook} {match} counter "
                       f'comment "job={job_id} {what}"\n')
        self.runner.run(script, what=f"count job={job_id}")
        self._jobs[job_id] = v2_path

    def read(self) -> dict[str, dict[str, int]]:
        """job -> {"tx": bytes, "rx": bytes} for every watched job."""
        out: dict[str, dict[str, int]] = {}
        for item in self.runner.list_json("table", _FAMILY, self.table):
            rule = item.get("rule")
            if not rule:
                continue
            comment = str(rule.get("comment", ""))
            job, _, what = comment.removeprefix("job=").partition(" ")
            if not comment.startswith("job=") or what not in _CHAINS:
                continue
            for expr in rule.get("expr", []):
                counter = expr.get("counter") if isinstance(expr, dict) else None
                if counter:
                    out.setdefault(job, {})[what] = int(counter.get("bytes", 0))
        return out

    def forget(self, job_id: str) -> None:
        if self._jobs.pop(job_id, None) is None:
            return
        handles = []
        for item in self.runner.list_json("table", _FAMILY, self.table):
            rule = item.get("rule")
            if rule and str(rule.get("comment", "")).startswith(f"job={job_id} "):
                handles.append((rule["chain"], int(rule["handle"])))
        script = "".join(f"delete rule {_FAMILY} {self.table} {chain} handle {h}\n"
                         for chain, h in handles)
        if script:
            self.runner.run(script, what=f"forget job={job_id}")

    def close(self) -> None:
        self._jobs.clear()
        if self.runner.table_exists(_FAMILY, self.table):
            self.runner.run(f"delete table {_FAMILY} {self.table}\n", what="usage counters closed")
