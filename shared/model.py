"""The data model shared by the master, the node daemon, the CLI and the simulator."""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, field
from typing import ClassVar

from shared.schema import bounded

# Anything that may become part of a filesystem path (cgroup, resctrl group, state file) must
# match NAME_PATTERN: no '/', no '.', so neither '..' nor hidden files can be formed.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}"
UNIX_USER_PATTERN = r"[a-z_][a-z0-9_-]{0,31}"
_NAME_RE = re.compile(NAME_PATTERN)

# A node feature (a node's configured features, a job's --constraint): a100, nvlink, ib-hdr.
FEATURE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}"

LARGE_JOB_GPUS = 4  # SODA: jobs of 4 GPUs or more use the large-job array


def is_valid_name(name: str) -> bool:
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None


def check_name(name: str, what: str) -> str:
    if not is_valid_name(name):
        raise ValueError(
            f"{what} {name!r} is not a valid name: use 1-63 letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return name


class JobKind(enum.StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    CPU = "cpu"


class QosClass(enum.StrEnum):
    URGENT = "urgent"
    PRIOR = "prior"
    NORMAL = "normal"


class JobState(enum.StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Stopped at its time limit (JobSpec.time_limit_s): ended, but neither failed nor finished.
    TIMEOUT = "timeout"
    # Its node died (or a GPU it used failed) and it may not be requeued.
    NODE_LOST = "node_lost"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED,
                       JobState.TIMEOUT, JobState.NODE_LOST})


class WaitReason(enum.StrEnum):
    """Why a queued job waits: one vocabulary for every policy (docs/protocol.md).

    The admission gates (held, dependency, time_limit, quota) keep a job out of the policy's
    sight altogether; the others say why a job the policy sees did not start.
    """

    HELD = "held"  # trellisctl hold: a user or an admin holds it back
    DEPENDENCY = "dependency"  # it waits for the jobs it depends on (--after)
    TIME_LIMIT = "time_limit"  # its time limit exceeds what the master allows
    QUOTA = "quota"  # its account is at a cap (governance)
    # Its reservation (--reservation) has not begun, or is over or deleted.
    RESERVATION = "reservation"
    NO_FIT = "no_fit"  # no node has the free resources of its shape now
    PRIORITY = "priority"  # behind jobs the policy orders first
    RESERVED = "reserved"  # the resources it needs are reserved for the head job (backfill)
    POLICY = "policy"  # the policy's own note (SODA's arrays, GENIE's plan)


# ---------------------------------------------------------------------------------------------
# Node inventory


@dataclass(frozen=True)
class GpuInfo:
    index: int = bounded(min=0, max=1023)
    uuid: str = bounded(max_len=128)
    model: str = bounded(max_len=128)
    memory_mib: int = bounded(min=0)
    numa_node: int = bounded(-1, min=-1, max=1023)
    pci_bus_id: str = bounded("", max_len=64)
    # Id of the PCIe switch the GPU sits behind; GPUs sharing it talk fastest (GENIE's locality).
    pcie_switch: int = bounded(0, min=0)
    healthy: bool = True


@dataclass(frozen=True)
class CpuCore:
    id: int = bounded(min=0, max=65535)
    socket: int = bounded(0, min=0)
    numa_node: int = bounded(0, min=0)
    core: int = bounded(0, min=0)
    siblings: tuple[int, ...] = ()


@dataclass(frozen=True)
class NicInfo:
    name: str = bounded(max_len=64)
    speed_mbps: int = bounded(0, min=0)


@dataclass(frozen=True)
class RdtCapabilities:
    cat: bool = False
    mba: bool = False
    mbm: bool = False
    mba_mbps: bool = False


@dataclass(frozen=True)
class ReservationHold:
    """A reservation not over yet on a node (shared/reservations.py), as the master stamps
    it: its name, and the seconds left before it begins (0: it has begun), conservative."""

    name: str = bounded(pattern=NAME_PATTERN)
    in_s: float = bounded(0.0, min=0)


@dataclass(frozen=True)
class NodeInventory:
    name: str = bounded(pattern=NAME_PATTERN)
    hostname: str = bounded(max_len=255)
    address: str = bounded(max_len=255)
    gpus: tuple[GpuInfo, ...] = bounded(default_factory=tuple, max_len=1024)
    cpus: tuple[CpuCore, ...] = bounded(default_factory=tuple, max_len=65536)
    memory_mib: int = bounded(0, min=0)
    nics: tuple[NicInfo, ...] = bounded(default_factory=tuple, max_len=64)
    rdt: RdtCapabilities = field(default_factory=RdtCapabilities)
    # NVML topology levels between GPU i and j (0 same board ... 50 across sockets); may be empty.
    gpu_links: tuple[tuple[int, ...], ...] = ()
    # Where the node sits in the network (its configuration's node.rack and node.domain):
    # Liquid weighs traffic between nodes by it (1 same rack, 4 same domain, 40 otherwise).
    rack: str = bounded("", max_len=128)
    domain: str = bounded("", max_len=128)
    # Its features (the node's configuration's node.features), which jobs select by
    # (JobSpec.selector, Slurm's --constraint).
    features: tuple[str, ...] = bounded(default_factory=tuple, max_len=64,
                                        pattern=FEATURE_PATTERN)
    # The partitions the master's configuration puts it in (shared/partitions.py): set by
    # the master on the inventory it takes, whatever a node sends.
    partitions: tuple[str, ...] = bounded(default_factory=tuple, max_len=256,
                                          pattern=NAME_PATTERN)
    # Those of them that start no job now (down or inactive; set by the master too).
    closed_partitions: tuple[str, ...] = bounded(default_factory=tuple, max_len=256,
                                                 pattern=NAME_PATTERN)
    # Seconds left before its next maintenance window (0: in one; None: none planned),
    # stamped by the master (shared/maintenance.py): a job starts here only if its time
    # limit ends before then.
    maintenance_in_s: float | None = bounded(None, min=0)
    # The reservations not over yet that hold it (stamped by the master): a job starts here
    # only if it is in one of them, or its time limit ends before each begins.
    reservations: tuple[ReservationHold, ...] = bounded(default_factory=tuple, max_len=64)

    @property
    def gpu_model(self) -> str | None:
        return self.gpus[0].model if self.gpus else None

    @functools.cached_property
    def feature_set(self) -> frozenset[str]:
        return frozenset(self.features)

    @functools.cached_property
    def partition_set(self) -> frozenset[str]:
        return frozenset(self.partitions)

    @functools.cached_property
    def open_partition_set(self) -> frozenset[str]:
        """Its partitions that start jobs now."""
        return self.partition_set.difference(self.closed_partitions)

    @functools.cached_property
    def cpu_ids(self) -> frozenset[int]:
        """The ids of the node's cores (cached: the master reads it at every release)."""
        return frozenset(c.id for c in self.cpus)

    def numa_of_gpu(self, index: int) -> int:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu.numa_node
        return -1


# ---------------------------------------------------------------------------------------------
# Jobs

DEPENDENCY_TYPES = ("afterok", "afterany", "afternotok", "aftercorr")
# Signal names a job may ask for as its warning before the time limit (Slurm's --signal).
SIGNAL_NAMES = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM",
                "SIGCONT", "SIGSTOP", "SIGKILL", "SIGTSTP", "SIGWINCH", "SIGPWR", "SIGURG",
                "SIGXCPU")


