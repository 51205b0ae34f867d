"""Configuration of SODA's multi-array pools: array sizes, bounds, tenants, inner policies.

Sizes are written as an integer count (GPUs for the large array, cores per node for the CPU-job
array), a float fraction in [0, 1], or a percentage string such as ``"25%"``. A float is always a
fraction (``1.0`` is everything), an int always a count, so ``1`` and ``1.0`` mean different
things on purpose.

Example table (the ``options`` of the ``soda-arrays`` policy)::

    borrowing = true              # jobs may borrow idle resources of other arrays
    gpu_jobs_borrow_cpu_cores = false  # GPU jobs may also borrow idle cores of the CPU-job array
    lending = "idle"              # or "free": when an array lends (see LENDING)
    history_days = 7              # window resize() looks back over
    default_gpu_model = "A100"    # array for GPU jobs that name no model
    [inner]                       # ordering policy inside each array, by array kind
    small = "swaf"
    large = { name = "fifo", backfill = true }
    cpu = "drf"
    [models."*"]                  # every GPU model without its own entry
    large = 0.5                   # share of the model's GPUs in the large-job array
    large_min = 0.25
    large_max = 0.75
    cpu_job_cores = 4             # cores per GPU node reserved for CPU jobs
    cpu_job_cores_min = 2
    cpu_job_cores_max = "50%"
    [tenants.vision]
    weight = 2.0                  # DRF weight
    borrow_over_quota = true      # over-quota jobs may still run on borrowed resources
    quota = { small = { gpus = 8, cores = 64 }, "large:A100" = { gpus = 16 } }
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from shared.model import is_valid_name

DEFAULT_MODEL_KEY = "*"
JOB_ARRAY_KINDS = ("large", "small", "cpu")


class ArrayConfigError(ValueError):
    """The arrays' configuration is malformed; the message names the offending key."""


@dataclass(frozen=True)
class Size:
    """An amount of a resource, either absolute or relative to a capacity."""

    value: float
    fraction: bool

    def resolve(self, capacity: int) -> int:
        """The concrete amount for a pool of ``capacity`` units, never above the capacity."""
        # Fractions round half up, so 0.5 of 3 GPUs is 2 (Python's round() would pick 2 or 1).
        amount = math.floor(self.value * capacity + 0.5) if self.fraction else int(self.value)
        return max(0, min(capacity, amount))

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.fraction else str(int(self.value))

    @classmethod
    def count(cls, n: int) -> Size:
        return cls(float(n), False)

    @classmethod
    def share(cls, f: float) -> Size:
        return cls(float(f), True)


def parse_size(raw: object, where: str) -> Size:
    if isinstance(raw, Size):
        return raw
    if isinstance(raw, bool):
        raise ArrayConfigError(f"{where}: must be a count, a fraction or a percentage, got {raw!r}")
    if isinstance(raw, int):
        if raw < 0:
            raise ArrayConfigError(f"{where}: a count must not be negative, got {raw}")
        return Size.count(raw)
    if isinstance(raw, float):
        if not 0.0 <= raw <= 1.0:
            raise ArrayConfigError(
                f"{where}: a fraction must lie in [0, 1], got {raw} (write an int for a count)"
            )
        return Size.share(raw)
    if isinstance(raw, str) and raw.endswith("%"):
        try:
            pct = float(raw[:-1])
        except ValueError:
            raise ArrayConfigError(f"{where}: {raw!r} is not a percentage") from None
        if not 0.0 <= pct <= 100.0:
            raise ArrayConfigError(f"{where}: a percentage must lie in [0%, 100%], got {raw}")
        return Size.share(pct / 100.0)
    raise ArrayConfigError(
        f"{where}: must be a count (int), a fraction (float in [0, 1]) or 'N%', got {raw!r}"
    )


def clamp_size(value: Size, low: Size, high: Size, capacity: int) -> int:
    """Resolve ``value`` within ``[low, high]`` on ``capacity``; the upper bound wins a clash."""
    amount = max(value.resolve(capacity), low.resolve(capacity))
    return min(amount, high.resolve(capacity))


@dataclass(frozen=True)
class ModelArrays:
    """Array sizes for one GPU model's nodes."""

    # Share of the model's GPUs in the large-job array (whole nodes, see layout.py).
    large: Size = field(default_factory=lambda: Size.share(0.5))
    large_min: Size = field(default_factory=lambda: Size.share(0.0))
    large_max: Size = field(default_factory=lambda: Size.share(1.0))
    # Cores of each GPU node in the CPU-job array; the rest form the GPU-job CPU array.
    cpu_job_cores: Size = field(default_factory=lambda: Size.share(0.25))
    cpu_job_cores_min: Size = field(default_factory=lambda: Size.share(0.0))
    cpu_job_cores_max: Size = field(default_factory=lambda: Size.share(1.0))

    def large_gpus(self, model_gpus: int) -> int:
        return clamp_size(self.large, self.large_min, self.large_max, model_gpus)

    def cpu_cores(self, node_cores: int) -> int:
        return clamp_size(
            self.cpu_job_cores, self.cpu_job_cores_min, self.cpu_job_cores_max, node_cores
        )


