"""TOML configuration of both daemons. Every option is documented in docs/configuration.md."""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from shared.accounts import Account, AccountError, AccountTree
from shared.model import FEATURE_PATTERN, NAME_PATTERN, UNIX_USER_PATTERN
from shared.nodelease import lease_problem
from shared.partitions import Partition, PartitionError, PartitionTable
from shared.priorityclasses import ClassTable, PriorityClass, PriorityClassError
from shared.schema import SchemaError, bounded, decode

T = TypeVar("T")

# Sections that nest inside the main one (their keys become fields of that dataclass).


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class InferenceConfig:
    """SODA's hardware-aware inference placer (§V-D), ``[master.inference]``."""

    sustain_s: float = bounded(30.0, min=0, max=86400)
    scale_out_fraction: float = bounded(0.8, min=0.01, max=1)
    scale_in_fraction: float = bounded(0.6, min=0.01, max=1)
    gpu_down_fraction: float = bounded(0.75, min=0.01, max=0.99)
    min_replicas: int = bounded(1, min=1, max=1024)
    max_replicas: int = bounded(64, min=1, max=1024)
    # Memory bandwidth (GB/s) a GPU node lends to CPU replicas before contention (§V-E), used
    # until the contention monitor measures the node.
    mbw_headroom_gbps: float = bounded(20.0, min=0, max=100_000)
    max_services: int = bounded(1000, min=1, max=100_000)


@dataclass(frozen=True)
class LiquidConfig:
    """Liquid's resource-requirement model (§4), ``[master.liquid]``."""

    # Learn from jobs' usage and attach predictions to jobs (the liquid policy reads them).
    model: bool = True
    # Re-train this often from the journal's usage rows (0: only at start).
    retrain_s: float = bounded(600.0, min=0, max=30 * 86400)
    # Train on at most this many of the newest final usage reports.
    max_rows: int = bounded(20_000, min=10, max=10_000_000)
    seed: int = bounded(0, min=0, max=2**31 - 1)


@dataclass(frozen=True)
class EstimatorConfig:
    """QSSF's duration estimator (Helios §4.2.2), ``[master.estimator]``; it runs when the
    policy is ``qssf``."""

    # estimate = alpha * rolling + (1 - alpha) * LightGBM (Helios: 0.1).
    alpha: float = bounded(0.1, min=0, max=1)
    # Retrain the LightGBM model this often in a worker process (0: only at start).
    retrain_interval_s: float = bounded(3600.0, min=0, max=30 * 86400)
    # Train on at most this many of the newest finished jobs; not before this many exist.
    max_jobs: int = bounded(100_000, min=10, max=10_000_000)
    min_jobs: int = bounded(50, min=2, max=10_000_000)
    # Finished jobs read back into the rolling history at start (the newest).
    history_jobs: int = bounded(100_000, min=0, max=10_000_000)
    # trellisctl estimator: accuracy over this many of the newest finished jobs.
    accuracy_window: int = bounded(1000, min=1, max=1_000_000)


@dataclass(frozen=True)
class PowerConfig:
    """Cluster Energy Saving (Helios §4.3), ``[master.power]``: off unless ``enabled``."""

    enabled: bool = False
    # Operator executables, called with node names as arguments (as Slurm's SuspendProgram
    # and ResumeProgram); exit status 0 means done.
    suspend_program: str = bounded("", max_len=4096)
    resume_program: str = bounded("", max_len=4096)
    # A program still running after this long is killed and its nodes left usable.
    program_timeout_s: float = bounded(60.0, min=0.1, max=3600)
    # A resumed node that has not rejoined after this long is marked down (with the reason).
    resume_timeout_s: float = bounded(600.0, min=1, max=86400)
    # Algorithm 2's periodic check, and its step: the 10-minute maxima of busy nodes.
    check_interval_s: float = bounded(600.0, min=0.1, max=86400)
    # sigma: idle nodes kept powered for unexpected jobs.
    buffer_nodes: int = bounded(2, min=0, max=100_000)
    history_steps: int = bounded(2, min=1, max=10_000)
    future_steps: int = bounded(18, min=1, max=10_000)  # Helios clusters: 3 h of 10 min
    history_threshold: float = bounded(0.1, min=-1e9, max=1e9)
    future_threshold: float = bounded(0.0, min=-1e9, max=1e9)
    min_decrease: int = bounded(1, min=0, max=100_000)
    cooldown_steps: int = bounded(10, min=0, max=100_000)
    # Forecast busy nodes with LightGBM once this much history exists; retrain this often.
    forecast: bool = True
    forecast_min_steps: int = bounded(288, min=10, max=10_000_000)
    forecast_retrain_s: float = bounded(86400.0, min=1, max=365 * 86400)


