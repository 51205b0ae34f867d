"""``trellis-sim whatif``: the cluster's own history, replayed under other policies.

The history comes from a master's journal (a SQLite file or a PostgreSQL URL, read-only):
every job with its spec (shape, account, user), its measured run time and its submission
time, the nodes as they last registered and the account tree it holds now (quotas, caps
and shares, applied by the replay as the master applies them). Each named policy replays
it through sim/engine.py (the master's own scheduling core), and the table puts each replay
beside what really happened: mean and p95 wait, mean JCT, GPU utilisation and each
account's share of the GPU-hours.

Rules (docs/governance.md, "What if"):

* **A job that never ran** (cancelled or failed while queued, or still queued) is left out:
  there is no run time to replay. It is counted in the notes.
* **A job still running** when the journal is read is replayed with the time it has run so
  far (a lower bound), and counted in the notes.
* **A job requeued or preempted** is replayed with its last run's duration (its only
  complete run; the earlier runs were cut short by failures a replay does not repeat).
* **Failed, cancelled and timed-out jobs** that ran are replayed for as long as they held
  their resources: they cost the cluster that much whatever the policy.
* **A run time that depended on where the job ran**: the measured duration is taken as the
  job's time on its GPU count packed as tightly as possible (the truth model's reference
  run); a replay that spreads it over more nodes or PCIe switches runs it slower by the
  truth model's locality factor (docs/simulator.md), and one that packs it as it ran
  reproduces the measured time exactly. Noise and interference are off: the measurement
  already holds whatever interference there was.
* Dependencies and arrays are not replayed (the recorded submission times already
  follow from them); deadlines neither.

"What really happened" is computed from the same jobs (the replayed set) by the same
formulas, so the columns compare like with like.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from masterd.core.fairorder import FairShareOrdering
from masterd.core.fairshare import FairShare
from masterd.journal.accounts import tree_of
from masterd.journal.backends import is_postgres, open_reader
from masterd.journal.history import JobHistory, read_history
from shared.accounts import Account, AccountTree
from shared.model import JobSpec, NodeInventory
from shared.schema import SchemaError, decode
from sim.engine import SimConfig, SimResult
from sim.engines import engine_for
from sim.metrics import mean, percentile
from sim.studies.common import pyplot, save_figure
from sim.truth import TruthConfig, TruthParams
from sim.workloads.base import SimJob, Workload

REPLAY_TRUTH = TruthConfig(noise_sigma=0.0, interference=False)


class WhatIfError(ValueError):
    """The journal cannot be replayed (missing, unreadable, nothing that ran)."""


@dataclass
class Replayable:
    workload: Workload
    jobs: list[JobHistory]  # the replayed jobs, as they really ran
    notes: dict[str, Any] = field(default_factory=dict)
    read_at: float = 0.0
    # The journalled account tree (quotas, caps, shares), replayed as the cluster ran it;
    # () where the journal holds none (accounts were never on).
    accounts: tuple[Account, ...] = ()


def load_journal(location: str, since: float | None = None,
                 now: float | None = None) -> Replayable:
    """The journal's jobs submitted at or after ``since`` and its nodes, as a workload."""
    if not is_postgres(location) and not os.path.isfile(location):
        raise WhatIfError(f"--journal {location}: no such file (give a master's journal.db "
                          "or a postgresql:// URL)")
    try:
        db = open_reader(location, application_name="trellis-whatif")
    except Exception as exc:
        raise WhatIfError(f"--journal: cannot open the journal: {exc}") from None
    try:
        history = read_history(db, submitted_since=since, keep_spec=True)
        last_event = db.execute("SELECT MAX(time) FROM events").fetchone()[0]
    except Exception as exc:
        db.close()
        raise WhatIfError(f"--journal {location}: not a Trellis journal ({exc})") from None
    try:  # last: on PostgreSQL a missing table spoils the transaction
        accounts = tuple(tree_of(db) or ())
    except SchemaError as exc:
        raise WhatIfError(f"--journal {location}: its account tree: {exc}") from None
    except Exception:  # a journal from before accounts: no account_tree table
        accounts = ()
    finally:
        db.close()
    read_at = now if now is not None else float(last_event or 0.0)
    nodes: list[NodeInventory] = []
    for node in history.nodes.values():
        try:
            nodes.append(decode(NodeInventory, node.inventory))
        except SchemaError as exc:
            raise WhatIfError(f"node {node.name} in the journal: {exc}") from None
    if not nodes:
        raise WhatIfError("the journal has no nodes: nothing to replay on")
    jobs: list[SimJob] = []
    kept: list[JobHistory] = []
    notes = {"never_ran": 0, "still_running": 0, "requeued": 0, "bad_spec": 0}
    for record in history.jobs:
        if since is not None and record.submit < since:
            continue  # still queued or running, but submitted before the window
        if not record.runs:
            notes["never_ran"] += 1
            continue
        last = record.runs[-1]
        end = last.end
        if end is None:
            notes["still_running"] += 1
            end = max(read_at, last.start)
        if len(record.runs) > 1:
            notes["requeued"] += 1
        duration = max(1e-3, end - last.start)  # the truth model needs some work
        try:
            spec = decode(JobSpec, record.spec)
        except SchemaError:
            notes["bad_spec"] += 1
            continue
        spec = replace(spec, after=(), array=None, deadline=None)
        jobs.append(SimJob(id=record.id, spec=spec, submit=record.submit,
                           truth=TruthParams(known_duration=duration,
                                             known_gpus=last.gpus or spec.gpus)))
        kept.append(record)
    if not jobs:
        raise WhatIfError("no job in the journal's window ever ran: nothing to replay")
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].submit)
    origin = jobs[order[0]].submit
    shifted = [replace(jobs[i], submit=jobs[i].submit - origin) for i in order]
    workload = Workload(name="journal", jobs=shifted, nodes=nodes, origin=origin,
                        notes=dict(notes))
    return Replayable(workload, [kept[i] for i in order], notes, read_at, accounts)


