"""Ground truth for SODA's node-level mechanisms: CPU cores, memory bandwidth, query load.

What the simulator needs to know about a job that sim/truth.py does not model, so that the
adaptive CPU allocator, the contention eliminator and the inference placer (SODA §V-B, §V-E,
§V-D) can show what they are worth. Policies and the node's decision code never read this:
they see GPU utilisation and memory bandwidth *measured* from it, as noded would.

Every parameter is in :class:`SodaTruthConfig` with its source; ``assumption`` marks a
figure the paper does not give (docs/results-notes/openb.md lists them). Draws are seeded per
job (``random.Random`` seeded by a string), so a job's constants do not depend on the order
of the replay or on which policy runs.

**CPU cores** (§IV-B, §V-B). A training job part's throughput against its pinned cores ``c``
rises like a multithreaded data pipeline feeding the GPU up to its best fit ``b`` and then
holds or drops slightly: ``rel(c) = c / b`` below ``b``, ``1 - drop_per_core * (c - b)``
above (never below ``floor_above_best``). GPU utilisation follows the same curve (§V-B:
"a DNN training job's GPU utilization and running speed change in a same trend"): busy share
``u_best * rel(c)``. The best fit is the paper's category figure (CV 3, NLP 5, speech 5;
§V-B1) plus a seeded per-job offset (Fig. 6: the best fit differs by model and GPU). The
paper gives one figure per category and starts every job there whatever its GPUs, so a part's
best fit does not grow with its GPUs by default (``best_fit_scales_with_gpus``: assumption;
CODA's per-configuration figures are not in the seed).
A trace duration was measured with the cores the pod asked for, so a part's speed is
``rel(pinned) / rel(requested)``: exactly the trace's speed when it runs as recorded.

**Memory bandwidth** (§IV-C1, Table IV, §V-E, §VI-G). Every running job uses bandwidth on its
node: a CPU job ``light_gbps_per_core`` per core, or ``heavy_gbps_per_core`` for the seeded
``heavy_share`` of CPU jobs with high bandwidth needs (0.5 %, §VI-G); a training part
``training_gbps_per_core`` per pinned core; a CPU inference replica its profiled figure. The
node's peak is ``peak_gbps_per_socket`` per socket (the paper's 70 GB/s). A training job whose
model is bandwidth-sensitive (5 of 8 models, §IV-C1) slows by ``1 + k * p^2`` where ``p`` is
the pressure of the *other* jobs on its node (their bandwidth over the peak), with ``k`` such
that 50 % pressure costs the paper's 8.1 %. MBA at level ``L`` % caps a CPU job's bandwidth
at ``L`` % of its demand and slows it to ``(L/100)^beta`` (``beta`` = 1 for the memory-bound
heavy jobs, ``light_beta`` for the rest: assumption); halving its cores halves both.

**Query load** (§III-B, §V-D, §VI-E). A long-running inference service's load follows a day:
``peak * (trough + (1 - trough) * (1 - cos(2 pi (h - trough_hour) / 24)) / 2)``, lowest at
``trough_hour`` (few queries at night, §III-B), in queries per batching window. Its peak is
what its recorded GPUs carried at the service manager's 80 % scale-out point (§V-D1):
``0.8 * gpus * bs_gpu``. A GPU serving load ``x`` is busy ``x / bs_gpu`` of the time.
Profiles (§IV-E, Tables III and IV): the largest batch on 16 cores within the 200 ms target
and the bandwidth it takes, by the trace's model type; ``bs_gpu`` is not published
(assumption: 32 for every model).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# The simulator's model types (sim/workloads/assign.py) by SODA's categories (§IV, Table I).
CATEGORY = MappingProxyType({
    "alexnet": "cv", "googlenet": "cv", "resnet50": "cv", "inception-v3": "cv",
    "lstm": "nlp", "seq2seq": "nlp", "generic": "speech",
})
# §V-B1: "we choose 3 for CV models, 5 for NLP models, and 5 for SPEECH models".
BEST_FIT_PER_GPU = MappingProxyType({"cv": 3, "nlp": 5, "speech": 5})


@dataclass(frozen=True)
class InferenceModel:
    """One model's serving profile (§IV-E): Table III's batch on 16 cores, Table IV's GB/s."""

    cpu_batch: int
    cpu_mbw_gbps: float


# Table III / IV by the trace's model types: AlexNet 16 / 25.7, ResNet-50 4 / 26.9,
# Inception-v3 2 / 27.0; GoogLeNet as Inception (the same family); LSTM as Bi-att-Flow
# (1 / 29.5); seq2seq as the Transformer (8 / 26.3); generic as the speech models, which
# cannot serve on 16 cores (DeepSpeech and WaveNet: batch 0).
INFERENCE_MODELS = MappingProxyType({
    "alexnet": InferenceModel(16, 25.7),
    "resnet50": InferenceModel(4, 26.9),
    "inception-v3": InferenceModel(2, 27.0),
    "googlenet": InferenceModel(2, 27.0),
    "lstm": InferenceModel(1, 29.5),
    "seq2seq": InferenceModel(8, 26.3),
    "generic": InferenceModel(0, 0.0),
})


