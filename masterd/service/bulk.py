"""What a batch submission (``submit_many``) refuses, and the one journal look-up it needs.

A batch is all or none: every job is checked as a single submission is, and any refusal
refuses the whole batch, as Slurm refuses a bad job array, naming each refused job by its
index so the client can fix them all at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from masterd.core.scheduler import JobError
from masterd.journal.store import Store

MAX_LISTED = 20  # refusals spelled out in the error's message (the detail has every one)


@dataclass(frozen=True)
class Refusal:
    index: int
    code: str
    message: str


class BatchRefused(JobError):
    """The batch was not accepted; ``refusals`` are by index into the batch. ``accepted``:
    jobs journalled and queued anyway (only a store failure part-way leaves any)."""

    def __init__(self, refusals: list[Refusal], size: int,
                 accepted: list[str] | None = None) -> None:
        self.refusals = refusals
        self.size = size
        self.accepted = accepted or []
        listed = "; ".join(f"jobs[{r.index}]: {r.code}: {r.message}"
                           for r in self.refusals[:MAX_LISTED])
        more = len(self.refusals) - MAX_LISTED
        if more > 0:
            listed += f"; and {more} more"
        kept = (f"; {len(self.accepted)} job(s) were stored and queued all the same"
                if self.accepted else "; no job was submitted")
        super().__init__("batch_refused", f"{len(self.refusals)} of {self.size} job(s) "
                         f"refused{kept}: {listed}")

    def detail(self) -> dict[str, object]:
        refused = [{"index": r.index, "code": r.code, "message": r.message}
                   for r in self.refusals]
        return {"jobs": self.size, "refused": refused, "accepted": list(self.accepted)}


def journalled_ids(store: Store, ids: Sequence[str]) -> list[str]:
    """Which of ``ids`` the journal already holds (run in the journal writer)."""
    return [job_id for job_id in ids if store.job_exists(job_id)]
