"""Fair share with a memory: each account's decayed usage and its fair-share factor.

Plain synchronous code shared by the master (masterd/features/fairshare.py feeds it from the
journal and from job transitions) and the simulator (sim/engine.py feeds it from its runs).
Nothing here reads a clock: every call is given ``now``.

* **Usage.** A run of a job charges its account, at a constant rate while it holds its
  resources, ``gpu_weight`` per GPU-hour + ``cpu_weight`` per core-hour + ``memory_weight``
  per GiB-hour (Slurm's TRESBillingWeights). Usage decays exponentially with ``half_life_s``
  (Slurm's PriorityDecayHalfLife, 7 days): a GPU-hour used one half-life ago counts half. A
  run from ``s`` to ``e`` is worth ``rate·h/ln2·(2^-(now-e)/h − 2^-(now-s)/h)`` at ``now``,
  so ended runs fold into one number per account, decayed as a whole; running jobs are
  integrated up to ``now`` when asked.
* **Factor.** Slurm's classic multifactor formula ``F = 2^(-UE/S)``, computed down the account
  tree: ``S`` is the account's normalised share (its shares over its siblings' times its
  parent's normalised share), ``U`` its subtree's usage over the whole cluster's, and the
  effective usage ``UE = U + (UE_parent − U)·shares/siblings' shares`` (a top-level account:
  ``UE = U``), so an idle account of a group that over-used inherits part of the group's
  debt. F is 1 for an account that used nothing, 0.5 at exactly its share, 0.25 at twice it.
  Accounts not in the tree (every tenant, while no accounts are configured) are top-level
  accounts of 1 share each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from shared.accounts import AccountTree

LN2 = math.log(2.0)


@dataclass(frozen=True)
class UsageWeights:
    """What one hour of each resource is worth, in usage units (GPU-hour equivalents)."""

    gpu: float = 1.0
    cpu: float = 0.05
    memory_gib: float = 0.005

    def rate(self, gpus: int, cpus: int, memory_mib: int) -> float:
        """Usage units per second of a run holding these resources."""
        return (self.gpu * gpus + self.cpu * cpus
                + self.memory_gib * memory_mib / 1024.0) / 3600.0


def decayed(rate: float, start: float, end: float, now: float, half_life_s: float) -> float:
    """A run's usage at ``now``: ``rate`` from ``start`` to ``end`` (both at most ``now``),
    each second weighted by 2^-(age/half-life)."""
    if end <= start:
        return 0.0
    k = LN2 / half_life_s
    return rate / k * (math.exp(-k * (now - end)) - math.exp(-k * (now - start)))


@dataclass(frozen=True)
class ShareRow:
    """One account's line of ``trellisctl share``."""

    account: str
    parent: str | None
    shares: float
    norm_shares: float  # S: its fraction of the cluster by shares down the tree
    raw_usage: float  # its subtree's decayed usage, in usage units
    norm_usage: float  # U: raw_usage over the whole cluster's
    effective_usage: float  # UE
    factor: float  # F = 2^(-UE/S), in [0, 1]


@dataclass
class _Running:
    account: str
    rate: float
    start: float