@dataclass(frozen=True)
class WarnSignal:
    """A signal a job asks for ``seconds`` before its time limit (Slurm's --signal)."""

    signal: str = bounded(pattern="|".join(SIGNAL_NAMES))
    seconds: int = bounded(60, min=0, max=86400)
    # Only the job's leader process (the batch shell: Slurm's ``B:``) gets it, not its
    # children; otherwise every process of the job's process group.
    batch_only: bool = False


@dataclass(frozen=True)
class StopRules:
    """How a job is stopped, and what becomes of it when its node is lost or a GPU of it
    fails (trellisctl submit --signal, --grace, --requeue/--no-requeue)."""

    # A signal sent some seconds before the time limit (Slurm's --signal SIG@SECONDS), for
    # checkpoint hooks.
    warning: WarnSignal | None = None
    # Seconds between SIGTERM and SIGKILL when the job is stopped (capped by the master's
    # max_grace_s); nil: the master's stop_grace_s.
    grace_s: float | None = bounded(None, min=0, max=3600)
    # Whether the job is queued again (true) or ends node_lost (false) when its node is lost
    # or a GPU it uses fails (Slurm's --requeue/--no-requeue); nil: the master's
    # requeue_default.
    requeue: bool | None = None


# A job that says nothing of its stop: every spec without `stop` shares this one.
NO_STOP_RULES = StopRules()


