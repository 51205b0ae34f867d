"""The checker: Trellis's promises judged from the history and the jobs' own evidence only.

Nothing here asks the master what happened. The history holds what clients were told (an
acknowledged submission, an acknowledged cancel, the states a watcher saw, the final views
fetched after the cluster healed) and what the soak found on the nodes' kernels at the end;
the evidence holds what each job part wrote about itself. The invariants:

1. ``acked_lost``: every acknowledged submission reaches an end or is still known at the end.
2. ``overlap``: no two incarnations of a job run at once (nor two copies of one part).
3. ``start_after_cancel``: nothing of a job starts after its cancel was acknowledged.
4. ``end_unreported``: a job whose last incarnation ended on its own is reported ended within
   ``report_bound_s``, with the exit code its evidence holds.
5. ``dependency``: no job starts before its dependency's evidence allows it.
6. ``quota``: an account's surely running GPUs never exceed its quota + borrowing limit.
7. ``leftover``: after the heal, no node holds a process or cgroup of a job the master does
   not know as running, and no GPU is held once every job ended.

A violation names the invariant, the job and the evidence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bench.chaoskit.evidence import Evidence, Part
from bench.chaoskit.history import History

INVARIANTS = ("acked_lost", "overlap", "start_after_cancel", "end_unreported", "dependency",
              "quota", "leftover")
TERMINAL = frozenset({"finished", "failed", "cancelled", "timeout", "node_lost"})
# Start times and acknowledgements are read from the same clock (one machine); this covers
# the resolution of reading it in two processes.
CLOCK_EPSILON_S = 0.05


@dataclass(frozen=True)
class Violation:
    invariant: str
    job: str
    evidence: str


@dataclass
class Verdict:
    violations: list[Violation] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def by_invariant(self) -> dict[str, int]:
        counts = dict.fromkeys(INVARIANTS, 0)
        for v in self.violations:
            counts[v.invariant] = counts.get(v.invariant, 0) + 1
        return counts


@dataclass(frozen=True)
class Submitted:
    id: str
    user: str
    account: str
    gpus: int
    after: tuple[tuple[str, str], ...]
    expect_code: int | None
    acked_at: float


def submissions(history: History) -> dict[str, Submitted]:
    """Every acknowledged job, by id (a submission whose answer was lost is not counted)."""
    found: dict[str, Submitted] = {}
    for op in history.ops():
        if op.kind not in ("submit", "pty") or op.outcome != "ok":
            continue
        for job in op.args.get("jobs", []):
            found[job["id"]] = Submitted(
                id=job["id"], user=op.process, account=job.get("account", ""),
                gpus=int(job.get("gpus", 0)),
                after=tuple((t, j) for t, j in job.get("after", ())),
                expect_code=job.get("expect_code"), acked_at=op.completed)
    return found


def final_views(history: History) -> dict[str, dict[str, Any]]:
    return {op.args["id"]: {**op.result, "_outcome": op.outcome, "_error": op.error,
                            "_at": op.completed}
            for op in history.ops("final_job")}


def first_terminal_seen(history: History) -> dict[str, tuple[float, dict[str, Any]]]:
    """When a watcher first saw each job in an end state, and what it saw."""
    seen: dict[str, tuple[float, dict[str, Any]]] = {}
    for op in history.ops("observed"):
        job = op.result
        if job.get("state") in TERMINAL and job["id"] not in seen:
            seen[job["id"]] = (op.completed, job)
    return seen


def check(history: History, evidence: Evidence, caps: dict[str, int] | None = None,
          report_bound_s: float = 60.0) -> Verdict:
    verdict = Verdict()
    acked = submissions(history)
    finals = final_views(history)
    add = verdict.violations.append
    _acked_lost(acked, finals, add)
    _overlap(evidence, add, verdict.stats)
    _start_after_cancel(history, evidence, add)
    _end_unreported(acked, finals, first_terminal_seen(history), evidence, report_bound_s,
                    add, verdict.stats)
    _dependencies(acked, evidence, add)
    if caps:
        _quota(acked, evidence, caps, add)
    _leftovers(history, finals, add)
    verdict.stats.update(acked=len(acked), evidence_jobs=len(evidence.parts),
                         parts=sum(len(p) for p in evidence.parts.values()))
    return verdict


def _acked_lost(acked: dict[str, Submitted], finals: dict[str, dict[str, Any]], add) -> None:
    for job_id in acked:
        final = finals.get(job_id)
        if final is None:
            add(Violation("acked_lost", job_id, "acknowledged, and no final view was taken"))
        elif final["_outcome"] != "ok":
            # The checker's own reconciliation failing is not a pass.
            add(Violation("acked_lost", job_id, f"acknowledged at {acked[job_id].acked_at:.3f};"
                          f" at the end the master answered {final['_error']}"))


def _overlap(evidence: Evidence, add, stats: dict[str, int]) -> None:
    reruns = 0
    for job_id, parts in evidence.parts.items():
        for part in parts:
            if part.overlap:
                add(Violation("overlap", job_id, f"part pid {part.pid} (restart {part.restarts},"
                              f" rank {part.rank}) on {part.node} found the job's lock held by "
                              f"a live part when it started at {part.start:.3f}"))
        for i, a in enumerate(parts):
            for b in parts[i + 1:]:  # b started after a
                same = (a.restarts, a.rank) == (b.restarts, b.rank)
                if b.start < a.alive_until and (a.restarts != b.restarts or same):
                    add(Violation("overlap", job_id, f"{_part(b)} started at {b.start:.3f} while"
                                  f" {_part(a)} was alive (until at least "
                                  f"{a.alive_until:.3f})"))
                elif same:
                    reruns += 1  # the same incarnation ran twice, one after the other
    stats["same_incarnation_reruns"] = reruns


def _start_after_cancel(history: History, evidence: Evidence, add) -> None:
    for op in history.ops("cancel"):
        if op.outcome != "ok":
            continue
        job_id = op.args["id"]
        for part in evidence.of(job_id):
            if part.start > op.completed + CLOCK_EPSILON_S:
                add(Violation("start_after_cancel", job_id, f"cancel acknowledged at "
                              f"{op.completed:.3f}; {_part(part)} started at "
                              f"{part.start:.3f}"))


def _end_unreported(acked: dict[str, Submitted], finals: dict[str, dict[str, Any]],
                    seen: dict[str, tuple[float, dict[str, Any]]], evidence: Evidence,
                    bound: float, add, stats: dict[str, int]) -> None:
    ended_then_rerun = 0
    for job_id, parts in evidence.parts.items():
        if job_id not in acked:
            continue
        last = max(p.restarts for p in parts)
        earlier = [p for p in parts if p.restarts < last and p.ended_on_its_own]
        ended_then_rerun += bool(earlier)
        final_parts = [p for p in parts if p.restarts == last]
        if not all(p.ended_on_its_own for p in final_parts):
            continue
        ended_at = max(p.end for p in final_parts if p.end is not None)
        codes = [p.code for p in sorted(final_parts, key=lambda p: p.rank)]
        final = finals.get(job_id, {})
        when, view = seen.get(job_id, (None, None))
        if view is None and final.get("state") in TERMINAL:
            when, view = final["_at"], final
        if view is None:
            add(Violation("end_unreported", job_id, f"every part of restart {last} ended on "
                          f"its own by {ended_at:.3f} (codes {codes}); the master never "
                          f"reported it ended (last said {final.get('state', 'nothing')})"))
            continue
        if when > ended_at + bound:
            add(Violation("end_unreported", job_id, f"ended at {ended_at:.3f}, first seen ended"
                          f" {when - ended_at:.1f} s later"))
        state = view.get("state")
        failed = [c for c in codes if c != 0]
        if state in ("finished", "failed"):
            want_state = "failed" if failed else "finished"
            want_code = failed[0] if failed else 0
            if state != want_state or (failed and view.get("exit_code") not in failed) \
                    or (not failed and view.get("exit_code") != 0):
                add(Violation("end_unreported", job_id, f"its parts exited with {codes}; the "
                              f"master reported {state} exit_code={view.get('exit_code')} "
                              f"(expected {want_state} {want_code})"))
    stats["ended_then_rerun"] = ended_then_rerun


def _dependencies(acked: dict[str, Submitted], evidence: Evidence, add) -> None:
    for job_id, sub in acked.items():
        parts = evidence.of(job_id)
        if not sub.after or not parts:
            continue
        started = parts[0].start
        for kind, dep in sub.after:
            dep_parts = evidence.of(dep)
            if kind == "afterok":
                ok = [p for p in dep_parts if p.ended_on_its_own and p.code == 0
                      and p.end is not None and p.end <= started + CLOCK_EPSILON_S]
                if not ok:
                    add(Violation("dependency", job_id, f"afterok:{dep}, started at "
                                  f"{started:.3f}, but no part of {dep} had ended with code 0 "
                                  f"by then ({_summary(dep_parts)})"))
            alive = [p for p in dep_parts if p.start <= started
                     and p.alive_until > started + CLOCK_EPSILON_S]
            if alive:
                add(Violation("dependency", job_id, f"{kind}:{dep}, started at {started:.3f} "
                              f"while {_part(alive[0])} was alive"))


def _quota(acked: dict[str, Submitted], evidence: Evidence, caps: dict[str, int],
           add) -> None:
    spans: dict[str, list[tuple[float, float, int, str]]] = {}
    for job_id, parts in evidence.parts.items():
        sub = acked.get(job_id)
        if sub is None or sub.account not in caps or not sub.gpus:
            continue
        by_incarnation: dict[int, list[Part]] = {}
        for part in parts:
            by_incarnation.setdefault(part.restarts, []).append(part)
        for incarnation in by_incarnation.values():
            # Surely running from its last part's start to its first part's last sign of life.
            start = max(p.start for p in incarnation)
            until = min(p.alive_until for p in incarnation)
            if until > start:
                spans.setdefault(sub.account, []).append((start, until, sub.gpus, job_id))
    for account, items in spans.items():
        cap = caps[account]
        for t, _, _, job_id in items:
            running = [(g, j) for s, u, g, j in items if s <= t < u]
            total = sum(g for g, _ in running)
            if total > cap:
                add(Violation("quota", job_id, f"account {account} surely ran {total} GPUs at "
                              f"{t:.3f} (cap {cap}): {sorted(j for _, j in running)}"))
                break  # one per account is enough to say it


def _leftovers(history: History, finals: dict[str, dict[str, Any]], add) -> None:
    for op in history.ops("final_node"):
        node = op.result.get("node", "?")
        if op.outcome != "ok":
            add(Violation("leftover", node, f"the node could not be inspected: {op.error}"))
            continue
        for what in ("processes", "cgroups", "containers"):
            for job_id in op.result.get(what, []):
                state = finals.get(job_id, {}).get("state")
                if state in (None, *TERMINAL):
                    add(Violation("leftover", job_id, f"{what[:-1]} of the job on {node} after "
                                  f"the heal; the master says {state or 'nothing of it'}"))
        if op.result.get("holding") and op.result.get("cluster_idle"):
            add(Violation("leftover", node, f"resources held by {op.result['holding']} while "
                          "every job has ended"))


def _part(part: Part) -> str:
    return f"part pid {part.pid} (restart {part.restarts}, rank {part.rank}) on {part.node}"


def _summary(parts: Iterable[Part]) -> str:
    parts = list(parts)
    if not parts:
        return "it never started"
    return "; ".join(f"{_part(p)}: " + (f"ended {p.code} at {p.end:.3f}" if p.end is not None
                                        else "no end line") + (" after a stop" if p.stopped
                                                                 else "")
                     for p in parts)
