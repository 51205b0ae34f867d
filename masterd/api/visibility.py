"""Who may see and act on which jobs: a client credential only on its own user's jobs, an
admin (and in-process callers, and open loopback access) on every job.

The caller is the RPC's authenticated principal (masterd.api.caller). Listing filters the
others' jobs out; naming one of them (show, logs, cancel) is refused with ``forbidden``.
"""

from __future__ import annotations

from masterd.api.caller import caller, is_admin, owns
from shared.model import Job
from shared.protocol import ProtocolError


def only_user() -> str | None:
    """The Unix user whose jobs the caller may see, or None for every job (an admin)."""
    who = caller()
    return None if is_admin(who) or who is None else who.name


def check_owner(job: Job, doing: str) -> None:
    """Refuse (``forbidden``, HTTP 403) a caller who may not ``doing`` (e.g. "read the
    output of") ``job``."""
    who = caller()
    if owns(who, job.spec.user):
        return
    assert who is not None  # owns() lets every caller without a principal through
    raise ProtocolError("forbidden", f"job {job.id} belongs to user {job.spec.user!r}; client "
                        f"{who.name!r} may {doing} its own jobs only")
