"""Seeded fill-ins for what a trace does not record (model type, batch, QoS class).

Every draw comes from a generator seeded by (seed, purpose, job key), so a job's assignment
does not depend on which other rows were loaded or skipped.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TypeVar

from shared.model import JobKind, QosClass
from sim.truth import NodeTopology, TruthModel

# GENIE Table 3: four CNNs and two RNNs.
MODEL_TYPES: tuple[str, ...] = (
    "alexnet", "googlenet", "resnet50", "inception-v3", "lstm", "seq2seq",
)

# Global batch sizes users pick per model type (powers of two around each model's sweet spot).
BATCHES: dict[str, tuple[int, ...]] = {
    "alexnet": (64, 128, 256, 512),
    "googlenet": (32, 64, 128, 256),
    "resnet50": (16, 32, 64, 128),
    "inception-v3": (16, 32, 64, 128),
    "lstm": (32, 64, 128, 256),
    "seq2seq": (32, 64, 128, 256),
}

# GENIE §7.1: Urgent 5%, Prior 35%, Normal 60%.
T = TypeVar("T")

GENIE_QOS_MIX: tuple[tuple[QosClass, float], ...] = (
    (QosClass.URGENT, 0.05),
    (QosClass.PRIOR, 0.35),
    (QosClass.NORMAL, 0.60),
)


def rng(seed: int, purpose: str, key: str) -> random.Random:
    return random.Random(f"{seed}/{purpose}/{key}")


def pick_weighted(r: random.Random, choices: tuple[tuple[T, float], ...]) -> T:
    x = r.random() * sum(w for _, w in choices)
    for value, weight in choices:
        x -= weight
        if x < 0:
            return value
    return choices[-1][0]


def pick_qos(seed: int, key: str) -> QosClass:
    return pick_weighted(rng(seed, "qos", key), GENIE_QOS_MIX)


@dataclass(frozen=True)
class ModelFill:
    model_type: str
    batch: int


def pick_model(seed: int, key: str) -> ModelFill:
    r = rng(seed, "model", key)
    model_type = MODEL_TYPES[r.randrange(len(MODEL_TYPES))]
    batches = BATCHES[model_type]
    return ModelFill(model_type, batches[r.randrange(len(batches))])


def iterations_for_duration(
    truth: TruthModel,
    fill: ModelFill,
    kind: JobKind,
    duration: float,
    gpus: int,
    topo: NodeTopology,
) -> int:
    """The iteration count a user running ``fill`` for ``duration`` s on ``gpus`` GPUs declared.

    Uses the true speed of the tightest packing without the job's private noise (users do not
    know it).
    """
    profile = truth.profile_for(fill.model_type, kind)
    rate = truth.reference_rate(profile, kind, float(fill.batch), gpus, topo)
    return max(1, math.floor(duration * rate / fill.batch + 0.5))