@dataclass(frozen=True)
class FairShareConfig:
    """Fair share with a memory (docs/governance.md), ``[master.fairshare]``."""

    # Order jobs by their account's fair-share factor under fifo, drf, qssf and sjf (a
    # tie-break under the other policies); off: the factor is computed and shown only.
    order: bool = False
    # Usage decays by half over this long (Slurm's PriorityDecayHalfLife).
    half_life_s: float = bounded(7 * 86400.0, min=60, max=365 * 86400)
    # What an hour of each resource is worth, in usage units (Slurm's TRESBillingWeights).
    gpu_weight: float = bounded(1.0, min=0, max=1e6)
    cpu_weight: float = bounded(0.05, min=0, max=1e6)
    memory_gib_weight: float = bounded(0.005, min=0, max=1e6)
    # Factors are recomputed at most this often while ordering (PriorityCalcPeriod).
    recalc_s: float = bounded(60.0, min=0, max=86400)
    # A restart rebuilds usage from jobs submitted within this many half-lives (older
    # usage has decayed below 2^-N).
    history_half_lives: float = bounded(10.0, min=1, max=100)


@dataclass(frozen=True)
class MasterConfig:
    listen_host: str = bounded("127.0.0.1", max_len=255)
    listen_port: int = bounded(7400, min=0, max=65535)
    state_dir: str = bounded("/var/lib/trellis/master", max_len=4096)
    policy: str = bounded("fifo", max_len=64)
    policy_options: dict[str, Any] = field(default_factory=dict)
    # A node silent for this long is marked unreachable: nothing new is placed there.
    node_grace_s: float = bounded(30.0, min=0.1, max=86400)
    # Node loss (Slurm's SlurmdTimeout, 300 s): a node silent this long (counted from the
    # same moment as node_grace_s, so at least that) is down, and each job with a part
    # there is requeued or ends node_lost; 0: never (a silent node keeps its jobs).
    node_lost_s: float = bounded(300.0, min=0, max=30 * 86400)
    # A node cut off from every master stops each part the master would requeue this long
    # before the master could (shared/nodelease.py), beyond 1.5 × node_heartbeat_s: timer
    # slack, network delay, clocks advancing at slightly different rates.
    node_fence_margin_s: float = bounded(5.0, min=0, max=3600)
    # Whether a job that does not say (its stop.requeue, submit --requeue/--no-requeue) is
    # requeued after its node is lost or its GPU fails (Slurm's JobRequeue) ...
    requeue_default: bool = True
    # ... and at most how many times (Slurm's MaxBatchRequeue); then it ends node_lost.
    max_requeues: int = bounded(5, min=0, max=1_000_000)
    command_timeout_s: float = bounded(15.0, min=0.1, max=3600)
    stop_grace_s: float = bounded(10.0, min=0, max=3600)
    # Time limits (Slurm's --time): the limit written into a job submitted without one (0:
    # none), the longest a job may have (0: no maximum; a longer one waits, gate time_limit),
    # and the longest SIGTERM-to-SIGKILL grace a stop gives (a job's --grace is capped to it).
    default_time_limit_s: int = bounded(0, min=0, max=366 * 86400)
    max_time_limit_s: int = bounded(0, min=0, max=366 * 86400)
    max_grace_s: float = bounded(120.0, min=0, max=3600)
    # A job nodes refuse to start this many times fails instead of being retried.
    max_start_failures: int = bounded(3, min=1, max=1000)
    # Unix users jobs may run as; empty means any user that exists, except root.
    allowed_users: tuple[str, ...] = bounded(default_factory=tuple, max_len=100_000)
    allow_root_jobs: bool = False
    log_level: str = bounded("info", pattern=r"(?i)debug|info|warning|error")
    # SODA's arrays: re-derive their sizes from recent demand this often (0 turns it off) ...
    array_resize_interval_s: float = bounded(3600.0, min=0, max=30 * 86400)
    # ... looking back this many days (None: the policy's own ``history_days``).
    array_history_days: float | None = bounded(None, min=0.001, max=3650)
    # SODA's adaptive CPU allocator for training jobs (§V-B): spec.cpus becomes the most cores
    # a job may hold, it starts at N_start and its node tunes it down to the best fit. A job's
    # TRELLIS_ADAPTIVE_CPUS environment variable (1/0) overrides this per job.
    adaptive_cpus: bool = False
    # The allocator's ceiling per GPU of a job part (§V-B, §VI-D: it may give more cores than
    # asked): a part may hold up to this many cores per GPU, the extra taken at launch from
    # spare cores of its node (masterd/core/widen.py). 0: a job's request is its ceiling.
    adaptive_max_cores_per_gpu: int = bounded(0, min=0, max=1024)
    # How many ended jobs (finished, failed, cancelled) the master keeps in memory, the most
    # recently ended ones; older ones live on only in the journal (trellisctl show and
    # events still find them). Queued and running jobs are always kept.
    finished_jobs_in_memory: int = bounded(10_000, min=0, max=10_000_000)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    liquid: LiquidConfig = field(default_factory=LiquidConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    power: PowerConfig = field(default_factory=PowerConfig)
    fairshare: FairShareConfig = field(default_factory=FairShareConfig)

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
    # Clients (by credential name; "*": every client) that may submit or update jobs of QoS
    # urgent, and of prior; admins always may.
    qos_urgent_users: tuple[str, ...] = bounded(default_factory=tuple, max_len=100_000)
    qos_prior_users: tuple[str, ...] = bounded(default_factory=lambda: ("*",), max_len=100_000)
    # Hostile-peer limits: a request (headers and body) or a node frame must arrive within
    # request_timeout_s of its first byte; a node must say hello within hello_timeout_s.
    request_timeout_s: float = bounded(10.0, min=0.05, max=3600)
    hello_timeout_s: float = bounded(10.0, min=0.05, max=3600)
    max_connections_per_ip: int = bounded(1024, min=1, max=1_000_000)
    # WebSocket ping period on node sessions: a silent (partitioned) node is noticed within
    # about 1.5 times this, and marked unreachable node_grace_s later.
    node_heartbeat_s: float = bounded(10.0, min=0.1, max=3600)
    # Garbage collector (masterd.gcpause): young-generation threshold, and how often the
    # objects frozen out of full collections are unfrozen and collected once.
    gc_young_threshold: int = bounded(700, min=1, max=10_000_000)
    gc_refreeze_s: float = bounded(3600.0, min=1, max=30 * 86400)
    # High availability (docs/high-availability.md): the journal in PostgreSQL
    # ("postgresql://..."; empty: SQLite in state_dir) shared by several masters, one leading.
    store: str = bounded("", max_len=4096)
    # Where clients and nodes reach this master (named to them by a standby); empty:
    # http(s)://listen_host:listen_port.
    advertise_url: str = bounded("", max_len=1024)
    # Leader election, kube-scheduler's defaults: a standby takes over once the lease is this
    # old, a leader that could not renew for renew_deadline_s stops, both act every retry_s.
    lease_s: float = bounded(15.0, min=1, max=3600)
    renew_deadline_s: float = bounded(10.0, min=0.5, max=3600)
    retry_s: float = bounded(2.0, min=0.1, max=600)
    # The account tree ([[master.accounts]], docs/governance.md); empty: accounts are off.
    accounts: tuple[Account, ...] = bounded(default_factory=tuple, max_len=100_000)
    # Partitions ([[master.partitions]], docs/partitions.md); empty: none, jobs may use every
    # node.
    partitions: tuple[Partition, ...] = bounded(default_factory=tuple, max_len=1024)
    # Priority classes ([[master.priority_classes]], docs/priority-classes.md); empty: none.
    priority_classes: tuple[PriorityClass, ...] = bounded(default_factory=tuple, max_len=64)
    # Interactive jobs (docs/interactive.md): a job run on a terminal whose client is gone
    # (dropped, or never attached) is cancelled after this long unless one attaches again.
    terminal_grace_s: float = bounded(30.0, min=0, max=86400)
    # Bytes a relayed stream (terminal, port-forward) may have unacknowledged per direction:
    # the most the master, the node and the client hold of it.
    relay_window_kib: int = bounded(2048, min=256, max=65536)

    def __post_init__(self) -> None:
        try:
            AccountTree.of(self.accounts)
            PartitionTable.of(self.partitions)
            ClassTable.of(self.priority_classes)
        except (AccountError, PartitionError, PriorityClassError) as exc:
            raise ValueError(str(exc)) from None
        if 0 < self.node_lost_s < self.node_grace_s:
            raise ValueError(f"node_lost_s ({self.node_lost_s:g}) is shorter than node_grace_s "
                             f"({self.node_grace_s:g}): a node is marked unreachable before "
                             "it is declared lost, so node_lost_s must be at least "
                             "node_grace_s (or 0: never)")
        problem = lease_problem(self.node_lost_s, self.max_grace_s, self.node_heartbeat_s,
                                self.node_fence_margin_s, self.node_grace_s)
        if problem is not None:
            raise ValueError(problem)
        if 0 < self.max_time_limit_s < self.default_time_limit_s:
            raise ValueError(f"default_time_limit_s ({self.default_time_limit_s}) exceeds "
                             f"max_time_limit_s ({self.max_time_limit_s}): every job without "
                             "a limit would wait forever")
        if self.store and not self.store.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"store must be a postgresql:// URL or empty (SQLite in "
                             f"state_dir), got {self.store.split('://')[0]!r}")
        if not self.retry_s < self.renew_deadline_s < self.lease_s:
            raise ValueError(f"leader election needs retry_s < renew_deadline_s < lease_s, "
                             f"got {self.retry_s:g}, {self.renew_deadline_s:g}, "
                             f"{self.lease_s:g}")

