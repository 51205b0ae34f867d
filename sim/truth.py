"""The simulator's ground truth: how fast a job *really* runs on the resources it was given.

This is deliberately separate from anything a scheduling policy predicts. Policies see a
:class:`~shared.model.JobSpec` (model type, batch, declared iterations) and predict with their
own model and coefficients; the simulator decides durations here, with its own coefficients,
seeded per-job noise, a locality penalty for spread placements and an interference penalty for
jobs sharing a PCIe switch or a node's network. See docs/simulator.md for the equations.

Work is measured in *work units* and speed in units per second:

* model-driven jobs (synthetic GENIE tasks, files without a duration): work = batch × iterations
  samples, speed = the processing rate PR of GENIE Eq. 5–8 in samples/s;
* known-duration jobs (Philly, openb, files with a duration): work = the trace duration in
  seconds, speed = PR(actual placement) / PR(reference placement), which is exactly 1.0 when
  the job runs as it ran in the trace (same GPU count, packed, no interference, no noise).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from masterd.core.sched2.locality import spread_slowdown
from shared.model import JobKind, NodeInventory, Placement


@dataclass(frozen=True)
class ModelProfile:
    """True single-GPU speed curve and communication coefficients of one model type.

    ``sPR(b) = k0 + k1·b + k2·b²`` (GENIE Eq. 7) up to the batch where the quadratic peaks,
    flat beyond it (the GPU is saturated; Observation 1). ``gamma``/``lam`` are GENIE Eq. 8's
    γ and λ in GPU-equivalents; ``startup_s`` is Eq. 4's ν.
    """

    k0: float
    k1: float
    k2: float
    gamma: float
    lam: float
    startup_s: float
    # SCHED²'s models: slowdown over two servers (§II-A), extended to other shapes by
    # ``masterd.core.sched2.locality`` instead of Eq. 8 (0: Eq. 8, as for every other model).
    spread_slowdown: float = 0.0

    @classmethod
    def from_shape(
        cls, *, c0: float, peak: float, b_sat: float, gamma: float, lam: float, startup_s: float,
        spread_slowdown: float = 0.0,
    ) -> ModelProfile:
        """A quadratic through (0, c0) whose vertex is (b_sat, peak)."""
        span = peak - c0
        return cls(c0, 2 * span / b_sat, -span / (b_sat * b_sat), gamma, lam, startup_s,
                   spread_slowdown)

    @property
    def saturation_batch(self) -> float:
        return -self.k1 / (2 * self.k2) if self.k2 < 0 else math.inf

    def single_gpu_rate(self, local_batch: float) -> float:
        b = min(local_batch, self.saturation_batch)
        rate = self.k0 + self.k1 * b + self.k2 * b * b
        return max(rate, self.k0, 1e-9)


def _pair(
    c0: float, peak: float, b_sat: float, gamma: float, lam: float, startup_s: float,
    spread_slowdown: float = 0.0,
) -> tuple[ModelProfile, ModelProfile]:
    # Inference: a forward pass only (about 3x the training rate, saturating later) and no
    # gradient synchronisation, hence gamma = 0 (GENIE §5.1.4).
    train = ModelProfile.from_shape(
        c0=c0, peak=peak, b_sat=b_sat, gamma=gamma, lam=lam, startup_s=startup_s,
        spread_slowdown=spread_slowdown,
    )
    infer = ModelProfile.from_shape(
        c0=3 * c0, peak=3 * peak, b_sat=2 * b_sat, gamma=0.0, lam=0.0, startup_s=startup_s
    )
    return train, infer


GENERIC_MODEL = "generic"


def gamma_for_slowdown(slowdown: float, lam: float, gpus: int = 4, servers: int = 2) -> float:
    """γ of GENIE Eq. 8 that makes ``gpus`` GPUs spread evenly over ``servers`` servers run
    ``slowdown`` times slower than on one server, at the same global batch.

    PR ∝ gpus − Comm (Eq. 5), with Comm = λ·γ on one server and b·γ on ``servers`` servers
    (b = ((s−1)·g/s + λ·(g/s − 1)) / (g − 1), Eq. 8), so slowdown R = (g − λγ) / (g − bγ)
    gives γ = g·(R − 1) / (R·b − λ). Used for the locality penalties SCHED² measured (§II-A).
    """
    per_server = gpus / servers
    b = ((servers - 1) * per_server + lam * (per_server - 1)) / (gpus - 1)
    if not (slowdown >= 1.0 and slowdown * b > lam):
        raise ValueError(f"no γ gives a {slowdown:g}× slowdown with λ={lam:g}")
    return gpus * (slowdown - 1.0) / (slowdown * b - lam)


# SCHED² §II-A (Fig. 1): a 4-GPU job over two servers instead of one runs this many times
# slower. These four models are SCHED²'s workload (seeds/sched2.md Table II).
SCHED2_SLOWDOWNS: dict[str, float] = {
    "vgg16": 5.9, "transformer": 2.7, "deepspeech": 1.6, "inception3": 1.4,
}
SCHED2_LAMBDA = 0.25  # the intra-server hop weight; γ is then solved from the slowdown

# The simulator's own coefficients, for a K80-class GPU (GENIE's platform, Table 1). They are
# plausible, not measured: what matters is that the policies under test do not share them.
DEFAULT_PROFILES: dict[str, tuple[ModelProfile, ModelProfile]] = {
    "alexnet": _pair(c0=15, peak=450, b_sat=256, gamma=1.0, lam=0.30, startup_s=20),
    "googlenet": _pair(c0=6, peak=160, b_sat=128, gamma=0.6, lam=0.25, startup_s=25),
    "resnet50": _pair(c0=3, peak=60, b_sat=64, gamma=0.7, lam=0.25, startup_s=30),
    "inception-v3": _pair(c0=2, peak=40, b_sat=64, gamma=0.7, lam=0.25, startup_s=30),
    "lstm": _pair(c0=20, peak=700, b_sat=128, gamma=0.9, lam=0.30, startup_s=15),
    "seq2seq": _pair(c0=10, peak=300, b_sat=128, gamma=0.9, lam=0.30, startup_s=20),
    GENERIC_MODEL: _pair(c0=5, peak=100, b_sat=64, gamma=0.7, lam=0.25, startup_s=20),
    # SCHED²'s models: spreading a job over servers costs what SCHED² measured at 4 GPUs over
    # two servers, and elsewhere what ``masterd.core.sched2.locality`` extends it to (monotone
    # in servers, the paper's order at every shape). γ is still solved from the slowdown, so
    # GENIE's Eq. 8 (the model database) reproduces the measured point, from which the
    # agent's profiles extend it the same way. Their sPR curves are placeholders (K80-like,
    # like the rows above); a known-duration job's speed is a ratio of two placements, which
    # they do not change.
    **{
        name: _pair(c0=c0, peak=peak, b_sat=b_sat, lam=SCHED2_LAMBDA, startup_s=30,
                    gamma=gamma_for_slowdown(SCHED2_SLOWDOWNS[name], SCHED2_LAMBDA),
                    spread_slowdown=SCHED2_SLOWDOWNS[name])
        for name, c0, peak, b_sat in (("vgg16", 4, 120, 64), ("transformer", 10, 300, 128),
                                      ("deepspeech", 3, 80, 64), ("inception3", 2, 40, 64))
    },
}

# Relative speed of GPU models against the K80 the profiles describe; the first matching
# prefix wins. Used only for model-driven jobs: a trace duration already is the real speed.
DEFAULT_GPU_SPEED: tuple[tuple[str, float], ...] = (
    ("K80", 1.0),
    ("P100", 1.9),
    ("V100", 3.0),
    ("T4", 1.3),
    ("A10", 2.2),
    ("A100", 5.0),
    ("G2", 2.0),
    ("G3", 2.5),
)


@dataclass(frozen=True)
class TruthConfig:
    """Knobs of the ground truth. Coefficients are documented in docs/simulator.md."""

    noise_sigma: float = 0.03  # lognormal sigma of each job's intrinsic speed factor
    interference: bool = True
    alpha_pcie: float = 0.08  # slowdown per other GPU job behind one of the job's PCIe switches
    alpha_net: float = 0.15  # slowdown per other multi-node job sharing one of the job's nodes
    beta_switch: float = 0.03  # a job's GPUs on one node span several PCIe switches
    beta_socket: float = 0.08  # ... span several NUMA nodes (sockets)
    batch_ref: float = 32.0  # sensitivity = batch_ref / (batch_ref + local batch)
    min_efficiency: float = 0.05  # PR never drops below this share of ideal linear scaling
    profiles: Mapping[str, tuple[ModelProfile, ModelProfile]] = field(
        default_factory=lambda: dict(DEFAULT_PROFILES)
    )
    gpu_speed: tuple[tuple[str, float], ...] = DEFAULT_GPU_SPEED


@dataclass(frozen=True)
class TruthParams:
    """What the simulator knows about one job that the scheduler does not."""

    model_type: str | None = None  # truth profile; None or unknown -> generic
    batch: int | None = None
    iterations: int | None = None  # the true iteration count (model-driven jobs)
    known_duration: float | None = None  # seconds, as recorded by a trace
    known_gpus: int | None = None  # GPU count the known duration was measured on


@dataclass(frozen=True)
class JobTruth:
    """Per-job constants derived once: how much work, how fast in the ideal case."""

    kind: JobKind
    profile: ModelProfile
    batch: float
    work: float  # work units
    unit_rate: float  # divides PR so that speed is in work units per second
    noise: float  # multiplicative speed factor
    startup_s: float
    lat11: float  # true latency on one GPU, packed, alone (GENIE's Lat(t, <1,1>))
    ideal_gpus: int  # GPU count of the reference run
    model_driven: bool


@dataclass(frozen=True)
class PlacementShape:
    """The parts of a placement the truth model looks at, precomputed at start."""

    nodes: tuple[str, ...]
    gpus: int
    switches: frozenset[tuple[str, int]]  # (node, pcie switch) pairs the job's GPUs sit behind
    spans_switches: bool  # some node holds the job's GPUs behind more than one switch
    spans_sockets: bool
    gpu_models: tuple[str, ...]

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1


def shape_of(placement: Placement, inventories: Mapping[str, NodeInventory]) -> PlacementShape:
    switches: set[tuple[str, int]] = set()
    spans_switches = spans_sockets = False
    models: set[str] = set()
    for alloc in placement.allocations:
        if not alloc.gpus:
            continue
        inv = inventories[alloc.node]
        by_index = {g.index: g for g in inv.gpus}
        node_switches = {by_index[i].pcie_switch for i in alloc.gpus}
        node_numas = {by_index[i].numa_node for i in alloc.gpus}
        models.update(by_index[i].model for i in alloc.gpus)
        switches.update((alloc.node, s) for s in node_switches)
        spans_switches |= len(node_switches) > 1
        spans_sockets |= len(node_numas) > 1
    return PlacementShape(
        nodes=tuple(a.node for a in placement.allocations if a.gpus) or placement.nodes,
        gpus=placement.gpu_count,
        switches=frozenset(switches),
        spans_switches=spans_switches,
        spans_sockets=spans_sockets,
        gpu_models=tuple(sorted(models)),
    )


def comm_penalty(profile: ModelProfile, d_node: int, d_gpn: float) -> float:
    """GENIE Eq. 8: average path length among the job's GPUs, weighted by γ and λ."""
    total = d_node * d_gpn
    if total <= 1:
        return 0.0
    return ((d_node - 1) * d_gpn + profile.lam * (d_gpn - 1)) * profile.gamma / (total - 1)


