"""Priority classes in an in-process master, through the RPC: a job gets the default class,
an unknown class is refused in one sentence and a client may not pick one above the
default; a production job preempts a preemptible one: the node is told to warn it with its
own --signal and to write why (StopJob preempted), with its class's grace, the preemption is
journalled, the victim requeued with restarts + 1, and the production job launched on the
freed node; SIGHUP replaces the classes."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path
from typing import Any

from masterd.api.rpc import Rpc
from masterd.service.master import Master
from shared.messages import StopJob
from shared.priorityclasses import PriorityClass
from tests.unit.master_fakes import exited, started, through_rpc, until
from tests.unit.test_holds_updates import ADMIN, ALICE, as_, refused

CLASSES = [
    dataclasses.asdict(PriorityClass("production", 100, preempts=("preemptible",))),
    dataclasses.asdict(PriorityClass("normal", 0, default=True)),
    # The victim's class says how long its jobs have to checkpoint.
    dataclasses.asdict(PriorityClass("preemptible", -100, preempt_grace_s=45)),
]


def submitted(**kw: Any) -> dict[str, Any]:
    return {"name": "j", "command": ["true"], "user": "alice", "kind": "training",
            "gpus": 2, "cpus": 1, **kw}


async def launched_victim(rpc: Rpc, session: Any) -> dict[str, Any]:
    """A preemptible job asking SIGUSR1 as its warning, launched on n1 (its start not yet
    reported)."""
    low = (await as_(ALICE, lambda: rpc.call("submit", {"job": submitted(
        priority_class="preemptible", stop={"warning": {"signal": "SIGUSR1",
                                                        "seconds": 60}})})))["job"]
    await until("the preemptible job launched", lambda: session.commands("start_job"))
    return low  # type: ignore[no-any-return]


def scenario(tmp_path: Path, body: Any, **config: Any) -> None:
    async def with_sessions(master: Master, rpc: Rpc, sessions: dict[str, Any]) -> None:
        master.sessions_for_test = sessions  # type: ignore[attr-defined]
        await body(master, rpc)

    through_rpc(tmp_path, with_sessions, {"n1": (2, 4)}, **config)


def test_classes_at_submission(tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        plain = (await as_(ALICE, lambda: call("submit", {"job": submitted()})))["job"]
        assert plain["priority_class"] == "normal"
        error = await refused(ALICE, lambda: call("submit", {"job": submitted(
            priority_class="gold")}))
        assert (error.code, error.message) == (
            "invalid_priority_class",
            "job j: no priority class 'gold' (classes: production, normal, preemptible)")
        error = await refused(ALICE, lambda: call("submit", {"job": submitted(
            priority_class="production")}))
        assert error.code == "forbidden" and "only an admin" in error.message
        low = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            priority_class="preemptible")})))["job"]
        assert low["priority_class"] == "preemptible"
        listing = (await as_(ALICE, lambda: call("priority_classes", {})))["classes"]
        assert [(c["name"], c["queued"] + c["running"]) for c in listing] == [
            ("production", 0), ("normal", 1), ("preemptible", 1)]

    scenario(tmp_path, body, priority_classes=CLASSES)


def test_a_production_job_preempts_and_the_victim_is_warned_and_requeued(
        tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        session = master.sessions_for_test["n1"]  # type: ignore[attr-defined]
        low = await launched_victim(rpc, session)
        await started(master, "n1", low["id"])
        prod = (await as_(ADMIN, lambda: call("submit", {"job": submitted(
            priority_class="production")})))["job"]
        master._run_pass()
        stops = await until("the victim's stop", lambda: session.commands("stop_job"))
        stop: StopJob = stops[0]
        assert (stop.job_id, stop.grace_s, stop.warning, stop.preempted) == (
            low["id"], 45.0, "SIGUSR1", True)
        assert stop.reason == f"for job {prod['id']} of priority class production"
        await exited(master, "n1", low["id"], None, 9)
        victim = master.core.jobs[low["id"]]
        assert victim.state.value == "queued" and victim.restarts == 1
        await until("the production job launched", lambda: any(
            c.job_id == prod["id"] for c in session.commands("start_job")))
        events = (await as_(ADMIN, lambda: call("events", {"job": low["id"]})))["events"]
        kinds = [e["kind"] for e in events]
        assert "preempted" in kinds and "requeued" in kinds, kinds
        preempted = next(e for e in events if e["kind"] == "preempted")
        assert preempted["detail"]["grace_s"] == 45

    scenario(tmp_path, body, priority_classes=CLASSES)


def test_sighup_replaces_the_classes(tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        assert master.core.preemption is not None
        master.config = replace(master.config, priority_classes=())
        master.events.config_changed.emit()
        assert master.core.preemption is None and not master.core.classes.enabled
        error = await refused(ADMIN, lambda: rpc.call("submit", {"job": submitted(
            priority_class="normal")}))
        assert error.code == "invalid_priority_class" and "no priority classes" in error.message

    scenario(tmp_path, body, priority_classes=CLASSES)


def test_a_victim_whose_start_is_reported_late_is_still_warned(tmp_path: Path) -> None:
    """The start of a job preempted while its launch was in flight is reported after the
    preemption: the stop sent again then is the preemption's (warning, reason, grace), not
    a plain SIGTERM that would kill it unwarned (bench/controls.py found it)."""
    async def body(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        session = master.sessions_for_test["n1"]  # type: ignore[attr-defined]
        low = await launched_victim(rpc, session)
        await as_(ADMIN, lambda: call("submit", {"job": submitted(
            priority_class="production")}))
        master._run_pass()
        await until("the victim's stop", lambda: session.commands("stop_job"))
        await started(master, "n1", low["id"])  # its start, reported late
        stops = await until("the stop sent again", lambda: len(
            session.commands("stop_job")) >= 2 and session.commands("stop_job"))
        assert {(s.warning, s.preempted, s.grace_s) for s in stops} == {("SIGUSR1", True,
                                                                          45.0)}
        assert all(not s.reason.startswith("preempted:") for s in stops)

    scenario(tmp_path, body, priority_classes=CLASSES)


def test_a_master_that_takes_over_still_stops_a_victim_as_preempted(tmp_path: Path) -> None:
    """The preemption is read from the journalled job (its reason, its end as queued) and
    its class, not from the memory of the master that decided it."""
    names: dict[str, str] = {}

    async def first(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        session = master.sessions_for_test["n1"]  # type: ignore[attr-defined]
        low = await launched_victim(rpc, session)
        await started(master, "n1", low["id"])
        await as_(ADMIN, lambda: call("submit", {"job": submitted(
            priority_class="production")}))
        master._run_pass()
        await until("the victim's stop", lambda: session.commands("stop_job"))
        names["low"] = low["id"]

    scenario(tmp_path, first, priority_classes=CLASSES)

    async def second(master: Master, rpc: Rpc) -> None:
        session = master.sessions_for_test["n1"]  # type: ignore[attr-defined]
        victim = master.core.jobs[names["low"]]
        assert victim.stopping and victim.end_as == "queued"
        await master._stop_part(victim.id, "n1", victim.reason)  # as a reconnect sends it
        stop = session.commands("stop_job")[-1]
        assert (stop.warning, stop.preempted, stop.grace_s) == ("SIGUSR1", True, 45.0)
        assert stop.reason.startswith("for job ")

    scenario(tmp_path, second, priority_classes=CLASSES)