@dataclass(frozen=True)
class TunerConfig:
    """The node's half of SODA's CPU allocator (§V-B2, §VI-H), section ``[tuner]``."""

    enabled: bool = True
    window_s: float = bounded(60.0, min=0.05, max=3600)  # one measurement window
    sample_interval_s: float = bounded(1.0, min=0.01, max=600)  # GPU samples inside a window
    # After a re-pin, wait this long before measuring: queues drain, rate meters catch up.
    settle_s: float = bounded(5.0, min=0, max=3600)
    # After the job starts, wait this long (framework start-up, data loading warm-up).
    warmup_s: float = bounded(60.0, min=0, max=86400)
    tolerance: float = bounded(2.0, min=0.01, max=100)  # points below the plateau that hold
    noise: float = bounded(1.0, min=0, max=100)  # std. dev. of one window's mean (points)
    reference_windows: int = bounded(2, min=1, max=100)
    max_windows: int = bounded(5, min=1, max=100)
    confidence_z: float = bounded(2.0, min=0, max=100)


@dataclass(frozen=True)
class GpuConfig:
    backend: str = bounded("emulated", pattern=r"emulated|nvml|auto")
    count: int = bounded(4, min=0, max=1024)
    model: str = bounded("A100-SXM4-40GB", max_len=128)
    memory_mib: int = bounded(40960, min=0)
    gpus_per_switch: int = bounded(2, min=1, max=1024)
    numa_nodes: int = bounded(1, min=1, max=64)
    busy_util: float = bounded(90.0, min=0, max=100)
    # Emulated GPUs: memory a job holds on each GPU unless it declares its own (None: three
    # quarters of memory_mib; see noded/gpu/declared.py).
    busy_memory_mib: int | None = bounded(None, min=0, max=1 << 30)
    # Emulated GPUs: the window and least interval of the progress-rate utilisation meter.
    rate_window_s: float = bounded(10.0, min=0.001, max=3600)
    min_rate_interval_s: float = bounded(1.0, min=0, max=3600)
    # A command that returns a GPU out of service to service when it exits 0 (run for each
    # such GPU every health_check_s, killed after health_check_timeout_s; {index} and
    # {uuid} in its arguments are replaced). Empty: only trellisctl gpu reset returns one.
    health_check: tuple[str, ...] = bounded(default_factory=tuple, max_len=256)
    health_check_s: float = bounded(60.0, min=0.1, max=86400)
    health_check_timeout_s: float = bounded(30.0, min=0.1, max=3600)
    # The GPU device fence (noded/gpufence.py, docs/gpu-isolation.md): auto (where the cgroups
    # allow), devices (cgroup v1 devices controller), bpf (cgroup v2 device program), off.
    fence: str = bounded("auto", pattern=r"auto|devices|bpf|off")
    # Emulated GPUs: where their device files (195:N, nvidiactl) are made; "" = STATE_DIR/gpu-dev.
    dev_dir: str = bounded("", max_len=4096)