@dataclass(frozen=True)
class NodeTopology:
    """GPU layout of the cluster's largest nodes: where a trace's reference run is placed."""

    gpus_per_node: int
    gpus_per_switch: int
    gpus_per_numa: int

    @classmethod
    def of(cls, nodes: Iterable[NodeInventory]) -> NodeTopology:
        largest = max(nodes, key=lambda n: (len(n.gpus), n.name), default=None)
        if largest is None or not largest.gpus:
            return cls(1, 1, 1)
        switches = Counter(g.pcie_switch for g in largest.gpus)
        numas = Counter(g.numa_node for g in largest.gpus)
        return cls(len(largest.gpus), max(switches.values()), max(numas.values()))

    def reference(self, gpus: int) -> tuple[int, bool, bool]:
        """(nodes, spans switches, spans sockets) of the tightest packing of ``gpus`` GPUs."""
        d_node = max(1, math.ceil(gpus / max(self.gpus_per_node, 1)))
        per_node = math.ceil(gpus / d_node)
        return d_node, per_node > self.gpus_per_switch, per_node > self.gpus_per_numa


class TruthModel:
    def __init__(self, config: TruthConfig | None = None, seed: int = 0) -> None:
        self.config = config or TruthConfig()
        self.seed = seed
        # placed_rate is pure and called at every re-pricing with few distinct arguments.
        self._rates: dict[tuple[object, ...], tuple[float, float]] = {}

    # -- per-job constants -----------------------------------------------------------------
    def profile_for(self, model_type: str | None, kind: JobKind) -> ModelProfile:
        pair = self.config.profiles.get((model_type or "").lower())
        if pair is None:
            pair = self.config.profiles[GENERIC_MODEL]
        return pair[1] if kind is JobKind.INFERENCE else pair[0]

    def gpu_speed(self, model: str | None) -> float:
        if model:
            for prefix, speed in self.config.gpu_speed:
                if model.upper().startswith(prefix):
                    return speed
        return 1.0

    def rng(self, job_key: str, purpose: str) -> random.Random:
        # Seeding from a string hashes it with SHA-512, so draws do not depend on the order
        # in which jobs are processed nor on PYTHONHASHSEED.
        return random.Random(f"{self.seed}/{purpose}/{job_key}")

    def placed_rate(
        self,
        profile: ModelProfile,
        kind: JobKind,
        batch: float,
        gpus: int,
        d_node: int,
        spans_switches: bool,
        spans_sockets: bool,
    ) -> tuple[float, float]:
        """PR of GENIE Eq. 5 on a placement, divided by its locality penalty, alone.

        Returns (rate, share of ideal linear scaling). Locality: a training job whose GPUs on
        one node sit behind several PCIe switches or NUMA nodes synchronises over slower
        paths (GENIE Fig. 7a), the more so the smaller its local batch (Observation 4).
        """
        key = (profile, kind, batch, gpus, d_node, spans_switches, spans_sockets)
        hit = self._rates.get(key)
        if hit is not None:
            return hit
        cfg = self.config
        per_gpu = profile.single_gpu_rate(batch / gpus)
        if profile.spread_slowdown and kind is JobKind.TRAINING and gpus > 1:
            # Eq. 8 inside one server, SCHED²'s form across servers (see ModelProfile).
            local = max(gpus - comm_penalty(profile, 1, gpus), cfg.min_efficiency * gpus)
            eff_gpus = local / spread_slowdown(profile.spread_slowdown, d_node)
        else:
            eff_gpus = max(
                gpus - comm_penalty(profile, d_node, gpus / d_node), cfg.min_efficiency * gpus
            )
        locality = 1.0
        if kind is JobKind.TRAINING and (spans_switches or spans_sockets):
            sens = cfg.batch_ref / (cfg.batch_ref + batch / gpus)
            if spans_switches:
                locality += cfg.beta_switch * sens
            if spans_sockets:
                locality += cfg.beta_socket * sens
        result = (eff_gpus * per_gpu / locality, eff_gpus / gpus / locality)
        self._rates[key] = result
        return result

    def reference_rate(
        self, profile: ModelProfile, kind: JobKind, batch: float, gpus: int, topo: NodeTopology
    ) -> float:
        """The rate of a trace's reference run: ``gpus`` GPUs packed as tightly as possible."""
        d_node, spans_switches, spans_sockets = topo.reference(gpus)
        return self.placed_rate(profile, kind, batch, gpus, d_node, spans_switches,
                                spans_sockets)[0]

    def job_truth(
        self, job_key: str, kind: JobKind, gpus: int, params: TruthParams, topo: NodeTopology
    ) -> JobTruth:
        """Derive a job's constants; ``topo`` places the reference run of a trace duration."""
        profile = self.profile_for(params.model_type, kind)
        sigma = self.config.noise_sigma
        noise = math.exp(self.rng(job_key, "noise").gauss(0.0, sigma)) if sigma > 0 else 1.0
        batch = float(params.batch or 32)
        if params.known_duration is not None:
            work = float(params.known_duration)
            ref_gpus = params.known_gpus if params.known_gpus is not None else gpus
            if kind is JobKind.CPU or ref_gpus == 0:
                return JobTruth(kind, profile, batch, work, 1.0, noise, 0.0, work / noise,
                                0, False)
            unit = self.reference_rate(profile, kind, batch, ref_gpus, topo)
            single = self.placed_rate(profile, kind, batch, 1, 1, False, False)[0]
            lat11 = work / (single / unit * noise)
            return JobTruth(kind, profile, batch, work, unit, noise, 0.0, lat11, ref_gpus, False)
        if params.iterations is None or params.batch is None:
            raise ValueError(
                f"job {job_key}: the truth model needs either a known duration or "
                "batch and iterations"
            )
        work = float(params.batch) * float(params.iterations)
        single = self.placed_rate(profile, kind, batch, 1, 1, False, False)[0]
        lat11 = work / (single * noise) + profile.startup_s
        return JobTruth(
            kind, profile, batch, work, 1.0, noise, profile.startup_s, lat11, max(gpus, 1), True
        )

    # -- speed on a concrete placement -----------------------------------------------------
    def speed(
        self,
        truth: JobTruth,
        shape: PlacementShape,
        pcie_neighbours: int = 0,
        net_neighbours: int = 0,
    ) -> float:
        """Work units per second of a job running on ``shape`` with the given neighbours."""
        return self.speed_and_efficiency(truth, shape, pcie_neighbours, net_neighbours)[0]

    def speed_and_efficiency(
        self,
        truth: JobTruth,
        shape: PlacementShape,
        pcie_neighbours: int,
        net_neighbours: int,
    ) -> tuple[float, float]:
        """Speed in work units/s, and the share of ideal linear scaling the GPUs deliver.

        ``pcie_neighbours``: other GPU jobs with a GPU behind one of this job's PCIe switches;
        ``net_neighbours``: other multi-node jobs on one of this job's nodes.
        """
        if truth.kind is JobKind.CPU or shape.gpus == 0:
            return truth.noise, 0.0
        cfg = self.config
        gpus = shape.gpus
        rate, share = self.placed_rate(
            truth.profile, truth.kind, truth.batch, gpus, max(len(shape.nodes), 1),
            shape.spans_switches, shape.spans_sockets,
        )
        if truth.model_driven and shape.gpu_models:
            # The slowest GPU paces a synchronous job.
            rate *= min(self.gpu_speed(m) for m in shape.gpu_models)
        interference = 1.0
        if cfg.interference and (pcie_neighbours or net_neighbours):
            sens = cfg.batch_ref / (cfg.batch_ref + truth.batch / gpus)
            if pcie_neighbours:
                interference *= 1.0 + cfg.alpha_pcie * pcie_neighbours * sens
            if net_neighbours and shape.multi_node and truth.kind is JobKind.TRAINING:
                interference *= 1.0 + cfg.alpha_net * net_neighbours * sens
        # Dividing by the reference rate first makes an unchanged trace job exactly 1.0.
        speed = rate / truth.unit_rate / interference * truth.noise
        return speed, share / interference
