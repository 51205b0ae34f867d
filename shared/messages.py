"""Bodies of the messages on the node channel; each is decoded with :func:`shared.schema.decode`.

Node → master: ``hello``, ``job_started``, ``job_exited``, ``gpu_util``, ``gpu_health``,
``contention``, ``cores_changed``, ``job_metric``, ``job_usage``, ``job_phase``.
Master → node: ``prepare_job``, ``start_job``, ``stop_job``, ``forget_job``, ``signal_job``,
``read_log`` (answered with a :class:`LogData` body), ``reset_gpu``.

Fencing (docs/high-availability.md, "Fencing on the nodes"): every command carries the
master's leadership ``epoch`` and the node refuses one older than the newest it has seen
(error ``stale_epoch``); a command about one job part names its incarnation, the job id and
its ``restarts`` (the times the job was requeued), and a node runs only the newest.

The node lease (shared/nodelease.py): the ack of a hello gives the master's node loss terms
(:class:`HelloAck`), a launch says whether the master would requeue the part if the node
were lost (``PrepareJob.requeue_if_lost``), and a node cut off from every master stops such
parts itself before the master requeues them; it reports them ``fenced``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.model import NAME_PATTERN, SIGNAL_NAMES, JobSpec, NodeAllocation, NodeInventory
from shared.nodelease import LeaseTerms
from shared.relay import MAX_CHUNK, MAX_WINDOW
from shared.schema import bounded

# Upper bounds on the wire of a master's leadership epoch and of a job's restart count.
MAX_EPOCH = 1 << 62
MAX_RESTARTS = 1 << 31


@dataclass(frozen=True)
class JobReport:
    """What a node knows about one job when it (re)connects."""

    job_id: str = bounded(pattern=NAME_PATTERN)
    state: str = bounded(pattern=r"prepared|running|exited")
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    # The part's incarnation (with the job id): the job's restart count it was prepared for.
    restarts: int = bounded(0, min=0, max=MAX_RESTARTS)
    # The node stopped the part on its own, cut off from every master (its lease ran out:
    # docs/high-availability.md); `reason` says when and why.
    fenced: bool = False
    # Why it exited, when the node knows more than the status says.
    reason: str = bounded("", max_len=512)
    # The GPUs the part holds on the node (its allocation): what the master must not give
    # to another job while a part it does not own still runs (masterd.core.cluster holds).
    gpus: tuple[int, ...] = bounded(default_factory=tuple, min=0, max_len=4096)


@dataclass(frozen=True)
class Hello:
    inventory: NodeInventory
    jobs: tuple[JobReport, ...] = bounded(default_factory=tuple, max_len=10_000)
    version: str = bounded("", max_len=64)
    # The newest master epoch this node has seen (kept in its state directory): a master
    # leading at an older one is refused with ``stale_epoch``. The hello's ack carries the
    # master's own epoch and its node lease (HelloAck).
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)


@dataclass(frozen=True)
class HelloAck:
    """The master's answer to a node's hello (the body of its ``ack``)."""

    # The epoch this master leads at; the node remembers it and refuses older ones.
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)
    # The master's node loss terms, `{node_lost_s, margin_s, max_grace_s}`: a node that
    # hears nothing from a leading master for node_lost_s - margin_s - a part's grace (at
    # most max_grace_s) stops each part launched with requeue_if_lost, before the master
    # requeues it elsewhere (shared/nodelease.py); nil, or node_lost_s 0: it stops nothing.
    lease: LeaseTerms | None = None
    # The master's clock (seconds since the epoch) when it acked: the node learns how far its
    # own clock is from the master's, to judge a command's ``expires_at`` (StartJob) in the
    # master's time. nil: an older master, whose commands carry no deadline.
    time: float | None = bounded(None, min=0)


@dataclass(frozen=True)
class JobStarted:
    job_id: str = bounded(pattern=NAME_PATTERN)
    pid: int = bounded(min=1)
    # The incarnation that started (the job's restart count it was prepared for).
    restarts: int = bounded(0, min=0, max=MAX_RESTARTS)


@dataclass(frozen=True)
class JobExited:
    job_id: str = bounded(pattern=NAME_PATTERN)
    exit_code: int | None = None
    signal: int | None = None
    # Why, when the node knows more than the status says (e.g. "out of memory: ...").
    reason: str = bounded("", max_len=512)
    # The incarnation that exited (the job's restart count it was prepared for).
    restarts: int = bounded(0, min=0, max=MAX_RESTARTS)
    # The node stopped the part on its own, cut off from every master (see `reason`): the
    # master settles the job as after a node loss (requeued or ended node_lost), not as a
    # failure of the job.
    fenced: bool = False


@dataclass(frozen=True)
class GpuUtil:
    index: int = bounded(min=0, max=1023)
    utilization_pct: float = bounded(min=0, max=100)
    band: str = bounded(pattern=r"idle|low|medium|high")
    job_id: str | None = bounded(None, pattern=NAME_PATTERN)


@dataclass(frozen=True)
class GpuHealth:
    index: int = bounded(min=0, max=1023)
    healthy: bool = True
    reason: str = bounded("", max_len=512)
    # The Xid that took the GPU out of service (shared/xid.py says what it means); nil for a
    # return to service and for faults without one (NVML lost the device, reset required).
    xid: int | None = bounded(None, min=0, max=1 << 31)


CONTENTION_ACTIONS = r"mba|cores|restore_mba|restore_cores"


@dataclass(frozen=True)
class NetPartitionSwitch:
    """The node's network partition (SODA §V-E) went on or off: while ``active``, GPU jobs are
    guaranteed ``gpu_share`` of ``interface`` and CPU jobs ``cpu_share``; ``jobs`` are the
    multi-node GPU jobs that call for it."""

    active: bool
    interface: str = bounded(max_len=15)
    link_mbit: int = bounded(min=0, max=10_000_000)
    gpu_share: float = bounded(min=0, max=1)
    cpu_share: float = bounded(min=0, max=1)
    jobs: tuple[str, ...] = bounded(default_factory=tuple, pattern=NAME_PATTERN, max_len=10_000)
    reason: str = bounded("", max_len=512)


@dataclass(frozen=True)
class Contention:
    """The node's contention eliminator changed a job's share (SODA V-E).

    ``value`` is the new setting: for ``mba``/``restore_mba`` the job's memory-bandwidth level in
    percent of unthrottled, for ``cores``/``restore_cores`` the number of cores it keeps.
    """

    job_id: str = bounded(pattern=NAME_PATTERN)
    action: str = bounded(pattern=CONTENTION_ACTIONS)
    value: int = bounded(min=0, max=1 << 20)
    reason: str = bounded("", max_len=512)
    previous: int | None = bounded(None, min=0, max=1 << 20)


MEM_BANDWIDTH_REPORT_EVERY_S = 30.0  # a measuring node reports at least this often


@dataclass(frozen=True)
class MemBandwidth:
    """The node's memory bandwidth as its contention monitor measured it over the last
    ``window_s`` (SODA §V-D, §V-E), in GB/s: ``used`` by everything on the node, and
    ``limit``, the eliminator's threshold share of the node's peak. The inference placer puts
    CPU replicas where the limit leaves room. Sent when it changes by a twentieth of the
    limit, and at least every few tens of seconds while the node measures."""

    used_gbps: float = bounded(min=0, max=1e6)
    limit_gbps: float = bounded(min=0, max=1e6)
    window_s: float = bounded(min=0, max=86_400)


@dataclass(frozen=True)
class CorePlan:
    """SODA's adaptive CPU allocator for one job part (§V-B): the node tunes the part's core
    count inside its allocation, starting from ``n_start`` (the master's N_start)."""

    n_start: int = bounded(min=1, max=65536)
    # N_start came from the owner's history (the tuner trusts it within a few cores).
    warm: bool = False
    # Cores the part runs on when tuning begins (N_start, clamped to the allocation).
    launch_cores: int = bounded(1, min=1, max=65536)
    min_cores: int = bounded(1, min=1, max=65536)


@dataclass(frozen=True)
class CoresChanged:
    """A tuning step re-pinned a running job part (§V-B2): it now runs on ``pinned`` and holds
    ``cpus`` (a superset the tuner may still need); cores it held before and not now are
    free. ``utilisation`` is the mean GPU utilisation of the window just measured at
    ``measured_cores``; ``converged`` marks the last step (``pinned`` is the best fit)."""

    job_id: str = bounded(pattern=NAME_PATTERN)
    cpus: tuple[int, ...] = bounded(min=0, max=65535, max_len=65536)
    pinned: tuple[int, ...] = bounded(min=0, max=65535, max_len=65536)
    step: int = bounded(min=0, max=1 << 20)
    utilisation: float | None = bounded(None, min=0, max=100)
    measured_cores: int | None = bounded(None, min=1, max=65536)
    converged: bool = False
    reason: str = bounded("", max_len=256)

    def __post_init__(self) -> None:
        if not self.cpus:
            raise ValueError("cpus must not be empty: a running job holds at least one core")
        if len(set(self.cpus)) != len(self.cpus):
            raise ValueError(f"cpus {list(self.cpus)} lists a core twice")
        if not self.pinned or not set(self.pinned) <= set(self.cpus):
            raise ValueError(
                f"pinned {list(self.pinned)} must be a non-empty subset of cpus {list(self.cpus)}"
            )


@dataclass(frozen=True)
class PrepareJob:
    job_id: str = bounded(pattern=NAME_PATTERN)
    spec: JobSpec
    allocation: NodeAllocation
    node_rank: int = bounded(0, min=0)
    nnodes: int = bounded(1, min=1)
    # Set when the job's core count is tuned on the node; None pins the allocation as is.
    cores: CorePlan | None = None
    # The incarnation to prepare (with the job id): the job's restart count. A part of an
    # older incarnation still on the node is stopped (reported with ``stale_part``).
    restarts: int = bounded(0, min=0, max=MAX_RESTARTS)
    # The master's leadership epoch (set on every command the master sends); a node that
    # has seen a newer one refuses the command with ``stale_epoch``.
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)
    # The SIGTERM-to-SIGKILL grace of the part when the node stops it on its own (the job's
    # stop.grace_s, else the master's stop_grace_s, at most max_grace_s, at launch).
    grace_s: float = bounded(10.0, min=0, max=3600)
    # The master would requeue the job if this node were lost (its stop.requeue, else
    # requeue_default, and restarts left under max_requeues, at launch): a node cut off
    # from every master stops such a part before the master could requeue it elsewhere
    # (the lease in the hello's ack; docs/high-availability.md).
    requeue_if_lost: bool = False
    # Every node of the job, in rank order (Slurm's SLURM_JOB_NODELIST; docs/slurm.md).
    nodes: tuple[str, ...] = bounded(default_factory=tuple, pattern=NAME_PATTERN, max_len=4096)


