"""SODA's multi-array resource pools (§V-C): array map, sizing, and the array policy.

``ArrayPolicy`` (registered as ``soda-arrays``) wraps any inner policy per array; see
``policy.py`` for one pass, ``layout.py`` for which units belong to which array, and
``resize.py`` for sizing arrays from demand history.
"""

from masterd.core.arrays.config import (
    ArrayConfig,
    ArrayConfigError,
    InnerSpec,
    ModelArrays,
    Quota,
    Size,
    TenantConfig,
    parse_size,
)
from masterd.core.arrays.layout import ArrayId, ArrayMap, Home, NodeArrays, build_array_map
from masterd.core.arrays.policy import ArrayPolicy, PassResult
from masterd.core.arrays.resize import DemandRecord, demand_of, resize
from masterd.core.arrays.summary import ArraySummary

__all__ = [
    "ArrayConfig",
    "ArrayConfigError",
    "ArrayId",
    "ArrayMap",
    "ArrayPolicy",
    "ArraySummary",
    "DemandRecord",
    "Home",
    "InnerSpec",
    "ModelArrays",
    "NodeArrays",
    "PassResult",
    "Quota",
    "Size",
    "TenantConfig",
    "build_array_map",
    "demand_of",
    "parse_size",
    "resize",
]
