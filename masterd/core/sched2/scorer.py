"""The per-job scorer (``sched2-scorer``, beyond the paper): forward pass in numpy.

SCHED²'s Q-network (``network``) has one output per window slot, so it sees only the J oldest
waiting jobs and learns ten position-specific heads. The scorer instead applies one small
network to every waiting job that fits, so it sees the whole queue, ranks jobs by what they
are rather than where they stand, and does not fix the cluster's size:

    F_i = f(S_i; w_s)                    the per-server MLP over each row of remaining times
    C   = f([mean_i F_i, max_i F_i, stats]; w_c)   a context of the cluster and the queue
    Q_j = f(f([x_j, C]; w_a); w_b) · w_q   one score per candidate job, shared weights
    Q_0 = f(C; w_n) · w_o                "no job"

``x_j``: the job's predicted time at k placements, its GPUs ÷ M, its wait and the slowdown
of the placement packing would give it now (``state.job_vector``'s per-slot features).
``stats``: the waiting GPU jobs' count, mean demand, mean ideal time and mean wait (Table I's
statistics, over the whole queue), the share of GPUs free and the number of candidates.

Arrays (numpy ``x @ w + b``): ``s1`` (M, hs1), ``s2`` (hs1, hs2), ``c1`` (2·hs2 + 6, hc),
``a1`` (k + 3 + hc, ha1), ``a2`` (ha1, ha2), ``q`` (ha2, 1), ``n1`` (hc, hn), ``o`` (hn, 1),
each ``_w`` and ``_b``; ``meta``: JSON (format, version, gpus_per_server, profiles,
time_scale, and what the trainer records).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from masterd.core.sched2.network import (
    ModelFileError,
    check_arrays,
    read_model_file,
    write_model_file,
)

FORMAT = "trellis-sched2-scorer"
VERSION = 1
STATS = 6  # count, mean demand, mean ideal, mean wait, free share, candidates
LAYERS = ("s1", "s2", "c1", "a1", "a2", "q", "n1", "o")
DEFAULT_HIDDEN: Mapping[str, int] = {"s1": 32, "s2": 16, "c1": 64, "a1": 64, "a2": 32,
                                     "n1": 32}


@dataclass(frozen=True)
class ScorerShape:
    gpus_per_server: int  # M: a server's row of remaining times
    profiles: int = 4  # k

    @property
    def job_features(self) -> int:
        """Per candidate: k profile levels, demand, wait, packing's slowdown."""
        return self.profiles + 3


def expected_shapes(shape: ScorerShape, hidden: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    h = hidden
    ins = {"s1": shape.gpus_per_server, "s2": h["s1"], "c1": 2 * h["s2"] + STATS,
           "a1": shape.job_features + h["c1"], "a2": h["a1"], "q": h["a2"], "n1": h["c1"],
           "o": h["n1"]}
    outs = {"s1": h["s1"], "s2": h["s2"], "c1": h["c1"], "a1": h["a1"], "a2": h["a2"],
            "q": 1, "n1": h["n1"], "o": 1}
    result: dict[str, tuple[int, ...]] = {}
    for layer in LAYERS:
        result[f"{layer}_w"] = (ins[layer], outs[layer])
        result[f"{layer}_b"] = (outs[layer],)
    return result


def hidden_of(weights: Mapping[str, np.ndarray]) -> dict[str, int]:
    return {k: int(weights[f"{k}_w"].shape[1]) for k in DEFAULT_HIDDEN}


@dataclass(frozen=True)
class ScorerNetwork:
    shape: ScorerShape
    weights: Mapping[str, np.ndarray]
    time_scale: float = 3600.0
    meta: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<memory>"

    def __post_init__(self) -> None:
        _check(self.shape, self.weights, self.source)
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ModelFileError(f"{self.source}: time_scale must be > 0, got {self.time_scale}")

    def q_values(self, servers: np.ndarray, jobs: np.ndarray, stats: np.ndarray) -> np.ndarray:
        """Scores of the candidates then of "no job": ``servers`` (N, M), ``jobs`` (C, F),
        ``stats`` (6,) -> (C + 1,)."""
        w = self.weights
        h = np.maximum(servers @ w["s1_w"] + w["s1_b"], 0.0)
        f = np.maximum(h @ w["s2_w"] + w["s2_b"], 0.0)
        pooled = (np.concatenate((f.mean(axis=0), f.max(axis=0))) if len(f)
                  else np.zeros(2 * f.shape[1], dtype=np.float32))
        c = np.maximum(np.concatenate((pooled, stats)) @ w["c1_w"] + w["c1_b"], 0.0)
        x = np.concatenate((jobs, np.broadcast_to(c, (len(jobs), len(c)))), axis=1)
        a = np.maximum(x @ w["a1_w"] + w["a1_b"], 0.0)
        a = np.maximum(a @ w["a2_w"] + w["a2_b"], 0.0)
        scores = (a @ w["q_w"] + w["q_b"])[:, 0]
        none = np.maximum(c @ w["n1_w"] + w["n1_b"], 0.0) @ w["o_w"] + w["o_b"]
        out: np.ndarray = np.concatenate((scores, none))
        return out

    def check(self, gpus_per_server: int | None = None) -> None:
        if gpus_per_server is not None and gpus_per_server != self.shape.gpus_per_server:
            raise ModelFileError(
                f"{self.source}: scorer trained for servers of {self.shape.gpus_per_server} "
                f"GPUs; expected {gpus_per_server}")

    def save(self, path: Path | str) -> None:
        meta = {**self.meta, "format": FORMAT, "version": VERSION,
                "gpus_per_server": self.shape.gpus_per_server, "profiles": self.shape.profiles,
                "time_scale": self.time_scale}
        write_model_file(path, meta, self.weights)

    @classmethod
    def load(cls, path: Path | str) -> ScorerNetwork:
        source = str(path)
        meta, arrays = read_model_file(path, FORMAT, VERSION, "SCHED² scorer")
        try:
            shape = ScorerShape(int(meta["gpus_per_server"]), int(meta["profiles"]))
            time_scale = float(meta["time_scale"])
            if shape.gpus_per_server < 1 or shape.profiles < 1:
                raise ValueError("gpus_per_server and profiles must be positive")
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{source}: bad metadata: {exc}") from None
        return cls(shape, {k: v.astype(np.float32) for k, v in arrays.items()}, time_scale,
                   meta, source)


def _check(shape: ScorerShape, weights: Mapping[str, np.ndarray], source: str) -> None:
    check_arrays(weights, LAYERS, source)
    for name, want in expected_shapes(shape, hidden_of(weights)).items():
        found = tuple(weights[name].shape)
        if found != want:
            raise ModelFileError(f"{source}: {name} is {found}, expected {want} for servers of "
                                 f"{shape.gpus_per_server} GPUs, k={shape.profiles}")


def random_scorer(shape: ScorerShape, seed: int = 0,
                  hidden: Mapping[str, int] | None = None) -> ScorerNetwork:
    """Seeded random weights (He initialisation): for tests and timing."""
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, dims in expected_shapes(shape, dict(hidden or DEFAULT_HIDDEN)).items():
        weights[name] = ((rng.standard_normal(dims) * math.sqrt(2.0 / dims[0]))
                         if name.endswith("_w") else np.zeros(dims)).astype(np.float32)
    return ScorerNetwork(shape, weights)