class FairShare:
    """Decayed usage per account and the factors derived from it."""

    def __init__(self, tree: AccountTree | None = None, half_life_s: float = 7 * 86400.0,
                 weights: UsageWeights | None = None) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s!r}")
        self.tree = tree if tree is not None else AccountTree.of(())
        self.half_life_s = half_life_s
        self.weights = weights if weights is not None else UsageWeights()
        # Ended runs per account (the account the job was charged to), decayed to _at.
        self._ended: dict[str, float] = {}
        self._at = 0.0
        self._running: dict[str, _Running] = {}
        # Accounts seen (with jobs) while they are not in the tree: flat top-level accounts.
        self._seen: set[str] = set()

    # -- inputs --------------------------------------------------------------------------
    def set_tree(self, tree: AccountTree) -> None:
        """A new account tree (configuration reloaded, an admin changed it): usage stays
        with the accounts it was charged to."""
        self.tree = tree

    def set_weights(self, weights: UsageWeights, half_life_s: float) -> None:
        """New weights or half-life apply from now on; usage charged so far keeps its value."""
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s!r}")
        self.weights = weights
        self.half_life_s = half_life_s

    def note(self, account: str) -> None:
        """An account with jobs (so it has a row and a factor although it used nothing)."""
        self._seen.add(account)

    def _decay_to(self, now: float) -> None:
        if now <= self._at:
            return
        factor = math.exp(-LN2 * (now - self._at) / self.half_life_s)
        for account in self._ended:
            self._ended[account] *= factor
        self._at = now

    def charge(self, account: str, gpus: int, cpus: int, memory_mib: int, start: float,
               end: float) -> None:
        """A run that has ended (rebuilt from the journal, or just now)."""
        self._seen.add(account)
        rate = self.weights.rate(gpus, cpus, memory_mib)
        if end <= start or rate <= 0:
            return
        if end > self._at:
            self._decay_to(end)
        self._ended[account] = (self._ended.get(account, 0.0)
                                + decayed(rate, start, end, self._at, self.half_life_s))

    def started(self, job_id: str, account: str, gpus: int, cpus: int, memory_mib: int,
                start: float) -> None:
        """A job began running (it is charged from ``start`` until :meth:`stopped`)."""
        self._seen.add(account)
        self._running[job_id] = _Running(account, self.weights.rate(gpus, cpus, memory_mib),
                                         start)

    def stopped(self, job_id: str, end: float) -> None:
        """A running job stopped (ended, preempted or requeued): its run is charged."""
        run = self._running.pop(job_id, None)
        if run is None or end <= run.start or run.rate <= 0:
            return
        if end > self._at:
            self._decay_to(end)
        self._ended[run.account] = (self._ended.get(run.account, 0.0)
                                    + decayed(run.rate, run.start, end, self._at,
                                              self.half_life_s))

    def running(self) -> int:
        return len(self._running)

    # -- outputs -------------------------------------------------------------------------
    def usage(self, now: float) -> dict[str, float]:
        """Each account's own decayed usage at ``now`` (not its sub-accounts')."""
        at = max(now, self._at)
        scale = math.exp(-LN2 * (at - self._at) / self.half_life_s)
        out = {account: value * scale for account, value in self._ended.items()}
        for run in self._running.values():
            start = min(run.start, at)
            out[run.account] = out.get(run.account, 0.0) + decayed(
                run.rate, start, at, at, self.half_life_s)
        for account in self._seen:
            out.setdefault(account, 0.0)
        return out

    def rows(self, now: float) -> list[ShareRow]:
        """Every account (the tree's and the flat ones with jobs), parents before children."""
        own = self.usage(now)
        tree = self.tree
        flat = sorted(a for a in own if a not in tree)
        # Subtree usage: own usage charged to each account and all its ancestors.
        subtree: dict[str, float] = {name: 0.0 for name in tree.accounts}
        for account, value in own.items():
            if account in tree:
                for name in tree.lineage(account):
                    subtree[name] += value
            else:
                subtree[account] = value
        total = sum(v for a, v in own.items())
        tops = [*tree.roots(), *flat]
        top_shares = sum(self._shares(a) for a in tops)
        out: list[ShareRow] = []

        def visit(name: str, parent: str | None, siblings_shares: float, parent_norm: float,
                  parent_ue: float | None) -> None:
            shares = self._shares(name)
            fraction = shares / siblings_shares if siblings_shares > 0 else 0.0
            norm_share = parent_norm * fraction
            u = subtree[name] / total if total > 0 else 0.0
            ue = u if parent_ue is None else u + (parent_ue - u) * fraction
            factor = 2.0 ** (-ue / norm_share) if norm_share > 0 else 0.0
            out.append(ShareRow(name, parent, shares, norm_share, subtree[name], u, ue,
                                min(1.0, max(0.0, factor))))
            children = tree.children(name) if name in tree else ()
            child_shares = sum(self._shares(c) for c in children)
            for child in children:
                visit(child, name, child_shares, norm_share, ue)

        for top in tops:
            visit(top, None, top_shares, 1.0, None)
        return out

    def factors(self, now: float) -> dict[str, float]:
        """account -> fair-share factor in [0, 1]."""
        return {row.account: row.factor for row in self.rows(now)}

    def _shares(self, name: str) -> float:
        return self.tree[name].shares if name in self.tree else 1.0


def factor_of(factors: Mapping[str, float], account: str) -> float:
    """An account's factor; an account never seen has used nothing: 1."""
    return factors.get(account, 1.0)