@dataclass(frozen=True)
class RdtConfig:
    """Where noded finds Intel RDT (resctrl)."""

    # auto: the real /sys/fs/resctrl when mounted, else none (contention is then detected from
    # GPU utilisation); real: require it; emulated: a directory tree (demo, tests); off: none.
    mode: str = bounded("auto", pattern=r"auto|real|emulated|off")
    # Root of the emulated tree; empty means STATE_DIR/resctrl. Built on first use.
    emulated_root: str = bounded("", max_len=4096)
    emulated_profile: str = bounded(
        "full", pattern=r"full|no_mb|mbps|gaps|few_closids|mon_only")


CONTENTION_KINDS = ("cpu", "inference")


@dataclass(frozen=True)
class ContentionConfig:
    """The contention eliminator (SODA V-E); see noded/policy/contention.py for the algorithm."""

    enabled: bool = True
    interval_s: float = bounded(1.0, min=0.05, max=3600)
    # Node-total MBM reads per interval: one with the full pass, the rest in between; a read
    # showing the threshold crossed starts a pass at once (1 = full passes only).
    onset_checks: int = bounded(2, min=1, max=100)
    # Throttle when node memory bandwidth reaches this fraction of the peak ...
    threshold: float = bounded(0.75, min=0.01, max=1.0)
    # ... and step back up after restore_intervals consecutive intervals below this one.
    restore_threshold: float = bounded(0.60, min=0.0, max=1.0)
    restore_intervals: int = bounded(5, min=1, max=1_000_000)
    # Node peak memory bandwidth in MiB/s (resctrl's MBps); 0 = measure it at start-up.
    peak_bandwidth_mbps: float = bounded(0.0, min=0, max=1e9)
    mba_step: int = bounded(20, min=1, max=100)
    # Lowest MBA percentage to throttle to; 0 means the hardware's minimum.
    mba_min: int = bounded(0, min=0, max=100)
    # Job kinds (CPU-only jobs of these kinds) the eliminator may throttle.
    throttle_kinds: tuple[str, ...] = bounded(default_factory=lambda: ("cpu",), max_len=4)
    # Without MBM: a training job whose GPU utilisation falls this many points below its stable
    # level for gpu_drop_intervals intervals while CPU jobs run signals contention.
    gpu_drop_points: float = bounded(15.0, min=1, max=100)
    gpu_drop_intervals: int = bounded(3, min=1, max=1_000_000)
    gpu_stable_window: int = bounded(60, min=2, max=1_000_000)
    gpu_warmup_intervals: int = bounded(5, min=1, max=1_000_000)
    # GPU utilisation answers a throttle slowly: wait this many intervals between steps.
    gpu_settle_intervals: int = bounded(5, min=0, max=1_000_000)

    def __post_init__(self) -> None:
        if self.restore_threshold >= self.threshold:
            raise ValueError(
                f"restore_threshold ({self.restore_threshold}) must be below threshold "
                f"({self.threshold}), or throttling and restoring would alternate"
            )
        for kind in self.throttle_kinds:
            if kind not in CONTENTION_KINDS:
                raise ValueError(
                    f"throttle_kinds entry {kind!r} is not one of {', '.join(CONTENTION_KINDS)}"
                )
        if self.gpu_warmup_intervals > self.gpu_stable_window:
            raise ValueError(
                f"gpu_warmup_intervals ({self.gpu_warmup_intervals}) exceeds gpu_stable_window "
                f"({self.gpu_stable_window})"
            )


