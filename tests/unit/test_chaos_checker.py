"""The chaos soak's checker (bench/chaoskit/checker.py) on made-up histories and evidence:
each invariant is silent on a clean run and names the job and the evidence when broken."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from bench.chaoskit.checker import check
from bench.chaoskit.evidence import read_evidence
from bench.chaoskit.history import History, Op

T0 = 1_000_000.0


def submit(history: History, job: str, at: float, *, outcome: str = "ok", gpus: int = 1,
           account: str = "alpha", after: list[tuple[str, str]] | None = None,
           code: int = 0) -> None:
    history.record(Op("nobody", "submit", at, at + 0.01, outcome, {"jobs": [{
        "id": job, "account": account, "gpus": gpus, "after": after or [],
        "expect_code": code}]}))


def final(history: History, job: str, state: str | None, exit_code: int | None = None,
          at: float = T0 + 10) -> None:
    if state is None:
        history.record(Op("checker", "final_job", at, at, "fail", {"id": job},
                          error="unknown_job"))
    else:
        history.record(Op("checker", "final_job", at, at, "ok", {"id": job},
                          {"state": state, "exit_code": exit_code}))


def observed(history: History, job: str, state: str, at: float,
             exit_code: int | None = None) -> None:
    history.record(Op("watcher", "observed", at, at, "ok", {},
                      {"id": job, "state": state, "exit_code": exit_code}))


def part(root: Path, job: str, *, start: float, until: float, restarts: int = 0,
         rank: int = 0, pid: int = 100, code: int | None = None, stopped: bool = False,
         overlap: bool = False, node: str = "n1") -> None:
    path = root / f"{job}.r{restarts}.n{rank}.{pid}"
    lines = [{"ev": "start", "t": start, "node": node, "overlap": overlap}]
    if stopped:
        lines.append({"ev": "term", "t": until - 0.1})
    if code is not None:
        lines.append({"ev": "end", "t": until, "code": code})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    os.utime(path, (until, until))  # the last heartbeat


@pytest.fixture
def world(tmp_path: Path) -> tuple[History, Path]:
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    return History(), evidence


def verdict(world: tuple[History, Path], **kw: object) -> dict[str, int]:
    history, evidence = world
    return check(history, read_evidence(evidence), **kw).by_invariant()  # type: ignore[arg-type]


def test_a_clean_history_has_no_violation(world: tuple[History, Path]) -> None:
    history, evidence = world
    submit(history, "a", T0)
    part(evidence, "a", start=T0 + 1, until=T0 + 5, code=0)
    observed(history, "a", "finished", T0 + 6, 0)
    final(history, "a", "finished", 0)
    submit(history, "b", T0 + 1, after=[("afterok", "a")])
    part(evidence, "b", start=T0 + 6, until=T0 + 7, code=3)
    final(history, "b", "failed", 3)
    assert not any(verdict(world, caps={"alpha": 2}).values())


def test_an_acknowledged_job_unknown_at_the_end_is_lost(world: tuple[History, Path]) -> None:
    history, _ = world
    submit(history, "gone", T0)
    submit(history, "maybe", T0, outcome="info")  # never acknowledged: not counted
    final(history, "gone", None)
    final(history, "maybe", None)
    assert verdict(world)["acked_lost"] == 1


def test_two_incarnations_alive_at_once_overlap(world: tuple[History, Path]) -> None:
    history, evidence = world
    submit(history, "j", T0)
    part(evidence, "j", start=T0 + 1, until=T0 + 30, restarts=0, pid=1)  # killed, last beat
    part(evidence, "j", start=T0 + 20, until=T0 + 40, restarts=1, pid=2, code=0)
    final(history, "j", "finished", 0)
    counts = verdict(world)
    assert counts["overlap"] == 1


def test_the_lock_a_live_part_held_is_an_overlap(world: tuple[History, Path]) -> None:
    history, evidence = world
    submit(history, "j", T0)
    part(evidence, "j", start=T0 + 1, until=T0 + 2, overlap=True, code=0)
    final(history, "j", "finished", 0)
    assert verdict(world)["overlap"] == 1


def test_a_part_started_after_the_cancel_was_acknowledged(world: tuple[History, Path]) -> None:
    history, evidence = world
    submit(history, "c", T0)
    history.record(Op("nobody", "cancel", T0 + 2, T0 + 2.1, "ok", {"id": "c"}))
    history.record(Op("nobody", "cancel", T0 + 9, T0 + 9.1, "fail", {"id": "c"},
                      error="job_finished"))  # refused: not an acknowledgement
    part(evidence, "c", start=T0 + 2.5, until=T0 + 3, stopped=True, code=143)
    final(history, "c", "cancelled")
    assert verdict(world)["start_after_cancel"] == 1


def test_an_end_never_reported_or_with_another_code(world: tuple[History, Path]) -> None:
    history, evidence = world
    for job in ("silent", "wrong", "late"):
        submit(history, job, T0)
    part(evidence, "silent", start=T0 + 1, until=T0 + 2, code=0)
    final(history, "silent", "running")
    part(evidence, "wrong", start=T0 + 1, until=T0 + 2, code=7)
    final(history, "wrong", "finished", 0)
    part(evidence, "late", start=T0 + 1, until=T0 + 2, code=0)
    observed(history, "late", "finished", T0 + 200, 0)
    final(history, "late", "finished", 0)
    assert verdict(world)["end_unreported"] == 3


def test_a_dependant_started_before_its_dependency_allowed(world: tuple[History, Path]) -> None:
    history, evidence = world
    submit(history, "a", T0, code=2)
    submit(history, "b", T0, after=[("afterok", "a")])
    submit(history, "c", T0, after=[("afterany", "a")])
    part(evidence, "a", start=T0 + 1, until=T0 + 5, code=2)  # failed: b must never start
    part(evidence, "b", start=T0 + 6, until=T0 + 7, code=0)
    part(evidence, "c", start=T0 + 3, until=T0 + 7, code=0)  # while a surely ran
    for job, state, code in (("a", "failed", 2), ("b", "finished", 0), ("c", "finished", 0)):
        final(history, job, state, code)
    assert verdict(world)["dependency"] == 2


def test_an_account_over_its_limit_and_leftovers(world: tuple[History, Path]) -> None:
    history, evidence = world
    for job in ("x", "y"):
        submit(history, job, T0, gpus=2)
        part(evidence, job, start=T0 + 1, until=T0 + 9, code=0, pid=hash(job) % 1000)
        final(history, job, "finished", 0)
    history.record(Op("checker", "final_node", T0, T0, "ok", {}, {
        "node": "n1", "processes": ["x"], "cgroups": [], "holding": ["y"],
        "cluster_idle": True}))
    counts = verdict(world, caps={"alpha": 3})
    assert counts["quota"] == 1
    assert counts["leftover"] == 2


async def test_the_nemesis_mends_every_fault_it_made_and_counts_them() -> None:
    """A nemesis on a stand-in cluster: faults with a duration are mended (also those still
    in force when the run ends), and every injected fault is in the history."""
    import random

    from bench.chaoskit.nemesis import Nemesis, Target

    broken: set[str] = set()
    calls: list[str] = []

    async def nothing(*_: object) -> None:
        return None

    async def hostile(_: float) -> int:
        return 3

    target = Target(
        leader=lambda: 0, masters=3, nodes=["n1", "n2"],
        kill_master=lambda i: calls.append(f"kill m{i}"),
        freeze_master=lambda i: broken.add(f"frozen m{i}"),
        thaw_master=lambda i: broken.discard(f"frozen m{i}"),
        cut=broken.add, restore=broken.discard,
        kill_noded=lambda n, jobs: calls.append(f"kill {n} {jobs}"),
        pg_restart=nothing, xid=lambda n, g, x: calls.append(f"xid {n} {g} {x}"),
        gpu_reset=nothing, fill_disk=lambda n: broken.add(f"disk {n}"),
        free_disk=lambda n: broken.discard(f"disk {n}"), hostile=hostile)
    history = History()
    nemesis = Nemesis(target, history, random.Random(5), mean_gap_s=0.01)
    original_sleep = asyncio.sleep

    async def quick(seconds: float, *a: object) -> None:  # faults last a blink here
        await original_sleep(min(seconds, 0.01))

    import bench.chaoskit.nemesis as module

    module.asyncio.sleep = quick  # type: ignore[assignment]
    try:
        await nemesis.run(time.time() + 0.5)
    finally:
        module.asyncio.sleep = original_sleep  # type: ignore[assignment]
    assert broken == set() and nemesis.in_force == set()
    faults = [op for op in history.ops("fault") if op.outcome == "ok"]
    assert len(faults) == sum(nemesis.injected.values()) > 5