@dataclass(frozen=True)
class StartJob:
    job_id: str = bounded(pattern=NAME_PATTERN)
    master_addr: str = bounded(max_len=255)
    master_port: int = bounded(min=1, max=65535)
    # The incarnation to start: refused (``stale_incarnation``) unless it is the one prepared.
    restarts: int = bounded(0, min=0, max=MAX_RESTARTS)
    # The master's leadership epoch (set on every command the master sends); a node that
    # has seen a newer one refuses the command with ``stale_epoch``.
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)
    # When the master stops waiting for this start (its clock, seconds since the epoch): a
    # node that reads the command later (it was frozen, its link was cut, the frame sat in a
    # buffer) refuses it with ``expired`` instead of starting a part the master has given up
    # on, perhaps cancelled and acknowledged since. nil: no deadline.
    expires_at: float | None = bounded(None, min=0)


@dataclass(frozen=True)
class StopJob:
    job_id: str = bounded(pattern=NAME_PATTERN)
    grace_s: float = bounded(10.0, min=0, max=3600)
    reason: str = bounded("", max_len=256)
    # The incarnation to stop: a newer part of the job is left alone. None: whichever runs.
    restarts: int | None = bounded(None, min=0, max=MAX_RESTARTS)
    # The signal the part gets first (None: SIGTERM); SIGKILL follows after grace_s.
    warning: str | None = bounded(None, pattern="|".join(SIGNAL_NAMES))
    # A priority class's preemption: the node writes the reason to the job's
    # $TRELLIS_PREEMPTED_FILE before the warning.
    preempted: bool = False
    # The master's leadership epoch (set on every command the master sends); a node that
    # has seen a newer one refuses the command with ``stale_epoch``.
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)


