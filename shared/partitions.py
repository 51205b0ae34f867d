"""Partitions: named sets of nodes with their own time limits and accounts (Slurm's
``PartitionName=``), as the master's configuration lists them (``[[master.partitions]]``).

A node may be in several partitions. A job runs in one or several (``--partition a,b``: any
that admits it) or, naming none, in the default partition; at submission the master keeps
of the named partitions those that admit the job (its account, its time limit), writes them
into the job's selector and refuses the job with one sentence when none does. Where the job
may run is then what any selector says: the nodes of its partitions
(``masterd/core/eligibility.py``). Without partitions configured nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from shared.hostlist import HostlistError, expand
from shared.model import NAME_PATTERN
from shared.schema import bounded

ALL_NODES = "ALL"  # a partition of every node, as Slurm's Nodes=ALL
# Slurm's partition states: which take new jobs (submissions) and which start them.
STATES = ("up", "down", "drain", "inactive")
TAKES_JOBS = frozenset({"up", "down"})
STARTS_JOBS = frozenset({"up", "drain"})


class PartitionError(ValueError):
    """A configuration of partitions that cannot be used; one sentence naming the entry."""


@dataclass(frozen=True)
class Partition:
    """One partition as configured."""

    name: str = bounded(pattern=NAME_PATTERN)
    # Its nodes as a Slurm node list ("gpu-[01-16],big-01"), or "ALL".
    nodes: str = bounded(max_len=65_536)
    # Jobs that name no partition run here (at most one partition is the default).
    default: bool = False
    # The longest time limit a job here may have (Slurm's MaxTime); None: no limit.
    max_time_s: int | None = bounded(None, min=1, max=366 * 86400)
    # The limit written into a job that asks none (DefaultTime; MaxTime where unset).
    default_time_s: int | None = bounded(None, min=1, max=366 * 86400)
    # Accounts whose jobs may run here (empty: every account) ...
    allow_accounts: tuple[str, ...] = bounded(default_factory=tuple, max_len=100_000,
                                              pattern=NAME_PATTERN)
    # ... or those whose jobs may not (AllowAccounts / DenyAccounts; one or the other).
    deny_accounts: tuple[str, ...] = bounded(default_factory=tuple, max_len=100_000,
                                             pattern=NAME_PATTERN)
    # Slurm's State: up; down (jobs queue, none starts); drain (no new jobs, queued ones
    # start); inactive (neither). An admin's `trellisctl partition update` overrides it.
    state: str = bounded("up", pattern="up|down|drain|inactive")
    # Slurm's PriorityTier: jobs that may run here queue before those of lower tiers (after
    # their priority class); a job in several partitions takes the highest.
    priority_tier: int = bounded(0, min=-1000, max=1000)

    @property
    def starts_jobs(self) -> bool:
        """Jobs start on its nodes through it (up or drain)."""
        return self.state in STARTS_JOBS

    @property
    def time_for_unlimited(self) -> int | None:
        """The limit a job that asked none gets here."""
        return self.default_time_s if self.default_time_s is not None else self.max_time_s

    def refusal(self, account: str | None, time_limit_s: int | None) -> str | None:
        """Why this partition does not take a job of ``account`` with that limit, or None."""
        if self.state not in TAKES_JOBS:
            return f"partition {self.name!r} is {self.state}: it takes no new jobs"
        if account is not None:
            if self.allow_accounts and account not in self.allow_accounts:
                return (f"partition {self.name!r} admits only accounts "
                        f"{', '.join(self.allow_accounts)} (this job's is {account!r})")
            if account in self.deny_accounts:
                return f"partition {self.name!r} does not admit account {account!r}"
        if (time_limit_s is not None and self.max_time_s is not None
                and time_limit_s > self.max_time_s):
            return (f"partition {self.name!r} takes time limits up to "
                    f"{duration(self.max_time_s)} (this job asks {duration(time_limit_s)})")
        return None


@dataclass(frozen=True)
class Choice:
    """Where a job runs: the partitions that admit it, and the time limit it then gets
    (its own, or the partitions' default; None: none)."""

    partitions: tuple[str, ...]
    time_limit_s: int | None


@dataclass(frozen=True)
class PartitionTable:
    """Validated partitions; build with :meth:`of`."""

    partitions: dict[str, Partition] = field(default_factory=dict)
    _members: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)
    _everywhere: tuple[str, ...] = ()

    @classmethod
    def of(cls, partitions: Iterable[Partition]) -> PartitionTable:
        by_name: dict[str, Partition] = {}
        members: dict[str, frozenset[str]] = {}
        everywhere: list[str] = []
        defaults: list[str] = []
        for p in partitions:
            where = f"partition {p.name!r}"
            if p.name in by_name:
                raise PartitionError(f"{where} is configured twice")
            if p.nodes.strip() == ALL_NODES:
                everywhere.append(p.name)
            else:
                try:
                    members[p.name] = frozenset(expand(p.nodes, f"{where}: nodes"))
                except HostlistError as exc:
                    raise PartitionError(str(exc)) from None
            if (p.default_time_s is not None and p.max_time_s is not None
                    and p.default_time_s > p.max_time_s):
                raise PartitionError(f"{where}: default_time_s {p.default_time_s:g} exceeds "
                                     f"max_time_s {p.max_time_s:g}")
            if p.allow_accounts and p.deny_accounts:
                raise PartitionError(f"{where}: give allow_accounts or deny_accounts, not "
                                     "both")
            if p.default:
                defaults.append(p.name)
            by_name[p.name] = p
        if len(defaults) > 1:
            raise PartitionError(f"partitions {', '.join(map(repr, defaults))} are each "
                                 "marked default; at most one may be")
        return cls(by_name, members, tuple(everywhere))

    @property
    def enabled(self) -> bool:
        return bool(self.partitions)

    @property
    def default(self) -> str | None:
        return next((p.name for p in self.partitions.values() if p.default), None)

    def __getitem__(self, name: str) -> Partition:
        return self.partitions[name]

    def of_node(self, node: str) -> tuple[str, ...]:
        """The partitions ``node`` is in, in configuration order."""
        return tuple(name for name in self.partitions
                     if name in self._everywhere or node in self._members.get(name, ()))

    def closed_on(self, node: str) -> tuple[str, ...]:
        """Those of ``node``'s partitions that start no job now (down or inactive)."""
        return tuple(name for name in self.of_node(node)
                     if not self.partitions[name].starts_jobs)

    def tiers(self) -> dict[str, int]:
        """Each partition's priority tier, where one is set (the others' is 0)."""
        return {name: p.priority_tier for name, p in self.partitions.items()
                if p.priority_tier}

    def with_states(self, states: dict[str, str]) -> PartitionTable:
        """The table with these partitions' states (unknown names are left out)."""
        return PartitionTable.of(replace(p, state=states.get(p.name, p.state))
                                 for p in self.partitions.values())

    def unknown_nodes(self, known: Iterable[str]) -> dict[str, list[str]]:
        """Per partition, the nodes it names that are not in ``known``."""
        have = set(known)
        return {name: sorted(nodes - have) for name, nodes in self._members.items()
                if not nodes <= have}

    def choose(self, named: Sequence[str], account: str | None,
               time_limit_s: int | None) -> Choice:
        """Where a job naming ``named`` (empty: the default) of ``account`` with that limit
        runs; raises PartitionError with every reason when no partition takes it."""
        if not named:
            default = self.default
            if default is None:
                raise PartitionError("this cluster has no default partition: name one with "
                                     f"--partition ({', '.join(self.partitions)})")
            named = (default,)
        unknown = [n for n in named if n not in self.partitions]
        if unknown:
            raise PartitionError(f"no partition {', '.join(map(repr, unknown))} (partitions: "
                                 f"{', '.join(self.partitions)})")
        limit = time_limit_s
        if limit is None:  # the tightest default among them, so each of them admits it
            defaults = [t for n in named if (t := self[n].time_for_unlimited) is not None]
            limit = min(defaults, default=None)
        why = {n: self[n].refusal(account, limit) for n in dict.fromkeys(named)}
        chosen = tuple(n for n, reason in why.items() if reason is None)
        if not chosen:
            raise PartitionError("; ".join(r for r in why.values() if r is not None))
        return Choice(chosen, limit)


def duration(seconds: float) -> str:
    """"90s", "45min", "2h", "1d6h": a limit as people read it."""
    s = round(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200 and s % 3600:
        return f"{s // 60}min"
    days, hours = divmod(s // 3600, 24)
    rest = "" if s % 3600 == 0 else f"{(s % 3600) // 60}min"
    return (f"{days}d" if days else "") + (f"{hours}h" if hours or not days else "") + rest
