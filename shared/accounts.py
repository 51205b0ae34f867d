"""Accounts: who is charged for a job, what each group is guaranteed, and how far it may go.

An account tree (organisation -> group -> ...) names the Unix users in each account. A job runs
under one account its user belongs to (``JobSpec.tenant``; Slurm's ``--account``). Per account:

- ``quota``: the nominal resources it is guaranteed (Kueue's nominalQuota). Unset: none
  (nothing is guaranteed; everything it uses is borrowed).
- ``borrowing_limit``: how much it may use over its quota while others leave resources idle
  (Kueue's borrowingLimit); borrowed resources are reclaimed when an owner needs them. Unset:
  no bound but the cluster.
- ``caps``: hard caps on its jobs (Slurm's GrpJobs/GrpSubmitJobs/MaxTRESPerJob/MaxWall).
- ``shares``: its fair-share weight among its siblings (Slurm's Fairshare=).

An account's usage includes its sub-accounts', so a parent's quota and caps bound its whole
subtree. This module is the tree and its validation only: plain data, no I/O, shared by the
master and the simulator. An empty tree means accounts are off: every job is charged to the
account its spec names (``default``), as before accounts existed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from shared.model import NAME_PATTERN, UNIX_USER_PATTERN
from shared.schema import bounded

# The account every job is charged to while no accounts are configured.
DEFAULT_ACCOUNT = "default"


class AccountError(ValueError):
    """An account tree (or a change to it) that cannot hold; the message names the problem."""


@dataclass(frozen=True)
class Resources:
    """An amount of each resource; None: no bound (for a quota: nothing guaranteed)."""

    gpus: int | None = bounded(None, min=0, max=1 << 20)
    cpus: int | None = bounded(None, min=0, max=1 << 24)
    memory_mib: int | None = bounded(None, min=0, max=1 << 40)


@dataclass(frozen=True)
class AccountCaps:
    """Hard caps on an account's jobs (its subtree's, for a parent); None: no cap."""

    # Jobs running at once (Slurm's GrpJobs).
    running_jobs: int | None = bounded(None, min=0, max=10_000_000)
    # Jobs queued or running at once (GrpSubmitJobs): a submission over it is refused.
    submitted_jobs: int | None = bounded(None, min=0, max=10_000_000)
    # GPUs one job may ask for (MaxTRESPerJob=gres/gpu): a submission over it is refused.
    gpus_per_job: int | None = bounded(None, min=0, max=1 << 20)
    # The longest time limit a job may ask for, in seconds (MaxWall): refused over it.
    time_limit_s: int | None = bounded(None, min=1, max=366 * 86400)


NO_CAPS = AccountCaps()
NO_RESOURCES = Resources()


@dataclass(frozen=True)
class Account:
    """One account as configured ([[master.accounts]]) or changed by ``trellisctl account``."""

    name: str = bounded(pattern=NAME_PATTERN)
    # The parent account; None: a root (an organisation).
    parent: str | None = bounded(None, pattern=NAME_PATTERN)
    # The Unix users who may run jobs under this account.
    users: tuple[str, ...] = bounded(default_factory=tuple, max_len=100_000,
                                     pattern=UNIX_USER_PATTERN)
    # Users (among ``users``) whose jobs go here when they name no account.
    default_for: tuple[str, ...] = bounded(default_factory=tuple, max_len=100_000,
                                           pattern=UNIX_USER_PATTERN)
    # Fair-share weight among its siblings.
    shares: float = bounded(1.0, min=0.0001, max=1e9)
    quota: Resources = NO_RESOURCES
    borrowing_limit: Resources = NO_RESOURCES
    caps: AccountCaps = NO_CAPS


@dataclass(frozen=True)
class AccountTree:
    """A validated set of accounts. Build it with :meth:`of`; it never holds a cycle, an
    unknown parent, or a user without a default account."""

    accounts: dict[str, Account] = field(default_factory=dict)
    _children: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    _defaults: dict[str, str] = field(default_factory=dict, repr=False)
    _member_of: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, accounts: Iterable[Account]) -> AccountTree:
        by_name: dict[str, Account] = {}
        for account in accounts:
            if account.name in by_name:
                raise AccountError(f"account {account.name!r} is defined twice")
            by_name[account.name] = account
        children: dict[str, list[str]] = {name: [] for name in by_name}
        for account in by_name.values():
            if account.parent is None:
                continue
            if account.parent not in by_name:
                raise AccountError(f"account {account.name!r} names an unknown parent "
                                   f"{account.parent!r}")
            children[account.parent].append(account.name)
        for name in by_name:
            _check_acyclic(name, by_name)
        member_of: dict[str, set[str]] = {}
        for account in by_name.values():
            stray = sorted(set(account.default_for) - set(account.users))
            if stray:
                raise AccountError(f"account {account.name!r} is the default of user "
                                   f"{stray[0]!r}, who is not among its users")
            for user in account.users:
                member_of.setdefault(user, set()).add(account.name)
        defaults: dict[str, str] = {}
        for user, names in member_of.items():
            chosen = sorted(n for n in names if user in by_name[n].default_for)
            if len(chosen) > 1:
                raise AccountError(f"user {user!r} has two default accounts: {chosen[0]!r} "
                                   f"and {chosen[1]!r}")
            if chosen:
                defaults[user] = chosen[0]
            elif len(names) == 1:
                defaults[user] = next(iter(names))
            else:
                raise AccountError(f"user {user!r} is in accounts {sorted(names)} and none "
                                   f"is marked default_for them")
        return cls(by_name, {k: tuple(sorted(v)) for k, v in children.items()}, defaults,
                   {u: frozenset(n) for u, n in member_of.items()})

    @property
    def enabled(self) -> bool:
        """Whether accounts are configured at all (off: every job in its spec's account)."""
        return bool(self.accounts)

    def __contains__(self, name: object) -> bool:
        return name in self.accounts

    def __getitem__(self, name: str) -> Account:
        try:
            return self.accounts[name]
        except KeyError:
            raise AccountError(f"no account named {name!r}") from None

    def children(self, name: str) -> tuple[str, ...]:
        return self._children.get(name, ())

    def roots(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, a in self.accounts.items() if a.parent is None))

    def ancestors(self, name: str) -> Iterator[str]:
        """``name``'s parent, its parent, ... up to its root (``name`` itself excluded)."""
        parent = self[name].parent
        while parent is not None:
            yield parent
            parent = self.accounts[parent].parent

    def lineage(self, name: str) -> tuple[str, ...]:
        """``name`` and its ancestors, nearest first: every account a job of ``name`` is
        charged to."""
        return (name, *self.ancestors(name))

    def subtree(self, name: str) -> tuple[str, ...]:
        """``name`` and all its descendants."""
        out = [name]
        for child in self.children(name):
            out.extend(self.subtree(child))
        return tuple(out)

    def accounts_of(self, user: str) -> frozenset[str]:
        """The accounts ``user`` may run jobs under."""
        return self._member_of.get(user, frozenset())

    def default_account(self, user: str) -> str | None:
        """Where ``user``'s jobs go when they name no account; None: the user is in none."""
        return self._defaults.get(user)

    def account_for(self, user: str, named: str | None) -> str:
        """The account a job of ``user`` runs under, naming ``named`` (None: the user's
        default). Raises AccountError with the reason when it may not."""
        if named is None or named == "":
            default = self.default_account(user)
            if default is None:
                raise AccountError(f"user {user!r} is in no account; an admin must add them "
                                   f"to one (trellisctl account add-user)")
            return default
        if named not in self.accounts:
            raise AccountError(f"no account named {named!r}")
        if named not in self.accounts_of(user):
            raise AccountError(f"user {user!r} is not in account {named!r} (their accounts: "
                               f"{', '.join(sorted(self.accounts_of(user))) or 'none'})")
        return named

    def submission_account(self, user: str, tenant: str) -> str | None:
        """The account a submission by ``user`` whose spec names ``tenant`` will run under
        (a spec's tenant reads ``default`` when the submission named none), or None when it
        may not (the accounts feature refuses it and says why). Without accounts, the
        tenant as named."""
        if not self.enabled:
            return tenant
        named: str | None = tenant
        if named == DEFAULT_ACCOUNT and DEFAULT_ACCOUNT not in self.accounts_of(user):
            named = None  # left as it was: the user's default (as the accounts feature reads)
        try:
            return self.account_for(user, named)
        except AccountError:
            return None

    def replaced(self, account: Account) -> AccountTree:
        """The tree with ``account`` added or replacing its namesake; validated whole, so a
        change that breaks the tree raises and applies nothing."""
        rest = [a for n, a in self.accounts.items() if n != account.name]
        return AccountTree.of([*rest, account])

    def without(self, name: str) -> AccountTree:
        """The tree with account ``name`` removed (refused while it has sub-accounts)."""
        self[name]
        if self.children(name):
            raise AccountError(f"account {name!r} has sub-accounts "
                               f"({', '.join(self.children(name))}); remove them first")
        return AccountTree.of(a for n, a in self.accounts.items() if n != name)


def _check_acyclic(name: str, by_name: dict[str, Account]) -> None:
    seen = [name]
    parent = by_name[name].parent
    while parent is not None:
        if parent in seen:
            cycle = " -> ".join([*seen[seen.index(parent):], parent])
            raise AccountError(f"accounts form a cycle: {cycle}")
        seen.append(parent)
        parent = by_name[parent].parent
