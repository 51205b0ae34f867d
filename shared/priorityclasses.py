"""Priority classes: who goes first, by force (Kueue's WorkloadPriorityClass, Slurm's QoS
with PreemptType=preempt/qos and PreemptMode=REQUEUE).

An operator names classes (``[[master.priority_classes]]``), each with a priority and the
classes whose jobs it may preempt (each strictly lower). A job names its class (``--priority-
class``) or gets the default one. Waiting jobs of a higher class come first in the queue; a
job of a class that preempts, which its policy could not place, has running jobs of the
classes it names stopped for it (masterd/core/preemption.py): each victim is warned (its own
``--signal``'s signal, else SIGTERM, and ``$TRELLIS_PREEMPTED_FILE`` saying why), killed
after its class's ``preempt_grace_s``, and requeued in its own place with ``restarts`` + 1.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.model import NAME_PATTERN
from shared.schema import bounded


class PriorityClassError(ValueError):
    """A configuration of classes that cannot be used; one sentence naming the entry."""


@dataclass(frozen=True)
class PriorityClass:
    """One class as configured."""

    name: str = bounded(pattern=NAME_PATTERN)
    # Higher runs first; jobs without a class run at the default class's (0 without one).
    priority: int = bounded(0, min=-1_000_000, max=1_000_000)
    # The classes whose running jobs this one's waiting jobs may preempt (each lower).
    preempts: tuple[str, ...] = bounded(default_factory=tuple, max_len=64,
                                        pattern=NAME_PATTERN)
    # Preempt only jobs of the preemptor's own account (else any account's).
    within_account: bool = False
    # A job of this class runs at least this long before it may be preempted.
    min_runtime_s: int = bounded(0, min=0, max=366 * 86400)
    # A preempted job of this class: from its warning to its kill (its time to checkpoint).
    preempt_grace_s: int = bounded(30, min=0, max=3600)
    # Jobs that name no class are of this one (at most one default).
    default: bool = False


@dataclass(frozen=True)
class ClassTable:
    """Validated classes; build with :meth:`of`."""

    classes: dict[str, PriorityClass] = field(default_factory=dict)

    @classmethod
    def of(cls, classes: Iterable[PriorityClass]) -> ClassTable:
        by_name: dict[str, PriorityClass] = {}
        for c in classes:
            if c.name in by_name:
                raise PriorityClassError(f"priority class {c.name!r} is configured twice")
            by_name[c.name] = c
        defaults = [c.name for c in by_name.values() if c.default]
        if len(defaults) > 1:
            raise PriorityClassError(f"priority classes {', '.join(map(repr, defaults))} are "
                                     "each marked default; at most one may be")
        for c in by_name.values():
            for victim in c.preempts:
                where = f"priority class {c.name!r}"
                if victim == c.name:
                    raise PriorityClassError(f"{where} may not preempt itself")
                other = by_name.get(victim)
                if other is None:
                    raise PriorityClassError(f"{where} preempts {victim!r}, which is not a "
                                             f"class ({', '.join(by_name)})")
                if other.priority >= c.priority:
                    raise PriorityClassError(
                        f"{where} (priority {c.priority}) may preempt only lower classes; "
                        f"{victim!r} has priority {other.priority}")
        return cls(by_name)

    @property
    def enabled(self) -> bool:
        return bool(self.classes)

    @functools.cached_property
    def victim_classes(self) -> frozenset[str]:
        """The classes some class may preempt (cached: read at every job start)."""
        return frozenset(name for c in self.classes.values() for name in c.preempts)

    @functools.cached_property
    def preempting_floor(self) -> int | None:
        """The lowest priority of a class that may preempt (None: none may)."""
        return min((c.priority for c in self.classes.values() if c.preempts), default=None)

    @property
    def default(self) -> str | None:
        return next((c.name for c in self.classes.values() if c.default), None)

    def __getitem__(self, name: str) -> PriorityClass:
        return self.classes[name]

    def __contains__(self, name: object) -> bool:
        return name in self.classes

    def of_job(self, name: str | None) -> PriorityClass | None:
        """A job's class: the one it names, else the default (None: none)."""
        if name is not None and name in self.classes:
            return self.classes[name]
        default = self.default
        return self.classes[default] if default is not None else None

    def tier(self, name: str | None) -> int:
        """Where a job of class ``name`` queues: its class's priority."""
        found = self.of_job(name)
        return found.priority if found is not None else 0

    def may_preempt(self, preemptor: str | None, victim: str | None) -> bool:
        """Whether a job of class ``preemptor`` may preempt one of class ``victim``."""
        mine, theirs = self.of_job(preemptor), self.of_job(victim)
        return mine is not None and theirs is not None and theirs.name in mine.preempts