@dataclass(frozen=True)
class SodaTruthConfig:
    # -- CPU cores (§IV-B, §V-B) --------------------------------------------------------------
    best_fit_per_gpu: Mapping[str, int] = field(default_factory=lambda: BEST_FIT_PER_GPU)
    best_fit_offsets: tuple[int, ...] = (-1, 0, 1)  # seeded per job; assumption (Fig. 6 spread)
    best_fit_scales_with_gpus: bool = False  # True: times the part's GPUs; assumption
    u_best: float = 0.90  # GPU busy share at the best fit; assumption
    drop_per_core: float = 0.01  # "does not change or drop slightly" past it; assumption
    floor_above_best: float = 0.90  # assumption
    # -- memory bandwidth (§IV-C1, Table IV, §VI-G) -------------------------------------------
    peak_gbps_per_socket: float = 70.0  # §IV-E: "the theoretical bandwidth (70GB/s)"
    heavy_share: float = 0.005  # §VI-G: "only 0.5% of CPU tasks have high ... bandwidth"
    heavy_gbps_per_core: float = 40.3 / 16  # Table IV's largest (VGG16, 16 cores); assumption
    light_gbps_per_core: float = 0.25  # assumption
    training_gbps_per_core: float = 1.0  # assumption (the paper's figures are in CODA)
    sensitive_share: float = 5 / 8  # §IV-C1: 5 of 8 models slow down under pressure
    slowdown_at_half: float = 0.081  # §IV-C1: 8.1 % on average at 50 % pressure
    light_beta: float = 0.3  # how memory-bound a light CPU job is under MBA; assumption
    # -- query load (§III-B, §V-D, §VI-E) -----------------------------------------------------
    service_min_runtime_s: float = 86_400.0  # LS pods running a day or more are services
    trough: float = 0.10  # night load as a share of the peak; assumption ("few queries")
    trough_hour: float = 4.0  # assumption
    peak_share_of_capacity: float = 0.8  # §V-D1: replicas are added at 80 % of max load
    bs_gpu: int = 32  # largest batch one GPU serves within the target; assumption
    cpu_cores: int = 16  # §IV-E: Table III is measured on 16 cores
    qos_ms: float = 200.0  # §IV-E
    window_ms: float = 100.0  # §VI-E: a window close to the ~100 ms computation


@dataclass(frozen=True)
class PartTruth:
    best_fit: int  # cores at which the part's throughput peaks


@dataclass(frozen=True)
class CpuJobTruth:
    heavy: bool
    gbps_per_core: float
    beta: float


class SodaTruth:
    def __init__(self, config: SodaTruthConfig | None = None, seed: int = 0) -> None:
        self.config = config or SodaTruthConfig()
        self.seed = seed

    def _rng(self, key: str, purpose: str) -> random.Random:
        return random.Random(f"soda/{self.seed}/{purpose}/{key}")

    # -- CPU cores -----------------------------------------------------------------------------
    def category(self, model_type: str | None) -> str:
        return CATEGORY.get((model_type or "generic").lower(), "speech")

    def best_fit(self, job_key: str, model_type: str | None, gpus_on_node: int) -> int:
        cfg = self.config
        base = cfg.best_fit_per_gpu[self.category(model_type)]
        offset = self._rng(job_key, "best-fit").choice(cfg.best_fit_offsets)
        scale = max(1, gpus_on_node) if cfg.best_fit_scales_with_gpus else 1
        return max(1, (base + offset) * scale)

    def throughput(self, cores: int, best_fit: int) -> float:
        """Relative throughput of a part pinned to ``cores`` (1.0 at the best fit)."""
        cfg = self.config
        if cores <= 0:
            return 0.0
        if cores <= best_fit:
            return cores / best_fit
        return max(cfg.floor_above_best, 1.0 - cfg.drop_per_core * (cores - best_fit))

    def busy_share(self, cores: int, best_fit: int) -> float:
        return self.config.u_best * self.throughput(cores, best_fit)

    # -- memory bandwidth ----------------------------------------------------------------------
    def peak_gbps(self, sockets: int) -> float:
        return self.config.peak_gbps_per_socket * max(1, sockets)

    def cpu_job(self, job_key: str) -> CpuJobTruth:
        cfg = self.config
        heavy = self._rng(job_key, "heavy").random() < cfg.heavy_share
        return CpuJobTruth(heavy, cfg.heavy_gbps_per_core if heavy else cfg.light_gbps_per_core,
                           1.0 if heavy else cfg.light_beta)

    def cpu_job_speed(self, job: CpuJobTruth, mba_pct: int, cores_kept: int,
                      cores: int) -> float:
        """A CPU job's speed under an MBA level and a core cut (1.0 unthrottled)."""
        share = cores_kept / cores if cores else 1.0
        return share * (mba_pct / 100.0) ** job.beta

    def cpu_job_gbps(self, job: CpuJobTruth, mba_pct: int, cores_kept: int) -> float:
        return job.gbps_per_core * cores_kept * mba_pct / 100.0

    def training_gbps(self, pinned_cores: int) -> float:
        return self.config.training_gbps_per_core * pinned_cores

    def sensitive(self, job_key: str) -> bool:
        return self._rng(job_key, "bandwidth-sensitive").random() < self.config.sensitive_share

    def contention_slowdown(self, pressure: float) -> float:
        """Run-time factor (>= 1) of a sensitive training job at the others' pressure."""
        k = self.config.slowdown_at_half / 0.25  # 1 + k * 0.5^2 = 1 + 8.1 %
        p = min(max(pressure, 0.0), 1.0)
        return 1.0 + k * p * p

    # -- query load ----------------------------------------------------------------------------
    def daily_load(self, peak: float, t: float) -> float:
        cfg = self.config
        hours = (t / 3600.0 - cfg.trough_hour) % 24.0
        shape = (1.0 - math.cos(2.0 * math.pi * hours / 24.0)) / 2.0
        return peak * (cfg.trough + (1.0 - cfg.trough) * shape)

    def service_peak(self, gpus: int) -> float:
        cfg = self.config
        return cfg.peak_share_of_capacity * max(1, gpus) * cfg.bs_gpu

    def inference_model(self, model_type: str | None) -> InferenceModel:
        return INFERENCE_MODELS.get((model_type or "generic").lower(), INFERENCE_MODELS["generic"])
