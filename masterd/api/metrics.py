"""The master's Prometheus metrics, served at ``GET /metrics`` on its HTTP port.

Counters and histograms are updated as things happen (scheduling passes, RPCs, preemptions);
everything that is a state of the cluster (jobs per state, queue, nodes) is read from the
master when Prometheus scrapes, so the numbers are exact and cost nothing between scrapes.
Each master has its own :class:`CollectorRegistry`: no process-global metric state.

Collection runs on the event-loop thread (the master's state is only consistent there).
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from masterd.api.accountmetrics import AccountCollector
from masterd.core.policy import Preempt, Start
from shared.model import Job, JobKind, JobState

if TYPE_CHECKING:
    from masterd.service.leader import Leadership
    from masterd.service.master import Master

NODE_STATUSES = ("ready", "drained", "maintenance", "reserved", "disconnected", "unreachable",
                 "down", "powering_down", "powered_down", "powering_up")
PENDING_QUEUES = ("active", "requeued")
ARRAY_FAMILIES = ("cpu", "small", "large")
ATTEMPT_RESULTS = ("scheduled", "unschedulable")

# A pass over an idle cluster is tens of microseconds; one over thousands of queued jobs with
# packing policies can reach a second.
PASS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5, 1.0, 2.5)
# From submission to the decision to start: seconds on an idle cluster, hours on a full one.
JOB_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                       900.0, 3600.0, 14400.0, 86400.0)
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class MasterStateCollector(Collector):
    """Reads the master's state at scrape time."""

    def __init__(self, master: Master, version: str, clock: Callable[[], float]) -> None:
        self.master = master
        self.version = version
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        master = self.master
        core = master.core
        info = InfoMetricFamily("trellis_master_build", "Version and policy of this master.")
        info.add_metric([], {"version": self.version, "policy": core.policy.name})
        yield info

        counts: dict[tuple[str, str], int] = {
            (s.value, k.value): 0 for s in JobState for k in JobKind
        }
        for job in core.jobs.values():
            key = (job.state.value, job.spec.kind.value)
            counts[key] = counts.get(key, 0) + 1
        jobs = GaugeMetricFamily("trellis_jobs", "Jobs known to the master, by state and kind.",
                                 labels=["state", "kind"])
        for (state, kind), n in sorted(counts.items()):
            jobs.add_metric([state, kind], n)
        yield jobs

        queue = core.queue()
        yield GaugeMetricFamily("trellis_queue_length", "Jobs waiting to be placed.",
                                value=len(queue))
        head_wait = max(0.0, self.clock() - queue[0].submit_time) if len(queue) else 0.0
        yield GaugeMetricFamily(
            "trellis_queue_head_wait_seconds",
            "How long the job at the head of the queue has waited (0 when the queue is empty).",
            value=head_wait)
        yield from pending_jobs(queue, self.clock())

        status = GaugeMetricFamily(
            "trellis_node_status",
            "Connection state of each node: 1 for its current status, 0 for the others.",
            labels=["node", "status"])
        gpus = GaugeMetricFamily("trellis_node_gpus", "GPUs a node has.", labels=["node"])
        gpus_used = GaugeMetricFamily("trellis_node_gpus_allocated",
                                      "GPUs of a node allocated to jobs.", labels=["node"])
        cores = GaugeMetricFamily("trellis_node_cpu_cores", "CPU cores a node offers to jobs.",
                                  labels=["node"])
        cores_used = GaugeMetricFamily("trellis_node_cpu_cores_allocated",
                                       "CPU cores of a node allocated to jobs.", labels=["node"])
        for view in core.cluster.views():
            current = master.node_status(view.name)
            for s in NODE_STATUSES:
                status.add_metric([view.name, s], 1.0 if s == current else 0.0)
            total_gpus = len(view.inventory.gpus)
            gpus.add_metric([view.name], total_gpus)
            gpus_used.add_metric([view.name], total_gpus - len(view.free_gpus))
            total_cores = len(view.inventory.cpus)
            cores.add_metric([view.name], total_cores)
            cores_used.add_metric([view.name], total_cores - len(view.free_cpus))
        yield status
        yield gpus
        yield gpus_used
        yield cores
        yield cores_used
        yield GaugeMetricFamily("trellis_nodes_connected", "Nodes with a live session.",
                                value=len(master.sessions))
        # Reservations and maintenance windows not over yet, planned or begun.
        now = self.clock()
        for name, help_, starts in (
                ("trellis_reservations", "Reservations not over yet, by state.",
                 [r.start for r in master.features.reservations.reservations.values()]),
                ("trellis_maintenance_windows", "Maintenance windows not over yet, by state.",
                 [w.start for w in master.features.maintenance.windows.values()])):
            family = GaugeMetricFamily(name, help_, labels=["state"])
            family.add_metric(["planned"], sum(1 for s in starts if s > now))
            family.add_metric(["active"], sum(1 for s in starts if s <= now))
            yield family
        power = master.features.power
        if power.enabled:  # Helios' Cluster Energy Saving
            yield GaugeMetricFamily("trellis_nodes_powered_down",
                                    "Nodes powered down by Cluster Energy Saving.",
                                    value=power.counts()["powered_down"])
            yield CounterMetricFamily("trellis_power_wakeups",
                                      "Times Cluster Energy Saving woke nodes.",
                                      value=power.wakeups)
            yield CounterMetricFamily("trellis_power_nodes_woken",
                                      "Nodes Cluster Energy Saving woke.", value=power.nodes_woken)
            yield CounterMetricFamily("trellis_power_node_hours_saved",
                                      "Node-hours spent powered down.",
                                      value=power.node_seconds_saved / 3600.0)

        journal = master.journal
        yield CounterMetricFamily(
            "trellis_journal_transactions",
            "SQLite transactions the journal writer committed (group commit: several "
            "submissions and state changes share one).", value=journal.commits)
        yield CounterMetricFamily(
            "trellis_journal_writer_restarts",
            "Journal writer processes started because the previous one died.",
            value=journal.writer_restarts)
        yield CounterMetricFamily(
            "trellis_journal_write_errors",
            "Journal operations the store failed (disk full, read-only, the writer gone): "
            "what they recorded was refused with store_unavailable or may be lost.",
            value=journal.write_errors)
        yield GaugeMetricFamily(
            "trellis_journal_in_flight",
            "Journal operations waiting for the writer's answer (a growing number means the "
            "disk is not keeping up).", value=journal.in_flight)


