"""Study: Philly's virtual clusters as accounts sharing one cluster, with and without quotas.

Setup, fixed before any result was looked at:

* Jobs: ``philly-jobs.csv`` submitted in [since, until) (default the first two weeks of
  Helios' Philly period, 2017-10-01 to 2017-10-15, so the three replays run in minutes), each
  job's virtual cluster (VC) its account, running exactly its recorded duration.
* Cluster: one shared pool of 8-GPU nodes, as many as the VCs of ``philly-vcs.csv`` hold at
  VC scale 0.2125 (each VC round(scale × its nodes), at least one): the scale at which the
  Philly study finds FIFO's node utilisation at Helios' 69 % (docs/results.md), so the
  cluster is busy. Jobs of VCs missing from ``philly-vcs.csv`` belong to no account.
* Accounts: one per VC, its nominal GPU quota its scaled nodes × 8: quotas proportional to
  the VCs' nodes, summing to the cluster.
* Modes: ``none`` (no accounts), ``hard`` (quotas, borrowing limit 0: a VC never runs beyond
  its quota) and ``borrow`` (quotas, unbounded borrowing of idle GPUs, reclaimed by
  preemption when an owner within its quota needs them; a preempted job restarts from
  scratch, its lost work counted) and ``fair`` (``borrow`` with fair share ordering the
  admitted jobs: usage decayed with Slurm's 7-day half-life, the master's own
  ``masterd.core.fairshare`` and ``fairorder``, each VC's shares its quota).
* Order: ``fifo`` with Helios' consolidated placement and no backfill. Quotas decide whether
  a job may run; the order decides which admitted job runs first (:data:`ORDER`, wrapped by
  fair share in the ``fair`` mode).

Measured: each account's GPU-hours against its entitlement (quota share × the cluster's
GPU-hours) over time (a plot) and in total; how much of its guarantee each account got
(GPU-hours below min(its demand, its quota), integrated over time: its *shortfall*); the
cluster's GPU utilisation; each account's queueing; preemptions and GPU-hours lost to them.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from masterd.core.fairorder import FairShareOrdering
from masterd.core.fairshare import FairShare
from masterd.core.policies import make_policy
from shared.accounts import Account, AccountTree, Resources
from sim.engine import SimConfig, SimResult, Simulator
from sim.metrics import mean, percentile
from sim.studies.common import ReportError, Section, Study, pyplot, save_figure
from sim.studies.philly import _day
from sim.tables import Table
from sim.truth import TruthConfig, TruthModel
from sim.workloads import philly
from sim.workloads.base import LoadOptions, Workload

MODES = ("none", "hard", "borrow", "fair")
MODE_TITLES = {"none": "no quotas", "hard": "hard quotas", "borrow": "quotas + borrowing",
               "fair": "quotas + borrowing + fair share"}
# Slurm's anchor for usage decay (PriorityDecayHalfLife=7-0), the master's default too.
FAIR_HALF_LIFE_S = 7 * 86400.0
# The order among admitted jobs, the same in every mode: (policy, options). A fair-share
# order is added here as another mode (its own policy or option), nothing else changes.
ORDER: tuple[str, dict[str, Any]] = ("fifo", {"backfill": False, "placement": "consolidate"})
PHILLY_STUDY_SCALE = 0.2125  # docs/results.md: FIFO's node utilisation 69.9 % there
DAY = 86400.0


@dataclass(frozen=True)
class TenantsStudy:
    since: str = "2017-10-01"
    until: str = "2017-10-15"
    vc_scale: float = PHILLY_STUDY_SCALE
    seed: int = 1
    modes: tuple[str, ...] = MODES
    bin_s: float = DAY  # the plot's time bins
    limit: int | None = None


def tiny() -> TenantsStudy:
    return replace(TenantsStudy(), until="2017-10-03", vc_scale=1.0, bin_s=3600.0)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenants-since", help="first submission date kept (default 2017-10-01)")
    parser.add_argument("--tenants-until", help="end of the window (default 2017-10-15)")
    parser.add_argument("--tenants-scale", type=float,
                        help="VC scale of the shared cluster (default 0.2125)")


def apply_options(study: TenantsStudy, args: argparse.Namespace) -> TenantsStudy:
    if getattr(args, "tenants_since", None):
        study = replace(study, since=args.tenants_since)
    if getattr(args, "tenants_until", None):
        study = replace(study, until=args.tenants_until)
    scale = getattr(args, "tenants_scale", None)
    if scale is not None:
        if not scale > 0:
            raise ReportError(f"--tenants-scale must be positive, got {scale:g}")
        study = replace(study, vc_scale=scale)
    return study


@dataclass(frozen=True)
class Setup:
    workload: Workload
    quotas: dict[str, int]  # account -> GPUs
    total_gpus: int
    window: tuple[float, float]  # first and last submission (simulation clock)


def setup(study: TenantsStudy, trace_dir: Path) -> Setup:
    skipped: list[str] = []
    options = LoadOptions(seed=study.seed, limit=study.limit)
    vcs = philly.load_vcs(trace_dir / philly.VCS_FILE, options, skipped)
    nodes = {vc: max(1, round(count * study.vc_scale)) for vc, count in vcs.items()}
    workload = philly.load(
        trace_dir, options, TruthModel(TruthConfig(noise_sigma=0.0, interference=False),
                                       study.seed),
        nodes_override=sum(nodes.values()), since=_day(study.since, "--tenants-since"),
        until=_day(study.until, "--tenants-until"))
    quotas = {vc: count * philly.GPUS_PER_NODE for vc, count in nodes.items()}
    submits = [j.submit for j in workload.jobs]
    return Setup(workload, quotas, sum(quotas.values()), (min(submits), max(submits)))


def accounts(quotas: dict[str, int], mode: str) -> tuple[Account, ...]:
    if mode == "none":
        return ()
    borrow = Resources(gpus=0) if mode == "hard" else Resources()
    # Fair share's shares: each VC's quota (what it paid for), as Slurm sites set Fairshare=.
    return tuple(Account(vc, users=(f"vc-{vc.lower()}"[:32],), shares=max(1, gpus),
                         quota=Resources(gpus=gpus), borrowing_limit=borrow)
                 for vc, gpus in sorted(quotas.items()))


class _Recorder(Simulator):
    """The simulator, noting every run of a job (its account, GPUs, start and end)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.runs: list[tuple[str, int, float, float]] = []
        self._started: dict[str, tuple[str, int, float]] = {}
        # workload job -> GPU-seconds of its runs before the last (thrown away: a preempted
        # job restarts from scratch), and of its last run.
        self.lost_gpu_s: dict[str, float] = defaultdict(float)
        self._last_gpu_s: dict[str, float] = {}

    def _begin(self, job_id: str, now: float) -> None:
        super()._begin(job_id, now)
        job = self.core.jobs[job_id]
        placement = job.placement
        self._started[job_id] = (job.spec.tenant, placement.gpu_count if placement else 0, now)

    def _end_run(self, job_id: str, now: float) -> Any:
        run = super()._end_run(job_id, now)
        began = self._started.pop(job_id, None)
        if began is not None:
            self.runs.append((began[0], began[1], began[2], now))
            record = self._record_of[job_id].id
            if record in self._last_gpu_s:
                self.lost_gpu_s[record] += self._last_gpu_s[record]
            self._last_gpu_s[record] = began[1] * (now - began[2])
        return run