@dataclass(frozen=True)
class Mount:
    """A host path bound into a job's container (trellisctl submit --mount SRC:DST[:ro])."""

    # The host path; it must lie under one of the node's [containers] allowed_mounts prefixes.
    source: str = bounded(max_len=4096)
    # Where the job sees it inside its container (an absolute path).
    target: str = bounded(max_len=4096)
    read_only: bool = False


@dataclass(frozen=True)
class LaunchSpec:
    """How a job's processes are started and where their output goes: its container image,
    a batch script sent with it, its output files and whether it runs on a terminal. Grouped
    to keep JobSpec under 30 attributes; most jobs share NO_LAUNCH."""

    # An OCI image reference (registry/name:tag or @sha256:...) the job runs in; None: on the
    # host, fenced from GPUs it was not given by the device cgroup.
    image: str | None = bounded(None, max_len=1024)
    # Host paths bound into the container (only with an image).
    mounts: tuple[Mount, ...] = bounded(default_factory=tuple, max_len=64)
    # A batch script's content, sent with the job as sbatch sends it; the node writes it to
    # the job's directory and runs it (command is then the script's name and its arguments).
    script: str | None = bounded(None, max_len=1 << 20)
    # Where the node writes the job's stdout (and stderr, unless `stderr` is set): a path
    # pattern with Slurm's %j %x %A %a %u %N %%; None: the node's own job log only.
    stdout: str | None = bounded(None, max_len=4096)
    stderr: str | None = bounded(None, max_len=4096)
    # Run on a pseudo-terminal allocated by the node (trellisctl run --pty).
    pty: bool = False
    # Also give the job Slurm's names for Trellis' variables (SLURM_JOB_ID, SLURM_PROCID, ...).
    slurm_env: bool = False

    def __post_init__(self) -> None:
        # Refused at submission, not on the node at start (docs/slurm.md).
        if self.script is not None and not self.script.startswith("#!"):
            raise ValueError("launch.script has no shebang (#!) on its first line: the node "
                             "runs a script with the interpreter it names")
        for what, pattern in (("stdout", self.stdout), ("stderr", self.stderr)):
            if pattern is not None:
                from shared.outputpattern import check_pattern

                check_pattern(pattern, f"launch.{what}")
        if self.pty and self.image is not None:
            # The terminal is the shim's; podman would need its own (-t) and a relay of it.
            raise ValueError("launch.pty with launch.image: a job on a terminal runs on the "
                             "host for now (docs/interactive.md); drop --pty or --image")


# A job launched as a plain host command: every spec without `launch` shares this one.
NO_LAUNCH = LaunchSpec()


@dataclass(frozen=True)
class CpuTraits:
    """Traits SODA's CPU allocator uses to pick a job's starting core count (§V-B1); None:
    not declared (the job's TRELLIS_* variables may say). A spec that gives them at its top
    level, as specs did before they were grouped here, is still accepted."""

    # The input pipeline overlaps compute (one core fewer) ...
    pipelined_input: bool | None = None
    # ... the model's weights are large (one core fewer) ...
    large_weights: bool | None = None
    # ... the input needs heavy preprocessing (one core more).
    heavy_preprocessing: bool | None = None


NO_TRAITS = CpuTraits()


