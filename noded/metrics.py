"""The node daemon's Prometheus metrics on a small loopback listener (``metrics_port``).

GPU figures come from the agent's latest sample (taken every ``sample_interval_s`` for the
utilisation-band events anyway), so a scrape never touches NVML. Job figures come from the job
runner. Everything is read at scrape time, on the event-loop thread, into a registry of this
daemon's own.

What the node enforces (MBA throttles and core cuts of the contention eliminator, the CPU
tuner's steps and core counts, the network partition) is exported by
:mod:`noded.enforced_metrics`, registered beside this collector.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.health import Readiness, readiness_response

if TYPE_CHECKING:
    from noded.agent import NodeAgent
    from noded.jobs import JobRunner

MIB = 1024 * 1024


class NodeStateCollector(Collector):
    def __init__(self, node: str, agent: NodeAgent, runner: JobRunner,
                 gpu_uuids: dict[int, str]) -> None:
        self.node = node
        self.agent = agent
        self.runner = runner
        self.gpu_uuids = gpu_uuids

    def collect(self) -> Iterator[Metric]:
        node = self.node
        running = [p for p in self.runner.parts.values() if p.state == "running"]
        holder = {g: p.job_id for p in running for g in p.prepare.allocation.gpus}

        gpu_labels = ["node", "gpu", "uuid", "job"]
        util = GaugeMetricFamily(
            "trellis_gpu_utilization_ratio",
            "GPU utilisation from the latest sample, 0 to 1; job is the holder ('' if idle).",
            labels=gpu_labels)
        used = GaugeMetricFamily("trellis_gpu_memory_used_bytes",
                                 "GPU memory in use from the latest sample.", labels=gpu_labels)
        total = GaugeMetricFamily("trellis_gpu_memory_total_bytes", "GPU memory size.",
                                  labels=["node", "gpu", "uuid"])
        healthy = GaugeMetricFamily("trellis_gpu_healthy",
                                    "1 if the GPU is healthy, 0 if it was taken out of service.",
                                    labels=["node", "gpu", "uuid"])
        for s in self.agent.last_samples:
            uuid = self.gpu_uuids.get(s.index, "")
            gpu = str(s.index)
            job = holder.get(s.index, "")
            util.add_metric([node, gpu, uuid, job], min(100.0, s.utilization_pct) / 100.0)
            used.add_metric([node, gpu, uuid, job], s.memory_used_mib * MIB)
            total.add_metric([node, gpu, uuid], s.memory_total_mib * MIB)
            healthy.add_metric([node, gpu, uuid], 1.0 if s.healthy else 0.0)
        yield util
        yield used
        yield total
        yield healthy

        cores = GaugeMetricFamily("trellis_job_cpu_cores",
                                  "CPU cores allocated to each running job part on this node.",
                                  labels=["node", "job"])
        gpus = GaugeMetricFamily("trellis_job_gpus",
                                 "GPUs allocated to each running job part on this node.",
                                 labels=["node", "job"])
        for part in running:
            alloc = part.prepare.allocation
            cores.add_metric([node, part.job_id], len(alloc.cpus))
            gpus.add_metric([node, part.job_id], len(alloc.gpus))
        yield cores
        yield gpus
        yield _single("trellis_jobs_running", "Job parts running on this node.", node,
                      len(running))
        yield _single("trellis_node_connected",
                      "1 while this node has a session with the master, else 0.", node,
                      1.0 if self.agent.connected.is_set() else 0.0)


def _single(name: str, doc: str, node: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["node"])
    family.add_metric([node], value)
    return family


class NodeMetrics:
    def __init__(self, node: str, agent: NodeAgent, runner: JobRunner,
                 gpu_uuids: dict[int, str]) -> None:
        self.agent = agent
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(NodeStateCollector(node, agent, runner, gpu_uuids))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def node_readiness(agent: NodeAgent) -> Readiness:
    """A node takes work while it has a session with the master (its jobs keep running
    without one, but nothing new can reach it)."""
    readiness = Readiness()
    readiness.add("master", lambda: None if agent.connected.is_set()
                  else "no session with the master (dialling, with backoff)")
    return readiness


async def serve_metrics(metrics: NodeMetrics, host: str, port: int,
                        readiness: Readiness | None = None) -> web.AppRunner:
    """Start ``GET /metrics``, ``/healthz`` and ``/readyz`` on host:port; the caller cleans
    the returned runner up."""
    ready = readiness if readiness is not None else node_readiness(metrics.agent)

    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})  # answering at all is the liveness

    async def readyz(_: web.Request) -> web.Response:
        return readiness_response(ready)

    app = web.Application()
    app.router.add_get("/metrics", handle)
    app.router.add_get("/healthz", health)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