@dataclass(frozen=True)
class Quota:
    """Most a tenant may hold in one array; None is unlimited."""

    gpus: int | None = None
    cores: int | None = None

    def allows(self, used_gpus: int, used_cores: int, gpus: int, cores: int) -> bool:
        if self.gpus is not None and used_gpus + gpus > self.gpus:
            return False
        return self.cores is None or used_cores + cores <= self.cores


UNLIMITED = Quota()


@dataclass(frozen=True)
class TenantConfig:
    weight: float = 1.0
    # A job over its quota waits; with this set it may instead run on borrowed resources only.
    borrow_over_quota: bool = False
    # Keyed by array name ("small:A100") or array kind ("small"), the name winning.
    quotas: Mapping[str, Quota] = field(default_factory=lambda: MappingProxyType({}))

    def quota_for(self, array_name: str, kind: str) -> Quota:
        return self.quotas.get(array_name) or self.quotas.get(kind) or UNLIMITED


DEFAULT_TENANT = TenantConfig()


@dataclass(frozen=True)
class InnerSpec:
    """Which registered policy orders jobs inside an array, and its options."""

    name: str
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


# When an array lends its free units to jobs of other arrays:
# - "idle": only while none of its owners waits for it (an owner that could fit the array when
#   empty), so a loan is never preempted in the pass right after it was made;
# - "free" (SODA §V-C): whenever none of its waiting owners could start on its free units with
#   its loans taken back; the loan is reclaimed (preempted, migrated where jobs checkpoint) as
#   soon as one could. More use of idle GPUs, more preemptions.
LENDING = ("idle", "free")


@dataclass(frozen=True)
class ArrayConfig:
    default: ModelArrays = field(default_factory=ModelArrays)
    models: Mapping[str, ModelArrays] = field(default_factory=lambda: MappingProxyType({}))
    tenants: Mapping[str, TenantConfig] = field(default_factory=lambda: MappingProxyType({}))
    borrowing: bool = True
    # GPU jobs may borrow idle cores of the CPU-job array on their nodes (SODA §V-C lends
    # both ways); off by default: such a loan is preempted whenever a CPU job needs the core.
    gpu_jobs_borrow_cpu_cores: bool = False
    lending: str = "idle"  # one of LENDING
    history_days: float = 7.0
    default_gpu_model: str | None = None
    inner: Mapping[str, InnerSpec] = field(default_factory=lambda: MappingProxyType({}))

    def for_model(self, model: str) -> ModelArrays:
        return self.models.get(model, self.default)

    def tenant(self, name: str) -> TenantConfig:
        return self.tenants.get(name, DEFAULT_TENANT)

    def with_model(self, model: str | None, arrays: ModelArrays) -> ArrayConfig:
        """A copy with ``arrays`` for ``model`` (None: the default for unlisted models)."""
        if model is None:
            return replace(self, default=arrays)
        models = dict(self.models)
        models[model] = arrays
        return replace(self, models=MappingProxyType(models))

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str = "arrays") -> ArrayConfig:
        """Build from a configuration table, rejecting unknown keys and bad values by name."""
        _check_keys(
            table,
            {"borrowing", "gpu_jobs_borrow_cpu_cores", "lending", "history_days",
             "default_gpu_model", "inner", "models", "tenants"},
            where,
        )
        borrowing = _bool(table.get("borrowing", True), f"{where}.borrowing")
        cpu_loans = _bool(table.get("gpu_jobs_borrow_cpu_cores", False),
                          f"{where}.gpu_jobs_borrow_cpu_cores")
        lending = table.get("lending", "idle")
        if lending not in LENDING:
            raise ArrayConfigError(
                f"{where}.lending: must be one of {', '.join(LENDING)}, got {lending!r}"
            )
        days = table.get("history_days", 7.0)
        if isinstance(days, bool) or not isinstance(days, int | float) or not 0 < days <= 3650:
            raise ArrayConfigError(
                f"{where}.history_days: must be a number of days in (0, 3650], got {days!r}"
            )
        default_model = table.get("default_gpu_model")
        if default_model is not None and (
            not isinstance(default_model, str) or not default_model or len(default_model) > 128
        ):
            raise ArrayConfigError(
                f"{where}.default_gpu_model: must be a GPU model name, got {default_model!r}"
            )
        models_raw = _table(table.get("models", {}), f"{where}.models")
        default = ModelArrays()
        models: dict[str, ModelArrays] = {}
        if DEFAULT_MODEL_KEY in models_raw:
            default = _model_arrays(
                models_raw[DEFAULT_MODEL_KEY], default, f"{where}.models.{DEFAULT_MODEL_KEY}"
            )
        for model, raw in models_raw.items():
            if model == DEFAULT_MODEL_KEY:
                continue
            if not isinstance(model, str) or not model or len(model) > 128:
                raise ArrayConfigError(f"{where}.models: {model!r} is not a GPU model name")
            models[model] = _model_arrays(raw, default, f"{where}.models.{model}")
        tenants = {
            name: _tenant(raw, f"{where}.tenants.{name}")
            for name, raw in _table(table.get("tenants", {}), f"{where}.tenants").items()
        }
        for name in tenants:
            if not is_valid_name(name):
                raise ArrayConfigError(f"{where}.tenants: {name!r} is not a valid tenant name")
        inner: dict[str, InnerSpec] = {}
        for kind, raw in _table(table.get("inner", {}), f"{where}.inner").items():
            if kind not in JOB_ARRAY_KINDS:
                raise ArrayConfigError(
                    f"{where}.inner: {kind!r} is not an array kind "
                    f"(one of {', '.join(JOB_ARRAY_KINDS)})"
                )
            inner[kind] = _inner_spec(raw, f"{where}.inner.{kind}")
        return cls(
            default=default,
            models=MappingProxyType(models),
            tenants=MappingProxyType(tenants),
            borrowing=borrowing,
            gpu_jobs_borrow_cpu_cores=cpu_loans,
            lending=lending,
            history_days=float(days),
            default_gpu_model=default_model,
            inner=MappingProxyType(inner),
        )