@dataclass(frozen=True)
class NetConfig:
    """SODA's network partition (§V-E), section ``[net]``: while a multi-node GPU job runs on
    the node, GPU jobs are guaranteed ``gpu_share`` of the data NIC and CPU jobs
    ``cpu_share``; either may use the whole link alone (noded/netpartition.py)."""

    enabled: bool = False
    interface: str = bounded("", pattern=r"[^/\s:]{0,15}")  # the data NIC, e.g. "ib0"
    link_mbit: int = bounded(0, min=0, max=10_000_000)  # 0: the NIC's speed from sysfs
    gpu_share: float = bounded(0.75, min=0.01, max=1.0)
    cpu_share: float = bounded(0.25, min=0.01, max=1.0)
    # How job traffic is told apart: cgroup2 (socket cgroupv2; needs jobs in v2 cgroups),
    # net_cls (a cgroup v1 net_cls hierarchy), or auto (cgroup2 under cgroup v2, else net_cls).
    classifier: str = bounded("auto", pattern=r"auto|cgroup2|net_cls")
    net_cls_mount: str = bounded("", max_len=4096)  # empty: found in /proc/self/mountinfo
    # The network namespace the data NIC lives in; empty: noded's own (tests use one).
    netns: str = bounded("", pattern=r"[A-Za-z0-9_.-]{0,64}")
    nft_table: str = bounded("trellis_netshape", pattern=r"[A-Za-z][A-Za-z0-9_]{0,63}")

    def __post_init__(self) -> None:
        if self.enabled and not self.interface:
            raise ValueError("net.interface must name the data NIC when net.enabled is true")
        if self.gpu_share + self.cpu_share > 1.0 + 1e-9:
            raise ValueError(f"net.gpu_share + net.cpu_share must be at most 1, got "
                             f"{self.gpu_share} + {self.cpu_share}")