def pending_jobs(queue: Sequence[Job], now: float) -> Iterator[Metric]:
    """kube-scheduler's scheduler_pending_pods, for jobs: the queue by ``queue`` (``active``:
    never placed yet; ``requeued``: back after a preemption or a failed start) and by SODA
    ``array`` family (``cpu``, ``small``, ``large``), and the oldest waiting job's wait."""
    counts = {(q, a): 0 for q in PENDING_QUEUES for a in ARRAY_FAMILIES}
    oldest: float | None = None
    for job in queue:
        key = ("requeued" if job.attempts else "active", job.spec.array_kind)
        counts[key] = counts.get(key, 0) + 1
        if oldest is None or job.submit_time < oldest:
            oldest = job.submit_time
    family = GaugeMetricFamily(
        "trellis_scheduler_pending_jobs",
        "Jobs waiting to be placed, by queue (active: never placed; requeued: preempted or "
        "failed to start) and array family (cpu, small, large).", labels=["queue", "array"])
    for (queue_name, array), n in sorted(counts.items()):
        family.add_metric([queue_name, array], n)
    yield family
    yield GaugeMetricFamily(
        "trellis_scheduler_oldest_pending_job_seconds",
        "How long the longest-waiting queued job has waited (0 when none waits).",
        value=max(0.0, now - oldest) if oldest is not None else 0.0)


