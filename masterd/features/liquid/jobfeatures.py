"""The features Liquid's resource model reads of a job (§4.2), and its labels from usage.

Features come from what the job asks for and how it is launched, never from where it ran, so
the same vector is known at submission (prediction) and at exit (training): GPUs, nodes at most,
batch, iterations, cores, memory, kind, the model type and family, user and tenant, a fraction
of a GPU, and the hyperparameters on its command line (``--batch-size 64``, ``--lr=0.1``,
``-e 3``; Liquid's own features). Names Liquid's jobs commonly use get a column each; any
other flag lands in one of a few hashed columns. Strings are hashed (CRC-32, stable across
runs and processes) to numbers, as Liquid's code hashes them.

Labels are per task (one worker, one GPU): mean and standard deviation of GPU utilisation
(0–1), peak GPU memory, peak CPU in cores, peak memory, and network bandwidth (MB/s sent and
received), from a part's final ``job_usage`` divided over the workers the part ran; and the
lengths of the part's launching and post phases in seconds (Liquid §6.1's phase model), as
noded measured them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

from shared.model import JobSpec

# Command-line names -> feature column (flags are compared without dashes, lower case, with
# '-' as '_').
HYPERPARAMETERS: dict[str, str] = {
    "batch": "hp_batch", "batch_size": "hp_batch", "bs": "hp_batch", "b": "hp_batch",
    "lr": "hp_lr", "learning_rate": "hp_lr",
    "epochs": "hp_epochs", "epoch": "hp_epochs", "e": "hp_epochs",
    "steps": "hp_steps", "iterations": "hp_steps", "iters": "hp_steps", "max_steps": "hp_steps",
    "model": "hp_model", "arch": "hp_model", "network": "hp_model",
    "dataset": "hp_data", "data": "hp_data",
    "hidden": "hp_hidden", "hidden_size": "hp_hidden", "width": "hp_hidden",
    "layers": "hp_layers", "num_layers": "hp_layers", "depth": "hp_layers",
    "seq_len": "hp_seq", "max_len": "hp_seq", "sequence_length": "hp_seq",
    "workers": "hp_workers", "num_workers": "hp_workers",
    "amp": "hp_amp", "fp16": "hp_amp",
    "gpu_mem_mib": "hp_gpu_mem", "gpu_util": "hp_gpu_util",
}
HASHED_BUCKETS = 4
FEATURES: tuple[str, ...] = (
    "gpus", "max_nodes", "batch", "log_iterations", "cpus", "memory_gib", "kind",
    "model_type", "model_family", "params_m", "user", "tenant", "gpu_milli",
    *sorted(set(HYPERPARAMETERS.values())),
    *(f"hp_other_{i}" for i in range(HASHED_BUCKETS)),
)
LABELS: tuple[str, ...] = ("gpu_util", "gpu_util_std", "gpu_mem_mib", "cpu", "mem_mib",
                           "net_mbps", "pre_s", "post_s")
_KINDS = {"training": 0.0, "inference": 1.0, "cpu": 2.0}


def stable_hash(text: str) -> float:
    """A string as a number in [0, 1), the same in every process."""
    return zlib.crc32(text.encode("utf-8", "replace")) / 2**32


def _value(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        return stable_hash(text)
    return number if math.isfinite(number) else stable_hash(text)


def command_flags(command: tuple[str, ...]) -> dict[str, float]:
    """``--name value``, ``--name=value``, ``-n value`` and bare ``--flag`` (1.0)."""
    flags: dict[str, float] = {}
    i = 0
    while i < len(command):
        token = command[i]
        i += 1
        if not token.startswith("-") or token in ("-", "--") or _is_number(token):
            continue
        name, eq, value = token.lstrip("-").partition("=")
        name = name.lower().replace("-", "_")
        if not name:
            continue
        if eq:
            flags[name] = _value(value)
        elif i < len(command) and (not command[i].startswith("-") or _is_number(command[i])):
            flags[name] = _value(command[i])
            i += 1
        else:
            flags[name] = 1.0
    return flags


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def features_of(spec: JobSpec) -> dict[str, float]:
    row = {name: 0.0 for name in FEATURES}
    row.update(
        gpus=float(spec.gpus),
        max_nodes=float(spec.max_nodes or 0),
        batch=float(spec.batch or 0),
        log_iterations=math.log10(spec.iterations) if spec.iterations else 0.0,
        cpus=float(spec.cpus),
        memory_gib=spec.memory_mib / 1024,
        kind=_KINDS.get(spec.kind.value, 0.0),
        model_type=stable_hash(spec.model_type or ""),
        model_family=stable_hash(spec.model_family or ""),
        params_m=float(spec.model_params_m or 0.0),
        user=stable_hash(spec.user),
        tenant=stable_hash(spec.tenant),
        gpu_milli=float(spec.gpu_milli or 0),
    )
    for name, value in command_flags(spec.command).items():
        column = HYPERPARAMETERS.get(name)
        if column is None:
            column = f"hp_other_{zlib.crc32(name.encode()) % HASHED_BUCKETS}"
        row[column] = value
    return row


def vector(features: Mapping[str, Any], names: tuple[str, ...] = FEATURES) -> list[float]:
    """The features in ``names`` order (:data:`FEATURES` by default; a missing one is 0)."""
    return [float(features.get(name, 0.0) or 0.0) for name in names]


def labels_of(usage: Mapping[str, Any], workers: int) -> dict[str, float] | None:
    """Per-task labels from a final usage report of a part that ran ``workers`` workers, or
    None when the report lacks what the model learns (a part that ran no time)."""
    seconds = float(usage.get("seconds") or 0.0)
    if seconds <= 0:
        return None
    share = max(1, workers)
    util = usage.get("gpu_util_mean")
    std = usage.get("gpu_util_std")
    tx, rx = usage.get("net_tx_bytes"), usage.get("net_rx_bytes")
    labels = {
        "gpu_util": None if util is None else util / 100.0,
        "gpu_util_std": None if std is None else std / 100.0,
        "gpu_mem_mib": usage.get("gpu_memory_peak_mib"),
        "cpu": None if usage.get("cpu_peak") is None else usage["cpu_peak"] / share,
        "mem_mib": (None if usage.get("memory_peak_mib") is None
                    else usage["memory_peak_mib"] / share),
        "net_mbps": (None if tx is None or rx is None
                     else (tx + rx) / seconds / 1e6 / share),
        "pre_s": usage.get("pre_s"),
        "post_s": usage.get("post_s"),
    }
    return {k: float(v) for k, v in labels.items() if v is not None}