@dataclass(frozen=True)
class ForgetJob:
    """The master has durably recorded the job's exit; the node may drop its state."""

    job_id: str = bounded(pattern=NAME_PATTERN)
    # The incarnation whose exit was recorded: a newer part's record is kept. None: any.
    restarts: int | None = bounded(None, min=0, max=MAX_RESTARTS)
    # The master's leadership epoch (set on every command the master sends); a node that
    # has seen a newer one refuses the command with ``stale_epoch``.
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)


@dataclass(frozen=True)
class ListParts:
    """Ask a connected node for every part it holds (what its hello reports): the master
    asks when the node refuses GPUs the master thought free, to find what holds them."""

    epoch: int = bounded(0, min=0, max=MAX_EPOCH)


@dataclass(frozen=True)
class PartList:
    """The answer to ``list_parts``."""

    jobs: tuple[JobReport, ...] = bounded(default_factory=tuple, max_len=10_000)


# A job's output travels in chunks of at most this many bytes: a read_log answer (data and a
# few fields) must fit in one node-channel frame (shared.protocol.MAX_FRAME, 1 MiB).
MAX_LOG_CHUNK = 960 * 1024
# The longest a read_log may wait for output to grow (the master's RPC caps it lower).
MAX_LOG_WAIT_S = 60.0


