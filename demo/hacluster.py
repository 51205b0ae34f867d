"""A highly available cluster on this machine: several masters sharing a PostgreSQL journal
(one leads, the others stand by) and N node daemons given every master's URL.

Used by the HA end-to-end tests and ``bench/failover.py``. The PostgreSQL server is the
caller's (``demo.pgserver.PgServer``); masters are real ``trellis-masterd`` processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from control.client import MasterClient, RpcError, Unreachable
from control.failover import ATTEMPT_S, FailoverClient
from demo.cluster import Daemon, LocalCluster, _toml, free_port
from shared.auth import Secret


@dataclass
class HaCluster(LocalCluster):
    store: str = ""  # the masters' PostgreSQL URL
    masters: int = 2
    # Leader election timing ([master] lease_s, renew_deadline_s, retry_s).
    election: dict[str, float] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    master_daemons: list[Daemon] = field(default_factory=list)
    # Per master (by index), for masters in network namespaces of their own: the address it
    # listens and is reached on (default 127.0.0.1), its store URL (default ``store``) and a
    # command prefix (e.g. ["ip", "netns", "exec", NS]).
    master_hosts: list[str] = field(default_factory=list)
    master_stores: list[str] = field(default_factory=list)
    master_wrappers: dict[int, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.ports:
            self.ports = [self.port] + [free_port() for _ in range(self.masters - 1)]

    def master_host(self, i: int) -> str:
        return self.master_hosts[i] if i < len(self.master_hosts) else "127.0.0.1"

    def master_url(self, i: int) -> str:
        return f"{self.scheme}://{self.master_host(i)}:{self.ports[i]}"

    @property
    def url(self) -> str:  # every master: what nodes and clients are given
        return ",".join(self.master_url(i) for i in range(self.masters))

    def client(self, timeout: float = 10.0, role: str = "admin",
               attempt_timeout: float = ATTEMPT_S) -> FailoverClient:
        return FailoverClient(self.url, timeout=timeout, attempt_timeout=attempt_timeout,
                              token=self._token(role))

    def master_client(self, i: int, timeout: float = 2.0) -> MasterClient:
        return MasterClient(self.master_url(i), timeout=timeout, token=self._token("admin"))

    def _token(self, role: str) -> Secret | None:
        return Secret(self.tokens[role]) if role in self.tokens else None

    def start_master(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.master_daemons = []
        # Every master the same tokens (a master off loopback needs them).
        tokens = self.make_tokens(max(self.nodes, 8)) if self.auth else {}
        for i in range(self.masters):
            store = self.master_stores[i] if i < len(self.master_stores) else self.store
            settings: dict[str, Any] = {
                "listen_host": self.master_host(i), "listen_port": self.ports[i],
                "state_dir": str(self.root / f"master{i}"), "policy": self.policy,
                "node_grace_s": self.node_grace_s, "command_timeout_s": 10,
                "stop_grace_s": 3, "store": store, **self.election, **tokens,
                **self.extra_master,
            }
            extra = "".join(f"{k} = {_toml(v)}\n" for k, v in settings.items())
            cfg = self._write(f"master{i}.toml", "[master]\n" + extra)
            daemon = Daemon(f"master{i}", [*self.master_wrappers.get(i, []), sys.executable,
                                           "-m", "masterd.main", "-c", str(cfg)],
                            self.root / f"master{i}.log")
            self.master_daemons.append(daemon)
        # In order: master0 leads (a test or bench knows which one it set apart), the others
        # stand by, each answering before this returns.
        self.master = self.master_daemons[0]
        self.master.start(self._env())
        self.wait_leader(self.master_start_timeout_s)
        for i, daemon in enumerate(self.master_daemons[1:], 1):
            daemon.start(self._env())
            self.wait_standby(i, self.master_start_timeout_s)

    def leader(self) -> int | None:
        """The index of the master that answers as the leader now, if any."""
        for i, daemon in enumerate(self.master_daemons):
            if not daemon.running:
                continue
            try:
                self.master_client(i).call("ping")
                return i
            except (RpcError, Unreachable):
                continue
        return None

    def wait_leader(self, timeout: float = 30.0, not_index: int | None = None) -> int:
        deadline = time.monotonic() + timeout
        while True:
            found = self.leader()
            if found is not None and found != not_index:
                return found
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- master{i}\n{self.log(f'master{i}')}"
                                 for i in range(self.masters))
                raise TimeoutError(f"no master leads after {timeout:g} s\n{logs}")
            time.sleep(0.05)

    def wait_standby(self, i: int, timeout: float = 30.0) -> None:
        """Until master ``i`` answers as a standby (not_leader)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.master_client(i).call("ping")
            except RpcError as exc:
                if exc.code == "not_leader":
                    return
            except Unreachable:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"master{i} does not stand by after {timeout:g} s\n"
                                   + self.log(f"master{i}"))
            time.sleep(0.05)

    def kill_master(self, i: int, sig: int = signal.SIGKILL) -> None:
        self.master_daemons[i].stop(sig)

    def freeze_master(self, i: int, within_s: float = 10.0) -> list[int]:
        """SIGSTOP master ``i`` and its journal writer (its process group): a silent leader
        whose kernel still accepts connections. Returns once every process of the group is
        seen stopped (a signal is delivered asynchronously: on a busy machine a process can
        still read as running just after ``killpg``), with their pids."""
        proc = self.master_daemons[i].proc
        assert proc is not None
        os.killpg(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + within_s
        while True:
            group = _group(proc.pid)
            if group and all(state in STOPPED for state in group.values()):
                return sorted(group)
            if time.monotonic() > deadline:
                raise TimeoutError(f"master{i}'s processes not all stopped after {within_s}s: "
                                   f"{group}")
            time.sleep(0.02)

    def resume_master(self, i: int) -> None:
        proc = self.master_daemons[i].proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)

    def start_again(self, i: int) -> None:
        """Start master ``i`` again (as a standby, unless nobody leads)."""
        self.master_daemons[i].start(self._env())

    def stop(self) -> None:
        for daemon in self.node_daemons.values():
            daemon.stop()
        for i, daemon in enumerate(self.master_daemons):
            self.resume_master(i)  # a frozen one would not see SIGTERM, nor its writer
            daemon.stop()

    def log(self, name: str) -> str:
        if name == "master" and self.master_daemons:
            found = self.leader()
            name = f"master{found if found is not None else 0}"
        return super().log(name)


STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def _group(pgid: int) -> dict[int, str]:
    """The live processes of process group ``pgid`` and their states."""
    group: dict[int, str] = {}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid:
                group[proc.pid] = proc.status()
    return group
