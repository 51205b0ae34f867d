"""GENIE's model database (seeds/genie.md §6, Fig. 12): coefficients per task type and GPU model.

A key is (model type, GPU model, calculation type); names match case-insensitively and ignore
punctuation, so "Inception-v3", "inception_v3" and "InceptionV3" are one type. A lookup that
misses falls back, and says so:

1. GPU model never profiled -> the database's ``default_gpu_model`` (if set).
2. inference type not profiled but its training is -> the training fit with no
   synchronisation and ``INFERENCE_SPEEDUP`` × its single-GPU rate (a forward pass is about a
   third of a training step's work).
3. type unknown -> the most similar profiled type on that GPU: the same declared family
   (e.g. "cnn", "rnn") first, then the nearest parameter count on a log scale, then the name.
   The paper compares model graphs (PB file / MetaGraph); family and parameter count are what a
   job spec carries here.

Persistence: JSON or TOML files (``load``/``save``), or flat rows (``to_rows``/``from_rows``,
columns ``ROW_FIELDS``) for the master's SQLite store.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from masterd.core.genie.model import Coefficients, ModelError

KINDS = ("training", "inference")
INFERENCE_SPEEDUP = 3.0
MAX_FILE_BYTES = 64 << 20  # a model database file (thousands of rows take well under 1 MiB)

ROW_FIELDS: tuple[str, ...] = (
    "model_type",
    "gpu_model",
    "kind",
    "family",
    "params_m",
    "k0",
    "k1",
    "k2",
    "gamma",
    "lam",
    "nu",
    "max_local_batch",
    "source",
)
_COEFF_FIELDS = ("k0", "k1", "k2", "gamma", "lam", "nu", "max_local_batch")
_MAX_NAME = 128


class ModelDBError(ValueError):
    """A model database file or row that cannot be used; the message names the bad field."""


def normalise(name: str) -> str:
    """The matching key of a model or GPU name: lower case, letters and digits only."""
    return re.sub(r"[^0-9a-z]", "", name.casefold())


@dataclass(frozen=True)
class ModelEntry:
    model_type: str
    gpu_model: str
    kind: str
    coefficients: Coefficients
    family: str | None = None
    params_m: float | None = None  # millions of parameters
    source: str = ""  # where the numbers come from: "profiled <date>", "plausible ...", ...

    def __post_init__(self) -> None:
        for name in ("model_type", "gpu_model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not normalise(value) or len(value) > _MAX_NAME:
                raise ModelDBError(f"{name} must be a name of 1-{_MAX_NAME} characters "
                                   f"with a letter or digit, got {value!r}")
        if self.kind not in KINDS:
            raise ModelDBError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.family is not None and (
            not isinstance(self.family, str) or len(self.family) > 64
        ):
            raise ModelDBError(f"family must be a short string, got {self.family!r}")
        if self.params_m is not None and not (
            isinstance(self.params_m, int | float)
            and not isinstance(self.params_m, bool)
            and math.isfinite(self.params_m)
            and self.params_m > 0
        ):
            raise ModelDBError(f"params_m must be a number > 0, got {self.params_m!r}")

    @property
    def key(self) -> tuple[str, str, str]:
        return normalise(self.model_type), normalise(self.gpu_model), self.kind


@dataclass(frozen=True)
class Resolution:
    """The coefficients a lookup settled on, and whether they are a stand-in."""

    coefficients: Coefficients
    model_type: str  # the profiled type the coefficients belong to
    gpu_model: str  # the profiled GPU model they belong to
    fallback: bool
    reason: str = ""  # why a fallback was used; empty for an exact hit


def _inference_from_training(c: Coefficients) -> Coefficients:
    return Coefficients(
        c.k0 * INFERENCE_SPEEDUP,
        c.k1 * INFERENCE_SPEEDUP,
        c.k2 * INFERENCE_SPEEDUP,
        0.0,
        0.0,
        c.nu,
        c.max_local_batch,
    )


class ModelDB:
    """An in-memory model database; plain data, no I/O except ``load``/``save``."""

    def __init__(
        self, entries: Iterable[ModelEntry] = (), default_gpu_model: str | None = None
    ) -> None:
        self._entries: dict[tuple[str, str, str], ModelEntry] = {}
        self.default_gpu_model = default_gpu_model
        # Bumped on every change, so users that cache lookups know to redo them.
        self.version = 0
        for entry in entries:
            self.put(entry)

    # -- content -------------------------------------------------------------------------
    def put(self, entry: ModelEntry) -> None:
        """Add or replace the entry for its (model type, GPU model, kind)."""
        self._entries[entry.key] = entry
        self.version += 1

    def get(self, model_type: str, gpu_model: str, kind: str = "training") -> ModelEntry | None:
        return self._entries.get((normalise(model_type), normalise(gpu_model), kind))

    def entries(self) -> list[ModelEntry]:
        return sorted(self._entries.values(), key=lambda e: e.key)

    def __len__(self) -> int:
        return len(self._entries)

    def gpu_models(self) -> set[str]:
        return {key[1] for key in self._entries}

    # -- lookup with fallback --------------------------------------------------------------
    def resolve(
        self,
        model_type: str | None,
        gpu_model: str,
        kind: str = "training",
        family: str | None = None,
        params_m: float | None = None,
    ) -> Resolution | None:
        """Coefficients for a task on ``gpu_model``, or None when nothing is similar enough."""
        if kind not in KINDS:
            raise ModelDBError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        reasons: list[str] = []
        gpu = normalise(gpu_model)
        if gpu not in self.gpu_models():
            default = normalise(self.default_gpu_model) if self.default_gpu_model else ""
            if default not in self.gpu_models():
                return None
            reasons.append(f"GPU model {gpu_model!r} not profiled, used {self.default_gpu_model!r}")
            gpu = default
        if model_type is not None:
            hit = self._exact(normalise(model_type), gpu, kind)
            if hit is not None:
                entry, derived = hit
                if derived:
                    reasons.append(f"no inference profile of {entry.model_type!r}, "
                                   f"used its training fit x{INFERENCE_SPEEDUP:g}")
                return self._resolution(entry, kind, reasons)
        similar = self._similar(gpu, kind, family, params_m)
        if similar is None:
            return None
        what = f"model type {model_type!r}" if model_type is not None else "no model type"
        basis = []
        if family is not None:
            basis.append(f"family={family}")
        if params_m is not None:
            basis.append(f"params_m={params_m:g}")
        reasons.append(f"{what} not profiled, used similar {similar.model_type!r} "
                       f"({', '.join(basis) or 'by name'})")
        return self._resolution(similar, kind, reasons)

    def _exact(
        self, model: str, gpu: str, kind: str
    ) -> tuple[ModelEntry, bool] | None:
        entry = self._entries.get((model, gpu, kind))
        if entry is not None:
            return entry, False
        if kind == "inference":
            entry = self._entries.get((model, gpu, "training"))
            if entry is not None:
                return entry, True
        return None

    def _similar(
        self, gpu: str, kind: str, family: str | None, params_m: float | None
    ) -> ModelEntry | None:
        pool = [e for e in self._entries.values() if e.key[1] == gpu and e.kind == kind]
        if not pool and kind == "inference":
            pool = [e for e in self._entries.values() if e.key[1] == gpu]
        if family is not None:
            same = [e for e in pool if e.family and normalise(e.family) == normalise(family)]
            if same:
                pool = same
            elif params_m is None:
                return None  # neither the family nor the size says anything
        elif params_m is None:
            return None
        if not pool:
            return None

        def distance(e: ModelEntry) -> tuple[float, str]:
            if params_m is None or params_m <= 0:
                return (0.0, e.key[0])
            if e.params_m is None:
                return (math.inf, e.key[0])
            return (abs(math.log(e.params_m) - math.log(params_m)), e.key[0])

        return min(pool, key=distance)

    @staticmethod
    def _resolution(entry: ModelEntry, kind: str, reasons: list[str]) -> Resolution:
        coefficients = entry.coefficients
        if kind == "inference" and entry.kind == "training":
            coefficients = _inference_from_training(coefficients)
            if not any("training fit" in r for r in reasons):
                reasons.append(f"used the training fit of {entry.model_type!r} "
                               f"x{INFERENCE_SPEEDUP:g} for inference")
        return Resolution(
            coefficients=coefficients,
            model_type=entry.model_type,
            gpu_model=entry.gpu_model,
            fallback=bool(reasons),
            reason="; ".join(reasons),
        )

    # -- rows (SQLite) ---------------------------------------------------------------------
    def to_rows(self) -> list[tuple[Any, ...]]:
        """One tuple per entry, in ``ROW_FIELDS`` order (None for absent values)."""
        rows = []
        for e in self.entries():
            c = e.coefficients
            rows.append((
                e.model_type, e.gpu_model, e.kind, e.family, e.params_m,
                c.k0, c.k1, c.k2, c.gamma, c.lam, c.nu, c.max_local_batch, e.source,
            ))
        return rows

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[Sequence[Any] | Mapping[str, Any]],
        default_gpu_model: str | None = None,
    ) -> ModelDB:
        """Rebuild from ``to_rows`` output (tuples) or mappings keyed by ``ROW_FIELDS``."""
        db = cls(default_gpu_model=default_gpu_model)
        for i, row in enumerate(rows):
            if isinstance(row, Mapping):
                record = dict(row)
            else:
                if len(row) != len(ROW_FIELDS):
                    raise ModelDBError(
                        f"row {i}: expected {len(ROW_FIELDS)} columns "
                        f"({', '.join(ROW_FIELDS)}), got {len(row)}"
                    )
                record = dict(zip(ROW_FIELDS, row, strict=True))
            db.put(_entry_from_record(record, f"row {i}"))
        return db

    # -- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        models = []
        for row in self.to_rows():
            models.append({k: v for k, v in zip(ROW_FIELDS, row, strict=True) if v is not None})
        out: dict[str, Any] = {"models": models}
        if self.default_gpu_model is not None:
            out["default_gpu_model"] = self.default_gpu_model
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelDB:
        if not isinstance(data, Mapping):
            raise ModelDBError("a model database must be a table with a 'models' list")
        unknown = set(data) - {"models", "default_gpu_model"}
        if unknown:
            raise ModelDBError(f"unknown top-level keys: {', '.join(sorted(unknown))}")
        default = data.get("default_gpu_model")
        if default is not None and not isinstance(default, str):
            raise ModelDBError(f"default_gpu_model must be a string, got {default!r}")
        models = data.get("models", [])
        if not isinstance(models, list):
            raise ModelDBError("'models' must be a list of tables")
        db = cls(default_gpu_model=default)
        for i, record in enumerate(models):
            if not isinstance(record, Mapping):
                raise ModelDBError(f"models[{i}] must be a table")
            db.put(_entry_from_record(dict(record), f"models[{i}]"))
        return db

    @classmethod
    def load(cls, path: str | Path) -> ModelDB:
        """Read a ``.json`` or ``.toml`` model database."""
        path = Path(path)
        # The suffix first, and a regular file of a bounded size only: the master reads the
        # path an admin RPC names, and /dev/zero or a FIFO would never end (or never start).
        if path.suffix not in (".json", ".toml"):
            raise ModelDBError(f"{path}: use a .json or .toml file")
        try:
            with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise ModelDBError(f"{path}: not a regular file")
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise ModelDBError(f"cannot read model database {path}: {exc.strerror}") from None
        if len(raw) > MAX_FILE_BYTES:
            raise ModelDBError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB")
        try:
            data = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode())
        except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ModelDBError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from None
        try:
            return cls.from_dict(data)
        except ModelDBError as exc:
            raise ModelDBError(f"{path}: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write as ``.json`` or ``.toml`` (by suffix), atomically."""
        path = Path(path)
        if path.suffix == ".json":
            text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        elif path.suffix == ".toml":
            text = _to_toml(self.to_dict())
        else:
            raise ModelDBError(f"{path}: use a .json or .toml file")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)

    # -- the built-in table ----------------------------------------------------------------
    @classmethod
    def default(cls) -> ModelDB:
        """GENIE's six model types (§7.1 Table 3) on the paper's Tesla K80; see DEFAULT_TABLE."""
        return cls(default_entries(), default_gpu_model=DEFAULT_GPU_MODEL)