@dataclass(frozen=True)
class ReadLog:
    """Read one chunk of a job part's output on this node (stdout and stderr, as the shim
    wrote them). ``offset`` None starts ``tail`` lines from the end (0: at the end), or at 0.
    With ``wait_s`` and nothing new at ``offset`` while the part may still write, the node
    waits (at most that long) until the output grows or the part ends. ``pending``: the
    master placed the part here and it may not have started yet, so a missing log is empty
    output to come, not an error."""

    job_id: str = bounded(pattern=NAME_PATTERN)
    # Byte of the log to read from; nil: `tail` lines from the end, or the beginning.
    offset: int | None = bounded(None, min=0, max=1 << 62)
    # With no offset: start this many lines before the end (0: at the end).
    tail: int | None = bounded(None, min=0, max=1 << 31)
    # The most bytes to answer with; 0 asks only for the size (a wait for growth).
    max_bytes: int = bounded(MAX_LOG_CHUNK, min=0, max=MAX_LOG_CHUNK)
    # With nothing new at the offset while the part may write: wait up to this long.
    wait_s: float = bounded(0.0, min=0, max=MAX_LOG_WAIT_S)
    # The master placed the part here: a missing log is output to come, not an error.
    pending: bool = False
    # The master's leadership epoch (set on every command the master sends); a node that
    # has seen a newer one refuses the command with ``stale_epoch``.
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)


@dataclass(frozen=True)
class LogData:
    """The answer to ``read_log``: ``data`` is the output from ``offset`` (where the read
    began: the asked offset, or where the tail begins); ``size`` the log's size when read;
    ``done``: the part has ended and ``data`` reaches the end of its log (nothing more will
    come)."""

    # The output read (at most 960 KiB, MAX_LOG_CHUNK).
    data: bytes
    # Where in the log `data` begins.
    offset: int = bounded(min=0, max=1 << 62)
    # The log's size when it was read.
    size: int = bounded(min=0, max=1 << 62)
    # The part has ended and `data` reaches the end of its log: nothing more will come.
    done: bool = False

    def __post_init__(self) -> None:
        if len(self.data) > MAX_LOG_CHUNK:
            raise ValueError(f"data holds {len(self.data)} bytes, at most {MAX_LOG_CHUNK} "
                             "allowed")
        if self.offset + len(self.data) > self.size:
            raise ValueError(f"data ends at {self.offset + len(self.data)}, past the log's "
                             f"size {self.size}")
