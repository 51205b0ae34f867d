"""What the replay's nodes measure of the jobs they run, through noded's and the master's code.

Liquid learns from the usage earlier runs left (§4.2). In the replay those runs are simulated
(:class:`MeteredSimulator`: a :class:`~sim.liquid_sim.LiquidSimulator` with the parameter
servers' traffic) and every part of a job — one per node, as noded runs them — is metered as
noded meters it (``noded/usage/collector.py``): a GPU utilisation sample every
``interval_s`` into noded's accumulator (:class:`noded.policy.stats.Running`), the bytes
through the part's sockets counted, the peak GPU memory kept; at the part's exit a final
:class:`shared.messages.JobUsage` is built, passed through the wire schema (encode, decode:
the bounds the master enforces) and turned into the model's labels by the master's own
:func:`masterd.features.liquid.jobfeatures.labels_of` (per-task figures over the part's
workers, as ``masterd/features/liquid/feature.py`` journals them).

What is measured is what the simulated run did — its placement, the flows it shared NICs
with, its launching phase (no GPU work, no traffic) — not the traffic model's formula for an
idealised placement. Measurement noise is drawn apart from the truth, with stated sizes:

* ``util_noise_pct``: each utilisation sample off by a Gaussian of this many percentage points
  (NVML's utilisation is a sampled counter), clipped to 0–100;
* ``bytes_noise``: a part's byte count off by a lognormal factor of this sigma (the counters
  count every byte of the job's sockets: retransmissions, headers, traffic besides the
  gradients);
* ``memory_noise``: a part's peak GPU memory off by a lognormal factor of this sigma (the
  framework's allocator).

A part without GPUs (a PS alone on its node) has no GPU samples, as on a node.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from masterd.features.liquid.jobfeatures import features_of, labels_of
from noded.policy.stats import Running
from shared.messages import JobUsage
from shared.model import JobSpec
from shared.schema import decode, encode
from sim.engine import _Run
from sim.liquid_sim import LiquidSimulator

# Peak GPU memory of one worker per model (MiB, batch 32 on a T4): the truth the meter reads.
MEMORY_MIB = {"resnet50": 5200.0, "inception-v3": 4600.0, "vgg16": 7400.0}

Row = tuple[dict[str, float], dict[str, float]]


@dataclass(frozen=True)
class MeterConfig:
    interval_s: float = 1.0  # noded's usage_interval_s default
    util_noise_pct: float = 5.0
    bytes_noise: float = 0.10
    memory_noise: float = 0.05


@dataclass
class _Part:
    gpus: int
    util: Running = field(default_factory=Running)
    megabytes: float = 0.0


@dataclass
class _Track:
    started: float
    startup_end: float
    parts: dict[str, _Part]
    since: float  # start of the current segment
    util: float = 0.0  # GPU utilisation while training in the segment, 0..1
    rates: dict[str, float] = field(default_factory=dict)  # node -> MB/s while training
    next_sample: float = 0.0


class UsageMeter:
    """Per job part: samples and counters over piecewise-constant segments of a run."""

    def __init__(self, config: MeterConfig, seed: int) -> None:
        self.config = config
        self.rng = random.Random(f"liquid-meter/{seed}")
        self.tracks: dict[str, _Track] = {}

    def segment(self, job_id: str, run: _Run, now: float, util: float,
                rates: Mapping[str, float]) -> None:
        """From ``now`` the job trains at ``util`` with ``rates`` (closing what came before)."""
        track = self.tracks.get(job_id)
        if track is None:
            parts = {a.node: _Part(len(a.gpus)) for a in run.placement.allocations}
            track = self.tracks[job_id] = _Track(run.started, run.startup_end, parts, now,
                                                 next_sample=run.started)
        else:
            self.close(job_id, now)
        track.util, track.rates = util, dict(rates)

    def close(self, job_id: str, now: float) -> None:
        track = self.tracks.get(job_id)
        if track is None or now <= track.since:
            return
        begin, end = track.since, now
        training = max(0.0, end - max(begin, track.startup_end))
        for node, rate in track.rates.items():
            part = track.parts.get(node)
            if part is not None:
                part.megabytes += rate * training
        step = self.config.interval_s
        t = track.next_sample
        while t < end:
            truth = 100.0 * track.util if t >= track.startup_end else 0.0
            for part in track.parts.values():
                if part.gpus:
                    noisy = truth + self.rng.gauss(0.0, self.config.util_noise_pct)
                    part.util.add(min(100.0, max(0.0, noisy)))
            t += step
        track.next_sample = t
        track.since = end

    def finish(self, job_id: str, spec: JobSpec, now: float) -> list[Row]:
        """The part's final reports as the master turns them into training rows."""
        self.close(job_id, now)
        track = self.tracks.pop(job_id, None)
        if track is None:
            return []
        rows: list[Row] = []
        features = features_of(spec)
        seconds = max(0.0, now - track.started)
        for part in track.parts.values():
            total = part.megabytes * 1e6 * math.exp(self.rng.gauss(0.0, self.config.bytes_noise))
            memory = None
            if part.gpus and (truth := MEMORY_MIB.get((spec.model_type or "").lower())):
                memory = truth * math.exp(self.rng.gauss(0.0, self.config.memory_noise))
            usage = JobUsage(
                job_id=job_id, seconds=seconds, samples=part.util.count,
                gpu_util_mean=part.util.value(),
                gpu_util_std=part.util.std if part.util.count else None,
                gpu_memory_peak_mib=memory,
                net_tx_bytes=int(total / 2), net_rx_bytes=int(total - total // 2),
                final=True)
            wire = decode(JobUsage, encode(usage))
            report = {k: v for k, v in dataclasses.asdict(wire).items() if k != "job_id"}
            labels = labels_of(report, max(1, part.gpus))
            if labels:
                rows.append((dict(features), labels))
        return rows


class MeteredSimulator(LiquidSimulator):
    """A replay whose nodes meter the jobs they run (``rows``: the training rows)."""

    def __init__(self, *args: Any, meter: UsageMeter, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.meter = meter
        self.rows: list[Row] = []

    def _reprice(self, run: _Run, now: float) -> None:
        super()._reprice(run, now)
        rates = self.network.part_rates(run.job_id) if self.network is not None else {}
        # The GPU's busy share as the truth has it (computing over the iteration's time).
        self.meter.segment(run.job_id, run, now, min(1.0, max(0.0, run.efficiency)), rates)

    def _end_run(self, job_id: str, now: float) -> _Run | None:
        metered = job_id in self.meter.tracks
        if metered:
            self.meter.close(job_id, now)
        run = super()._end_run(job_id, now)
        if metered:
            self.rows.extend(self.meter.finish(job_id, self.core.jobs[job_id].spec, now))
        return run
