"""What noded enforces, on its ``/metrics``: the contention eliminator's throttles, the CPU
tuner's steps and core counts, and the network partition.

A collector of :mod:`noded.metrics`' registry, read at scrape time from the live objects (the
enforcer's controller, the tuning supervisor, the partition driver); a feature the node does
not run (``contention.enabled = false``, ``tuner.enabled = false``, ``net.enabled = false``)
has no metrics, so a dashboard can tell "off" from "on and idle".

* ``trellis_contention_mba_percent{node,job}``: the MBA level of every throttled CPU job
  (100 = unthrottled), ``trellis_contention_cores{node,job}``: cores a throttled job keeps
  (only jobs whose cores were cut), ``trellis_contention_actions_total{node,action}``:
  decisions applied since noded started (``mba``, ``cores``, ``restore_mba``,
  ``restore_cores``).
* ``trellis_tuner_pinned_cores``, ``trellis_tuner_held_cores``, ``trellis_tuner_step`` and
  ``trellis_tuner_converged`` per tuned job part (its latest ``cores_changed``).
* ``trellis_net_partition_active{node,interface}`` (1 while GPU jobs are guaranteed their
  share), ``trellis_net_partition_changes_total``, ``trellis_net_partition_share{class}``
  (the configured split), ``trellis_net_class_bytes_total{class}`` (bytes each HTB class sent
  while on) and ``trellis_net_job_class{job,class}`` (how each running job is classified).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from noded.enforcer import ContentionEnforcer
    from noded.netpartition import NetPartition
    from noded.tuning import CoreTuning

ACTIONS = ("mba", "cores", "restore_mba", "restore_cores")


class EnforcementCollector(Collector):
    def __init__(self, node: str, contention: ContentionEnforcer | None,
                 tuning: CoreTuning | None, partition: NetPartition | None) -> None:
        self.node = node
        self.contention = contention
        self.tuning = tuning
        self.partition = partition

    def collect(self) -> Iterator[Metric]:
        if self.contention is not None:
            yield from self._contention(self.contention)
        if self.tuning is not None and self.tuning.config.enabled:
            yield from self._tuning(self.tuning)
        if self.partition is not None:
            yield from self._partition(self.partition)

    def _contention(self, enforcer: ContentionEnforcer) -> Iterator[Metric]:
        node = self.node
        mba = GaugeMetricFamily("trellis_contention_mba_percent",
                                "MBA level of each throttled CPU job (100 = unthrottled).",
                                labels=["node", "job"])
        cores = GaugeMetricFamily("trellis_contention_cores",
                                  "Cores a CPU job keeps after the eliminator halved them.",
                                  labels=["node", "job"])
        for job, (level, kept) in sorted(enforcer.controller.throttled().items()):
            mba.add_metric([node, job], level)
            if kept is not None:
                cores.add_metric([node, job], kept)
        actions = CounterMetricFamily("trellis_contention_actions",
                                      "Contention eliminator decisions applied, by action.",
                                      labels=["node", "action"])
        for action in ACTIONS:
            actions.add_metric([node, action], enforcer.actions.get(action, 0))
        yield mba
        yield cores
        yield actions

    def _tuning(self, tuning: CoreTuning) -> Iterator[Metric]:
        node = self.node
        labels = ["node", "job"]
        pinned = GaugeMetricFamily("trellis_tuner_pinned_cores",
                                   "Cores a tuned job part runs on now.", labels=labels)
        held = GaugeMetricFamily("trellis_tuner_held_cores",
                                 "Cores a tuned job part still holds (it may probe up to "
                                 "them).", labels=labels)
        step = GaugeMetricFamily("trellis_tuner_step",
                                 "Re-pins the CPU tuner made for a job part.", labels=labels)
        converged = GaugeMetricFamily("trellis_tuner_converged",
                                      "1 once the tuner found the part's best fit.",
                                      labels=labels)
        for job, event in sorted(tuning.last.items()):
            pinned.add_metric([node, job], len(event.pinned))
            held.add_metric([node, job], len(event.cpus))
            step.add_metric([node, job], event.step)
            converged.add_metric([node, job], 1.0 if event.converged else 0.0)
        yield pinned
        yield held
        yield step
        yield converged

    def _partition(self, part: NetPartition) -> Iterator[Metric]:
        node, iface = self.node, part.config.interface
        state = part.state
        active = GaugeMetricFamily("trellis_net_partition_active",
                                   "1 while the data NIC is partitioned between GPU and CPU "
                                   "jobs (a multi-node GPU job runs here).",
                                   labels=["node", "interface"])
        active.add_metric([node, iface], 1.0 if state.active else 0.0)
        changes = CounterMetricFamily("trellis_net_partition_changes",
                                      "Times the partition went on or off.",
                                      labels=["node", "interface"])
        changes.add_metric([node, iface], state.changes)
        share = GaugeMetricFamily("trellis_net_partition_share",
                                  "Guaranteed share of the link per class while on.",
                                  labels=["node", "interface", "class"])
        share.add_metric([node, iface, "gpu"], part.config.gpu_share)
        share.add_metric([node, iface, "cpu"], part.config.cpu_share)
        sent = CounterMetricFamily("trellis_net_class_bytes",
                                   "Bytes sent by each HTB class of the partition while on.",
                                   labels=["node", "interface", "class"])
        for cls, value in sorted(part.class_bytes().items()):
            sent.add_metric([node, iface, cls], value)
        jobs = GaugeMetricFamily("trellis_net_job_class",
                                 "1 for each job's traffic class while the partition is on.",
                                 labels=["node", "job", "class"])
        for job, cls in sorted(state.classified.items()):
            jobs.add_metric([node, job, cls], 1.0)
        yield active
        yield changes
        yield share
        yield sent
        yield jobs
