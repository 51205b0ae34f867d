"""SCHED²'s Q-network, forward pass only, in numpy over exported weights (seeds/sched2.md Eq. 3–5).

    F_i = f(S_i; w_shared)            one MLP applied to every server's row of remaining times
    G   = f(J_1..J_J, Stat; w_1)      an MLP over the job features and the queue statistics
    E   = Concat(F_1, ..., F_N, G)
    A   = f(f(E; w_2); w_3)           two fully connected layers: one Q-value per action

Each ``f`` is linear + ReLU; the last layer is linear. The weights come from a ``.npz`` file
written by the trainer (``sim.rl``, PyTorch) with the layout below; the master and the replays
never import torch. A file is checked as a whole when loaded: every array present, finite and
of the shape its metadata implies. A model fixes the cluster shape (N servers × M GPUs) and
the queue window J it was trained for; :meth:`QNetwork.check` compares them with what a caller
expects and says which differs.

Arrays (numpy ``x @ w + b`` layout, ``w`` is ``(inputs, outputs)``):

- ``s1_w`` (M, hs1), ``s1_b``, ``s2_w`` (hs1, hs2), ``s2_b``: the per-server MLP;
- ``j1_w`` ((k+2)·J + 4, hj1; (k+3)·J + 4 with ``packing_feature``), ``j1_b``, ``j2_w``
  (hj1, hj2), ``j2_b``: the job MLP;
- ``f1_w`` (N·hs2 + hj2, hf), ``f1_b``, ``f2_w`` (hf, J + 1), ``f2_b``: Eq. 5;
- ``meta``: a JSON string — format, version, servers, gpus_per_server, jobs, profiles,
  packing_feature, canonical_servers (both false when absent), time_scale and anything the
  trainer records (its command, the workload).
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "trellis-sched2-qnet"
VERSION = 1
STATISTICS = 4  # queue statistics in the job vector (Table I)
LAYERS = ("s1", "s2", "j1", "j2", "f1", "f2")


class ModelFileError(ValueError):
    """A model file that cannot be used here; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Shape:
    """What a model was trained for."""

    servers: int  # N
    gpus_per_server: int  # M
    jobs: int  # J
    profiles: int = 4  # k
    # Beyond Table I (the learning fixes of docs/policies/sched2.md), off for older models:
    # one more feature per job, the slowdown of the placement packing would give it now;
    # and the servers' rows in a canonical (sorted) order instead of by name.
    packing: bool = False
    canonical: bool = False

    @property
    def job_step(self) -> int:
        """Features per window slot: k profiles, demand, wait (+ packing's slowdown)."""
        return self.profiles + 2 + int(self.packing)

    @property
    def job_features(self) -> int:
        """Length of the job-and-statistics vector: (k + 2)·J + 4 (Table I), + J with the
        packing feature."""
        return self.job_step * self.jobs + STATISTICS

    @property
    def actions(self) -> int:
        return self.jobs + 1  # one per window slot, then "no job"


def job_vector_size(profiles: int, jobs: int) -> int:
    return (profiles + 2) * jobs + STATISTICS


