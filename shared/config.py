"""TOML configuration of both daemons. Every option is documented in README.md."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shared.model import NAME_PATTERN, UNIX_USER_PATTERN
from shared.schema import SchemaError, bounded, decode

T = TypeVar("T")


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class MasterConfig:
    listen_host: str = bounded("127.0.0.1", max_len=255)
    listen_port: int = bounded(7400, min=0, max=65535)
    state_dir: str = bounded("/var/lib/trellis/master", max_len=4096)
    policy: str = bounded("fifo", max_len=64)
    policy_options: dict[str, Any] = field(default_factory=dict)
    # A node silent for this long is marked unreachable: nothing new is placed there.
    node_grace_s: float = bounded(30.0, min=0.1, max=86400)
    command_timeout_s: float = bounded(15.0, min=0.1, max=3600)
    stop_grace_s: float = bounded(10.0, min=0, max=3600)
    # Unix users jobs may run as; empty means any user that exists, except root.
    allowed_users: tuple[str, ...] = bounded(default_factory=tuple, max_len=100_000)
    allow_root_jobs: bool = False
    log_level: str = bounded("info", pattern=r"(?i)debug|info|warning|error")
    # Authentication (see docs/security.md). Token files: lines "NAME TOKEN" (or "TOKEN"),
    # mode 0600; with none of these and no TLS client CA the master serves loopback only.
    admin_token_file: str = bounded("", max_len=4096)
    client_token_file: str = bounded("", max_len=4096)
    node_token_file: str = bounded("", max_len=4096)
    tls_cert_file: str = bounded("", max_len=4096)
    tls_key_file: str = bounded("", max_len=4096)
    tls_ca_file: str = bounded("", max_len=4096)  # verifies client certificates (mTLS)
    tls_admin_cns: tuple[str, ...] = bounded(default_factory=tuple, max_len=10_000)
    tls_client_cns: tuple[str, ...] = bounded(default_factory=tuple, max_len=10_000)
    tls_node_cns: tuple[str, ...] = bounded(default_factory=tuple, max_len=10_000)
    # Clients may submit jobs, each only as the Unix user named by its identity.
    clients_may_submit: bool = False
    # Hostile-peer limits: a request (headers and body) or a node frame must arrive within
    # request_timeout_s of its first byte; a node must say hello within hello_timeout_s.
    request_timeout_s: float = bounded(10.0, min=0.05, max=3600)
    hello_timeout_s: float = bounded(10.0, min=0.05, max=3600)
    max_connections_per_ip: int = bounded(1024, min=1, max=1_000_000)
    # WebSocket ping period on node sessions: a silent (partitioned) node is noticed within
    # about 1.5 times this, and marked unreachable node_grace_s later.
    node_heartbeat_s: float = bounded(10.0, min=0.1, max=3600)


@dataclass(frozen=True)
class GpuConfig:
    backend: str = bounded("emulated", pattern=r"emulated|nvml|auto")
    count: int = bounded(4, min=0, max=1024)
    model: str = bounded("A100-SXM4-40GB", max_len=128)
    memory_mib: int = bounded(40960, min=0)
    gpus_per_switch: int = bounded(2, min=1, max=1024)
    numa_nodes: int = bounded(1, min=1, max=64)
    busy_util: float = bounded(90.0, min=0, max=100)


@dataclass(frozen=True)
class NodeConfig:
    name: str = bounded(pattern=NAME_PATTERN)
    master_url: str = bounded("http://127.0.0.1:7400", max_len=1024)
    # Address other nodes reach this one at (MASTER_ADDR of distributed jobs ranked here).
    address: str = bounded("127.0.0.1", max_len=255)
    state_dir: str = bounded("/var/lib/trellis/node", max_len=4096)
    cgroup_parent: str = bounded("trellis", pattern=NAME_PATTERN)
    cgroup_mode: str = bounded("auto", pattern=r"auto|v1|v2|affinity")
    # Cores this node offers to jobs, e.g. "0-15,32-47"; empty means every online core.
    cpus: str = bounded("", pattern=r"[0-9,\- ]*")
    allow_root_jobs: bool = False
    allowed_users: tuple[str, ...] = bounded(default_factory=tuple, max_len=100_000)
    sample_interval_s: float = bounded(1.0, min=0.05, max=3600)
    reconnect_max_s: float = bounded(30.0, min=0.1, max=3600)
    log_level: str = bounded("info", pattern=r"(?i)debug|info|warning|error")
    gpu: GpuConfig = field(default_factory=GpuConfig)
    # Authentication to the master: a token file (one token, mode 0600) and/or TLS.
    token_file: str = bounded("", max_len=4096)
    tls_ca_file: str = bounded("", max_len=4096)
    tls_cert_file: str = bounded("", max_len=4096)
    tls_key_file: str = bounded("", max_len=4096)

    def __post_init__(self) -> None:
        import re

        for user in self.allowed_users:
            if not re.fullmatch(UNIX_USER_PATTERN, user):
                raise ValueError(f"allowed_users entry {user!r} is not a valid user name")


def load_config(cls: type[T], path: str | Path | None, section: str, **overrides: Any) -> T:
    """Read ``[section]`` of a TOML file (if given), apply overrides, validate."""
    data: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such configuration file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        unknown = [k for k in doc if k not in (section, "gpu")]
        if unknown:
            raise ConfigError(f"{path}: unknown section(s) {', '.join(unknown)}")
        data = dict(doc.get(section, {}))
        if "gpu" in doc:
            data["gpu"] = doc["gpu"]
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return decode(cls, data, section)
    except SchemaError as exc:
        raise ConfigError(f"{where}: {exc}") from None