@dataclass(frozen=True)
class ResetGpu:
    """An operator returns a GPU to service (trellisctl gpu reset): the node clears the
    fault its health tracking holds, so the GPU reports healthy again. The answer's
    ``recovered`` is false when the node held no fault on it."""

    index: int = bounded(min=0, max=1023)
    # The master's leadership epoch, as on every command.
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)


@dataclass(frozen=True)
class RelayOpen:
    """Master to node: open stream ``stream`` into job ``job_id``'s part here: its terminal
    (``pty``) or a TCP connection to 127.0.0.1:``port`` (``tcp``, which a process of the job
    must listen on). ``probe``: only check that it could be opened, and open nothing."""

    stream: int = bounded(min=1, max=1 << 62)
    job_id: str = bounded(pattern=NAME_PATTERN)
    kind: str = bounded(pattern=r"pty|tcp")
    # Bytes the node may send before an ack (the credit of module shared.relay).
    window: int = bounded(min=MAX_CHUNK, max=MAX_WINDOW)
    restarts: int = bounded(0, min=0, max=MAX_RESTARTS)
    port: int = bounded(0, min=0, max=65535)
    # The client terminal's size (pty): set on the job's terminal as it is attached.
    rows: int = bounded(0, min=0, max=10000)
    cols: int = bounded(0, min=0, max=10000)
    probe: bool = False
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)


@dataclass(frozen=True)
class SignalJob:
    """Send a signal to a running job part (its time limit's warning, Slurm's --signal): to
    every process of the job's process group, or with ``leader_only`` to its leader (the
    batch shell) alone. The answer's ``delivered`` is false when the part no longer runs."""

    job_id: str = bounded(pattern=NAME_PATTERN)
    signal: str = bounded(pattern="|".join(SIGNAL_NAMES))
    # Only the job's leader process (the batch shell), not its process group.
    leader_only: bool = False
    # The incarnation to signal: another one is not signalled (``delivered`` false). None:
    # whichever runs.
    restarts: int | None = bounded(None, min=0, max=MAX_RESTARTS)
    # The master's leadership epoch (set on every command the master sends); a node that
    # has seen a newer one refuses the command with ``stale_epoch``.
    epoch: int = bounded(0, min=0, max=MAX_EPOCH)


@dataclass(frozen=True)
class SignalSent:
    """The answer to ``signal_job``."""

    # False when the part no longer runs here (or is another incarnation).
    delivered: bool


# What a job may report on its metrics channel (noded/metrics_channel.py): lower-case names.
METRIC_NAME_PATTERN = r"[a-z][a-z0-9_]{0,31}"


@dataclass(frozen=True)
class JobMetric:
    """Values a job reported on its metrics channel since the last event of this name.

    ``value`` is their mean, ``last`` the newest, ``count`` how many lines they came from. The
    node sends at most one event per job and name per ``job_metrics_interval_s``.
    """

    job_id: str = bounded(pattern=NAME_PATTERN)
    name: str = bounded(pattern=METRIC_NAME_PATTERN)
    value: float = bounded(min=0, max=1e15)
    last: float = bounded(min=0, max=1e15)
    count: int = bounded(1, min=1, max=1 << 32)


