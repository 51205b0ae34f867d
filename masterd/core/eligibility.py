"""May this request use this node: the one answer every placer asks for.

A job that asks for no GPU may use any node; one that asks for GPUs without naming a model
may use any node's; one that names a model only nodes of that model. The placers (packing,
EASY backfill's shadow, quota reclaim, the profiler, Liquid's candidates, the inference
planner) all ask here, so a new condition (a node's labels, a flavor) is added once.
"""

from __future__ import annotations

from shared.model import JobSpec


def model_fits(wanted: str | None, model: str | None) -> bool:
    """A node whose GPUs are ``model`` serves a request for ``wanted`` (None: any model)."""
    return wanted is None or model == wanted


def eligible(spec: JobSpec, model: str | None) -> bool:
    """The job may run on a node whose GPUs are ``model``."""
    return spec.gpus == 0 or spec.gpu_model is None or model == spec.gpu_model
