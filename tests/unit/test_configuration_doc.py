"""docs/configuration.md documents every key the daemons read: a key added to shared.config
without a line there fails here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from shared import config

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _keys(cls: type) -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type) or f.name in _NESTED:
            continue
        keys.append(f.name)
    return keys


# Fields that are tables of their own ([master.inference], [gpu], ...), documented key by key.
_NESTED = {"inference", "estimator", "power", "liquid", "gpu", "rdt", "contention", "tuner",
           "net", "jobs", "fairshare"}


def test_every_configuration_key_is_documented() -> None:
    text = DOC.read_text()
    missing = []
    for name in dir(config):
        cls = getattr(config, name)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and name.endswith("Config"):
            missing += [f"{name}.{key}" for key in _keys(cls) if f"`{key}`" not in text
                        and f".{key}`" not in text and f"/ `{key}`" not in text
                        and f"/ {key}`" not in text]
    assert not missing, f"keys missing from {DOC.name}: {missing}"