@dataclass(frozen=True)
class JobUsage:
    """What one job part really used on its node (Liquid §4): sent when the part exits
    (``final``) and every ``usage_report_s`` while it runs, each covering the whole run so far.

    CPU from the job's cgroup CPU accounting (peak over sampling intervals, in cores), memory
    from its cgroup (peak), GPU utilisation over the part's GPUs (mean and standard deviation
    of the samples, percent), GPU memory from the per-process figures (peak, MiB), network
    bytes from the kernel's counters for the job's cgroup. ``None``: not measurable here
    (the reason is in the node's log)."""

    job_id: str = bounded(pattern=NAME_PATTERN)
    seconds: float = bounded(min=0, max=1e9)  # how long the part has run
    samples: int = bounded(0, min=0, max=1 << 32)
    cpu_peak: float | None = bounded(None, min=0, max=1e6)
    cpu_mean: float | None = bounded(None, min=0, max=1e6)
    memory_peak_mib: float | None = bounded(None, min=0, max=1e12)
    gpu_util_mean: float | None = bounded(None, min=0, max=100)
    gpu_util_std: float | None = bounded(None, min=0, max=100)
    gpu_memory_peak_mib: float | None = bounded(None, min=0, max=1e12)
    net_tx_bytes: int | None = bounded(None, min=0, max=1 << 62)
    net_rx_bytes: int | None = bounded(None, min=0, max=1 << 62)
    final: bool = False
    # Liquid §6.1's phases as the part's GPU utilisation showed them (15% crossings): the
    # launching phase, and (final reports only) the post phase from its start to the exit.
    pre_s: float | None = bounded(None, min=0, max=1e9)
    post_s: float | None = bounded(None, min=0, max=1e9)


@dataclass(frozen=True)
class JobPhase:
    """A job part entered a phase (Liquid §6.1): ``post`` when its GPU utilisation fell below
    the threshold after having been above it (training is over; it is saving its model)."""

    job_id: str = bounded(pattern=NAME_PATTERN)
    phase: str = bounded(pattern=r"post")
    gpu_util: float = bounded(min=0, max=100)  # the utilisation that crossed the threshold
    pre_s: float | None = bounded(None, min=0, max=1e9)  # launching phase it had, if seen


@dataclass(frozen=True)
class StalePart:
    """The node stopped (or dropped, if it had not started) a part of an older incarnation
    of a job on its own, because the master asked it to prepare a newer one; the master
    journals it (``trellisctl events``). The part's exit follows as ``job_exited``."""

    job_id: str = bounded(pattern=NAME_PATTERN)
    # The incarnation stopped, and the newer one the master asked for.
    restarts: int = bounded(min=0, max=MAX_RESTARTS)
    newer: int = bounded(min=0, max=MAX_RESTARTS)
    # "running": stopped (its exit follows); "prepared": dropped before it started.
    state: str = bounded(pattern=r"prepared|running")
    reason: str = bounded("", max_len=512)


NODE_EVENTS = {
    "hello": Hello,
    "job_started": JobStarted,
    "job_exited": JobExited,
    "gpu_util": GpuUtil,
    "gpu_health": GpuHealth,
    "contention": Contention,
    "mem_bandwidth": MemBandwidth,
    "net_partition": NetPartitionSwitch,
    # The name before partitions of the cluster took the word: nodes not yet upgraded send it.
    "partition": NetPartitionSwitch,
    "cores_changed": CoresChanged,
    "job_metric": JobMetric,
    "job_usage": JobUsage,
    "job_phase": JobPhase,
    "stale_part": StalePart,
}
NODE_COMMANDS = {
    "prepare_job": PrepareJob,
    "start_job": StartJob,
    "stop_job": StopJob,
    "forget_job": ForgetJob,
    "list_parts": ListParts,
    "signal_job": SignalJob,
    "read_log": ReadLog,
    "reset_gpu": ResetGpu,
    # A job's terminal or TCP port, relayed (shared/relay.py, docs/interactive.md).
    "relay_open": RelayOpen,
}
# Commands whose ``ack`` carries a body of its own (the others answer an empty map or a few
# fields named in their docstrings).
NODE_COMMAND_REPLIES = {
    "read_log": LogData,
    "signal_job": SignalSent,
    "list_parts": PartList,
}
# Node events whose ``ack`` carries a body (the others are answered with an empty one).
NODE_EVENT_REPLIES = {
    "hello": HelloAck,
}


def utilisation_band(pct: float) -> str:
    if pct < 5:
        return "idle"
    if pct < 30:
        return "low"
    if pct < 70:
        return "medium"
    return "high"
