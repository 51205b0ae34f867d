"""The placement RPC for inference services (SODA §V-D): ``register_service``,
``report_load``, ``place``, ``deregister_service`` and ``services``, served by the inference
feature (``masterd.features.inference``), whose parameter schemas are also its journalled
registrations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from masterd.features.inference import (
    InferenceService,
    NoServiceParams,
    RegisterServiceParams,
    ReportLoadParams,
    ServiceParams,
)


def method_table(svc: InferenceService) -> Mapping[str, tuple[type, Any]]:
    """The placement RPC's entries for :class:`masterd.api.rpc.Rpc`'s method table."""
    return {
        "register_service": (RegisterServiceParams, svc.register_service),
        "report_load": (ReportLoadParams, svc.report_load),
        "place": (ServiceParams, svc.place),
        "deregister_service": (ServiceParams, svc.deregister_service),
        "services": (NoServiceParams, svc.services),
    }
