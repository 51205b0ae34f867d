"""``trellis-noded``: the node daemon.

Signals: SIGHUP reloads the configuration keys that can change at run time (see
``RELOADABLE``); SIGTERM/SIGINT stop the daemon and leave every job running under its shim (a
restarted noded re-adopts them). Under systemd (``Type=notify``) the daemon reports READY=1
once it has taken its inventory and dialled the master (connected, or retrying), STATUS= lines
with its connection state, and WATCHDOG=1 pings when the unit has a watchdog.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from noded.agent import NodeAgent
from noded.cgroups import detect_cgroups
from noded.containers.launcher import ContainerLauncher
from noded.enforced_metrics import EnforcementCollector
from noded.enforcer import ContentionEnforcer, running_jobs
from noded.fencing import EpochFence
from noded.gpu import open_backend
from noded.gpu.base import GpuBackend
from noded.gpu.emulated import EmulatedGpuConfig
from noded.gpu.healthcheck import GpuHealthCheck
from noded.gpufence import GpuFence
from noded.inventory import cpu_topology, hostname, memory_mib, nics
from noded.joblogs import LogReader
from noded.jobs import JobRunner
from noded.master_auth import master_credentials
from noded.membw import peak_bandwidth
from noded.metrics import NodeMetrics, serve_metrics
from noded.metrics_channel import MetricsChannel
from noded.mps import open_mps
from noded.netpartition import NetPartition
from noded.rdt_setup import open_node_resctrl
from noded.selffence import SelfFence
from noded.tuning import CoreTuning
from noded.usage.setup import open_usage
from shared.config import ConfigError, NodeConfig, load_config
from shared.eventloop import install_uvloop
from shared.logs import set_level, setup_logging
from shared.model import NodeInventory, RdtCapabilities
from shared.sdnotify import Notifier

log = logging.getLogger("trellis.node")

# Keys a SIGHUP applies to the running daemon; every other change needs a restart.
RELOADABLE = frozenset({"log_level", "sample_interval_s", "reconnect_max_s", "allowed_users",
                        "allow_root_jobs"})
STATUS_PERIOD_S = 1.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trellis-noded",
        description="Trellis node daemon: runs and confines the jobs the master places here.",
        epilog="Signals: SIGHUP reloads log_level, sample_interval_s, reconnect_max_s, "
               "allowed_users and allow_root_jobs; SIGTERM stops the daemon and leaves jobs "
               "running (a restarted daemon re-adopts them). Metrics: GET /metrics on "
               "metrics_host:metrics_port when metrics_port is set.",
    )
    p.add_argument("-c", "--config", help="TOML configuration file ([node] and [gpu] sections)")
    p.add_argument("--name", help="node name (overrides the config; default: short hostname)")
    p.add_argument("--master-url", help="master URL, e.g. http://10.0.0.1:7400; several "
                                        "masters (one leads) comma-separated")
    p.add_argument("--state-dir", help="directory for job state (overrides the config)")
    p.add_argument("--cgroup-parent", help="cgroup parent group name (overrides the config)")
    p.add_argument("--cgroup-mode", help="auto, v1, v2 or affinity")
    p.add_argument("--log-level", help="debug, info, warning or error")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def default_name(config_path: str | None) -> str | None:
    """The short hostname, unless the configuration file names the node."""
    if config_path:
        try:
            with open(config_path, "rb") as f:
                section = tomllib.load(f).get("node")
        except (OSError, tomllib.TOMLDecodeError):
            return None  # load_config reports the problem with the file
        if isinstance(section, dict) and "name" in section:
            return None
    return os.uname().nodename.split(".")[0]


def load_node_config(config_path: str | None, args: argparse.Namespace) -> NodeConfig:
    return load_config(
        NodeConfig, config_path, "node",
        name=args.name or default_name(config_path),
        master_url=args.master_url, state_dir=args.state_dir,
        cgroup_parent=args.cgroup_parent, cgroup_mode=args.cgroup_mode,
        log_level=args.log_level,
    )


def config_changes(old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    return [
        (f.name, getattr(old, f.name), getattr(new, f.name))
        for f in dataclasses.fields(old)
        if getattr(old, f.name) != getattr(new, f.name)
    ]


class NodeField(logging.Filter):
    """Puts ``node=NAME`` on every line of this daemon that does not name a node already, so
    lines gathered from many servers say where they come from."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.prefix = f"node={node} "

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "node=" not in record.msg:
            record.msg = self.prefix + record.msg
        return True


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
        busy_memory_mib=gpu.busy_memory_mib,
        rate_window_s=gpu.rate_window_s,
        min_rate_interval_s=gpu.min_rate_interval_s,
        # In the state directory, not a private temporary one: a job re-adopted after a
        # restart keeps its progress channel, and a daemon killed with -9 leaves nothing in /tmp.
        progress_dir=str(Path(config.state_dir) / "gpu-progress"),
        # Emulated Xids for tests and the demo (noded.gpu.emulated.write_fault).
        fault_dir=str(Path(config.state_dir) / "gpu-faults"),
        # Character devices 195:N standing in for /dev/nvidia* (root only; the device fence's
        # proof on machines without GPUs).
        dev_dir=gpu.dev_dir or str(Path(config.state_dir) / "gpu-dev"),
    )
    return open_backend(gpu.backend, emulated)