def _entry_from_record(record: dict[str, Any], where: str) -> ModelEntry:
    unknown = set(record) - set(ROW_FIELDS)
    if unknown:
        raise ModelDBError(f"{where}: unknown fields {', '.join(sorted(unknown))}")
    for name in ("model_type", "gpu_model", "k0", "k1", "k2"):
        if record.get(name) is None:
            raise ModelDBError(f"{where}: {name} is required")
    try:
        coefficients = Coefficients(
            **{k: record[k] for k in _COEFF_FIELDS if record.get(k) is not None}
        )
    except ModelError as exc:
        raise ModelDBError(f"{where}: {exc}") from None
    source = record.get("source") or ""
    if not isinstance(source, str):
        raise ModelDBError(f"{where}: source must be a string, got {source!r}")
    try:
        return ModelEntry(
            model_type=record["model_type"],
            gpu_model=record["gpu_model"],
            kind=record.get("kind") or "training",
            coefficients=coefficients,
            family=record.get("family"),
            params_m=record.get("params_m"),
            source=source,
        )
    except ModelDBError as exc:
        raise ModelDBError(f"{where}: {exc}") from None


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _to_toml(data: dict[str, Any]) -> str:
    lines = []
    if "default_gpu_model" in data:
        lines.append(f"default_gpu_model = {_toml_value(data['default_gpu_model'])}")
    for model in data["models"]:
        lines.append("")
        lines.append("[[models]]")
        for key in ROW_FIELDS:
            if key in model:
                lines.append(f"{key} = {_toml_value(model[key])}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The built-in table.
#
# The extracted paper text has no figure data, so these are PLAUSIBLE values, not measurements:
# single-GPU training peaks of the order public TensorFlow 1.x benchmarks report for one K80
# die (ResNet-50 ~50 img/s, Inception-v3 ~30 img/s, AlexNet several hundred img/s), a rate at
# local batch 1 far below the peak, and the peak batch where Fig. 4's curves flatten. The
# quadratic is the one through (1, r1) with its vertex at (b_peak, peak):
#     sPR(b) = peak − a·(b − b_peak)²,  a = (peak − r1) / (b_peak − 1)².
# γ grows with the parameter count (more to synchronise); λ = 0.3 makes an intra-node hop cost
# about a third of an inter-node hop (PCIe vs 56 Gb InfiniBand, Table 1); ν is TensorFlow
# start-up. Inference rows are the training rows ×INFERENCE_SPEEDUP with no synchronisation.
# Replace them by profiling (fit.fit_profile) on the real cluster.

DEFAULT_GPU_MODEL = "Tesla K80"
DEFAULT_SOURCE = "plausible (paper figures unavailable); replace by profiling"


@dataclass(frozen=True)
class _Plausible:
    model_type: str
    family: str
    params_m: float
    peak: float  # samples/s at the plateau
    b_peak: float  # local batch where the rate plateaus
    r1: float  # samples/s at local batch 1
    gamma: float
    lam: float
    nu: float
    max_local_batch: float | None


DEFAULT_TABLE: tuple[_Plausible, ...] = (
    _Plausible("Alexnet", "cnn", 61.0, 650.0, 256.0, 40.0, 1.4, 0.3, 20.0, 512.0),
    _Plausible("GoogleNet", "cnn", 6.8, 170.0, 128.0, 15.0, 0.5, 0.3, 25.0, 256.0),
    _Plausible("ResNet50", "cnn", 25.6, 52.0, 64.0, 12.0, 0.9, 0.3, 30.0, 96.0),
    _Plausible("Inception-v3", "cnn", 23.8, 31.0, 64.0, 8.0, 0.8, 0.3, 30.0, 64.0),
    _Plausible("LSTM", "rnn", 20.0, 9000.0, 128.0, 400.0, 1.0, 0.3, 15.0, 512.0),
    _Plausible("Seq2seq", "rnn", 40.0, 3500.0, 128.0, 150.0, 1.2, 0.3, 20.0, 256.0),
)


def plausible_coefficients(p: _Plausible) -> Coefficients:
    a = (p.peak - p.r1) / (p.b_peak - 1.0) ** 2
    return Coefficients(
        k0=p.peak - a * p.b_peak * p.b_peak,
        k1=2.0 * a * p.b_peak,
        k2=-a,
        gamma=p.gamma,
        lam=p.lam,
        nu=p.nu,
        max_local_batch=p.max_local_batch,
    )


def default_entries() -> list[ModelEntry]:
    entries = []
    for p in DEFAULT_TABLE:
        training = ModelEntry(
            model_type=p.model_type,
            gpu_model=DEFAULT_GPU_MODEL,
            kind="training",
            coefficients=plausible_coefficients(p),
            family=p.family,
            params_m=p.params_m,
            source=DEFAULT_SOURCE,
        )
        entries.append(training)
        entries.append(
            replace(
                training,
                kind="inference",
                coefficients=_inference_from_training(training.coefficients),
            )
        )
    return entries