@dataclass(frozen=True)
class Outcome:
    """One column of the table: a replay, or what really happened."""

    name: str
    jobs: int
    ended: int  # jobs that ended (any end state; a replay ends each after its run time)
    wait_mean_s: float
    wait_p95_s: float
    jct_mean_s: float
    utilisation: float  # GPU-time allocated over GPUs × span
    shares: dict[str, float]  # account -> fraction of the GPU-hours


def actual_outcome(jobs: Sequence[JobHistory], total_gpus: int, read_at: float) -> Outcome:
    waits, jcts = [], []
    gpu_s: dict[str, float] = {}
    first = min(j.submit for j in jobs)
    last = first
    finished = 0
    for job in jobs:
        start = job.runs[0].start
        waits.append(max(0.0, start - job.submit))
        if job.end is not None:
            jcts.append(job.end - job.submit)
            finished += 1
        for run in job.runs:
            end = run.end if run.end is not None else read_at
            gpu_s[job.account] = gpu_s.get(job.account, 0.0) + max(0.0, end - run.start) * run.gpus
            last = max(last, end)
    return _outcome("actual", len(jobs), finished, waits, jcts, gpu_s, total_gpus, last - first)


def replay_outcome(name: str, result: SimResult, accounts: dict[str, str]) -> Outcome:
    waits, jcts = [], []
    gpu_s: dict[str, float] = {}
    finished = 0
    for record in result.records:
        if record.first_start is not None:
            waits.append(record.first_start - record.submit)
        if record.jct is not None:
            jcts.append(record.jct)
        finished += record.end is not None
        account = accounts.get(record.id, record.tenant)
        gpu_s[account] = gpu_s.get(account, 0.0) + record.run_time * record.gpus_used
    span = max(result.end_time, 1e-9)
    return _outcome(name, len(result.records), finished, waits, jcts, gpu_s,
                    result.total_gpus, span)


def _outcome(name: str, jobs: int, finished: int, waits: list[float], jcts: list[float],
             gpu_s: dict[str, float], total_gpus: int, span: float) -> Outcome:
    total = sum(gpu_s.values())
    return Outcome(
        name=name, jobs=jobs, ended=finished,
        wait_mean_s=mean(waits) or 0.0, wait_p95_s=percentile(waits, 95) or 0.0,
        jct_mean_s=mean(jcts) or 0.0,
        utilisation=total / (total_gpus * span) if total_gpus and span > 0 else 0.0,
        shares={a: (v / total if total else 0.0) for a, v in sorted(gpu_s.items())})


