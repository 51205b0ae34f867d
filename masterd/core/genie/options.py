"""Turning a policy's configuration options into a model database and GENIE settings."""

from __future__ import annotations

from pathlib import Path

from masterd.core.genie.modeldb import ModelDB
from masterd.core.genie.plan import GenieSettings


def load_modeldb(modeldb: ModelDB | str | Path | None) -> ModelDB:
    """A ``ModelDB`` as given, read from a ``.json``/``.toml`` path, or the built-in table."""
    if modeldb is None:
        return ModelDB.default()
    if isinstance(modeldb, ModelDB):
        return modeldb
    if isinstance(modeldb, str | Path):
        return ModelDB.load(modeldb)
    raise ValueError(
        f"modeldb must be a path to a .json/.toml model database, got {type(modeldb).__name__}"
    )


def genie_setup(
    modeldb: ModelDB | str | Path | None,
    theta: float,
    shape_mode: str,
    default_rate: float,
    default_duration_s: float,
    urgent_placement: str = "fastest",
) -> tuple[ModelDB, GenieSettings]:
    settings = GenieSettings(
        theta=theta,
        shape_mode=shape_mode,
        default_rate=default_rate,
        default_duration_s=default_duration_s,
        urgent_placement=urgent_placement,
    )
    return load_modeldb(modeldb), settings