class FailureCollector(Collector):
    """Node loss and GPU faults (masterd.features.nodeloss, masterd.features.gpufaults):
    GPUs out of service per node, read at scrape time, and what failures did to jobs."""

    def __init__(self, master: Master) -> None:
        self.master = master

    def collect(self) -> Iterator[Metric]:
        master = self.master
        loss, faults = master.features.nodeloss, master.features.gpufaults
        leases = master.features.leases
        out = GaugeMetricFamily(
            "trellis_node_gpus_out_of_service",
            "GPUs of a node out of service (a fault its node reported: an Xid, a lost "
            "device), until trellisctl gpu reset or the node's health check returns them.",
            labels=["node"])
        for view in master.core.cluster.views():
            out.add_metric([view.name], sum(1 for g in view.inventory.gpus if not g.healthy))
        yield out
        kinds = CounterMetricFamily("trellis_gpu_faults",
                                    "GPU faults nodes reported, by kind: fatal (the jobs on "
                                    "the GPU were stopped) or other.", labels=["kind"])
        kinds.add_metric(["fatal"], faults.fatal_faults)
        kinds.add_metric(["other"], faults.other_faults)
        yield kinds
        yield CounterMetricFamily("trellis_nodes_lost",
                                  "Nodes declared down after node_lost_s of silence.",
                                  value=loss.nodes_lost)
        yield CounterMetricFamily(
            "trellis_parts_fenced", "Job parts their nodes reported stopping on their own, cut "
            "off from every master for longer than the node lease.", value=leases.fenced)
        requeued = CounterMetricFamily(
            "trellis_jobs_requeued", "Jobs requeued after a failure, by cause (node_lost: "
            "their node was lost; gpu_failure: a GPU they used had a fatal fault; "
            "node_fenced: their node stopped them, cut off from every master, before the "
            "master declared it lost).", labels=["cause"])
        requeued.add_metric(["node_lost"], loss.requeued)
        requeued.add_metric(["gpu_failure"], faults.requeued)
        requeued.add_metric(["node_fenced"], leases.requeued)
        yield requeued
        ended = CounterMetricFamily(
            "trellis_jobs_lost", "Jobs ended node_lost (not requeued: --no-requeue, "
            "requeue_default = false, or max_requeues reached), by cause.", labels=["cause"])
        ended.add_metric(["node_lost"], loss.ended)
        ended.add_metric(["gpu_failure"], faults.ended)
        ended.add_metric(["node_fenced"], leases.ended)
        yield ended


class LeadershipCollector(Collector):
    """Leader election among masters sharing a PostgreSQL journal (one master on SQLite
    always leads, its epoch counting its starts); served by the leader and by standbys alike."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def collect(self) -> Iterator[Metric]:
        state = self.leadership
        yield GaugeMetricFamily("trellis_master_leader",
                                "1 while this master leads, 0 while it stands by.",
                                value=1.0 if state.leader else 0.0)
        yield GaugeMetricFamily(
            "trellis_master_epoch", "The leadership epoch this master leads with (a standby: "
            "the leader's, as last read); it grows by one at every takeover (SQLite: at every "
            "start).",
            value=state.epoch)
        yield CounterMetricFamily("trellis_master_takeovers",
                                  "Times this master process took the leadership.",
                                  value=state.takeovers)


@dataclass
class _Series:
    counts: list[int]  # per bucket, +Inf last
    total: float = 0.0


class LoopHistogram(Collector):
    """A histogram (with at most one label) observed on the event loop alone.

    Observed per RPC and per scheduling pass: the client library's histogram takes a lock
    and walks its buckets in Python on every observation (0.7 us); this one is a bisect and
    two list updates (0.15 us). It needs no lock because the loop thread is the only one
    that observes and, at scrape time, reads it.
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 label: str | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(sorted(buckets))
        self.label = label
        self._series: dict[str, _Series] = {}  # by label value ("" without a label)

    def declare(self, label_value: str = "") -> None:
        """Export the series (all zeros) before its first observation, so that queries and
        dashboards find it from the start."""
        if label_value not in self._series:
            self._series[label_value] = _Series([0] * (len(self.bounds) + 1))

    def observe(self, value: float, label_value: str = "") -> None:
        series = self._series.get(label_value)
        if series is None:
            series = self._series[label_value] = _Series([0] * (len(self.bounds) + 1))
        series.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        series.total += value

    def collect(self) -> Iterator[Metric]:
        labels = [self.label] if self.label else []
        family = HistogramMetricFamily(self.name, self.documentation, labels=labels)
        names = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for label_value, series in self._series.items():
            cumulative = list(itertools.accumulate(series.counts))
            family.add_metric([label_value] if self.label else [],
                              list(zip(names, cumulative, strict=True)), series.total)
        yield family