@dataclass(frozen=True)
class QNetwork:
    shape: Shape
    weights: Mapping[str, np.ndarray]
    time_scale: float = 3600.0  # seconds; time features are log1p(t / time_scale)
    meta: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<memory>"

    def __post_init__(self) -> None:
        _check_weights(self.shape, self.weights, self.source)
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ModelFileError(f"{self.source}: time_scale must be > 0, got {self.time_scale}")

    # -- the forward pass ------------------------------------------------------------------
    def q_values(self, servers: np.ndarray, jobs: np.ndarray) -> np.ndarray:
        """Q-values of the J + 1 actions for one state: ``servers`` (N, M), ``jobs`` (D,).

        Eq. 5's first layer, whose input grows with N, is an ``einsum``: it runs in this
        thread, where ``@`` hands a product that size to a multi-threaded BLAS whose threads,
        on a host with busy cores, spin and wait (35 ms instead of 1 ms at 1,000 servers,
        measured). The other products are small enough for BLAS to keep to one thread.
        """
        w = self.weights
        h = np.maximum(servers @ w["s1_w"] + w["s1_b"], 0.0)
        f = np.maximum(h @ w["s2_w"] + w["s2_b"], 0.0)  # (N, hs2): F_i, shared weights
        g = np.maximum(jobs @ w["j1_w"] + w["j1_b"], 0.0)
        g = np.maximum(g @ w["j2_w"] + w["j2_b"], 0.0)
        e = np.concatenate((f.reshape(-1), g))  # Eq. 4
        hidden = np.maximum(np.einsum("e,eh->h", e, w["f1_w"]) + w["f1_b"], 0.0)
        out: np.ndarray = hidden @ w["f2_w"] + w["f2_b"]
        return out

    # -- expectations ----------------------------------------------------------------------
    def check(self, servers: int | None = None, gpus_per_server: int | None = None,
              jobs: int | None = None) -> None:
        """Raise :class:`ModelFileError` naming what differs from what the caller expects."""
        wanted = {"servers": servers, "gpus_per_server": gpus_per_server, "jobs": jobs}
        wrong = [
            f"{name} {value} (the model has {getattr(self.shape, name)})"
            for name, value in wanted.items()
            if value is not None and value != getattr(self.shape, name)
        ]
        if wrong:
            s = self.shape
            raise ModelFileError(
                f"{self.source}: model trained for {s.servers} servers × {s.gpus_per_server} "
                f"GPUs and a window of J={s.jobs} jobs; expected {', '.join(wrong)}")

    # -- files -----------------------------------------------------------------------------
    def save(self, path: Path | str) -> None:
        meta = {**self.meta, "format": FORMAT, "version": VERSION,
                "servers": self.shape.servers, "gpus_per_server": self.shape.gpus_per_server,
                "jobs": self.shape.jobs, "profiles": self.shape.profiles,
                "packing_feature": self.shape.packing,
                "canonical_servers": self.shape.canonical, "time_scale": self.time_scale}
        write_model_file(path, meta, self.weights)

    @classmethod
    def load(cls, path: Path | str) -> QNetwork:
        source = str(path)
        meta, arrays = read_model_file(path, FORMAT, VERSION, "SCHED² Q-network")
        try:
            shape = Shape(servers=_positive(meta, "servers"),
                          gpus_per_server=_positive(meta, "gpus_per_server"),
                          jobs=_positive(meta, "jobs"), profiles=_positive(meta, "profiles"),
                          packing=_flag(meta, "packing_feature"),
                          canonical=_flag(meta, "canonical_servers"))
            time_scale = float(meta["time_scale"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{source}: bad metadata: {exc}") from None
        weights = {k: v.astype(np.float32) for k, v in arrays.items()}
        return cls(shape, weights, time_scale, meta, source)


def write_model_file(path: Path | str, meta: Mapping[str, Any],
                     weights: Mapping[str, np.ndarray]) -> None:
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    with open(path, "wb") as handle:
        np.savez_compressed(handle, meta=np.array(json.dumps(meta, sort_keys=True)), **arrays)


def read_model_file(path: Path | str, fmt: str, version: int,
                    what: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The metadata and arrays of a ``.npz`` model file of format ``fmt``; every way the file
    can be wrong is a :class:`ModelFileError` naming it."""
    source = str(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: np.array(data[name]) for name in data.files}
    except FileNotFoundError:
        raise ModelFileError(f"{source}: no such model file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelFileError(f"{source}: not a readable .npz model file ({exc})") from None
    if "meta" not in arrays or arrays["meta"].dtype.kind != "U" or arrays["meta"].ndim:
        raise ModelFileError(f"{source}: no metadata (array 'meta' holding JSON)")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except ValueError as exc:
        raise ModelFileError(f"{source}: metadata is not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise ModelFileError(f"{source}: not a {what} (format "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != version:
        raise ModelFileError(f"{source}: model format version {meta.get('version')!r}; "
                             f"this Trellis reads version {version}")
    return meta, arrays


def check_arrays(weights: Mapping[str, np.ndarray], layers: tuple[str, ...],
                 source: str) -> None:
    """Every ``layer_w`` (2-D) and ``layer_b`` (1-D) present, nothing else, all finite."""
    names = {f"{layer}_{p}" for layer in layers for p in "wb"}
    missing = [f"{layer}_{p}" for layer in layers for p in "wb" if f"{layer}_{p}" not in weights]
    if missing:
        raise ModelFileError(f"{source}: missing weight arrays {', '.join(missing)}")
    extra = sorted(set(weights) - names)
    if extra:
        raise ModelFileError(f"{source}: unexpected arrays {', '.join(extra)}")
    for name, array in weights.items():
        if array.ndim != (2 if name.endswith("_w") else 1):
            raise ModelFileError(f"{source}: {name} has {array.ndim} dimensions")
        if not np.all(np.isfinite(array)):
            raise ModelFileError(f"{source}: {name} holds NaN or infinite values")


def _positive(meta: Mapping[str, Any], key: str) -> int:
    value = meta[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def _flag(meta: Mapping[str, Any], key: str) -> bool:
    value = meta.get(key, False)  # absent in models written before the flag existed
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def expected_shapes(shape: Shape, hidden: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Every array's shape for a network of these dimensions and hidden widths."""
    hs1, hs2, hj1, hj2, hf = (hidden[k] for k in ("s1", "s2", "j1", "j2", "f1"))
    ins = {"s1": shape.gpus_per_server, "s2": hs1, "j1": shape.job_features, "j2": hj1,
           "f1": shape.servers * hs2 + hj2, "f2": hf}
    outs = {"s1": hs1, "s2": hs2, "j1": hj1, "j2": hj2, "f1": hf, "f2": shape.actions}
    result: dict[str, tuple[int, ...]] = {}
    for layer in LAYERS:
        result[f"{layer}_w"] = (ins[layer], outs[layer])
        result[f"{layer}_b"] = (outs[layer],)
    return result


def _check_weights(shape: Shape, weights: Mapping[str, np.ndarray], source: str) -> None:
    check_arrays(weights, LAYERS, source)
    hidden = {layer: int(weights[f"{layer}_w"].shape[1]) for layer in LAYERS}
    for name, want in expected_shapes(shape, hidden).items():
        found = tuple(weights[name].shape)
        if found != want:
            raise ModelFileError(
                f"{source}: {name} is {found}, expected {want} for {shape.servers} servers × "
                f"{shape.gpus_per_server} GPUs, J={shape.jobs}, k={shape.profiles}")


def random_network(shape: Shape, seed: int = 0, hidden: Mapping[str, int] | None = None,
                   time_scale: float = 3600.0) -> QNetwork:
    """A network with seeded random weights (He initialisation): for tests and timing."""
    widths = dict(DEFAULT_HIDDEN if hidden is None else hidden)
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, dims in expected_shapes(shape, widths).items():
        if name.endswith("_w"):
            weights[name] = (rng.standard_normal(dims) * math.sqrt(2.0 / dims[0])).astype(
                np.float32)
        else:
            weights[name] = np.zeros(dims, dtype=np.float32)
    return QNetwork(shape, weights, time_scale)


# Hidden widths (not published: seeds/sched2.md leaves them out; REFERENCES.md).
DEFAULT_HIDDEN: Mapping[str, int] = {"s1": 32, "s2": 16, "j1": 128, "j2": 64, "f1": 128}
