"""Which engine replays a comparison, chosen by what its policies declare.

The base engine (:class:`sim.engine.Simulator`) holds every job on whole GPUs. A policy that
places jobs on shared GPUs (Liquid's sharing and pre-scheduling) declares it with a
``shares_gpus`` attribute; a comparison that holds such a policy replays on
:class:`sim.liquid_sim.LiquidSimulator`, which counts a shared GPU once, charges a fractional
job its share and slows jobs that share a GPU as measured pairs did.

Every policy of one comparison replays on the same engine, so that all of them face the
same ground truth: the sharing engine without shared placements is the base engine's truth,
except that a fractional job on a whole GPU keeps it busy only for its share.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from masterd.core.fairshare import FairShare
from masterd.core.policy import Policy
from sim.colocation import COLOCATION_FILE, ColocationTable
from sim.engine import Annotator, ProgressFn, SimConfig, SimResult, Simulator
from sim.liquid_sim import LiquidSimulator
from sim.workloads.base import Workload


def shares_gpus(policy: object) -> bool:
    """Whether ``policy`` declares that it places jobs on shared GPUs."""
    return bool(getattr(policy, "shares_gpus", False))


@dataclass(frozen=True)
class Engine:
    """The engine of one comparison: ``sharing`` picks the sharing engine, whose jobs on
    one GPU slow each other as ``colocation``'s measured pairs did (not at all without it)."""

    sharing: bool = False
    colocation: ColocationTable | None = None

    @property
    def name(self) -> str:
        return "sharing" if self.sharing else "base"

    def note(self) -> str | None:
        """What a reader of the comparison should know about the engine's truth."""
        if not self.sharing:
            return None
        if self.colocation is None:
            return ("a policy shares GPUs; with no co-location measurements "
                    f"({COLOCATION_FILE}), jobs sharing a GPU do not slow each other")
        return "a policy shares GPUs; jobs sharing a GPU slow each other as measured pairs did"

    def build(self, workload: Workload, policy: Policy, config: SimConfig | None = None,
              progress: ProgressFn | None = None, annotator: Annotator | None = None,
              fairshare: FairShare | None = None) -> Simulator:
        if self.sharing:
            return LiquidSimulator(workload, policy, config, progress, annotator,
                                   colocation=self.colocation, fairshare=fairshare)
        return Simulator(workload, policy, config, progress, annotator, fairshare)

    def replay(self, workload: Workload, policy: Policy, config: SimConfig | None = None,
               progress: ProgressFn | None = None, annotator: Annotator | None = None,
               fairshare: FairShare | None = None) -> SimResult:
        return self.build(workload, policy, config, progress, annotator, fairshare).run()


def engine_for(policies: Iterable[object], trace_dir: Path | None = None) -> Engine:
    """The engine for a comparison of ``policies``: the sharing engine if any of them shares
    GPUs, with the co-location measurements of ``trace_dir`` where it has them."""
    if not any(shares_gpus(p) for p in policies):
        return Engine()
    table = None
    if trace_dir is not None and (trace_dir / COLOCATION_FILE).is_file():
        table = ColocationTable.load(trace_dir / COLOCATION_FILE)
    return Engine(sharing=True, colocation=table)