# -- parsing helpers ----------------------------------------------------------------------


def _table(raw: object, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ArrayConfigError(f"{where}: must be a table, got {type(raw).__name__}")
    return raw


def _check_keys(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise ArrayConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )


def _bool(raw: object, where: str) -> bool:
    if not isinstance(raw, bool):
        raise ArrayConfigError(f"{where}: must be true or false, got {raw!r}")
    return raw


def _model_arrays(raw: object, base: ModelArrays, where: str) -> ModelArrays:
    table = _table(raw, where)
    names = {
        "large", "large_min", "large_max", "cpu_job_cores", "cpu_job_cores_min",
        "cpu_job_cores_max",
    }
    _check_keys(table, names, where)
    sizes = {k: parse_size(v, f"{where}.{k}") for k, v in table.items()}
    arrays = replace(base, **sizes)
    for low, high in (("large_min", "large_max"), ("cpu_job_cores_min", "cpu_job_cores_max")):
        lo, hi = getattr(arrays, low), getattr(arrays, high)
        if lo.fraction == hi.fraction and lo.value > hi.value:
            raise ArrayConfigError(f"{where}: {low} ({lo}) is above {high} ({hi})")
    return arrays


def _count(raw: object, where: str) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ArrayConfigError(f"{where}: must be a non-negative integer, got {raw!r}")
    return raw


def _tenant(raw: object, where: str) -> TenantConfig:
    table = _table(raw, where)
    _check_keys(table, {"weight", "borrow_over_quota", "quota"}, where)
    weight = table.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
        0 < weight <= 1e6
    ):
        raise ArrayConfigError(f"{where}.weight: must be a number in (0, 1e6], got {weight!r}")
    borrow = _bool(table.get("borrow_over_quota", False), f"{where}.borrow_over_quota")
    quotas: dict[str, Quota] = {}
    for key, qraw in _table(table.get("quota", {}), f"{where}.quota").items():
        qwhere = f"{where}.quota.{key}"
        kind = str(key).split(":", 1)[0]
        if kind not in JOB_ARRAY_KINDS:
            raise ArrayConfigError(
                f"{qwhere}: {key!r} is not an array kind or name (kind one of "
                f"{', '.join(JOB_ARRAY_KINDS)}, optionally ':MODEL')"
            )
        qtable = _table(qraw, qwhere)
        _check_keys(qtable, {"gpus", "cores"}, qwhere)
        quotas[str(key)] = Quota(
            gpus=_count(qtable.get("gpus"), f"{qwhere}.gpus"),
            cores=_count(qtable.get("cores"), f"{qwhere}.cores"),
        )
    return TenantConfig(
        weight=float(weight), borrow_over_quota=borrow, quotas=MappingProxyType(quotas)
    )


def _inner_spec(raw: object, where: str) -> InnerSpec:
    if isinstance(raw, str):
        return InnerSpec(raw)
    table = dict(_table(raw, where))
    name = table.pop("name", None)
    if not isinstance(name, str) or not name:
        raise ArrayConfigError(f"{where}.name: must name a registered policy, got {name!r}")
    return InnerSpec(name, MappingProxyType(table))