@dataclass(frozen=True)
class NodeSelector:
    """Which nodes a job may use beyond its GPU model (grouped to keep JobSpec under 30
    attributes; most jobs share NO_SELECTOR)."""

    # Every one of these node features (Slurm's --constraint=a100&nvlink) ...
    features: tuple[str, ...] = bounded(default_factory=tuple, max_len=64,
                                        pattern=FEATURE_PATTERN)
    # ... at least one of these on each node (--constraint=a100|h100; nodes may differ) ...
    any_features: tuple[str, ...] = bounded(default_factory=tuple, max_len=64,
                                            pattern=FEATURE_PATTERN)
    # ... none of these nodes (Slurm's --exclude) ...
    exclude: tuple[str, ...] = bounded(default_factory=tuple, max_len=1024,
                                       pattern=NAME_PATTERN)
    # ... only these nodes (Slurm's --nodelist; Slurm also insists on using every node
    # listed, Trellis places the job among them) ...
    only: tuple[str, ...] = bounded(default_factory=tuple, max_len=1024,
                                    pattern=NAME_PATTERN)
    # ... of one of these partitions (--partition; the master writes the default partition
    # into a job that names none, and keeps only those that admit it).
    partitions: tuple[str, ...] = bounded(default_factory=tuple, max_len=64,
                                          pattern=NAME_PATTERN)
    # ... in this reservation (--reservation; "": none), on its nodes while it lasts, or
    # (``flex``, the reservation's flag as it was at submission, which the master writes)
    # on its nodes at any time and on any other node as a job without one.
    reservation: str = bounded("", max_len=63, pattern=f"(|{NAME_PATTERN})")
    flex: bool = False
    # ... and whole nodes to itself (Slurm's --exclusive): only nodes running nothing else,
    # every GPU, core and byte of memory of each allocated to it, nothing else placed there
    # while it runs.
    exclusive: bool = False

    def __str__(self) -> str:
        """How people read it: "with a100&ib, not gpu-03"."""
        parts = []
        if self.features:
            parts.append("with " + "&".join(self.features))
        if self.any_features:
            parts.append("with " + "|".join(self.any_features))
        if self.only:
            parts.append("on " + ",".join(self.only))
        if self.exclude:
            parts.append("not " + ",".join(self.exclude))
        if self.partitions:
            parts.append("in " + "|".join(self.partitions))
        if self.reservation:
            parts.append(f"in reservation {self.reservation}")
        if self.exclusive:
            parts.append("whole nodes")
        return ", ".join(parts)

    @property
    def only_features(self) -> bool:
        """It selects by ``features`` alone ("with a100&ib" reads without brackets)."""
        return (bool(self.features) and not self.any_features and not self.exclude
                and not self.partitions and not self.only and not self.reservation
                and not self.exclusive)

    @property
    def only_partitions(self) -> bool:
        """It selects by ``partitions`` alone (every job of a cluster with partitions)."""
        return (bool(self.partitions) and not self.features and not self.any_features
                and not self.exclude and not self.only and not self.reservation
                and not self.exclusive)

    @property
    def constraint(self) -> str:
        """Its features in Slurm's --constraint syntax ("a100&ib", "a100|h100", "")."""
        return "&".join(self.features) or "|".join(self.any_features)


NO_SELECTOR = NodeSelector()


@dataclass(frozen=True)
class ArrayTask:
    """Which array a job is a task of (the array's id) and its index there."""

    id: str = bounded(pattern=NAME_PATTERN)
    index: int = bounded(min=0, max=1_000_000)


@dataclass(frozen=True)
class Dependency:
    """One term of a job's dependency (Slurm's ``--dependency TYPE:ID[:ID...]``)."""

    # afterok: the jobs finished; afterany: they ended, however; afternotok: they ended but
    # did not finish (failed, cancelled, timeout); aftercorr: the task of the same array
    # index of the named array finished.
    type: str = bounded(pattern="|".join(DEPENDENCY_TYPES))
    # Job ids, or array ids (a whole array: every task of it).
    jobs: tuple[str, ...] = bounded(pattern=NAME_PATTERN, max_len=1024)

    def __post_init__(self) -> None:
        if not self.jobs:
            raise ValueError(f"dependency {self.type} names no job")


