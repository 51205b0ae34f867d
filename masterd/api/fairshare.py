"""Fair share and accounting RPC: ``share`` (trellisctl share) and ``report`` (trellisctl
report), served by masterd/features/fairshare.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from masterd.api.visibility import only_user
from masterd.core.accounting import GROUPINGS
from masterd.features.fairshare import FairShareFeature, share_row
from masterd.runtime.caller import caller, is_admin
from shared.protocol import ProtocolError
from shared.rpcdoc import returns
from shared.schema import bounded

# Unix time bounds a report window may take (1970 .. 2200).
_MAX_TIME = 7_258_118_400.0


@dataclass(frozen=True)
class ShareParams:
    pass


@dataclass(frozen=True)
class ReportParams:
    # account, user or gpu-model.
    by: str = bounded("account", pattern=r"account|user|gpu-model")
    # The window [since, until) in Unix seconds; until defaults to now, since to 30 days
    # before until.
    since: float | None = bounded(None, min=0, max=_MAX_TIME)
    until: float | None = bounded(None, min=0, max=_MAX_TIME)


def method_table(feature: FairShareFeature
                 ) -> dict[str, tuple[type, Callable[[Any], Awaitable[Any]]]]:

    @returns("`time`, `half_life_s`, `weights` (`gpu`, `cpu`, `memory_gib`: usage units per "
             "hour), `order` (whether the factor orders jobs), `formula` and `accounts`: one "
             "row per account, parents before children: `account`, `parent`, `shares`, "
             "`norm_shares`, `raw_usage` (decayed usage of its subtree, usage units), "
             "`norm_usage`, `effective_usage`, `factor` (0..1). A client sees the rows of "
             "its own accounts and their sub-accounts, an admin every row.")
    async def share(_: ShareParams) -> dict[str, Any]:
        """Each account's shares, decayed usage and fair-share factor."""
        who = caller()
        visible = None if is_admin(who) or who is None else feature.visible_accounts(who.name)
        config = feature.ctx.config().fairshare
        return {
            "time": feature.ctx.clock(),
            "half_life_s": config.half_life_s,
            "weights": {"gpu": config.gpu_weight, "cpu": config.cpu_weight,
                        "memory_gib": config.memory_gib_weight},
            "order": config.order,
            "formula": "classic: F = 2^(-effective_usage/norm_shares)",
            "accounts": [share_row(row) for row in feature.rows(visible)],
        }

    @returns("`by`, `since`, `until` and `rows`: per account, user or GPU model "
             "`gpu_hours_allocated`, `gpu_hours_busy` (measured utilisation × allocated; "
             "nil where no node measured it), `gpu_hours_measured`, `jobs` (ended in the "
             "window, by end state), `running` (at `until`), `started`, `wait_p50_s`, "
             "`wait_p95_s` (submission to first start of the jobs started in the window), "
             "`requeues`. A client's report covers its own jobs only.", ("invalid_params",))
    async def report(params: ReportParams) -> dict[str, Any]:
        """Accounting from the journal over a window (read off the event loop)."""
        if params.by not in GROUPINGS:
            raise ProtocolError("invalid_params", f"by must be one of {', '.join(GROUPINGS)}")
        until = params.until if params.until is not None else feature.ctx.clock()
        since = params.since if params.since is not None else until - 30 * 86400.0
        if until <= since:
            raise ProtocolError("invalid_params", f"until ({until:.0f}) must be after since "
                                f"({since:.0f})")
        rows = await feature.report(params.by, since, until, only_user())
        return {"by": params.by, "since": since, "until": until, "rows": rows}

    return {"share": (ShareParams, share), "report": (ReportParams, report)}
