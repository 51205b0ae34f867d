"""The node daemon in-process: readiness while the master is away, reload, metrics, stop."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from demo.cluster import free_port
from noded.main import NodeDaemon
from shared.config import NodeConfig, load_config
from shared.sdnotify import Notifier
from tests.unit.helpers import wait_for_async


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    yield str(path), sock
    sock.close()


def write_config(path: Path, tmp: Path, name: str, metrics_port: int, master_port: int,
                 **extra: object) -> None:
    keys: dict[str, object] = {
        "name": f'"{name}"', "master_url": f'"http://127.0.0.1:{master_port}"',
        "state_dir": f'"{tmp / "state"}"', "cgroup_parent": f'"{name}"',
        "cgroup_mode": '"affinity"', "sample_interval_s": 0.05, "reconnect_max_s": 0.5,
        "metrics_port": metrics_port, **extra}
    lines = ["[node]", *(f"{k} = {v}" for k, v in keys.items()),
             "[gpu]", 'backend = "emulated"', "count = 2", "memory_mib = 1024"]
    path.write_text("\n".join(lines) + "\n")


async def messages(sock: socket.socket, until: str, timeout: float = 10.0) -> list[str]:
    loop = asyncio.get_running_loop()
    got: list[str] = []

    async def read() -> None:
        while not any(until in m for m in got):
            got.append((await loop.sock_recv(sock, 4096)).decode())

    await asyncio.wait_for(read(), timeout)
    return got


async def scrape(port: int) -> dict[str, list]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, []).extend(family.samples)
    return out


@pytest.fixture(autouse=True)
def keep_root_level() -> Iterator[None]:
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


async def test_node_lifecycle_ready_reload_metrics_stop(
        tmp_path: Path, unique_name: str, notify_socket: tuple[str, socket.socket],
        caplog: pytest.LogCaptureFixture) -> None:
    path, sock = notify_socket
    cfg_path = tmp_path / "node.toml"
    port, master_port = free_port(), free_port()  # nothing listens on master_port
    write_config(cfg_path, tmp_path, unique_name, port, master_port)

    def load() -> NodeConfig:
        return load_config(NodeConfig, cfg_path, "node")

    notifier = Notifier(environ={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    daemon = NodeDaemon(load(), notifier, load)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(daemon.run(stop))
    try:
        # The master is not there: the node is still ready (it retries) and says so.
        got = await messages(sock, "READY=1")
        assert got[0] == "STATUS=taking inventory"
        ready = next(m for m in got if "READY=1" in m)
        assert "retrying" in ready and "master unreachable" in ready
        got = await messages(sock, "WATCHDOG=1")

        async def sampled() -> dict[str, list] | None:
            m = await scrape(port)
            return m if m.get("trellis_gpu_utilization_ratio") else None

        m = await wait_for_async(sampled, what="a GPU sample in the node's metrics")
        util = m["trellis_gpu_utilization_ratio"]
        assert sorted(s.labels["gpu"] for s in util) == ["0", "1"]
        assert all(s.labels["node"] == unique_name and s.labels["job"] == "" and s.value == 0
                   and s.labels["uuid"].startswith("GPU-") for s in util)
        total = {s.labels["gpu"]: s.value for s in m["trellis_gpu_memory_total_bytes"]}
        assert total == {"0": 1024 * 2**20, "1": 1024 * 2**20}
        assert [s.value for s in m["trellis_jobs_running"]] == [0]
        assert [s.value for s in m["trellis_node_connected"]] == [0]
        assert m["trellis_job_cpu_cores"] == []
        # What the node enforces is exported: the contention eliminator (no throttle yet, no
        # action applied) and the CPU tuner (nothing tuned); the network partition is off in
        # this configuration, so it has no metrics at all.
        actions = {s.labels["action"]: s.value for s in m["trellis_contention_actions"]
                   if s.name.endswith("_total")}
        assert actions == {"mba": 0, "cores": 0, "restore_mba": 0, "restore_cores": 0}
        assert m["trellis_contention_mba_percent"] == []
        assert m["trellis_tuner_pinned_cores"] == [] and m["trellis_tuner_step"] == []
        assert not [name for name in m if name.startswith("trellis_net_")]

        write_config(cfg_path, tmp_path, unique_name, port, master_port, sample_interval_s=0.2,
                     allowed_users='["nobody"]', cgroup_mode='"v2"')
        with caplog.at_level(logging.INFO, "trellis.node"):
            assert daemon.reload()
        assert daemon.agent.sample_interval_s == 0.2
        assert daemon.runner.allowed_users == ("nobody",)
        assert daemon.config.cgroup_mode == "affinity"
        assert "config_reload key=sample_interval_s change=0.05→0.2" in caplog.text
        assert "config_reload key=cgroup_mode change='affinity'→'v2' not applied" in caplog.text
        got = await messages(sock, "READY=1")
        assert any(m.startswith("RELOADING=1") for m in got)

        cfg_path.write_text("[node]\nsample_interval_s = 0\n")
        with caplog.at_level(logging.INFO, "trellis.node"):
            assert not daemon.reload()
        assert "config_reload refused" in caplog.text
        assert daemon.agent.sample_interval_s == 0.2
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    got = await messages(sock, "STOPPING=1")
    assert any("0 job part(s) keep running" in m for m in got)
    with pytest.raises(aiohttp.ClientConnectionError):
        await scrape(port)
