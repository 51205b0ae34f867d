"""The soak: a whole HA cluster under users and a nemesis, then healed and judged.

Masters (on one PostgreSQL journal), PostgreSQL itself and every node daemon run in network
namespaces of their own, joined by a private bridge (demo/netlab.py: link-local addresses,
nothing leaves it), so any of their links can be cut; the users, the watcher and the
nemesis run on this machine's own side. Nodes use real cgroups and emulated GPUs. Everything
is started here and torn down here, also when the run is interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

from bench.chaoskit.checker import Verdict, check
from bench.chaoskit.evidence import read_evidence
from bench.chaoskit.history import History, Op, now
from bench.chaoskit.nemesis import Nemesis, Target
from bench.chaoskit.workload import User, Workload
from control.client import RpcError, Unreachable
from control.failover import FailoverClient
from demo.cluster import TREE
from demo.hacluster import HaCluster
from demo.harness import kill_jobs, live_environs, shielded
from demo.netlab import CUTS, NetLab
from demo.pgserver import PgServer
from demo.registry import BUSYBOX, Registry, build_image
from demo.terminal import Terminal
from noded.containers.podman import Podman
from noded.gpu.emulated import write_fault
from shared.auth import Secret

log = logging.getLogger("chaos")

# Existing system users: the soak creates no Unix accounts. Two accounts of two users each.
USERS = {"nobody": "alpha", "daemon": "alpha", "bin": "beta", "games": "beta"}
QUOTA_GPUS, BORROW_GPUS = 8, 4
# Timing: failures are noticed within seconds, so that a soak of minutes sees many recoveries.
MASTER = {
    "node_heartbeat_s": 2.0, "node_grace_s": 5.0, "node_lost_s": 20.0,
    "node_fence_margin_s": 2.0, "stop_grace_s": 2.0, "max_grace_s": 4.0,
    "command_timeout_s": 5.0, "clients_may_submit": True, "max_requeues": 20,
}
ELECTION = {"lease_s": 6.0, "renew_deadline_s": 4.0, "retry_s": 1.0}
NODE = {"master_heartbeat_s": 2.0, "master_connect_timeout_s": 3.0}
REPORT_BOUND_S = 60.0


@dataclass
class SoakConfig:
    minutes: float
    seed: int
    masters: int = 3
    nodes: int = 6
    gpus_per_node: int = 4
    mean_gap_s: float = 4.0
    min_faults: int | None = None  # default: 10 a minute
    out: Path | None = None  # where a failing run leaves its history and logs
    keep: bool = False

    @property
    def wanted_faults(self) -> int:
        return self.min_faults if self.min_faults is not None else round(self.minutes * 10)


@dataclass
class Soak:
    config: SoakConfig
    root: Path
    history: History
    lab: NetLab = field(default_factory=NetLab)
    cluster: HaCluster | None = None
    pg: PgServer | None = None
    evidence: Path = Path()
    job_py: Path = Path()
    tokens: dict[str, Path] = field(default_factory=dict)
    mounts: list[Path] = field(default_factory=list)
    restarts: Counter[str] = field(default_factory=Counter)
    hostile_5xx: int = 0
    frozen: set[int] = field(default_factory=set)
    registry: Registry | None = None
    image: str = ""  # the container jobs' image, "" when podman and its kin are missing
    containers_missing: str = ""

    # -- the cluster -------------------------------------------------------------------
    def build(self) -> None:
        cfg = self.config
        self.lab.start()
        host = self.lab.add("host", own_namespace=False)
        pg_site = self.lab.add("pg")
        masters = [self.lab.add(f"m{i}") for i in range(cfg.masters)]
        node_sites = [self.lab.add(f"n{i}") for i in range(1, cfg.nodes + 1)]
        self.pg = PgServer(listen=("127.0.0.1", pg_site.address), wrapper=pg_site.wrapper)
        self.pg.start()
        local = self.pg.create_database()
        import psycopg

        name = psycopg.conninfo.conninfo_to_dict(local)["dbname"]
        store = self.pg.url(str(name), host=pg_site.address)
        self.evidence = self.root / "evidence"
        self.evidence.mkdir()
        os.chmod(self.evidence, 0o1777)
        self.job_py = self.root / "job.py"  # where every job user can read it
        shutil.copy(Path(__file__).with_name("job.py"), self.job_py)
        os.chmod(self.job_py, 0o644)
        containers = self._start_registry(host.address)
        prefix = f"trellis-test-c{self.lab.tag}"
        cluster = HaCluster(
            self.root / "cluster", nodes=cfg.nodes, gpus_per_node=cfg.gpus_per_node,
            prefix=prefix, cgroup_mode="auto", store=store, masters=cfg.masters, auth=True,
            master_hosts=[s.address for s in masters],
            master_wrappers={i: s.wrapper for i, s in enumerate(masters)},
            master_start_timeout_s=90, election=ELECTION, node_settings=dict(NODE),
            # nsenter, not ip netns exec: that one mounts a sysfs of the namespace's own on
            # /sys, which hides the cgroup hierarchies, and the nodes need real cgroups.
            node_wrapper={f"{prefix}-n{i}": ["nsenter", f"--net=/run/netns/{s.ns}", "--"]
                          for i, s in enumerate(node_sites, 1)},
            node_grace_s=MASTER["node_grace_s"],
            node_sections={"containers": containers} if containers else {})
        self.cluster = cluster
        cluster.root.mkdir(parents=True)
        lines = []
        for user in USERS:
            token = f"{user}-{os.urandom(12).hex()}"
            lines.append(f"{user} {token}\n")
            self.tokens[user] = _secret(self.root / f"{user}.token", token + "\n")
        clients = _secret(self.root / "clients.tokens", "".join(lines))
        accounts = [{"name": account, "users": [u for u, a in USERS.items() if a == account],
                     "quota": {"gpus": QUOTA_GPUS}, "borrowing_limit": {"gpus": BORROW_GPUS}}
                    for account in sorted(set(USERS.values()))]
        cluster.extra_master = {**MASTER, "client_token_file": str(clients),
                                "accounts": accounts}
        for i in range(1, cfg.nodes + 1):  # each node's log directory on a small disk
            logs = cluster.root / cluster.node_name(i) / "logs"
            logs.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "trellis-test-chaos",
                            str(logs)], check=True, capture_output=True, timeout=30)
            self.mounts.append(logs)
        cluster.start()
        self.tokens["admin"] = cluster.token_file("admin")

    def _start_registry(self, address: str) -> dict[str, Any]:
        """A registry on this machine's side of the network, holding a busybox image, for
        the container jobs; the nodes' [containers] keys. Nothing when a tool is missing."""
        missing = [t for t in ("podman", "runc", "skopeo", "docker-registry")
                   if shutil.which(t) is None] + ([] if Path(BUSYBOX).exists() else ["busybox"])
        if missing:
            self.containers_missing = f"not installed: {', '.join(missing)}"
            log.warning("no container jobs: %s", self.containers_missing)
            return {}
        layout = self.root / "oci"
        build_image(layout, "v1")
        self.registry = Registry(address=address).start()
        self.image = self.registry.push(layout, "v1", "trellis-test/chaos")
        scripts = self.root / "ctr"
        scripts.mkdir(mode=0o755)
        shutil.copy(Path(__file__).with_name("job_container.sh"), scripts / "job.sh")
        os.chmod(scripts / "job.sh", 0o644)
        return {"insecure_registries": [self.registry.host], "pull_timeout_s": 30.0,
                "allowed_mounts": [str(self.evidence), str(scripts)]}

    def container_job(self, seconds: float, code: int) -> dict[str, Any] | None:
        """The spec fields of a container job writing its evidence; None without podman."""
        if not self.image:
            return None
        offset = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return {"command": ["/bin/sh", "/chaos/job.sh", "/evidence", f"{seconds:.1f}",
                            str(code)],
                "env": {"CHAOS_BOOT_OFFSET": f"{offset:.3f}"},
                "launch": {"image": self.image, "mounts": [
                    {"source": str(self.evidence), "target": "/evidence"},
                    {"source": str(self.root / "ctr"), "target": "/chaos",
                     "read_only": True}]}}

    def client(self, who: str, timeout: float = 10.0) -> FailoverClient:
        assert self.cluster is not None
        token = Secret(self.tokens[who].read_text().strip())
        return FailoverClient(self.cluster.url, timeout=timeout, attempt_timeout=3.0,
                              token=token)

    def teardown(self) -> None:
        with shielded():
            if self.cluster is not None:
                for i in range(len(self.cluster.master_daemons)):
                    self.cluster.resume_master(i)
                self.cluster.close()
            if self.cluster is not None:
                for name in self.cluster.node_daemons:
                    Podman(self.cluster.root / name / "containers").clean()
            if self.registry is not None:
                self.registry.close()
            if self.pg is not None:
                self.pg.stop()
            for mount in self.mounts:
                if subprocess.run(["umount", str(mount)], capture_output=True,
                                  timeout=30).returncode != 0:
                    subprocess.run(["umount", "-l", str(mount)], capture_output=True,
                                   timeout=30)
            self.lab.close()

    # -- what the nemesis acts through ---------------------------------------------------
    def target(self) -> Target:
        cluster = self.cluster
        assert cluster is not None and self.pg is not None
        rng = random.Random(self.config.seed + 1)

        def kill_master(i: int) -> None:
            proc = cluster.master_daemons[i].proc
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the master and its journal writer

        def freeze(i: int) -> None:
            self.frozen.add(i)
            cluster.freeze_master(i)

        def thaw(i: int) -> None:
            cluster.resume_master(i)
            self.frozen.discard(i)

        def kill_noded(node: str, with_jobs: bool) -> None:
            daemon = cluster.node_daemons[node]
            if daemon.proc is not None and daemon.proc.poll() is None:
                daemon.proc.kill()
                daemon.proc.wait()
            if with_jobs:  # as the node's crash would: every process of every job group,
                # a container's too (its processes live under conmon, not the shim)
                kill_jobs(cluster.root / node)
                from noded.cgroups import detect_cgroups

                with contextlib.suppress(Exception):
                    groups = detect_cgroups(node, state_dir=cluster.root / node / "cgroups")
                    for job in groups.list_jobs():
                        with contextlib.suppress(Exception):
                            groups.signal_all(job, signal.SIGKILL)

        async def pg_restart() -> None:
            await asyncio.to_thread(self._pg_restart)

        def xid(node: str, gpu: int, number: int) -> None:
            write_fault(cluster.root / node / "gpu-faults", gpu, number)

        async def gpu_reset(node: str, gpu: int) -> None:
            invoked = now()
            try:
                await asyncio.to_thread(self.client("admin").call, "gpu_reset",
                                        {"node": node, "index": gpu})
                outcome, error = "ok", ""
            except (RpcError, Unreachable, OSError) as exc:
                outcome, error = "info", str(exc)
            self.history.record(Op("operator", "gpu_reset", invoked, now(), outcome,
                                   {"node": node, "gpu": gpu}, error=error))

        return Target(
            leader=self._leader, masters=self.config.masters,
            nodes=sorted(cluster.node_daemons), kill_master=kill_master, freeze_master=freeze,
            thaw_master=thaw, cut=lambda site: self.lab.cut(self._site(site),
                                                            rng.choice(CUTS)),
            restore=lambda site: self.lab.restore(self._site(site)), kill_noded=kill_noded,
            pg_restart=pg_restart, xid=xid, gpu_reset=gpu_reset, fill_disk=self._fill,
            free_disk=self._free, hostile=self._hostile,
            gpus_per_node=self.config.gpus_per_node)

    def _site(self, name: str) -> str:
        """A node's name or a master's ``mI`` as the network's site name."""
        if name.startswith("m") and name[1:].isdigit():
            return name
        return "n" + name.rsplit("-n", 1)[1]

    def _leader(self) -> int | None:
        assert self.cluster is not None
        for i, daemon in enumerate(self.cluster.master_daemons):
            if i in self.frozen or not daemon.running:
                continue
            try:
                self.cluster.master_client(i, timeout=1.0).call("ping")
                return i
            except (RpcError, Unreachable, OSError):
                continue
        return None

    def _pg_restart(self) -> None:
        pg = self.pg
        assert pg is not None and pg.root is not None
        from demo.pgserver import server_bin

        # -l: the restarted server must not inherit pg_ctl's output pipes (run() would wait
        # for them to close for as long as the server lives).
        pg._run(str(server_bin() / "pg_ctl"), "-D", str(pg.root / "data"), "-l",
                str(pg.root / "server.log"), "-m", "immediate", "-w", "-t", "60", "restart",
                timeout=90)

    def _fill(self, node: str) -> None:
        assert self.cluster is not None
        filler = self.cluster.root / node / "logs" / "trellis-test-filler"
        # ENOSPC ends it: the disk is full, as wanted.
        with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * (1 << 16))

    def _free(self, node: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.cluster.root / node / "logs" / "trellis-test-filler").unlink()  # type: ignore[union-attr]

    async def _hostile(self, seconds: float) -> int:
        """A burst of malformed and absurd requests at the leader; counts 5xx answers."""
        leader = self._leader()
        if leader is None:
            return 0
        assert self.cluster is not None
        url = self.cluster.master_url(leader) + "/v1/rpc"
        rng = random.Random(self.config.seed ^ int(now()))
        bodies = [
            lambda: os.urandom(rng.randrange(1, 200)),
            lambda: msgpack.packb({"v": 1, "id": 1, "method": "events",
                                   "params": {"after": 2**63 + rng.randrange(100)}}),
            lambda: msgpack.packb({"v": True, "id": 2, "method": "ping", "params": {}}),
            lambda: msgpack.packb({"v": 1, "id": 3, "method": "x" * 300, "params": {}}),
            lambda: msgpack.packb({"v": 1, "id": 4, "method": "submit",
                                   "params": {"job": {"name": "../x", "gpus": -1}}}),
            lambda: msgpack.packb({"v": 1, "id": 5, "method": "jobs",
                                   "params": {"limit": 10**12}}),
            lambda: msgpack.packb([1, 2, 3]),
        ]
        token = self.tokens["bin"].read_text().strip()
        sent = 0
        deadline = time.monotonic() + seconds
        timeout = aiohttp.ClientTimeout(total=3)
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while time.monotonic() < deadline:
                    body = rng.choice(bodies)()
                    headers = {"Content-Type": "application/msgpack"}
                    if rng.random() < 0.5:
                        headers["Authorization"] = f"Bearer {token}"
                    async with session.post(url, data=body, headers=headers) as answer:
                        await answer.read()
                        sent += 1
                        if answer.status >= 500:
                            self.hostile_5xx += 1
        return sent

    # -- supervisor: systemd's Restart= ---------------------------------------------------
    async def supervise(self, stop: asyncio.Event) -> None:
        cluster = self.cluster
        assert cluster is not None
        dead_since: dict[str, float] = {}
        while not stop.is_set():
            for i, daemon in enumerate(cluster.master_daemons):
                self._restart_if_dead(f"master{i}", daemon.running, dead_since,
                                      lambda i=i: cluster.start_again(i))
            for n, (name, daemon) in enumerate(sorted(cluster.node_daemons.items()), 1):
                self._restart_if_dead(name, daemon.running, dead_since,
                                      lambda n=n: cluster.start_node(n))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    def _restart_if_dead(self, name: str, running: bool, dead_since: dict[str, float],
                         start: Any) -> None:
        if running:
            dead_since.pop(name, None)
            return
        since = dead_since.setdefault(name, time.monotonic())
        if time.monotonic() - since >= 1.5:  # RestartSec
            start()
            dead_since.pop(name, None)
            self.restarts[name] += 1
            self.history.record(Op("supervisor", "restart", now(), now(), "ok",
                                   {"daemon": name}))

    # -- the watcher --------------------------------------------------------------------
    async def watch(self, stop: asyncio.Event) -> None:
        """Every state change of every job, as an admin's listing shows it."""
        client = self.client("admin", timeout=5)
        last: dict[str, tuple[Any, ...]] = {}
        while not stop.is_set():
            try:
                listed = await asyncio.to_thread(client.call, "jobs", {"limit": 100_000})
            except (RpcError, Unreachable, OSError):
                listed = None
            if listed is not None:
                seen = now()
                for job in listed["jobs"]:
                    key = (job["state"], job.get("exit_code"), job.get("restarts"))
                    if last.get(job["id"]) != key:
                        last[job["id"]] = key
                        self.history.record(Op("watcher", "observed", seen, seen, "ok", {},
                                               {"id": job["id"], "state": job["state"],
                                                "exit_code": job.get("exit_code"),
                                                "restarts": job.get("restarts")}))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    # -- the users' side ----------------------------------------------------------------
    def job_command(self, seconds: float, code: int, pty: bool) -> list[str]:
        python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
        return [python, str(self.job_py), str(self.evidence), f"{seconds:.1f}", str(code),
                *(["--pty"] if pty else [])]

    def run_pty(self, user: User, job_id: str, argv: list[str], code: int
                ) -> tuple[int | None, bool, str]:
        assert self.cluster is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRELLIS_")}
        env.update(TRELLIS_TOKEN_FILE=str(self.tokens[user.name]), TERM="xterm")
        ctl = [sys.executable, "-m", "control.cli", "--master", self.cluster.url, "run",
               "--id", job_id, "--user", user.name, "--gpus", "1", "--cpus", "1", "--pty",
               "--", *argv]
        with Terminal(ctl, env, TREE) as term:
            try:
                term.expect(b"chaos-ready", timeout=60)
            except AssertionError as exc:
                return None, False, str(exc)[-300:]
            term.type(f"exit {code}\r".encode())
            try:
                return term.wait(timeout=60), True, ""
            except AssertionError as exc:
                return None, True, str(exc)[-300:]

    # -- heal and judge ----------------------------------------------------------------------
    async def heal(self) -> None:
        """Every daemon back, a leader, every node ready; then let every job end."""
        cluster = self.cluster
        assert cluster is not None
        for i in list(self.frozen):
            cluster.resume_master(i)
        for site in self.lab.sites:
            if self.lab.sites[site].cut:
                self.lab.restore(site)
        admin = self.client("admin")
        await _until("a leader and every node ready", 180, lambda: _ready(admin, cluster))
        # Jobs still running end by themselves (their time is short); whatever is left
        # (held, waiting on a dependency that never ends) is cancelled by the operator.
        await _until_quiet(admin, 120)
        leftover = await asyncio.to_thread(_unended, admin)
        for job_id in leftover:
            with contextlib.suppress(RpcError, Unreachable):
                await asyncio.to_thread(admin.call, "cancel", {"id": job_id})
        await _until("every job ended", 120, lambda: not _unended(admin))

    def final_views(self) -> None:
        admin = self.client("admin")
        ids = {meta["id"] for op in self.history.ops() if op.kind in ("submit", "pty")
               for meta in op.args.get("jobs", [])}
        for job_id in sorted(ids):
            invoked = now()
            try:
                job = admin.call("job", {"id": job_id})["job"]
                self.history.record(Op("checker", "final_job", invoked, now(), "ok",
                                       {"id": job_id}, {k: job.get(k) for k in (
                                           "state", "exit_code", "signal", "restarts",
                                           "reason")}))
            except RpcError as exc:
                self.history.record(Op("checker", "final_job", invoked, now(), "fail",
                                       {"id": job_id}, error=exc.code))
            except (Unreachable, OSError) as exc:
                self.history.record(Op("checker", "final_job", invoked, now(), "info",
                                       {"id": job_id}, error=str(exc)))

    async def inspect_nodes(self) -> None:
        """What each node's kernel holds of jobs, once the nodes had time to clean up: the
        last look of a bounded wait for nothing to be left."""
        admin = self.client("admin")
        deadline = time.monotonic() + 30
        while True:
            found = await asyncio.to_thread(self._node_state, admin)
            if not any(r.get("processes") or r.get("cgroups") for r in found) \
                    or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        for result in found:
            self.history.record(Op("checker", "final_node", now(), now(),
                                   "fail" if "error" in result else "ok", {}, result,
                                   result.get("error", "")))

    def _node_state(self, admin: FailoverClient) -> list[dict[str, Any]]:
        from noded.cgroups import detect_cgroups

        assert self.cluster is not None
        try:
            nodes = {n["name"]: n for n in admin.call("nodes")["nodes"]}
            idle = not _unended(admin)
        except (RpcError, Unreachable, OSError) as exc:
            return [{"node": "*", "error": f"the master did not answer: {exc}"}]
        processes: dict[str, set[str]] = {}
        for env in live_environs():
            if "TRELLIS_JOB_ID" in env and "TRELLIS_NODE" in env:
                processes.setdefault(env["TRELLIS_NODE"], set()).add(env["TRELLIS_JOB_ID"])
        found = []
        for name in sorted(self.cluster.node_daemons):
            try:
                groups = detect_cgroups(name, state_dir=self.cluster.root / name / "cgroups")
                found_groups = set(groups.list_jobs())
                # And what a container runtime made in the hierarchies noded does not use.
                for root in getattr(groups, "others", ()):
                    parent = root / name
                    if parent.is_dir():
                        found_groups |= {d.name for d in parent.iterdir() if d.is_dir()}
                cgroups = sorted(found_groups)
            except Exception as exc:
                cgroups = [f"<unreadable: {exc}>"]
            view = nodes.get(name, {})
            found.append({"node": name, "processes": sorted(processes.get(name, ())),
                          "cgroups": cgroups, "containers": self._containers(name),
                          "holding": list(view.get("jobs", [])), "cluster_idle": idle})
        return found


    def _containers(self, node: str) -> list[str]:
        """The containers still running in the node's podman store (after the heal, every
        one is a leftover: no job runs then)."""
        assert self.cluster is not None
        store = self.cluster.root / node / "containers"
        if not self.image or not store.exists():
            return []
        done = subprocess.run(Podman(store).argv("ps", "--format", "{{.Names}}"),
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            return [f"<podman ps failed: {done.stderr.strip()[-200:]}>"]
        return sorted(done.stdout.split())


def _secret(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def _ready(admin: FailoverClient, cluster: HaCluster) -> bool:
    try:
        nodes = admin.call("nodes")["nodes"]
    except (RpcError, Unreachable, OSError):
        return False
    return sum(1 for n in nodes if n["status"] == "ready") >= len(cluster.node_daemons)


def _unended(admin: FailoverClient) -> list[str]:
    try:
        jobs = admin.call("jobs", {"limit": 100_000})["jobs"]
    except (RpcError, Unreachable, OSError):
        return ["?"]  # unknown counts as not ended
    return [j["id"] for j in jobs if j["state"] not in
            ("finished", "failed", "cancelled", "timeout", "node_lost")]


async def _until(what: str, seconds: float, probe: Any) -> None:
    deadline = time.monotonic() + seconds
    while not await asyncio.to_thread(probe):
        if time.monotonic() > deadline:
            raise HealFailed(f"not healed: {what} after {seconds:g} s")
        await asyncio.sleep(1)


async def _until_quiet(admin: FailoverClient, seconds: float) -> None:
    """Until nothing runs or starts (what still waits may be held), at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            active = admin.call("jobs", {"state": "active"})["jobs"]
        except (RpcError, Unreachable, OSError):
            active = [None]
        if not active:
            return
        await asyncio.sleep(1)


class HealFailed(RuntimeError):
    """The cluster did not come back after the nemesis stopped: the run fails."""


async def _soak(soak: Soak) -> Verdict:
    cfg = soak.config
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=32))
    rng = random.Random(cfg.seed)
    workload = Workload(soak.history, soak.job_command, soak.run_pty, soak.container_job)
    users = [User(name, account, soak.client(name).call, random.Random(rng.random()))
             for name, account in USERS.items()]
    nemesis = Nemesis(soak.target(), soak.history, random.Random(rng.random()),
                      mean_gap_s=cfg.mean_gap_s)
    stop = asyncio.Event()
    background = [loop.create_task(soak.supervise(stop)), loop.create_task(soak.watch(stop))]
    until = now() + cfg.minutes * 60
    try:
        await asyncio.gather(nemesis.run(until), *(workload.run(u, until) for u in users))
        soak.injected = nemesis.injected  # type: ignore[attr-defined]
        await soak.heal()
        soak.final_views()
        await soak.inspect_nodes()
    finally:
        stop.set()
        await asyncio.gather(*background, return_exceptions=True)
    caps = {account: QUOTA_GPUS + BORROW_GPUS for account in set(USERS.values())}
    return check(soak.history, read_evidence(soak.evidence), caps, REPORT_BOUND_S)


def run_soak(config: SoakConfig) -> dict[str, Any]:
    """The whole soak; returns its result (the bench prints it as its last line)."""
    from demo.harness import exit_on_signals

    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="trellis-test-chaos-"))
    os.chmod(root, 0o755)
    history = History(root / "history.jsonl")
    soak = Soak(config, root, history)
    result: dict[str, Any] = {"seed": config.seed, "network": soak.lab.tag}
    failed = True
    try:
        with exit_on_signals():
            try:
                soak.build()
                verdict = asyncio.run(_soak(soak))
            except HealFailed as exc:
                verdict = None
                result["error"] = str(exc)
            finally:
                soak.teardown()
        injected: Counter[str] = getattr(soak, "injected", Counter())
        ops = [op for op in history.ops() if op.process in USERS]
        result.update(
            seconds=round(time.monotonic() - started, 1),
            faults=dict(sorted(injected.items())), faults_total=sum(injected.values()),
            faults_wanted=config.wanted_faults,
            operations=len(ops), operations_by_outcome=dict(Counter(op.outcome for op in ops)),
            operations_by_kind={kind: dict(Counter(op.outcome for op in ops if op.kind == kind))
                                for kind in sorted({op.kind for op in ops})},
            jobs=len({m["id"] for op in ops if op.kind in ("submit", "pty")
                      for m in op.args.get("jobs", [])}),
            daemon_restarts=sum(soak.restarts.values()), hostile_5xx=soak.hostile_5xx,
            errors_by_code=dict(Counter(op.error.split(":")[0] for op in ops
                                        if op.outcome == "fail")))
        if soak.containers_missing:
            result["containers"] = soak.containers_missing
        if verdict is not None:
            counts = verdict.by_invariant()
            result.update(violations=counts, acked_lost=counts["acked_lost"],
                          stats=verdict.stats,
                          violation_examples=[f"{v.invariant} {v.job}: {v.evidence}"
                                              for v in verdict.violations[:20]])
            failed = (any(counts.values()) or result["faults_total"] < config.wanted_faults
                      or soak.hostile_5xx > 0)
        if result["faults_total"] < config.wanted_faults:
            result["error"] = (f"the nemesis injected {result['faults_total']} faults, fewer "
                               f"than the {config.wanted_faults} asked")
        return result
    finally:
        history.close()
        result["failed"] = failed
        if failed or config.keep:
            kept = _keep(root, soak, config.out)
            result["kept"] = str(kept)
        with shielded():
            shutil.rmtree(root, ignore_errors=True)


def _keep(root: Path, soak: Soak, out: Path | None) -> Path:
    """A failing run's history, evidence and daemon logs, for replay with the same seed."""
    dest = out or Path(tempfile.mkdtemp(prefix=f"trellis-chaos-seed{soak.config.seed}-"))
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("history.jsonl",):
        with contextlib.suppress(OSError):
            shutil.copy(root / name, dest / name)
    with contextlib.suppress(OSError):
        shutil.copytree(root / "evidence", dest / "evidence", dirs_exist_ok=True)
    cluster = root / "cluster"
    if cluster.exists():
        for log_file in cluster.glob("*.log"):
            with contextlib.suppress(OSError):
                shutil.copy(log_file, dest / log_file.name)
    (dest / "config.json").write_text(json.dumps({
        "seed": soak.config.seed, "minutes": soak.config.minutes,
        "masters": soak.config.masters, "nodes": soak.config.nodes}))
    return dest