def replay(data: Replayable, policies: Sequence[Any], fairshare: bool = False,
           half_life_s: float = 7 * 86400.0) -> list[Outcome]:
    """``policies``: (name, Policy) pairs, each replayed over the same workload."""
    total_gpus = sum(len(n.gpus) for n in data.workload.nodes)
    outcomes = [actual_outcome(data.jobs, total_gpus, data.read_at)]
    accounts = {j.id: j.account for j in data.jobs}
    from sim.cli import qssf_annotator  # the estimate a replay of a trace gets (no cycle)

    # Every policy on one engine (sim/engines.py), chosen before fair share wraps them.
    engine = engine_for(policy for _, policy in policies)
    for name, policy in policies:
        tracker = None
        if fairshare:
            tracker = FairShare(AccountTree.of(data.accounts), half_life_s=half_life_s)
            policy = FairShareOrdering(policy, tracker)
        config = SimConfig(seed=1, truth=REPLAY_TRUTH, accounts=data.accounts)
        result = engine.replay(data.workload, policy, config,
                               annotator=qssf_annotator(name, data.workload), fairshare=tracker)
        outcomes.append(replay_outcome(name + ("+fairshare" if fairshare else ""), result,
                                       accounts))
    return outcomes


def table(outcomes: Sequence[Outcome], notes: dict[str, Any]) -> str:
    names = [o.name for o in outcomes]
    accounts = sorted({a for o in outcomes for a in o.shares})
    rows: list[tuple[str, list[str]]] = [
        ("jobs", [str(o.jobs) for o in outcomes]),
        ("ended", [str(o.ended) for o in outcomes]),
        ("wait mean (s)", [f"{o.wait_mean_s:.1f}" for o in outcomes]),
        ("wait p95 (s)", [f"{o.wait_p95_s:.1f}" for o in outcomes]),
        ("JCT mean (s)", [f"{o.jct_mean_s:.1f}" for o in outcomes]),
        ("GPU utilisation", [f"{o.utilisation:.1%}" for o in outcomes]),
    ]
    rows += [(f"share {a}", [f"{o.shares.get(a, 0.0):.1%}" for o in outcomes])
             for a in accounts]
    title_w = max(len(t) for t, _ in rows)
    col_w = max(10, *(len(n) for n in names))
    lines = [" " * title_w + "  " + "  ".join(n.rjust(col_w) for n in names)]
    lines += [t.ljust(title_w) + "  " + "  ".join(c.rjust(col_w) for c in cells)
              for t, cells in rows]
    left = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in notes.items() if v)
    if left:
        lines.append(f"(left out or approximated: {left}; rules: docs/governance.md)")
    return "\n".join(lines)


def as_json(outcomes: Sequence[Outcome], notes: dict[str, Any]) -> dict[str, Any]:
    return {"notes": notes, "runs": [o.__dict__ for o in outcomes]}


def write_plots(outcomes: Sequence[Outcome], out: Path) -> list[Path]:
    """Bar charts of wait, JCT and utilisation, and each account's share, per column."""
    plt = pyplot()
    if plt is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    names = [o.name for o in outcomes]
    written = []
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, (title, values) in zip(axes, (
            ("mean wait (s)", [o.wait_mean_s for o in outcomes]),
            ("mean JCT (s)", [o.jct_mean_s for o in outcomes]),
            ("GPU utilisation", [o.utilisation for o in outcomes])), strict=True):
        ax.bar(names, values, color=["#777"] + ["#3a7"] * (len(names) - 1))
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
    written.append(out / "whatif_summary.png")
    save_figure(plt, fig, written[-1])
    accounts = sorted({a for o in outcomes for a in o.shares})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 4))
    bottom = [0.0] * len(outcomes)
    for account in accounts:
        values = [o.shares.get(account, 0.0) for o in outcomes]
        ax.bar(names, values, bottom=bottom, label=account)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("share of GPU-hours")
    ax.legend(fontsize="small")
    ax.tick_params(axis="x", rotation=30)
    written.append(out / "whatif_shares.png")
    save_figure(plt, fig, written[-1])
    return written