class MasterMetrics:
    def __init__(self, master: Master, version: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.passes = LoopHistogram(
            "trellis_scheduling_pass_duration_seconds",
            "Wall time of one scheduling pass (the policy's decide plus applying decisions).",
            PASS_BUCKETS)
        self.rpc = LoopHistogram(
            "trellis_rpc_duration_seconds", "Time to serve one admin/client RPC, by method.",
            RPC_BUCKETS, label="method")
        self.registry.register(self.passes)
        self.registry.register(self.rpc)
        self.rpc_errors = Counter(
            "trellis_rpc_errors", "RPCs answered with an error, by method and error code.",
            ["method", "code"], registry=self.registry)
        self.preemptions = Counter(
            "trellis_preemptions", "Jobs the scheduler decided to preempt.",
            registry=self.registry)
        self.placements = Counter(
            "trellis_placements", "Jobs the scheduler decided to start.",
            registry=self.registry)
        self.registry.register(MasterStateCollector(master, version, clock))
        self.registry.register(LeadershipCollector(master.leadership))
        self.registry.register(FailureCollector(master))
        self.registry.register(AccountCollector(master))  # per account (fair share)
        self._scheduler_metrics(master, clock)

    def _scheduler_metrics(self, master: Master, clock: Callable[[], float]) -> None:
        """The scheduler's series under kube-scheduler's names (scheduler_schedule_attempts_
        total, scheduler_scheduling_attempt_duration_seconds, scheduler_pod_scheduling_sli_
        duration_seconds, scheduler_preemption_attempts_total / _victims), for jobs."""
        self.master = master
        self.clock = clock
        self.attempts = Counter(
            "trellis_scheduler_schedule_attempts",
            "Jobs each scheduling pass considered, by result: scheduled (a start was "
            "decided) or unschedulable (left waiting).", ["result"], registry=self.registry)
        for result in ATTEMPT_RESULTS:
            self.attempts.labels(result)
        self.attempt_duration = LoopHistogram(
            "trellis_scheduler_scheduling_attempt_duration_seconds",
            "Wall time of one scheduling pass, by result (scheduled: it started a job).",
            PASS_BUCKETS, label="result")
        self.job_latency = LoopHistogram(
            "trellis_scheduler_job_scheduling_sli_duration_seconds",
            "From a job's submission to the pass that decided to start it (a re-queued job: "
            "to its latest start).", JOB_LATENCY_BUCKETS)
        for result in ATTEMPT_RESULTS:
            self.attempt_duration.declare(result)
        self.passes.declare()
        self.job_latency.declare()
        self.registry.register(self.attempt_duration)
        self.registry.register(self.job_latency)
        self.preemption_attempts = Counter(
            "trellis_scheduler_preemption_attempts",
            "Scheduling passes that decided at least one preemption.", registry=self.registry)
        self.preemption_victims = Counter(
            "trellis_scheduler_preemption_victims",
            "Jobs preempted (stopped and re-queued at the head of their array).",
            registry=self.registry)

    def observe_pass(self, seconds: float, decisions: Sequence[Any]) -> None:
        self.passes.observe(seconds)
        started = preempted = 0
        now = self.clock()
        jobs = self.master.core.jobs
        for decision in decisions:
            if isinstance(decision, Preempt):
                self.preemptions.inc()
                preempted += 1
            elif isinstance(decision, Start):
                self.placements.inc()
                started += 1
                job = jobs.get(decision.job_id)
                if job is not None:
                    self.job_latency.observe(max(0.0, now - job.submit_time))
        waiting = len(self.master.core.queue())
        if started:
            self.attempts.labels("scheduled").inc(started)
        if waiting:
            self.attempts.labels("unschedulable").inc(waiting)
        self.attempt_duration.observe(seconds, "scheduled" if started else "unschedulable")
        if preempted:
            self.preemption_attempts.inc()
            self.preemption_victims.inc(preempted)

    def observe_rpc(self, method: str, seconds: float, error_code: str | None = None) -> None:
        self.rpc.observe(seconds, method)
        if error_code is not None:
            self.rpc_errors.labels(method, error_code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