@dataclass(frozen=True)
class JobSpec:
    """What a user asks for. Validated on submission; immutable afterwards."""

    # (The comment above a field is its meaning in docs/protocol.md.)
    # The job's name; the master names it NAME-SEQ unless the submission gives an id.
    name: str = bounded(pattern=NAME_PATTERN)
    # The program and its arguments, run without a shell.
    command: tuple[str, ...] = bounded(max_len=1024)
    # The Unix user the job runs as (never root unless the master allows it).
    user: str = bounded(pattern=UNIX_USER_PATTERN)
    kind: JobKind = JobKind.TRAINING
    # The account the job is charged to (Slurm's --account): quotas, fair share and reports
    # are per account.
    tenant: str = bounded("default", pattern=NAME_PATTERN)
    # GENIE's QoS class: urgent (as soon as possible), prior (its one-GPU latency), normal (twice).
    qos: QosClass = QosClass.NORMAL
    # GPUs in all (the policy chooses how they spread over nodes unless max_nodes says).
    gpus: int = bounded(0, min=0, max=4096)
    # Only GPUs of this model; None: any.
    gpu_model: str | None = bounded(None, max_len=128)
    # CPU cores in all, shared out over its nodes; with adaptive CPUs, the most it may hold.
    cpus: int = bounded(1, min=0, max=4096)
    # Memory limit in MiB (0: none).
    memory_mib: int = bounded(0, min=0, max=1 << 30)
    # Extra environment variables of the job's processes.
    env: dict[str, str] = field(default_factory=dict)
    # Working directory (default: the user's home).
    workdir: str | None = bounded(None, max_len=4096)
    # For GENIE's predictions: the model type (resnet50, bert, ...) ...
    model_type: str | None = bounded(None, max_len=128)
    # ... its family (cnn, rnn, ...), for a similar profiled model when the type has none ...
    model_family: str | None = bounded(None, max_len=64)
    # ... and its size in millions of parameters.
    model_params_m: float | None = bounded(None, min=0)
    # The global batch size, for GENIE's predictions.
    batch: int | None = bounded(None, min=1, max=1 << 24)
    # Training iterations, for GENIE's predictions.
    iterations: int | None = bounded(None, min=1, max=1 << 40)
    # Absolute deadline (seconds since the epoch); overrides the class's ECT when set.
    deadline: float | None = bounded(None, min=0)
    # Nodes a multi-node job may span at most; None lets the policy choose.
    max_nodes: int | None = bounded(None, min=1, max=4096)
    # What its owner declares about its CPU side, for SODA's starting core count; see
    # CpuTraits (grouped to keep the spec under 30 attributes).
    traits: CpuTraits = NO_TRAITS
    # A share of one GPU in thousandths (openb's gpu_milli), for a 1-GPU job that may share its
    # GPU with others (Liquid's fine-grained sharing); None: the whole GPU.
    gpu_milli: int | None = bounded(None, min=1, max=999)
    # (Fields below are few and grouped: an instance keeps CPython's shared-key attribute
    # table only below 30 attributes (29 at most), and a spec three times bigger is felt at
    # 100k jobs; tests/unit/test_schema.py measures it.)
    # Time limit in seconds (Slurm's --time): at the limit the job is stopped and ends
    # `timeout`. None: the master's default_time_limit_s.
    time_limit_s: int | None = bounded(None, min=1, max=366 * 86400)
    # Its warning before the time limit, its stop grace and whether it is requeued after a
    # failure (see StopRules; grouped to keep the spec under 30 attributes).
    stop: StopRules = NO_STOP_RULES
    # The job starts only when these hold (all of them); see Dependency.
    after: tuple[Dependency, ...] = bounded(default_factory=tuple, max_len=64)
    # Order among otherwise equal jobs: higher first. A user may only lower it; admins may
    # raise it.
    priority: int = bounded(0, min=-1_000_000, max=1_000_000)
    # Its priority class (shared/priorityclasses.py: who queues first, who may preempt
    # whom); the master writes the default class into a job that names none.
    priority_class: str | None = bounded(None, pattern=NAME_PATTERN)
    # The array the job is a task of, and its index there (trellisctl submit --array).
    array: ArrayTask | None = None
    # Its image, batch script, output files and terminal (see LaunchSpec; grouped to keep the
    # spec under 30 attributes).
    launch: LaunchSpec = NO_LAUNCH
    # The nodes it may use beyond its GPU model (their features); see NodeSelector.
    selector: NodeSelector = NO_SELECTOR

    # Fields that moved into a group, for specs written before (journals, job files): the
    # decoder files a top-level ``pipelined_input`` under ``traits``.
    __moved__: ClassVar[dict[str, str]] = {
        "pipelined_input": "traits", "large_weights": "traits",
        "heavy_preprocessing": "traits"}

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("command must not be empty")
        if self.kind is JobKind.CPU and self.gpus:
            raise ValueError(f"a cpu job cannot ask for GPUs (gpus={self.gpus})")
        if self.kind is JobKind.TRAINING and self.gpus == 0:
            raise ValueError("a training job needs at least one GPU (gpus=0)")
        if self.cpus == 0 and self.gpus == 0:
            raise ValueError("a job must ask for at least one GPU or one CPU core")
        if self.gpu_milli is not None and self.gpus != 1:
            raise ValueError(f"gpu_milli ({self.gpu_milli}) is a share of one GPU: only a job "
                             f"of gpus=1 may give it, this one asks for {self.gpus}")
        for key in self.env:
            if not key or "=" in key or len(key) > 256:
                raise ValueError(f"env key {key!r} is not a valid variable name")

    @property
    def array_kind(self) -> str:
        """Which SODA array family the job belongs to: cpu, small or large."""
        if self.gpus == 0:
            return "cpu"
        return "large" if self.gpus >= LARGE_JOB_GPUS else "small"


