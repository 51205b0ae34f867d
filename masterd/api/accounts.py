"""The RPC of accounts (``trellisctl account ...``), served by the accounts feature
(``masterd.features.accounts``). Listing is open to every caller; changes are an admin's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masterd.api.visibility import only_user
from masterd.core.scheduler import JobError
from masterd.features.accounts import (
    AccountAddParams,
    AccountNameParams,
    Accounts,
    AccountSetParams,
    AccountUserParams,
)
from shared.rpcdoc import returns


@dataclass(frozen=True)
class NoParams:
    pass


ACCOUNT_VIEW = ("an account view: `name`, `parent`, `users`, `default_for`, `shares`, "
                "`quota` and `borrowing_limit` (`{gpus, cpus, memory_mib}`, nil: unset), "
                "`caps` (`{running_jobs, submitted_jobs, gpus_per_job, time_limit_s}`), "
                "`children`, and `usage` (`{running_jobs, queued_jobs, gpus, cpus, "
                "memory_mib, borrowing}`: its subtree's jobs starting or running, and whether "
                "it uses more than its nominal quota)")
CHANGE_ERRORS = ("forbidden", "invalid_account", "invalid_params", "store_unavailable")


def method_table(accounts: Accounts) -> Mapping[str, tuple[type, Any]]:
    """The entries for :class:`masterd.api.rpc.Rpc`'s method table."""

    @returns(f"`accounts`: one {ACCOUNT_VIEW} per account, each root followed by its "
             "subtree; empty when accounts are off.")
    async def account_list(_: NoParams) -> dict[str, Any]:
        """Every account with its limits and current use. A client credential sees only
        its user's accounts and their sub-accounts."""
        user = only_user()
        views = accounts.views()
        if user is not None:
            mine = accounts.visible_accounts(user)
            views = [v for v in views if v["name"] in mine]
        return {"accounts": views}

    @returns(f"`account`: {ACCOUNT_VIEW}.", ("invalid_account", "forbidden"))
    async def account_show(p: AccountNameParams) -> dict[str, Any]:
        """One account with its limits and current use (a client: one of its user's
        accounts or their sub-accounts)."""
        user = only_user()
        if user is not None and p.name in accounts.tree \
                and p.name not in accounts.visible_accounts(user):
            raise JobError("forbidden", f"account {p.name!r} is not among client {user!r}'s "
                           "accounts")
        return {"account": accounts.view(p.name)}

    @returns(f"`account`: {ACCOUNT_VIEW}. Journalled (`account_changed`) before it applies.",
             CHANGE_ERRORS)
    async def account_add(p: AccountAddParams) -> dict[str, Any]:
        """Add an account (admins only). The whole tree is validated with it: an unknown
        parent, a cycle, a user left with two defaults or none refuse it."""
        added = await accounts.add(p.account, p.force)
        return {"account": accounts.view(added.name)}

    @returns(f"`account`: {ACCOUNT_VIEW}, as changed.", CHANGE_ERRORS)
    async def account_set(p: AccountSetParams) -> dict[str, Any]:
        """Change an account's parent, shares, quota, borrowing limit or caps (admins
        only); nil leaves a field as it is, -1 clears a limit. A cap or quota + borrowing
        limit below what the account runs now is refused unless `force` (nothing is
        stopped then; new jobs wait)."""
        changed = await accounts.set(p)
        return {"account": accounts.view(changed.name)}

    @returns("`removed`: the account's name.", CHANGE_ERRORS)
    async def account_remove(p: AccountNameParams) -> dict[str, Any]:
        """Remove an account (admins only): refused while it has sub-accounts or jobs
        queued or running."""
        await accounts.remove(p.name)
        return {"removed": p.name}

    @returns(f"`account`: {ACCOUNT_VIEW}.", CHANGE_ERRORS)
    async def account_add_user(p: AccountUserParams) -> dict[str, Any]:
        """Let a Unix user run jobs under an account (admins only); `default` makes it the
        account their jobs go to when they name none."""
        changed = await accounts.add_user(p.name, p.user, p.default)
        return {"account": accounts.view(changed.name)}

    @returns(f"`account`: {ACCOUNT_VIEW}.", CHANGE_ERRORS)
    async def account_remove_user(p: AccountUserParams) -> dict[str, Any]:
        """Take a user out of an account (admins only); their jobs accepted already keep
        it. Refused when it would leave them in several accounts and none default."""
        changed = await accounts.remove_user(p.name, p.user)
        return {"account": accounts.view(changed.name)}

    return {"account_list": (NoParams, account_list),
            "account_show": (AccountNameParams, account_show),
            "account_add": (AccountAddParams, account_add),
            "account_set": (AccountSetParams, account_set),
            "account_remove": (AccountNameParams, account_remove),
            "account_add_user": (AccountUserParams, account_add_user),
            "account_remove_user": (AccountUserParams, account_remove_user)}
