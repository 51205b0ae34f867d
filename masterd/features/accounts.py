"""Accounts at run time: the account tree, who may charge which account, caps at submission
and quota admission (docs/governance.md).

* The tree. ``[[master.accounts]]`` seeds the journal once, when it holds no tree yet; from
  then on the journalled tree is the truth, changed by admins (``trellisctl account ...``)
  without a restart and read back by a restarted or newly elected master. Later edits of
  ``[[master.accounts]]`` are ignored with a warning (the journal would otherwise lose
  changes made at run time on the next SIGHUP).
* Every change is validated whole (``AccountTree.of``: cycles, unknown parents, users
  without a default) and against what runs: a running_jobs cap or a quota + borrowing limit
  below the account's current use is refused unless ``force`` (then nothing is stopped; new
  jobs wait until its use falls). Lowering a nominal quota below use is allowed: the account
  becomes a borrower, and what it holds over its quota is reclaimable. A change is
  journalled before it applies; a refused one changes nothing.
* Submission: a job naming no account (``tenant`` left ``default``) runs under its user's
  default account (``spec_defaults``); naming one its user is not in is refused. Caps
  ``gpus_per_job``, ``time_limit_s`` and ``submitted_jobs`` are checked for the account and
  each ancestor, and refused with a sentence naming the cap. A job asking no time limit
  under an account with ``caps.time_limit_s`` (and no master default) gets that cap as its
  limit, as Slurm applies MaxWall.
* Admission: :class:`masterd.core.quotas.QuotaAdmission` on the scheduling core (running
  jobs caps, quota + borrowing limit, reclaim).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from masterd.core.quotas import RESOURCES, UNITS, QuotaAdmission, ceiling, demand, shown
from masterd.core.scheduler import JobError
from masterd.journal.accounts import create_tables, read_tree, write_tree
from masterd.runtime.caller import caller, is_admin
from masterd.runtime.context import FeatureContext
from shared.accounts import (
    DEFAULT_ACCOUNT,
    Account,
    AccountCaps,
    AccountError,
    AccountTree,
    Resources,
)
from shared.model import NAME_PATTERN, UNIX_USER_PATTERN, JobSpec
from shared.schema import bounded, encode

log = logging.getLogger("trellis.master.accounts")

# "Clear this value" in account_set's flat parameters (nil leaves it unchanged).
UNSET = -1


@dataclass(frozen=True)
class AccountNameParams:
    name: str = bounded(pattern=NAME_PATTERN)


@dataclass(frozen=True)
class AccountAddParams:
    account: Account
    # Apply even when a limit falls below what the account already runs (nothing stops).
    force: bool = False


@dataclass(frozen=True)
class AccountSetParams:
    """The fields to change; nil leaves one as it is, -1 clears a limit (no bound)."""

    name: str = bounded(pattern=NAME_PATTERN)
    # The new parent; "" makes it a root.
    parent: str | None = bounded(None, max_len=128)
    shares: float | None = bounded(None, min=0.0001, max=1e9)
    quota_gpus: int | None = bounded(None, min=UNSET, max=1 << 20)
    quota_cpus: int | None = bounded(None, min=UNSET, max=1 << 24)
    quota_memory_mib: int | None = bounded(None, min=UNSET, max=1 << 40)
    borrow_gpus: int | None = bounded(None, min=UNSET, max=1 << 20)
    borrow_cpus: int | None = bounded(None, min=UNSET, max=1 << 24)
    borrow_memory_mib: int | None = bounded(None, min=UNSET, max=1 << 40)
    running_jobs: int | None = bounded(None, min=UNSET, max=10_000_000)
    submitted_jobs: int | None = bounded(None, min=UNSET, max=10_000_000)
    gpus_per_job: int | None = bounded(None, min=UNSET, max=1 << 20)
    time_limit_s: int | None = bounded(None, min=UNSET, max=366 * 86400)
    force: bool = False


@dataclass(frozen=True)
class AccountUserParams:
    name: str = bounded(pattern=NAME_PATTERN)
    user: str = bounded(pattern=UNIX_USER_PATTERN)
    # add-user: make this the user's default account.
    default: bool = False


class Accounts:
    def __init__(self, ctx: FeatureContext) -> None:
        self.ctx = ctx
        self.tree = AccountTree.of(ctx.config().accounts)
        # Whether the journal holds a tree (then the configuration no longer counts).
        self._journalled = False
        self.admission: QuotaAdmission | None = None
        self._install()
        events = ctx.events
        events.submitting.subscribe(self.check_submission)
        events.screening.subscribe(self.screen)
        events.spec_defaults.provide(self.with_account)
        events.restored.subscribe(self.restored)
        events.config_changed.subscribe(self.reconfigured)

    # -- the tree ------------------------------------------------------------------------
    def _install(self) -> None:
        """Attach, update or detach quota admission for the current tree, and tell the
        others (fair share) which tree is in force."""
        self.ctx.events.accounts_changed.emit(self.tree)
        if not self.tree.enabled:
            if self.admission is not None:
                self.admission = None
                self.ctx.jobs.set_admission(None)
            return
        if self.admission is None:
            self.admission = QuotaAdmission(self.tree)
            self.ctx.jobs.set_admission(self.admission)
        else:
            self.admission.set_tree(self.tree)

    def restored(self) -> None:
        """After a restart or a failover: the journalled tree, or the configuration's
        journalled as the seed."""
        self.ctx.journal.now(create_tables)
        stored = self.ctx.journal.now(read_tree)
        if stored is not None:
            self._journalled = True
            tree = AccountTree.of(stored)
            if tree.accounts != self.tree.accounts:
                self._warn_config_ignored()
            self.tree = tree
        elif self.tree.enabled:
            self.ctx.journal.now(write_tree, list(self.tree.accounts.values()),
                                 self.ctx.clock(), None)
            self._journalled = True
            log.info("accounts seeded from the configuration: %d account(s)",
                     len(self.tree.accounts))
        self._install()
        if self.admission is not None:
            self.admission.restored()
        if self.tree.enabled:
            log.info("accounts on: %d account(s), %d user(s)", len(self.tree.accounts),
                     len({u for a in self.tree.accounts.values() for u in a.users}))
        if _loop_running():  # a restore in tests runs outside the loop
            self.ctx.request_pass()

    def reconfigured(self) -> None:
        """SIGHUP: the file counts only while the journal holds no tree."""
        configured = AccountTree.of(self.ctx.config().accounts)
        if configured.accounts == self.tree.accounts:
            return
        if self._journalled:
            self._warn_config_ignored()
            return
        self.tree = configured
        self._install()
        self.ctx.request_pass()

    def _warn_config_ignored(self) -> None:
        log.warning("[[master.accounts]] differs from the journalled account tree; the "
                    "journal's holds (change it with trellisctl account, docs/governance.md)")

    async def change(self, tree: AccountTree, action: str, detail: dict[str, Any],
                     force: bool = False) -> AccountTree:
        """Validate ``tree`` against what runs, journal it, then apply it (all or nothing)."""
        self._admin(action)
        if not force:
            why = self._below_use(tree)
            if why is not None:
                raise JobError("invalid_account", why)
        who = caller()
        event = (self.ctx.clock(), None, None, "account_changed",
                 {"action": action, **detail, "who": "local" if who is None else who.name})
        await self.ctx.journal.call(write_tree, list(tree.accounts.values()),
                                    self.ctx.clock(), event)
        self._journalled = True
        self.tree = tree
        self._install()
        self.ctx.request_pass()
        log.info("accounts changed: %s %s", action, detail)
        return tree

    def _below_use(self, tree: AccountTree) -> str | None:
        """A limit the new tree sets below what an account already runs, as a sentence."""
        if self.admission is None:
            return None
        ledger = self.admission.ledger
        for name, account in tree.accounts.items():
            running = ledger.running(name)
            cap = account.caps.running_jobs
            if cap is not None and running > cap:
                return (f"account {name!r} runs {running} job(s), more than the running_jobs "
                        f"cap {cap}; wait for them to end or pass --force (nothing is "
                        "stopped; new jobs wait)")
            top = ceiling(account.quota, account.borrowing_limit)
            for i, used in enumerate(ledger.used(name)):
                if used > top[i]:
                    return (f"a quota + borrowing limit below what is already running: "
                            f"account {name!r} uses {shown(i, used)} {UNITS[RESOURCES[i]]}, "
                            f"over {shown(i, top[i])}; pass --force to apply it anyway "
                            "(nothing is stopped)")
        for name in self.tree.accounts:
            if name not in tree.accounts and self._jobs_in(name):
                return (f"account {name!r} has {self._jobs_in(name)} job(s) queued or "
                        "running; cancel them or let them end before removing it")
        return None

    def _jobs_in(self, name: str) -> int:
        if self.admission is None:
            return 0
        return self.admission.queued_count(name) + self.admission.ledger.running_own(name)

    @staticmethod
    def _admin(action: str) -> None:
        if not is_admin(caller()):
            raise JobError("forbidden", f"only an admin may {action} accounts")

    # -- RPC actions ---------------------------------------------------------------------
    async def add(self, account: Account, force: bool = False) -> Account:
        self._admin("add")
        if account.name in self.tree:
            raise JobError("invalid_account", f"account {account.name!r} exists already; "
                           "change it with trellisctl account set")
        tree = self._validated(lambda: self.tree.replaced(account))
        await self.change(tree, "add", {"account": account.name}, force)
        return tree[account.name]

    async def set(self, p: AccountSetParams) -> Account:
        self._admin("change")
        old = self._validated(lambda: self.tree[p.name])
        new = _merged(old, p)
        if new == old:
            return old
        tree = self._validated(lambda: self.tree.replaced(new))
        await self.change(tree, "set", {"account": p.name, "changes": _changes(p)}, p.force)
        return tree[p.name]

    async def remove(self, name: str) -> None:
        self._admin("remove")
        tree = self._validated(lambda: self.tree.without(name))
        await self.change(tree, "remove", {"account": name})

    async def add_user(self, name: str, user: str, default: bool) -> Account:
        self._admin("change")
        old = self._validated(lambda: self.tree[name])
        users = old.users if user in old.users else (*old.users, user)
        defaults = old.default_for
        accounts = [a for a in self.tree.accounts.values() if a.name != name]
        if default:
            defaults = defaults if user in defaults else (*defaults, user)
            # Its default moves here: off every other account.
            accounts = [replace(a, default_for=tuple(u for u in a.default_for if u != user))
                        for a in accounts]
        new = replace(old, users=users, default_for=defaults)
        tree = self._validated(lambda: AccountTree.of([*accounts, new]))
        await self.change(tree, "add_user", {"account": name, "user": user,
                                             "default": default})
        return tree[name]

    async def remove_user(self, name: str, user: str) -> Account:
        self._admin("change")
        old = self._validated(lambda: self.tree[name])
        if user not in old.users:
            raise JobError("invalid_account", f"user {user!r} is not in account {name!r}")
        new = replace(old, users=tuple(u for u in old.users if u != user),
                      default_for=tuple(u for u in old.default_for if u != user))
        tree = self._validated(lambda: self.tree.replaced(new))
        await self.change(tree, "remove_user", {"account": name, "user": user})
        return tree[name]

    @staticmethod
    def _validated(build: Any) -> Any:
        try:
            return build()
        except AccountError as exc:
            raise JobError("invalid_account", str(exc)) from None

    # -- views ---------------------------------------------------------------------------
    def view(self, name: str) -> dict[str, Any]:
        account = self._validated(lambda: self.tree[name])
        out: dict[str, Any] = encode(account)
        out["children"] = list(self.tree.children(name))
        usage: dict[str, Any] = {"running_jobs": 0, "queued_jobs": 0, "gpus": 0, "cpus": 0,
                                 "memory_mib": 0, "borrowing": False}
        if self.admission is not None:
            ledger = self.admission.ledger
            used = ledger.used(name)
            usage.update(running_jobs=ledger.running(name),
                         queued_jobs=sum(self.admission.queued_count(a)
                                         for a in self.tree.subtree(name)),
                         gpus=shown(0, used[0]), cpus=used[1], memory_mib=used[2],
                         borrowing=ledger.borrowing(name))
        out["usage"] = usage
        return out

    def views(self) -> list[dict[str, Any]]:
        return [self.view(name) for name in self._ordered()]

    def _ordered(self) -> list[str]:
        out: list[str] = []
        for root in self.tree.roots():
            out.extend(self.tree.subtree(root))
        return out

    def visible_accounts(self, user: str) -> frozenset[str]:
        """The accounts whose jobs ``user`` may see: each of theirs and its sub-accounts."""
        out: set[str] = set()
        for name in self.tree.accounts_of(user):
            out.update(self.tree.subtree(name))
        return frozenset(out)

    # -- submission ----------------------------------------------------------------------
    def resolve(self, spec: JobSpec) -> str:
        """The account ``spec`` runs under (JobError when it may not)."""
        tree = self.tree
        named: str | None = spec.tenant
        if named == DEFAULT_ACCOUNT and DEFAULT_ACCOUNT not in tree.accounts_of(spec.user):
            named = None  # left as it was: the user's default
        try:
            return tree.account_for(spec.user, named)
        except AccountError as exc:
            raise JobError("forbidden", f"job {spec.name}: {exc}") from None

    def check_submission(self, spec: JobSpec) -> None:
        if not self.tree.enabled:
            return
        account = self.resolve(spec)
        limit = spec.time_limit_s or self.ctx.config().default_time_limit_s or None
        for name in self.tree.lineage(account):
            caps = self.tree[name].caps
            if caps.gpus_per_job is not None and spec.gpus > caps.gpus_per_job:
                raise JobError("over_cap", f"job {spec.name} asks for {spec.gpus} GPUs; "
                               f"account {name!r} allows {caps.gpus_per_job} per job "
                               "(gpus_per_job)")
            if caps.time_limit_s is not None and limit is not None \
                    and limit > caps.time_limit_s:
                raise JobError("over_cap", f"job {spec.name} asks for a time limit of "
                               f"{limit} s; account {name!r} allows {caps.time_limit_s} s "
                               "(time_limit_s)")
        if self.admission is not None:
            # Larger than its account may ever hold: refused now, not queued forever.
            never = self.admission.ledger.never(account, demand(spec))
            if never is not None:
                raise JobError("unsatisfiable", f"job {spec.name} {never}")

    def screen(self, specs: Sequence[JobSpec], ids: Sequence[str | None]
               ) -> Mapping[int, JobError]:
        """submitted_jobs caps, over the whole submission (a batch counts as many)."""
        if not self.tree.enabled or self.admission is None:
            return {}
        capped = {n: a.caps.submitted_jobs for n, a in self.tree.accounts.items()
                  if a.caps.submitted_jobs is not None}
        if not capped:
            return {}
        counts: dict[str, int] = {}
        refused: dict[int, JobError] = {}
        for index, spec in enumerate(specs):
            try:
                account = self.resolve(spec)
            except JobError:
                continue  # refused by check_submission already
            for name in self.tree.lineage(account):
                if name not in capped:
                    continue
                if name not in counts:
                    counts[name] = self._submitted(name)
                if counts[name] >= capped[name]:
                    refused[index] = JobError(
                        "over_cap", f"job {spec.name}: account {name!r} has {counts[name]} "
                        f"job(s) queued or running, its submitted_jobs cap "
                        f"({capped[name]})")
                    break
            else:
                for name in self.tree.lineage(account):
                    if name in counts:
                        counts[name] += 1
        return refused

    def _submitted(self, name: str) -> int:
        assert self.admission is not None
        return (self.admission.ledger.running(name)
                + sum(self.admission.queued_count(a) for a in self.tree.subtree(name)))

    def with_account(self, spec: JobSpec) -> JobSpec:
        """The spec charged to its resolved account (and the account's MaxWall as its limit
        when it asked none and the master sets no default)."""
        if not self.tree.enabled:
            return spec
        account = self.resolve(spec)
        changes: dict[str, Any] = {}
        if account != spec.tenant:
            changes["tenant"] = account
        if spec.time_limit_s is None and not self.ctx.config().default_time_limit_s:
            caps = [self.tree[n].caps.time_limit_s for n in self.tree.lineage(account)]
            tightest = min((c for c in caps if c is not None), default=None)
            if tightest is not None:
                changes["time_limit_s"] = tightest
        return replace(spec, **changes) if changes else spec


def _merged(old: Account, p: AccountSetParams) -> Account:
    def pick(current: int | None, given: int | None) -> int | None:
        if given is None:
            return current
        return None if given == UNSET else given

    quota = Resources(gpus=pick(old.quota.gpus, p.quota_gpus),
                      cpus=pick(old.quota.cpus, p.quota_cpus),
                      memory_mib=pick(old.quota.memory_mib, p.quota_memory_mib))
    borrow = Resources(gpus=pick(old.borrowing_limit.gpus, p.borrow_gpus),
                       cpus=pick(old.borrowing_limit.cpus, p.borrow_cpus),
                       memory_mib=pick(old.borrowing_limit.memory_mib, p.borrow_memory_mib))
    caps = AccountCaps(running_jobs=pick(old.caps.running_jobs, p.running_jobs),
                       submitted_jobs=pick(old.caps.submitted_jobs, p.submitted_jobs),
                       gpus_per_job=pick(old.caps.gpus_per_job, p.gpus_per_job),
                       time_limit_s=pick(old.caps.time_limit_s, p.time_limit_s))
    if caps.time_limit_s == 0:
        raise JobError("invalid_params", "time_limit_s: a cap must be at least 1 s "
                       "(-1 clears it)")
    parent = old.parent if p.parent is None else (p.parent or None)
    return replace(old, parent=parent, shares=old.shares if p.shares is None else p.shares,
                   quota=quota, borrowing_limit=borrow, caps=caps)


def _changes(p: AccountSetParams) -> dict[str, Any]:
    return {k: v for k, v in encode(p).items() if k not in ("name", "force") and v is not None}


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
