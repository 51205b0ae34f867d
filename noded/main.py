"""``trellis-noded``: the node daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from noded.agent import NodeAgent
from noded.cgroups import detect_cgroups
from noded.gpu import open_backend
from noded.gpu.base import GpuBackend
from noded.gpu.emulated import EmulatedGpuConfig
from noded.inventory import cpu_topology, hostname, memory_mib, nics
from noded.jobs import JobRunner
from noded.master_auth import master_credentials
from shared.config import ConfigError, NodeConfig, load_config
from shared.logs import setup_logging
from shared.model import NodeInventory

log = logging.getLogger("trellis.node")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="trellis-noded",
        description="Trellis node daemon: runs and confines the jobs the master places here.",
    )
    p.add_argument("-c", "--config", help="TOML configuration file ([node] and [gpu] sections)")
    p.add_argument("--name", help="node name (overrides the config)")
    p.add_argument("--master-url", help="master URL, e.g. http://10.0.0.1:7400")
    p.add_argument("--state-dir", help="directory for job state (overrides the config)")
    p.add_argument("--cgroup-parent", help="cgroup parent group name (overrides the config)")
    p.add_argument("--cgroup-mode", help="auto, v1, v2 or affinity")
    p.add_argument("--log-level", help="debug, info, warning or error")
    return p.parse_args(argv)


def make_gpu_backend(config: NodeConfig) -> GpuBackend:
    gpu = config.gpu
    emulated = EmulatedGpuConfig(
        count=gpu.count,
        model=gpu.model,
        memory_mib=gpu.memory_mib,
        gpus_per_switch=gpu.gpus_per_switch,
        numa_nodes=gpu.numa_nodes,
        uuid_seed=config.name,
        busy_util=gpu.busy_util,
    )
    return open_backend(gpu.backend, emulated)


class NodeDaemon:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        state = Path(config.state_dir)
        state.mkdir(parents=True, exist_ok=True)
        self.cpus = cpu_topology(config.cpus)
        self.gpus = make_gpu_backend(config)
        mode = None if config.cgroup_mode == "auto" else config.cgroup_mode
        self.cgroups = detect_cgroups(config.cgroup_parent, prefer=mode,
                                      state_dir=state / "cgroups")
        self.runner = JobRunner(
            config.name, state, self.cgroups, self.gpus,
            allow_root_jobs=config.allow_root_jobs, allowed_users=config.allowed_users,
            numa_of={c.id: c.numa_node for c in self.cpus},
        )
        headers, ssl_context = master_credentials(config)
        self.agent = NodeAgent(config.master_url, self.inventory, self.runner, self.gpus,
                               config.sample_interval_s, config.reconnect_max_s,
                               headers=headers, ssl_context=ssl_context)
        log.info("node=%s cgroups=%s gpus=%s cpus=%d", config.name, self.cgroups.kind,
                 self.gpus.name, len(self.cpus))

    def inventory(self) -> NodeInventory:
        gpus, links = self.gpus.inventory()
        unhealthy = self.agent.unhealthy_gpus() if hasattr(self, "agent") else {}
        gpus = tuple(replace(g, healthy=False) if g.index in unhealthy else g for g in gpus)
        return NodeInventory(
            name=self.config.name,
            hostname=hostname()[:255],
            address=self.config.address,
            gpus=gpus,
            cpus=self.cpus,
            memory_mib=memory_mib(),
            nics=nics(),
            gpu_links=links,
        )

    async def run(self, stop: asyncio.Event) -> None:
        self.runner.adopt()
        try:
            await self.agent.run(stop)
        finally:
            await self.runner.shutdown()
            self.gpus.close()
            log.info("node=%s stopped; %d job part(s) keep running", self.config.name,
                     sum(1 for p in self.runner.parts.values() if p.state == "running"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(
            NodeConfig, args.config, "node",
            name=args.name or (None if args.config else os.uname().nodename.split(".")[0]),
            master_url=args.master_url, state_dir=args.state_dir,
            cgroup_parent=args.cgroup_parent, cgroup_mode=args.cgroup_mode,
            log_level=args.log_level,
        )
        setup_logging(config.log_level)
    except (ConfigError, ValueError) as exc:
        print(f"trellis-noded: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass

    async def run() -> None:
        daemon = NodeDaemon(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await daemon.run(stop)

    try:
        asyncio.run(run())
    except (OSError, ValueError, RuntimeError) as exc:
        log.error("cannot run: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
