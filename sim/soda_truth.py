"""Ground truth for SODA's node-level mechanisms: CPU cores, memory bandwidth, query load.

What the simulator needs to know about a job that sim/truth.py does not model, so that the
adaptive CPU allocator, the contention eliminator and the inference placer (SODA §V-B, §V-E,
§V-D) can show what they are worth. Policies and the node's decision code never read this:
they see GPU utilisation and memory bandwidth *measured* from it, as noded would.

Every parameter is in :class:`SodaTruthConfig` with its source; ``assumption`` marks a
figure the paper does not give (docs/results-notes/openb.md lists them). Draws are seeded per
job (``random.Random`` seeded by a string), so a job's constants do not depend on the order
of the replay or on which policy runs.

**CPU cores** (§IV-A, §IV-B, §IV-E, §V-B). Steps 1–2 of Fig. 4 (reading and preprocessing
data) run on the CPU and feed the GPU; with fewer cores than the pipeline needs the GPU
starves. A training job part's throughput against its pinned cores ``c`` rises like a
multithreaded data pipeline (§IV-B: "like the traditional multithreading job") up to the
cores it needs, ``b``, and then holds or drops slightly: ``rel(c) = c / b`` below ``b``,
``1 - drop_per_core * (c - b)`` above (never below ``floor_above_best``). GPU busy share
while active follows the same curve (§V-B: "a DNN training job's GPU utilization and running
speed change in a same trend"): ``u_best * rel(c)``. So the cores a job *has* set both its
speed and how busy its GPUs are while it holds them.

The need ``b`` is **not** the allocator's formula (the master's N_start is one figure per
category, 3/5/5, whatever the GPUs, §V-B1). It is per GPU of the part, because each GPU
consumes its own input stream (§IV-B's aNbG setups; Fig. 6: the best fit differs by model
and configuration): ``b = need_per_gpu * gpus``. The per-GPU figure is anchored on §IV-E,
the paper's own measurement-based choice of "12 CPU cores to represent the CPU cores
occupied by GPU jobs" on its four-GPU test machines, i.e. 3 cores per GPU, and spread by
category with the paper's characterisation (§IV-C1, §IV-C3): CV models decode and augment
images and have the highest bandwidth and PCIe demand (2–5 per GPU), speech models'
preprocessing differs by model (2–4), NLP models move little data (1–3). Each job draws its
figure from its category's range, seeded by job (the spread and ranges are assumptions
around §IV-E's 3 per GPU). ``need_scales_with_gpus = False`` keeps one figure per part
whatever its GPUs (an ablation).
A trace duration was measured with the cores the job asked for, so a part's speed is
``rel(pinned) / rel(requested)``: exactly the trace's speed when it runs as recorded. The
GPU work of a job (busy GPU-seconds) is therefore the same whatever cores it gets, as it is
on a real GPU: the cores move how long the job holds its GPUs and how busy they are while
held, which is what SODA §III-A's utilisation (busy share of the GPUs in use) measures.

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
# Cores per GPU a part needs to keep its GPUs fed, by category: §IV-E's 3 per GPU (12 cores
# for the GPU jobs of a four-GPU machine), spread by §IV-C's characterisation (CV heaviest,
# NLP lightest). Ranges are assumptions; a job draws one value, seeded.
NEED_PER_GPU = MappingProxyType({"cv": (2, 3, 4, 5), "speech": (2, 3, 4), "nlp": (1, 2, 3)})


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
    need_per_gpu: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: NEED_PER_GPU)
    need_scales_with_gpus: bool = True  # False: one figure per part (ablation)
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
        per_gpu = self._rng(job_key, "need").choice(cfg.need_per_gpu[self.category(model_type)])
        scale = max(1, gpus_on_node) if cfg.need_scales_with_gpus else 1
        return max(1, per_gpu * scale)

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