class NodeDaemon:
    def __init__(self, config: NodeConfig, notifier: Notifier | None = None,
                 load: Any = None) -> None:
        self.config = config
        self.notifier = notifier or Notifier(environ={})
        self._load = load  # () -> NodeConfig, re-reads the configuration on SIGHUP
        self.notifier.status("taking inventory")
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
            log_max_bytes=int(config.jobs.log_max_mb * (1 << 20)),
            slurm_env=config.jobs.slurm_env,
        )
        # Hard GPU isolation: each job's group refuses the GPUs it was not given.
        self.runner.gpu_fence = GpuFence(config.gpu.fence, self.cgroups, self.gpus)
        # Jobs' output for the master's read_log, and its removal after log_retention_h.
        self.logs = LogReader(self.runner, config.jobs.log_retention_h * 3600)
        headers, ssl_context = master_credentials(config)
        self.agent = NodeAgent(config.master_url, self.inventory, self.runner, self.gpus,
                               config.sample_interval_s, config.reconnect_max_s,
                               headers=headers, ssl_context=ssl_context,
                               heartbeat_only_s=config.heartbeat_only_s, logs=self.logs,
                               fence=EpochFence(state),
                               connect_timeout_s=config.master_connect_timeout_s,
                               heartbeat_s=config.master_heartbeat_s,
                               # The node lease: parts the master would requeue are stopped
                               # here once no master was heard for too long.
                               lease=SelfFence(config.name, self.runner, state))
        # What jobs really use and when they enter their post phase (Liquid §4, §6.1).
        self.usage = open_usage(config, self.runner, self.gpus, self.agent)
        # Jobs that run in their own image (launch.image): podman + runc, noded/containers.
        # After the usage collector: its last reading of a part comes before the container's
        # groups are removed (cleanup hooks run in order).
        self.containers = ContainerLauncher(self.runner, config.containers, state)
        self.usage.group_finders.append(self.containers.usage_groups)
        self.mps = open_mps(config.mps, self.gpus.name, state, self.gpus.inventory()[0])
        if self.mps is not None:
            mps = self.mps
            self.runner.env_providers.append(lambda job, uid: mps.job_env(self.runner, job))
        self.tuning = CoreTuning(
            self.runner, self.gpus, self.cgroups, config.tuner, self.agent.send_event,
            numa_of={c.id: c.numa_node for c in self.cpus}, connected=self.agent.connected,
        )
        # What jobs report on TRELLIS_METRICS_FILE, relayed to the master as job_metric events.
        self.metrics_channel = MetricsChannel(state / "metrics", self.agent.send_event,
                                              self.runner.is_running,
                                              config.job_metrics_interval_s)
        self.runner.env_providers.append(self.metrics_channel.job_env)
        self.agent.preempted_note = self.metrics_channel.note_preempted
        # [gpu] health_check: GPUs out of service return when the operator's check passes.
        self.health_check: GpuHealthCheck | None = None
        if config.gpu.health_check:
            self.health_check = GpuHealthCheck(
                config.gpu.health_check, config.gpu.health_check_s,
                config.gpu.health_check_timeout_s, self.gpus, self.agent.unhealthy_gpus)
        gpus, _ = self.gpus.inventory()
        self.metrics = NodeMetrics(config.name, self.agent, self.runner,
                                   {g.index: g.uuid for g in gpus})
        self.resctrl = open_node_resctrl(config.rdt, state)
        self.contention: ContentionEnforcer | None = None
        if config.contention.enabled:
            workers = len(self.cpus) or 1
            self.contention = ContentionEnforcer(
                config.contention, self.cgroups, self.resctrl,
                lambda: running_jobs(self.runner), lambda: self.agent.last_samples,
                self.agent.send_event,
                measure_peak=lambda: peak_bandwidth(state, workers),
            )
        # SODA's network partition (§V-E), when [net] switches it on.
        self.partition: NetPartition | None = None
        if config.net.enabled:
            self.partition = NetPartition(config.net, self.runner, self.cgroups,
                                          self.agent.send_event)
        self.metrics.registry.register(EnforcementCollector(
            config.name, self.contention, self.tuning, self.partition))
        log.info("node=%s cgroups=%s gpus=%s gpu_count=%d cpus=%d rdt=%s contention=%s",
                 config.name, self.cgroups.kind, self.gpus.name, len(gpus), len(self.cpus),
                 "none" if self.resctrl is None else self.resctrl.root,
                 config.contention.enabled)

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
            rdt=(self.resctrl.capabilities.to_model() if self.resctrl is not None
                 else RdtCapabilities()),
            rack=self.config.rack,
            domain=self.config.domain,
            features=self.config.features,
        )

    def running_parts(self) -> int:
        return sum(1 for p in self.runner.parts.values() if p.state == "running")

    def describe(self) -> str:
        if self.agent.connected.is_set():
            return f"connected to {self.config.master_url}: jobs_running={self.running_parts()}"
        why = f" ({self.agent.last_error})" if self.agent.last_error else ""
        return (f"dialling {self.config.master_url}, retrying{why}: "
                f"jobs_running={self.running_parts()}")

    async def _report_status(self) -> None:
        while True:
            self.notifier.status(self.describe())
            await asyncio.sleep(STATUS_PERIOD_S)

    def reload(self) -> bool:
        """Re-read the configuration; apply what can change at run time. An unreadable or
        invalid file is refused as a whole and the running configuration kept."""
        self.notifier.reloading()
        try:
            new = self._load() if self._load is not None else self.config
        except ValueError as exc:  # ConfigError, or a check in the config's own code
            log.error("config_reload refused reason=%r; keeping the running configuration",
                      str(exc))
            self.notifier.ready(self.describe())
            return False
        applied: dict[str, Any] = {}
        changes = config_changes(self.config, new)
        for key, old, value in changes:
            if key in RELOADABLE:
                applied[key] = value
                log.info("config_reload key=%s change=%r→%r", key, old, value)
            else:
                log.warning("config_reload key=%s change=%r→%r not applied: needs a restart",
                            key, old, value)
        if not changes:
            log.info("config_reload unchanged")
        if applied:
            self.config = c = replace(self.config, **applied)
            set_level(c.log_level)
            self.agent.sample_interval_s = c.sample_interval_s
            self.agent.reconnect_max_s = c.reconnect_max_s
            self.runner.allowed_users = c.allowed_users
            self.runner.allow_root_jobs = c.allow_root_jobs
        self.notifier.ready(self.describe())
        return True

    async def run(self, stop: asyncio.Event) -> None:
        self.runner.adopt()
        self.metrics_channel.adopt()
        loop = asyncio.get_running_loop()
        metrics: web.AppRunner | None = None
        background: list[asyncio.Task[None]] = []
        agent = loop.create_task(self.agent.run(stop))
        enforcer = (loop.create_task(self.contention.run(stop))
                    if self.contention is not None else None)
        tuning = loop.create_task(self.tuning.run(stop))
        # Removes the partition and restores the NIC's qdisc once stop is set.
        net = (loop.create_task(self.partition.run(stop))
               if self.partition is not None else None)
        channel = loop.create_task(self.metrics_channel.run(stop))
        usage = loop.create_task(self.usage.run(stop))
        sweeps = loop.create_task(self.logs.run_sweeps(stop))
        checks = (loop.create_task(self.health_check.run(stop))
                  if self.health_check is not None else None)
        try:
            if self.config.metrics_port:
                metrics = await serve_metrics(self.metrics, self.config.metrics_host,
                                              self.config.metrics_port)
                log.info("metrics host=%s port=%d", self.config.metrics_host,
                         self.config.metrics_port)
            self.notifier.status(f"dialling {self.config.master_url}")
            dialled = loop.create_task(self.agent.dialled.wait())
            await asyncio.wait({agent, dialled}, return_when=asyncio.FIRST_COMPLETED)
            dialled.cancel()
            self.notifier.ready(self.describe())
            background = [loop.create_task(self.notifier.watchdog_loop()),
                          loop.create_task(self._report_status())]
            await agent
        finally:
            stop.set()  # the agent closes its session and returns by itself
            tuning.cancel()
            channel.cancel()
            usage.cancel()
            sweeps.cancel()
            if checks is not None:
                checks.cancel()
            for task in background:
                task.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.gather(*background, agent, tuning, channel,
                                                      usage, sweeps, return_exceptions=True),
                                       5.0)
            self.usage.close()
            if self.mps is not None and self.running_parts() == 0:
                self.mps.close()
            if net is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(net, 10.0)
            if enforcer is not None:
                enforcer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await enforcer
            left = self.running_parts()
            self.notifier.stopping(f"stopping; {left} job part(s) keep running")
            if metrics is not None:
                await metrics.cleanup()
            await self.runner.shutdown()
            self.gpus.close()
            for part in sorted(self.runner.parts.values(), key=lambda p: p.job_id):
                if part.state == "running":
                    log.info("job=%s keeps running shim_pid=%s", part.job_id, part.shim_pid)
            log.info("node=%s stopped; jobs keep running under their shims count=%d",
                     self.config.name, left)
            self.notifier.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config_path = str(Path(args.config).resolve()) if args.config else None
    try:
        config = load_node_config(config_path, args)
        setup_logging(config.log_level)
    except (ConfigError, ValueError) as exc:
        print(f"trellis-noded: {exc}", file=sys.stderr)
        return 2
    for handler in logging.getLogger().handlers:
        handler.addFilter(NodeField(config.name))
    install_uvloop()
    notifier = Notifier()

    async def run() -> None:
        daemon = NodeDaemon(config, notifier, lambda: load_node_config(config_path, args))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_stop(sig: signal.Signals) -> None:
            log.info("signal=%s: stopping; jobs keep running", sig.name)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, daemon.reload)
        await daemon.run(stop)

    try:
        asyncio.run(run())
    except (OSError, ValueError, RuntimeError) as exc:
        log.error("cannot run: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
