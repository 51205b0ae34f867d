"""Who may see and act on which jobs: a client credential sees its own user's jobs and, with
accounts on, every job of its accounts and their sub-accounts (never another group's); it
acts (cancel, read the output of) on its own jobs only. An admin (and in-process callers,
and open loopback access) sees and acts on every job.

The caller is the RPC's authenticated principal (masterd.api.caller). Listing filters the
others' jobs out; naming one of them (show, logs, cancel) is refused with ``forbidden``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from masterd.api.caller import caller, is_admin, owns
from shared.model import Job
from shared.protocol import ProtocolError

# user -> the accounts whose jobs that user may see (masterd.features.accounts).
AccountsOf = Callable[[str], frozenset[str]]


@dataclass(frozen=True)
class Viewer:
    """A client credential's view: its user's jobs and its accounts' subtrees' jobs."""

    user: str
    accounts: frozenset[str]

    def sees(self, job: Job) -> bool:
        return job.spec.user == self.user or job.spec.tenant in self.accounts


def only_user() -> str | None:
    """The Unix user whose jobs the caller may act on, or None for every job (an admin)."""
    who = caller()
    return None if is_admin(who) or who is None else who.name


def viewer(accounts_of: AccountsOf | None = None) -> Viewer | None:
    """What the caller may see, or None for every job (an admin)."""
    user = only_user()
    if user is None:
        return None
    return Viewer(user, accounts_of(user) if accounts_of is not None else frozenset())


def check_visible(job: Job, doing: str, accounts_of: AccountsOf | None = None) -> None:
    """Refuse (``forbidden``) a caller who may not see ``job`` (neither theirs nor of an
    account of theirs)."""
    who = viewer(accounts_of)
    if who is None or who.sees(job):
        return
    if not who.accounts:  # accounts off, or the user in none: its own jobs only
        raise ProtocolError("forbidden", f"job {job.id} belongs to user {job.spec.user!r}; "
                            f"client {who.user!r} may {doing} its own jobs only")
    raise ProtocolError("forbidden", f"job {job.id} belongs to user {job.spec.user!r} of "
                        f"account {job.spec.tenant!r}; client {who.user!r} may {doing} its own "
                        "jobs and its accounts' only")


def check_owner(job: Job, doing: str) -> None:
    """Refuse (``forbidden``, HTTP 403) a caller who may not ``doing`` (e.g. "read the
    output of") ``job``."""
    who = caller()
    if owns(who, job.spec.user):
        return
    assert who is not None  # owns() lets every caller without a principal through
    raise ProtocolError("forbidden", f"job {job.id} belongs to user {job.spec.user!r}; client "
                        f"{who.name!r} may {doing} its own jobs only")