def replay(study: TenantsStudy, prepared: Setup, mode: str
           ) -> tuple[SimResult, _Recorder, float]:
    started = time.monotonic()
    tree = accounts(prepared.quotas, mode)
    config = SimConfig(seed=study.seed,
                       truth=TruthConfig(noise_sigma=0.0, interference=False),
                       accounts=tree)
    name, options = ORDER
    policy: Any = make_policy(name, **options)
    tracker = None
    if mode == "fair":
        tracker = FairShare(AccountTree.of(tree), half_life_s=FAIR_HALF_LIFE_S)
        policy = FairShareOrdering(policy, tracker)
    sim = _Recorder(prepared.workload, policy, config, fairshare=tracker)
    result = sim.run()
    return result, sim, time.monotonic() - started


def _integrate(changes: list[tuple[float, float]], start: float, end: float) -> float:
    """∫ of a step function given as (time, delta) over [start, end]."""
    total = level = 0.0
    last = start
    for t, delta in sorted(changes):
        t_clamped = min(max(t, start), end)
        total += level * (t_clamped - last)
        last = t_clamped
        level += delta
    return total + level * (end - last)


def measure(study: TenantsStudy, prepared: Setup, result: SimResult,
            recorder: _Recorder) -> dict[str, Any]:
    runs = recorder.runs
    start, end = prepared.window
    span_h = (end - start) / 3600.0
    cluster_gpu_h = prepared.total_gpus * span_h
    # Allocation per account (its runs) and demand (GPUs of jobs submitted and not ended).
    alloc: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for account, gpus, begin, stop in runs:
        alloc[account] += [(begin, gpus), (stop, -gpus)]
    demand: dict[str, list[tuple[float, float]]] = defaultdict(list)
    horizon = result.end_time
    for r in result.records:
        if r.state == "rejected":
            continue
        demand[r.tenant] += [(r.submit, r.gpus), (r.end if r.end is not None else horizon,
                                                  -r.gpus)]
    per_account: dict[str, Any] = {}
    for account in sorted(set(prepared.quotas) | set(alloc)):
        quota = prepared.quotas.get(account)
        used_h = _integrate(alloc[account], start, end) / 3600.0
        owed_h = short_h = None
        if quota is not None:
            owed_h, short_h = _guarantee(alloc[account], demand[account], quota, start, end)
        done = [r for r in result.records if r.tenant == account and r.state == "finished"]
        delays = [r.queue_delay for r in done if r.queue_delay is not None]
        per_account[account] = {
            "quota_gpus": quota,
            "entitled_share_pct": None if quota is None
            else 100.0 * quota / prepared.total_gpus,
            "used_share_pct": 100.0 * used_h / cluster_gpu_h if cluster_gpu_h else None,
            "gpu_hours": used_h,
            "owed_gpu_hours": owed_h,
            "shortfall_gpu_hours": short_h,
            "guarantee_met_pct": None if not owed_h else 100.0 * (1 - short_h / owed_h),
            "jobs": sum(r.tenant == account for r in result.records),
            "finished": len(done),
            "unfinished": sum(r.tenant == account and r.state == "unfinished"
                              for r in result.records),
            "avg_queue_s": mean(delays),
            "p95_queue_s": percentile(delays, 95),
            "preemptions": sum(r.preemptions for r in result.records if r.tenant == account),
        }
    total_used_h = sum(a["gpu_hours"] for a in per_account.values())
    owed = sum(a["owed_gpu_hours"] or 0.0 for a in per_account.values())
    short = sum(a["shortfall_gpu_hours"] or 0.0 for a in per_account.values())
    done = [r for r in result.records if r.state == "finished"]
    delays = [r.queue_delay for r in done if r.queue_delay is not None]
    bins = _bins(study, prepared, runs)
    return {
        "gpu_util_pct": 100.0 * total_used_h / cluster_gpu_h if cluster_gpu_h else None,
        "guarantee_met_pct": 100.0 * (1 - short / owed) if owed else None,
        "shortfall_gpu_hours": short,
        "finished": len(done),
        "unfinished": sum(r.state == "unfinished" for r in result.records),
        "rejected": sum(r.state == "rejected" for r in result.records),
        "avg_queue_s": mean(delays),
        "p95_queue_s": percentile(delays, 95),
        "preemptions": sum(r.preemptions for r in result.records),
        # Every run of a job before its last one: thrown away (it restarts from scratch).
        "lost_gpu_hours": sum(recorder.lost_gpu_s.values()) / 3600.0,
        "accounts": per_account,
        "bins": bins,
    }


