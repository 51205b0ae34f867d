"""A whole Trellis cluster on this machine: one master and N node daemons as real processes.

Used by the demo and by the end-to-end tests. Every daemon is a separate OS process started
from its console entry point, talking over loopback exactly as on a real cluster.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from control.client import MasterClient, Unreachable
from demo.harness import shielded, sweep_node
from shared.auth import Secret

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_job_user() -> str:
    """Jobs never run as root: as root, the demo runs them as 'nobody'."""
    if os.geteuid() == 0:
        return "nobody"
    import getpass

    return getpass.getuser()


# The tree this module belongs to: its daemons run from here.
TREE = Path(__file__).resolve().parent.parent
# The demo's emulated training job, which the demo and the end-to-end tests submit.
TRAINER = str(TREE / "demo" / "trainer.py")


@dataclass
class Daemon:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        # ``python -m`` puts the working directory ahead of PYTHONPATH: started from another
        # checkout, the daemons ran that checkout's code, and a bench comparing two trees
        # compared one with itself.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, env=env, cwd=TREE,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 5000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


@dataclass
class LocalCluster:
    root: Path
    nodes: int = 2
    gpus_per_node: int = 4
    prefix: str = "trellis-demo"
    policy: str = "fifo"
    cgroup_mode: str = "auto"
    node_grace_s: float = 5.0
    extra_master: dict[str, Any] = field(default_factory=dict)
    # Extra [node] keys per node number (1-based), e.g. {2: {"allowed_users": ["bob"]}}.
    extra_node: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Extra node configuration by section for every node: "gpu" keys join [gpu], any other
    # name becomes its own section, e.g. {"tuner": {"window_s": 1.0}}.
    node_sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Extra [node] keys for every node.
    node_settings: dict[str, Any] = field(default_factory=dict)
    # Extra sections per node number (1-based), e.g. {1: {"net": {"enabled": True, ...}}}.
    node_sections_by_node: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # Bearer tokens for every role (files of mode 0600 under root); off = open loopback access.
    auth: bool = False
    listen_host: str = "127.0.0.1"
    # How nodes reach the master, and a command prefix per node (e.g. ip netns exec NS).
    node_master_host: str | None = None
    node_wrapper: dict[str, list[str]] = field(default_factory=dict)
    # A command prefix for the master (e.g. valgrind, for bench/rpc_cost.py) and how long
    # to wait for it to answer.
    master_wrapper: list[str] = field(default_factory=list)
    master_start_timeout_s: float = 20.0
    scheme: str = "http"  # https when the master has TLS configured
    client_ssl: Any = None  # ssl.SSLContext the cluster's own client uses
    port: int = field(default_factory=free_port)
    master: Daemon | None = None
    node_daemons: dict[str, Daemon] = field(default_factory=dict)

    tokens: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.listen_host in ("127.0.0.1", "0.0.0.0") else self.listen_host
        return f"{self.scheme}://{host}:{self.port}"

    def client(self, timeout: float = 10.0, role: str = "admin") -> MasterClient:
        token = Secret(self.tokens[role]) if role in self.tokens else None
        return MasterClient(self.url, timeout=timeout, token=token, ssl_context=self.client_ssl)

    def _secret_file(self, name: str, text: str) -> Path:
        path = self.root / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def make_tokens(self, nodes: int) -> dict[str, Any]:
        """Token files for every role; returns the master's config keys for them."""
        for role in ("admin", "client"):
            self.tokens.setdefault(role, secrets.token_urlsafe(24))
        for i in range(1, nodes + 1):
            self.tokens.setdefault(self.node_name(i), secrets.token_urlsafe(24))
        node_lines = "".join(f"{self.node_name(i)} {self.tokens[self.node_name(i)]}\n"
                             for i in range(1, nodes + 1))
        return {
            "admin_token_file": str(self._secret_file("admin.token",
                                                      self.tokens["admin"] + "\n")),
            "client_token_file": str(self._secret_file(
                "clients.tokens", f"{default_job_user()} {self.tokens['client']}\n")),
            "node_token_file": str(self._secret_file("nodes.tokens", node_lines or "#\n")),
        }

    def token_file(self, role: str) -> Path:
        """A client-side token file (one token) for ``role`` or a node name."""
        return self._secret_file(f"{role}.own.token", self.tokens[role] + "\n")

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        root = str(TREE)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env
                                    else "")
        return env

    def _write(self, name: str, text: str) -> Path:
        path = self.root / name
        path.write_text(text)
        return path

    def start_master(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        settings: dict[str, Any] = {
            "listen_host": self.listen_host, "listen_port": self.port,
            "state_dir": str(self.root / "master"), "policy": self.policy,
            "node_grace_s": self.node_grace_s, "command_timeout_s": 10, "stop_grace_s": 3,
        }
        if self.auth:
            settings.update(self.make_tokens(max(self.nodes, 8)))
        settings.update(self.extra_master)
        extra = "".join(f"{k} = {_toml(v)}\n" for k, v in settings.items())
        cfg = self._write("master.toml", "[master]\n" + extra)
        self.master = Daemon("master", [*self.master_wrapper, sys.executable, "-m",
                                        "masterd.main", "-c", str(cfg)],
                             self.root / "master.log")
        self.master.start(self._env())
        self.wait_master(self.master_start_timeout_s)

    def wait_master(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client(timeout=2).call("ping")
                return
            except Unreachable:
                if self.master and not self.master.running:
                    raise RuntimeError("the master exited:\n" + self.log("master")) from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def node_name(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    def start_node(self, i: int) -> None:
        name = self.node_name(i)
        extra = {k: dict(v) for k, v in self.node_sections.items()}
        for section, keys in self.node_sections_by_node.get(i, {}).items():
            extra.setdefault(section, {}).update(keys)
        gpu_extra = "".join(f"{k} = {_toml(v)}\n" for k, v in extra.pop("gpu", {}).items())
        sections = "".join(
            f"[{section}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in keys.items())
            for section, keys in extra.items()
        )
        settings = {**self.node_settings, **self.extra_node.get(i, {})}
        if self.auth and name in self.tokens:
            settings.setdefault("token_file", str(self.token_file(name)))
        node_keys = "".join(f"{k} = {_toml(v)}\n" for k, v in settings.items())
        url = self.url
        if self.node_master_host:
            url = f"{self.scheme}://{self.node_master_host}:{self.port}"
        cfg = self._write(f"{name}.toml", (
            "[node]\n"
            f'name = "{name}"\nmaster_url = "{url}"\n{node_keys}'
            f'state_dir = "{self.root / name}"\ncgroup_parent = "{name}"\n'
            f'cgroup_mode = "{self.cgroup_mode}"\nsample_interval_s = 0.5\n'
            f"reconnect_max_s = 1.0\n"
            "[gpu]\n"
            f'backend = "emulated"\ncount = {self.gpus_per_node}\nmodel = "A100-SXM4-40GB"\n'
            f"{gpu_extra}{sections}"
        ))
        daemon = Daemon(name, [*self.node_wrapper.get(name, []), sys.executable, "-m",
                               "noded.main", "-c", str(cfg)], self.root / f"{name}.log")
        daemon.start(self._env())
        self.node_daemons[name] = daemon

    def start(self) -> None:
        self.start_master()
        for i in range(1, self.nodes + 1):
            self.start_node(i)
        self.wait_nodes(self.nodes)

    def wait_nodes(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = self.client().call("nodes")["nodes"]
            if sum(1 for n in nodes if n["status"] == "ready") >= count:
                return
            for name, daemon in self.node_daemons.items():
                if not daemon.running:
                    raise RuntimeError(f"node {name} exited:\n" + self.log(name))
            time.sleep(0.1)
        raise TimeoutError(f"fewer than {count} nodes became ready; see {self.root}")

    def restart_master(self, sig: int = signal.SIGKILL) -> None:
        assert self.master is not None
        self.master.stop(sig)
        self.master.start(self._env())
        self.wait_master()

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def stop(self) -> None:
        for daemon in self.node_daemons.values():
            daemon.stop()
        if self.master:
            self.master.stop()

    def close(self) -> None:
        """Stop everything this cluster started, whatever state it is in."""
        with shielded():
            self.stop()
            for name in self.node_daemons:
                sweep_node(name, self.root / name)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_for(self, what: str, check: Callable[[], T], timeout: float = 60.0) -> T:
        """Poll ``check`` until it returns something true and return that; on timeout, fail
        with the master's log, where the reason usually is."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n" + self.log("master"))
            time.sleep(0.3)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table, e.g. policy_options
        import json

        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}"
                                for k, v in value.items()) + " }"
    return str(value)
