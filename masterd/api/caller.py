"""Who is calling the RPC being served: see :mod:`masterd.runtime.caller`, where the context
variable lives so that features (a layer below the API) can read it too. Re-exported here
for the HTTP layer that sets it."""

from __future__ import annotations

from masterd.runtime.caller import CALLER, caller, is_admin, owns

__all__ = ["CALLER", "caller", "is_admin", "owns"]