def _guarantee(alloc: list[tuple[float, float]], demand: list[tuple[float, float]],
               quota: int, start: float, end: float) -> tuple[float, float]:
    """(owed, shortfall) GPU-hours over [start, end]: owed = ∫ min(demand, quota); shortfall
    = ∫ max(0, min(demand, quota) − allocated)."""
    events = sorted([(t, "a", d) for t, d in alloc] + [(t, "d", d) for t, d in demand])
    a = d = 0.0
    last = start
    owed = short = 0.0
    for t, kind, delta in events:
        t_clamped = min(max(t, start), end)
        span = t_clamped - last
        due = min(d, quota)
        owed += due * span
        short += max(0.0, due - a) * span
        last = t_clamped
        if kind == "a":
            a += delta
        else:
            d += delta
    due = min(d, quota)
    owed += due * (end - last)
    short += max(0.0, due - a) * (end - last)
    return owed / 3600.0, short / 3600.0


def _bins(study: TenantsStudy, prepared: Setup,
          runs: list[tuple[str, int, float, float]]) -> dict[str, list[float]]:
    """Each account's share (%) of the cluster's GPU-hours per time bin."""
    start, end = prepared.window
    count = max(1, int((end - start) // study.bin_s) + 1)
    width = study.bin_s * prepared.total_gpus
    out: dict[str, list[float]] = {a: [0.0] * count for a in prepared.quotas}
    for account, gpus, begin, stop in runs:
        shares = out.setdefault(account, [0.0] * count)
        b0, b1 = max(begin, start), min(stop, start + count * study.bin_s)
        i = int((b0 - start) // study.bin_s)
        while b0 < b1 and i < count:
            edge = min(b1, start + (i + 1) * study.bin_s)
            shares[i] += 100.0 * gpus * (edge - b0) / width
            b0 = edge
            i += 1
    return out


def run(study: TenantsStudy, trace_dir: Path, out_dir: Path, show: bool = False) -> Section:
    section = Section("tenants", "Accounts and quotas: Philly's virtual clusters sharing one "
                                 "cluster")
    began = time.monotonic()
    prepared = setup(study, trace_dir)
    notes = prepared.workload.notes
    measured: dict[str, dict[str, Any]] = {}
    walls: dict[str, float] = {}
    for mode in study.modes:
        result, recorder, wall = replay(study, prepared, mode)
        measured[mode] = measure(study, prepared, result, recorder)
        walls[mode] = wall
    no_account = sorted(set(notes.get("vcs_without_size", [])))
    section.text(
        f"**Setup (generated).** `philly-jobs.csv` jobs submitted from {study.since} to "
        f"{study.until}: {len(prepared.workload.jobs)} jobs, each virtual cluster (VC) an "
        f"account. One shared cluster of {notes['nodes']} nodes of 8 GPUs "
        f"({prepared.total_gpus} GPUs): the VCs of `philly-vcs.csv` at VC scale "
        f"{study.vc_scale:g}. Each account's nominal GPU quota is its scaled nodes × 8. "
        f"Modes: no quotas; hard quotas (borrowing limit 0); quotas + borrowing (idle GPUs "
        f"lent without bound, reclaimed by preempting the newest borrowers; a preempted job "
        f"restarts from scratch); quotas + borrowing + fair share (the same, with the "
        f"admitted jobs ordered by each account's fair-share factor: usage decayed with a "
        f"{FAIR_HALF_LIFE_S / 86400:g}-day half-life, shares = quotas). Order among admitted "
        f"jobs: `{ORDER[0]}` with "
        f"{', '.join(f'{k}={v}' for k, v in ORDER[1].items())}. Jobs of VCs without a size "
        f"({', '.join(no_account) or 'none'}) belong to no account. Utilisation and shares "
        f"are GPU-hours between the first and the last submission; an account's *guarantee "
        f"met* is 100 % minus the GPU-hours it got below min(its demand, its quota), over "
        f"the GPU-hours of min(demand, quota).")
    summary = Table("tenants-summary", ["mode", "GPU util %", "guarantee met %",
                                        "shortfall GPU-h", "avg queueing s", "p95 queueing s",
                                        "finished", "unfinished", "preemptions",
                                        "GPU-h lost to preemption", "wall s"],
                    ["", "{:.1f}", "{:.1f}", "{:.0f}", "{:.0f}", "{:.0f}", "{:d}", "{:d}",
                     "{:d}", "{:.0f}", "{:.1f}"],
                    caption="The cluster under each mode.")
    for mode in study.modes:
        m = measured[mode]
        summary.add(MODE_TITLES[mode], m["gpu_util_pct"], m["guarantee_met_pct"],
                    m["shortfall_gpu_hours"], m["avg_queue_s"], m["p95_queue_s"],
                    m["finished"], m["unfinished"], m["preemptions"], m["lost_gpu_hours"],
                    walls[mode])
    section.table(summary)
    accounts_table = Table(
        "tenants-accounts",
        ["account", "quota GPUs", "entitled %",
         *[f"used % ({MODE_TITLES[m]})" for m in study.modes],
         *[f"guarantee met % ({MODE_TITLES[m]})" for m in study.modes],
         *[f"avg queueing s ({MODE_TITLES[m]})" for m in study.modes]],
        ["", "{}", "{:.1f}", *(["{:.1f}"] * len(study.modes)),
         *(["{:.1f}"] * len(study.modes)), *(["{:.0f}"] * len(study.modes))],
        caption="Each account: its share of the cluster's GPU-hours against its entitlement, "
                "how much of its guarantee it got, and its jobs' average queueing.")
    names = sorted({a for m in measured.values() for a in m["accounts"]})
    for account in names:
        rows = [measured[m]["accounts"].get(account, {}) for m in study.modes]
        first = next((r for r in rows if r), {})
        accounts_table.add(account, first.get("quota_gpus") if first.get("quota_gpus")
                           is not None else "-", first.get("entitled_share_pct"),
                           *[r.get("used_share_pct") for r in rows],
                           *[r.get("guarantee_met_pct") for r in rows],
                           *[r.get("avg_queue_s") for r in rows])
    section.table(accounts_table)
    figure = _plot(study, prepared, measured, out_dir)
    if figure:
        section.figures.append((figure, "Each account's share of the cluster's GPU-hours per "
                                        "bin (solid) against its entitlement (dashed), per "
                                        "mode."))
    section.data = {
        "setup": {"since": study.since, "until": study.until, "vc_scale": study.vc_scale,
                  "seed": study.seed, "jobs": len(prepared.workload.jobs),
                  "nodes": notes["nodes"], "gpus": prepared.total_gpus,
                  "quotas": prepared.quotas, "order": [ORDER[0], ORDER[1]],
                  "bin_s": study.bin_s},
        "runs": {mode: {k: v for k, v in m.items() if k != "bins"}
                 for mode, m in measured.items()},
        "bins": {mode: m["bins"] for mode, m in measured.items()},
    }
    section.wall_s = time.monotonic() - began
    return section


def _plot(study: TenantsStudy, prepared: Setup, measured: dict[str, dict[str, Any]],
          out_dir: Path) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    modes = list(study.modes)
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 4), sharey=True,
                             squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    accounts = sorted(prepared.quotas)
    for ax, mode in zip(axes[0], modes, strict=True):
        bins = measured[mode]["bins"]
        for i, account in enumerate(accounts):
            colour = colours[i % len(colours)]
            series = bins.get(account, [])
            xs = [(k + 0.5) * study.bin_s / DAY for k in range(len(series))]
            ax.plot(xs, series, color=colour, linewidth=1.0, label=account)
            ax.axhline(100.0 * prepared.quotas[account] / prepared.total_gpus, color=colour,
                       linestyle="--", linewidth=0.6)
        ax.set_title(MODE_TITLES[mode])
        ax.set_xlabel("days since the first submission")
    axes[0][0].set_ylabel("share of the cluster's GPU-hours, %")
    axes[0][-1].legend(fontsize=6, ncol=2)
    name = "tenants_share.png"
    save_figure(plt, fig, out_dir / name)
    return name


STUDY = Study(name="tenants", label="tenants",
              config=TenantsStudy, run=run, tiny=tiny, add_options=add_options,
              apply_options=apply_options)
