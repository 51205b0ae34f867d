"""Ground truth for parameter-server traffic on the nodes' NICs (Liquid's testbed, §5.1, §7.4).

Liquid's jobs synchronise through a parameter server each iteration (Eq. 1: ``T = T_l +
N(T_t + T_sy) + T_sa``): every worker pushes its gradients to the PS and pulls the parameters
back, ``2·G`` bytes for a model of ``G`` bytes. The PS of a job runs with rank 0, on the node of
the placement's first allocation. A worker on the PS's node exchanges over the node itself
(``local_mbps``); a worker elsewhere sends a flow through both nodes' NICs, which all flows
through that NIC share equally (``nic_mbps`` each way). One iteration then takes

    T = t_compute + max over the job's workers of 2·G / (bandwidth of that worker's flow)

and the job's speed relative to computing alone is ``t_compute / T``. Distances of Liquid's
score (rack, domain) do not change bandwidth here: the testbed is one network of 15 Gbps
NICs. The figures per model (gradient size, compute time per iteration on a T4) are inputs
the study documents, not fitted.

Calibration (:func:`calibrate`): the paper measured what one worker exchanges — a VGG-16
worker's traffic "can reach 200 MB/s" (§5.1, Fig. 4, read as the per-second rate a monitor
shows, i.e. bytes per iteration over the iteration's time). A model of full parameter-sized
exchanges at 15 Gbps gives a lone VGG-16 worker about 945 MB/s, nearly five times that. The
calibration keeps the compute times and the ratio between the models' sizes and scales every
model's exchanged bytes by one factor, so that a lone worker of the reference model (its PS
on another node, nothing else on either NIC) exchanges the measured rate:
``B / (t_compute + B / nic) = rate``, hence ``B = rate · t_compute / (1 − rate / nic)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from shared.model import Placement


@dataclass(frozen=True)
class SyncProfile:
    gradient_mb: float  # G: pushed and pulled each iteration (the model's size, uncalibrated)
    compute_s: float  # one iteration of one worker, computing alone


def lone_worker_mbps(profile: SyncProfile, nic_mbps: float) -> float:
    """MB/s a lone worker exchanges with its PS on another node (nothing else on the NICs):
    ``2·G`` per iteration over the iteration's time."""
    exchanged = 2.0 * profile.gradient_mb
    return exchanged / (profile.compute_s + exchanged / nic_mbps)


def calibrate(profiles: Mapping[str, SyncProfile], reference: str, worker_mbps: float,
              nic_mbps: float) -> tuple[dict[str, SyncProfile], float]:
    """Profiles whose exchanged bytes are scaled by one factor so that a lone worker of
    ``reference`` exchanges ``worker_mbps`` on ``nic_mbps`` NICs; and the factor."""
    if not 0 < worker_mbps < nic_mbps:
        raise ValueError(f"a worker's measured rate must be positive and below the NIC's "
                         f"({worker_mbps} MB/s against {nic_mbps} MB/s)")
    base = profiles.get(reference)
    if base is None or base.gradient_mb <= 0:
        raise ValueError(f"no profile with traffic for the reference model {reference!r}")
    exchanged = worker_mbps * base.compute_s / (1.0 - worker_mbps / nic_mbps)
    scale = exchanged / (2.0 * base.gradient_mb)
    return ({name: replace(p, gradient_mb=p.gradient_mb * scale)
             for name, p in profiles.items()}, scale)


@dataclass
class _Job:
    ps: str
    workers: dict[str, int]  # node -> workers of the job there
    profile: SyncProfile


class PsNetwork:
    def __init__(self, nic_mbps: float, local_mbps: float,
                 profiles: Mapping[str, SyncProfile]) -> None:
        if not (nic_mbps > 0 and local_mbps > 0):
            raise ValueError("NIC and local bandwidth must be positive")
        self.nic_mbps = nic_mbps
        self.local_mbps = local_mbps
        self.profiles = dict(profiles)
        self._jobs: dict[str, _Job] = {}
        self._flows: dict[str, int] = {}  # node -> remote flows through its NIC
        self._on: dict[str, set[str]] = {}  # node -> jobs with a flow through its NIC

    def start(self, job_id: str, model_type: str | None, placement: Placement) -> set[str]:
        """Register a running job; the jobs whose speed its flows change."""
        profile = self.profiles.get((model_type or "").lower())
        workers = {a.node: len(a.gpus) for a in placement.allocations if a.gpus}
        if profile is None or not workers or not placement.allocations:
            return set()
        job = _Job(placement.allocations[0].node, workers, profile)
        self._jobs[job_id] = job
        return self._change(job_id, job, +1)

    def end(self, job_id: str) -> set[str]:
        job = self._jobs.pop(job_id, None)
        return set() if job is None else self._change(job_id, job, -1)

    def _change(self, job_id: str, job: _Job, sign: int) -> set[str]:
        touched: set[str] = set()
        for node, count in job.workers.items():
            if node == job.ps:
                continue
            for nic in (node, job.ps):
                self._flows[nic] = self._flows.get(nic, 0) + sign * count
                jobs = self._on.setdefault(nic, set())
                touched |= jobs
                if sign > 0:
                    jobs.add(job_id)
                else:
                    jobs.discard(job_id)
        touched.discard(job_id)
        return touched

    def factor(self, job_id: str) -> float:
        """Speed relative to computing alone (1.0 for jobs this model does not cover)."""
        job = self._jobs.get(job_id)
        if job is None:
            return 1.0
        bytes_mb = 2.0 * job.profile.gradient_mb
        sync = 0.0
        for node, count in job.workers.items():
            if node == job.ps:
                sync = max(sync, bytes_mb * count / self.local_mbps)
                continue
            share = min(self.nic_mbps / max(1, self._flows.get(node, 0)),
                        self.nic_mbps / max(1, self._flows.get(job.ps, 0)))
            sync = max(sync, bytes_mb / share)
        compute = job.profile.compute_s
        return compute / (compute + sync)

    def part_rates(self, job_id: str) -> dict[str, float]:
        """MB/s through the sockets of each node's part of the job while it trains: its
        workers' exchanges (``2·G`` per iteration each, local or remote) and, on the PS's
        node, the PS's side of every worker's (what a node's byte counters would count)."""
        job = self._jobs.get(job_id)
        if job is None:
            return {}
        exchanged = 2.0 * job.profile.gradient_mb
        step = job.profile.compute_s / self.factor(job_id)
        rates = {node: exchanged * count / step for node, count in job.workers.items()}
        rates[job.ps] = rates.get(job.ps, 0.0) + exchanged * sum(job.workers.values()) / step
        return rates

    def neighbours(self, job_id: str) -> set[str]:
        job = self._jobs.get(job_id)
        if job is None:
            return set()
        found: set[str] = set()
        for node in job.workers:
            if node != job.ps:
                found |= self._on.get(node, set()) | self._on.get(job.ps, set())
        found.discard(job_id)
        return found