@dataclass(frozen=True)
class JobsConfig:
    """Jobs' output on the node, section ``[jobs]`` (noded/shim.py, noded/joblogs.py)."""

    # A job part's log holds at most this much of its output (stdout and stderr); past it the
    # rest is dropped after a line saying so, and the job runs on. 0: no cap.
    log_max_mb: float = bounded(1024.0, min=0, max=1 << 30)
    # Finished jobs' logs are removed this long after the job ended. 0: kept for ever.
    log_retention_h: float = bounded(168.0, min=0, max=24 * 365 * 100)
    # Which jobs also see Slurm's names for their variables (SLURM_JOB_ID, SLURM_PROCID, ...;
    # docs/slurm.md): "requested" (those that ask, as batch scripts do), "always", "never".
    slurm_env: str = bounded("requested", pattern=r"requested|always|never")


@dataclass(frozen=True)
class ContainersConfig:
    """Jobs run in their own image, section ``[containers]`` (docs/containers.md)."""

    # The OCI runtime podman starts containers with: runc (crun refuses hybrid cgroup
    # layouts such as this project's CI machine's).
    runtime: str = bounded("runc", pattern=r"runc|crun")
    # Host path prefixes a job may bind into its container (--mount SRC:DST); empty: none.
    allowed_mounts: tuple[str, ...] = bounded(default_factory=tuple, max_len=1000)
    # The node's image cache holds at most this many MiB; least recently used images go
    # first, never one a container still uses.
    cache_max_mb: float = bounded(20480.0, min=1, max=1 << 40)
    # One pull attempt may take this long before it counts as a hung registry.
    pull_timeout_s: float = bounded(600.0, min=1, max=86400)
    # Attempts after the first for a pull that failed for a reason worth retrying (the
    # registry down or hanging); a missing image or refused credentials is not retried.
    pull_retries: int = bounded(2, min=0, max=100)
    # One file per registry host (e.g. ``registry.example.com:5000``) holding ``user:password``,
    # mode 0600: the credentials the node pulls with. Never in a job spec.
    credentials_dir: str = bounded("/etc/trellis/registries", max_len=4096)
    # Registries reached over plain HTTP or with an unverified certificate (loopback test
    # registries); every other registry must present a valid certificate.
    insecure_registries: tuple[str, ...] = bounded(default_factory=tuple, max_len=1000)
    # podman's image store and run state; empty: STATE_DIR/containers.
    storage_dir: str = bounded("", max_len=4096)

    def __post_init__(self) -> None:
        for prefix in self.allowed_mounts:
            if not prefix.startswith("/"):
                raise ValueError(f"containers.allowed_mounts entry {prefix!r} must be an "
                                 "absolute path")


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
    # A silent master (frozen, or cut off: docs/high-availability.md): a dial (TCP, TLS, the
    # WebSocket handshake) must finish within master_connect_timeout_s, and a master that
    # does not answer a ping within half of master_heartbeat_s is left for the next one.
    master_connect_timeout_s: float = bounded(5.0, min=0.1, max=3600)
    master_heartbeat_s: float = bounded(5.0, min=0.2, max=3600)
    log_level: str = bounded("info", pattern=r"(?i)debug|info|warning|error")
    # How often jobs' metrics files are read and relayed (at most one event per job and
    # metric name per period; see noded/metrics_channel.py).
    job_metrics_interval_s: float = bounded(1.0, min=0.05, max=3600)
    # Where the node sits in the network, sent in its hello (Liquid weighs traffic by it).
    rack: str = bounded("", pattern=f"({NAME_PATTERN})?")
    domain: str = bounded("", pattern=f"({NAME_PATTERN})?")
    # The node's features, sent in its hello: jobs select nodes by them (trellisctl submit
    # --constraint a100&ib, Slurm's node Features), e.g. ["a100", "ib", "nvlink"].
    features: tuple[str, ...] = bounded(default_factory=tuple, max_len=64,
                                        pattern=FEATURE_PATTERN)
    # What jobs really use (noded/usage): sampled this often, reported at exit and every
    # usage_report_s while a part runs (0: at exit only).
    usage_interval_s: float = bounded(1.0, min=0.05, max=3600)
    usage_report_s: float = bounded(300.0, min=0, max=86400)
    # Liquid's post phase: GPU utilisation below this after having been above it, for
    # phase_samples samples in a row, is reported as a job_phase event.
    phase_threshold_pct: float = bounded(15.0, min=0.1, max=100)
    phase_samples: int = bounded(3, min=1, max=1000)
    # Shared GPUs (fractional jobs) under CUDA MPS on NVIDIA nodes: auto (when
    # nvidia-cuda-mps-control exists and the backend is nvml), on (required), off.
    mps: str = bounded("auto", pattern=r"auto|on|off")
    # For benchmarks and tests only: hold every event and send what accumulated every this
    # many seconds, as a heartbeat-only node would (0: send each event as it happens).
    heartbeat_only_s: float = bounded(0.0, min=0, max=3600)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    # Prometheus /metrics listener; 0 = off. Loopback by default: a scraper on the node (or a
    # deliberate address here) reads it, nothing else can.
    metrics_port: int = bounded(0, min=0, max=65535)
    metrics_host: str = bounded("127.0.0.1", max_len=255)
    rdt: RdtConfig = field(default_factory=RdtConfig)
    contention: ContentionConfig = field(default_factory=ContentionConfig)
    tuner: TunerConfig = field(default_factory=TunerConfig)
    net: NetConfig = field(default_factory=NetConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    containers: ContainersConfig = field(default_factory=ContainersConfig)
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
        # Nested tables of the config (gpu, tuner) may also be written as top-level sections.
        nested = {f.name for f in fields(cls)  # type: ignore[arg-type]
                  if f.default_factory is not MISSING and is_dataclass(f.default_factory())}
        unknown = [k for k in doc if k != section and k not in nested]
        if unknown:
            raise ConfigError(f"{path}: unknown section(s) {', '.join(unknown)}")
        data = dict(doc.get(section, {}))
        for name in nested & doc.keys():
            data[name] = doc[name]
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return decode(cls, data, section)
    except SchemaError as exc:
        raise ConfigError(f"{where}: {exc}") from None