@dataclass(frozen=True)
class NodeAllocation:
    """The concrete resources of one node given to one job."""

    node: str = bounded(pattern=NAME_PATTERN)
    gpus: tuple[int, ...] = ()
    cpus: tuple[int, ...] = ()
    memory_mib: int = bounded(0, min=0)
    # The GPUs are shared with other jobs (a fractional job, or one pre-scheduled onto GPUs
    # whose job is saving its model), not held whole; see masterd.core.cluster.
    shared: bool = False


@dataclass(frozen=True)
class Placement:
    allocations: tuple[NodeAllocation, ...]

    @functools.cached_property
    def nodes(self) -> tuple[str, ...]:
        # Cached in the instance dict (frozen dataclasses allow that; eq, hash and the wire
        # form see fields only): read per event and per listed job on the master's hot path.
        return tuple(a.node for a in self.allocations)

    @property
    def gpu_count(self) -> int:
        return sum(len(a.gpus) for a in self.allocations)


@dataclass
class Job:
    """The master's record of one job (mutable: state moves as events arrive)."""

    id: str
    spec: JobSpec
    submit_time: float
    state: JobState = JobState.QUEUED
    placement: Placement | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    attempts: int = 0
    # Per-node state of a starting/running job: node -> "preparing"|"running"|"exited".
    node_states: dict[str, str] = field(default_factory=dict)
    # Higher sorts first among jobs re-queued at the head of their array (preemption).
    requeue_priority: int = 0
    # Being stopped (cancelled, preempted or a rank failed): its parts are told to exit.
    stopping: bool = False
    start_failures: int = 0
    # Predictions features attach for policies to read (key -> value, e.g. QSSF's
    # "duration_estimate_s"); see JobActions.annotate in masterd/runtime/context.py. Not part
    # of the journalled row: the feature that computes them attaches them again on restore.
    annotations: dict[str, float] = field(default_factory=dict)
    # Who holds the job back from scheduling: "" (nobody), "user" or "admin"; only an admin
    # releases an admin's hold. Journalled.
    held: str = ""
    # Why a queued job waits (a WaitReason value, "" when it does not); ``reason`` is the
    # sentence. Journalled with the reason.
    wait: str = ""
    # The state a job being stopped ends in once its parts have exited (cancelled, timeout),
    # "" for the ordinary exit rules. Journalled: a restarted master still ends it so.
    end_as: str = ""
    # Times the job was requeued after a failure (its node lost, a GPU fallen off the bus);
    # with the job id it names an incarnation: a node runs only the newest. Journalled.
    restarts: int = 0
    # The admission gates that keep this queued job from the policy (a WaitReason value ->
    # the sentence); see SchedulingCore.set_gate. Not journalled: the features that set
    # them set them again on restore.
    gates: dict[str, str] = field(default_factory=dict)

    @property
    def queued_seconds(self) -> float | None:
        if self.start_time is None:
            return None
        return self.start_time - self.submit_time
