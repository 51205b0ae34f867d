"""Accounting over a year of journal: how long ``trellisctl report`` takes to compute.

    python bench/governance_report.py [--days 365] [--jobs-per-day 1000] [--keep]

Writes a synthetic journal into a ``trellis-test-`` scratch directory through the journal's
own store code (``Store.insert_rows`` for submissions, ``Store.apply_updates`` for every
state change and its events, ``Store.save_node``, Liquid's ``insert_usage`` for measured
utilisation, and the fair-share feature's ``record_ended`` for the accounting rows of the
jobs that ended): 100 nodes of 8 GPUs, 20 accounts, 200 users, ``--jobs-per-day`` jobs a day of
0-8 GPUs, each with its ``submitted``, ``placed``, ``running`` and end events; 2% of them
requeued once (a second run, read back from their events), half with a final usage report.
Then times what the ``report`` RPC runs in its thread (``report_from_journal``: read the
history, aggregate by account over the whole year) and, for comparison, by user.

Last line: JSON with ``report_s`` (by account, wall time; target <= 5 s), ``report_cpu_s``
(the CPU time it took: on a loaded machine wall time grows, CPU time hardly), ``load_average``
and ``cpus`` (to read the two against), ``report_user_s``, ``jobs``, ``events``, ``write_s``
(building the journal) and ``seconds`` (the whole run). ``--journal`` times the report again
over a journal a ``--keep`` run left.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.harness import exit_on_signals, scratch_dir  # noqa: E402
from masterd.features.fairshare import report_from_journal  # noqa: E402
from masterd.journal import accounting, liquid  # noqa: E402
from masterd.journal.store import Store, new_job_rows, update_rows  # noqa: E402
from shared.model import (  # noqa: E402
    CpuCore,
    GpuInfo,
    Job,
    JobKind,
    JobSpec,
    JobState,
    NodeAllocation,
    NodeInventory,
    Placement,
)

TARGET_S = 5.0
DAY = 86400.0
ORIGIN = 1_700_000_000.0


def node(i: int) -> NodeInventory:
    name = f"n{i:03d}"
    return NodeInventory(
        name=name, hostname=name, address="127.0.0.1",
        gpus=tuple(GpuInfo(index=g, uuid=f"GPU-{name}-{g}", model="A100" if i % 2 else "V100",
                           memory_mib=40_000) for g in range(8)),
        cpus=tuple(CpuCore(id=c) for c in range(32)), memory_mib=512_000)


def build(store: Store, days: int, per_day: int, rng: random.Random) -> tuple[int, int]:
    nodes = [node(i) for i in range(100)]
    for inv in nodes:
        store.save_node(inv, False, ORIGIN)
    liquid.create_tables(store)
    accounting.create_tables(store)
    seq = 0
    events = 0
    specs = {}
    for day in range(days):
        batch: list[tuple[int, Job]] = []
        updates: list[Job] = []
        rows: list[tuple] = []
        usage: list[tuple] = []
        for k in range(per_day):
            seq += 1
            gpus = rng.choice((0, 1, 1, 1, 2, 4, 8))
            account = f"acct{rng.randrange(20):02d}"
            user = f"user{rng.randrange(200):03d}"
            key = (gpus, account, user)
            spec = specs.get(key)
            if spec is None:
                spec = specs[key] = JobSpec(
                    name=f"train-{account}", command=("python", "train.py"), user=user,
                    tenant=account, kind=JobKind.TRAINING if gpus else JobKind.CPU,
                    gpus=gpus, cpus=max(1, gpus * 4), memory_mib=8192 * max(1, gpus))
            submit = ORIGIN + day * DAY + k * DAY / per_day
            job = Job(id=f"j{seq}", spec=spec, submit_time=submit)
            batch.append((seq, job))
            host = nodes[rng.randrange(100)]
            placement = Placement((NodeAllocation(
                node=host.name, gpus=tuple(range(gpus)), cpus=tuple(range(spec.cpus)),
                memory_mib=spec.memory_mib),))
            place = [{"node": host.name, "gpus": list(range(gpus)),
                      "cpus": list(range(spec.cpus))}]
            wait = rng.expovariate(1 / 600.0)
            run = rng.expovariate(1 / 7200.0)
            start = submit + wait
            if rng.random() < 0.02:  # requeued once after a node loss: two runs
                cut = start + run / 3
                rows += [(start - 1, job.id, None, "placed", {"placement": place}),
                         (start, job.id, None, "running", {}),
                         (cut, job.id, None, "requeued", {"reason": "node lost"})]
                job.restarts = 1
                start = cut + 60.0
            job.state = rng.choices((JobState.FINISHED, JobState.FAILED, JobState.CANCELLED,
                                     JobState.TIMEOUT), (90, 6, 3, 1))[0]
            job.placement = placement
            job.start_time = start
            job.end_time = start + run
            job.attempts = 1 + job.restarts
            rows += [(start - 1, job.id, None, "placed", {"placement": place}),
                     (start, job.id, None, "running", {}),
                     (job.end_time, job.id, None, job.state.value, {"reason": ""})]
            updates.append(job)
            if gpus and rng.random() < 0.5:
                usage.append((job.id, host.name, job.end_time, True,
                               {"seconds": run, "gpu_util_mean": rng.uniform(20, 95)},
                               None, None))
        store.insert_rows([new_job_rows(s, j) for s, j in batch])
        store.apply_updates(*update_rows(updates, rows))
        liquid.insert_usage(store, usage)
        # What the fair-share feature does as jobs end: their compact accounting rows.
        accounting.record_ended(store, [job.id for job in updates])
        events += len(rows) + len(batch)
    return seq, events


def measure(days: int = 365, jobs_per_day: int = 1000, keep: bool = False,
            journal: str | None = None) -> dict:
    """Write a synthetic journal of ``days`` x ``jobs_per_day`` (unless ``journal`` names
    one) and time the accounting report over it. bench/governance.py calls it too."""
    began = time.perf_counter()
    rng = random.Random(31)
    with exit_on_signals(), scratch_dir("trellis-test-governance-report-", keep=keep) as root:
        path = Path(root) / "journal.db"
        if journal:
            path = Path(journal)
            jobs = events = -1  # not counted
        else:
            store = Store(path)
            try:
                jobs, events = build(store, days, jobs_per_day, rng)
            finally:
                store.close()
        write_s = time.perf_counter() - began
        since, until = ORIGIN, ORIGIN + days * DAY + DAY
        t0, c0 = time.perf_counter(), time.process_time()
        rows = report_from_journal(str(path), "account", since, until)
        report_s = time.perf_counter() - t0
        # CPU time of this process (SQLite runs in it): what the report costs whatever else
        # the machine runs; report_s is wall time, and grows with the machine's load.
        report_cpu_s = time.process_time() - c0
        t0 = time.perf_counter()
        report_from_journal(str(path), "user", since, until)
        report_user_s = time.perf_counter() - t0
    allocated = sum(r["gpu_hours_allocated"] for r in rows)
    print(f"{jobs} jobs, {events} events; report by account: {report_s:.2f} s "
          f"({len(rows)} rows, {allocated:,.0f} GPU-hours); by user: {report_user_s:.2f} s")
    return {"report_s": round(report_s, 3), "report_cpu_s": round(report_cpu_s, 3),
            "report_user_s": round(report_user_s, 3),
            "load_average": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
            "jobs": jobs, "events": events, "write_s": round(write_s, 1),
            "target_s": TARGET_S, "meets_target": report_s <= TARGET_S,
            "seconds": round(time.perf_counter() - began, 1)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--jobs-per-day", type=int, default=1000)
    p.add_argument("--keep", action="store_true", help="keep the scratch journal")
    p.add_argument("--journal", help="time the report over this journal (one an earlier "
                   "--keep run left) instead of writing a new one")
    args = p.parse_args()
    print(json.dumps(measure(args.days, args.jobs_per_day, args.keep, args.journal)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
