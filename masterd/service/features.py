"""The one place that names the master's features: builds each around the feature context,
in the order their subscriptions must run, and the policy that reads their state.

Adding a feature is a module under ``masterd.features``, a line here and a field of
:class:`Features` (which the API reads to serve the feature's RPC methods).
"""

from __future__ import annotations

from dataclasses import dataclass

from masterd.core.fairorder import FairShareOrdering
from masterd.core.policy import Policy
from masterd.core.profiling import ProfilingPolicy
from masterd.features.accounts import Accounts
from masterd.features.adaptive import AdaptiveCpus
from masterd.features.arrays.pools import ArrayPools
from masterd.features.containers import Containers
from masterd.features.dependencies import Dependencies
from masterd.features.fairshare import FairShareFeature
from masterd.features.fencing import Fencing
from masterd.features.genie.models import ModelStore, build_policy
from masterd.features.genie.profiler import Profiler
from masterd.features.gpufaults import GpuFaults
from masterd.features.helios.estimator import DurationEstimator
from masterd.features.helios.power import PowerManager
from masterd.features.holds import JobControls
from masterd.features.inference import InferenceService
from masterd.features.liquid.feature import LiquidResources
from masterd.features.logs import JobLogs
from masterd.features.maintenance import Maintenance
from masterd.features.netpartition import NetPartitions
from masterd.features.nodeloss import NodeLoss
from masterd.features.partitions import Partitions
from masterd.features.priorityclasses import PriorityClasses
from masterd.features.relays import Relays
from masterd.features.reservations import Reservations
from masterd.features.selffence import NodeLeases
from masterd.features.timelimits import TimeLimits
from masterd.runtime.context import FeatureContext
from shared.config import MasterConfig


@dataclass(frozen=True)
class Features:
    models: ModelStore  # GENIE's model database, journalled
    profiler: Profiler  # GENIE's lightweight profiler
    adaptive: AdaptiveCpus  # SODA's adaptive CPU allocator (the master's half)
    inference: InferenceService  # SODA's hardware-aware inference placer
    arrays: ArrayPools  # SODA's multi-array pools: view and re-sizing
    net_partitions: NetPartitions  # SODA's network partition, as the nodes report it
    liquid: LiquidResources  # Liquid's usage journal, resource model and post phases
    estimator: DurationEstimator  # Helios' QSSF duration estimates (qssf policy)
    power: PowerManager  # Helios' Cluster Energy Saving ([master.power])
    logs: JobLogs  # jobs' output, relayed from their nodes (trellisctl logs)
    # Partitions: node sets with their own limits and accounts; before the time limits, so
    # a partition's default time is the one a job gets.
    partitions: Partitions
    # Priority classes: the queue's order and who may preempt whom.
    priority_classes: PriorityClasses
    # Maintenance windows: no job starts where its limit would cross one.
    maintenance: Maintenance
    reservations: Reservations
    timelimits: TimeLimits  # time limits: default, maximum, warning signal, timeout
    # Job dependencies (--after), then holds, updates and QoS permissions: in this order, so
    # a restore resolves dependencies before holds close their gates.
    dependencies: Dependencies
    controls: JobControls
    # Failures: nodes silent for node_lost_s are down and their jobs requeued or ended;
    # GPUs with faults held out of service (fatal ones stop their jobs) until returned.
    nodeloss: NodeLoss
    gpufaults: GpuFaults
    # Fencing to the node: stale epochs and incarnations, a node returning different.
    fencing: Fencing
    # The node lease: a node cut off from every master stops the parts the master would
    # requeue elsewhere, before the master does.
    leases: NodeLeases
    # Image jobs: the reference and mounts checked at submission (noded runs them).
    containers: Containers
    # Jobs' terminals and ports, relayed between clients and nodes (trellisctl run --pty,
    # port-forward).
    relays: Relays
    # Fair share with a memory (usage from the journal, factors, ordering) and accounting.
    fairshare: FairShareFeature
    # Accounts, caps and quota admission (docs/governance.md); last, so its restore sees
    # every gate the others closed.
    accounts: Accounts


def assemble(ctx: FeatureContext, config: MasterConfig) -> tuple[Features, Policy]:
    """Build the features and the policy the core runs.

    Order matters where two features hear the same event: on ``restored`` the inference
    service cancels stale replicas before the profiler settles its runs; on
    ``job_transition`` the profiler records a run's end before anything else.
    """
    models = ModelStore.for_config(ctx, config.policy, config.policy_options)
    adaptive = AdaptiveCpus(ctx, config.adaptive_cpus, config.adaptive_max_cores_per_gpu)
    inference = InferenceService(ctx, config.inference)
    profiler = Profiler(ctx, models)
    arrays = ArrayPools(ctx)
    fairshare = FairShareFeature(ctx)
    # Every predicting part of the policy reads the live model database; with fair share
    # ordering on it sees the queue in fair-share order; profiling runs are started only on
    # resources no waiting job can use.
    configured = build_policy(config.policy, config.policy_options, models.db)
    if config.fairshare.order:
        configured = fairshare.ordering = FairShareOrdering(configured, fairshare.tracker,
                                                            config.fairshare.recalc_s)
    policy = ProfilingPolicy(configured, profiler.is_run, profiler.any_runs)
    features = Features(models=models, profiler=profiler, adaptive=adaptive,
                        inference=inference, arrays=arrays, net_partitions=NetPartitions(ctx),
                        liquid=LiquidResources(ctx),
                        estimator=DurationEstimator(ctx, config.policy),
                        power=PowerManager(ctx), logs=JobLogs(ctx),
                        partitions=Partitions(ctx),
                        priority_classes=PriorityClasses(ctx),
                        maintenance=Maintenance(ctx),
                        reservations=Reservations(ctx), timelimits=TimeLimits(ctx),
                        dependencies=Dependencies(ctx),
                        controls=JobControls(ctx), nodeloss=NodeLoss(ctx),
                        gpufaults=GpuFaults(ctx), fencing=Fencing(ctx),
                        leases=NodeLeases(ctx), containers=Containers(ctx),
                        relays=Relays(ctx), fairshare=fairshare, accounts=Accounts(ctx))
    return features, policy
