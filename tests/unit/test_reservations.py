"""Reservations (shared/reservations.py, masterd/features/reservations.py): one sentence per
mistake; before a reservation no job outside it whose time limit crosses its start starts on
its nodes, and while it lasts none at all (under every policy: the eligibility test); a job
in it waits for it, then runs on its nodes only, and is stopped at its end; only its users
and accounts may name it; a restarted master keeps it; counted GPUs pick whole nodes."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from control.cli import build_parser
from control.reservations import run_reservation, show_reservations
from control.submit import jobs_from_args
from control.usage import UsageError
from masterd.api.authn import CLIENT_METHODS
from masterd.api.rpc import Rpc
from masterd.core.eligibility import eligible
from masterd.core.policies import REGISTRY
from masterd.service.master import Master
from shared.model import JobSpec, JobState, NodeSelector, ReservationHold
from shared.reservations import (
    Candidate,
    NodeReservation,
    ReservationError,
    check,
    holds,
    pick_nodes,
)
from tests.unit.helpers import inventory, job
from tests.unit.master_fakes import Clock, exited, started, through_rpc, until
from tests.unit.test_holds_updates import ADMIN, ALICE, as_, refused
from tests.unit.test_maintenance import journalled, long_and_short

T = 1_000_000.0
BOB = replace(ALICE, name="bob")


def resv(name: str = "r", nodes: str = "n1", start: float = T + 3600,
         end: float = T + 7200, **kw: Any) -> NodeReservation:
    return NodeReservation(name, nodes, start, end, **{"users": ("alice",), **kw})


def test_a_reservation_is_checked_in_one_sentence_per_mistake() -> None:
    known = ["n1", "n2", "n3"]
    made = [resv("a", "n[1-2]", T + 100, T + 200)]
    for bad, why in (
        (resv("b", "n3", T + 50, T + 40), "reservation 'b' ends before it starts"),
        (resv("b", "n3", T - 50, T - 10), "reservation 'b' is in the past"),
        (resv("b", "n[3-4]", T + 300, T + 400), "names node(s) the master has never seen: n4"),
        (resv("b", "n2,n3", T + 150, T + 250), "overlaps reservation 'a' on n2"),
        (resv("b", "n3", users=()), "names no user and no account: nobody could use it"),
        (resv("b", "n3", flags=("often",)), "unknown flag(s) often"),
        (resv("b", "n[2-", T + 300, T + 400), "reservation 'b': nodes 'n[2-'"),
    ):
        with pytest.raises(ReservationError, match=re.escape(why)):
            check(bad, made, known, T)
    check(resv("b", "n2,n3", T + 200, T + 300), made, known, T)  # back to back
    check(resv("m", "n3", users=(), flags=("maint",)), made, known, T)  # nobody's: maint
    # An update is checked against the others, not against itself.
    check(replace(made[0], end=T + 500), made, known, T)


def test_holds_are_stamped_per_node_earliest_first() -> None:
    later, sooner = resv("later", "n1", T + 7200, T + 9000), resv("sooner", "n[1-2]")
    stamped = holds([later, sooner], T)
    assert stamped["n1"] == (ReservationHold("sooner", 3540.0), ReservationHold("later", 7140.0))
    assert stamped["n2"] == (ReservationHold("sooner", 3540.0),)
    assert holds([sooner], T + 3600)["n1"] == (ReservationHold("sooner", 0.0),)
    assert holds([sooner], T + 7200) == {}


def test_a_count_of_gpus_takes_the_fewest_whole_nodes_of_one_model() -> None:
    nodes = [Candidate("a1", "A100", 8, 0), Candidate("a2", "A100", 8, 1),
             Candidate("a3", "A100", 4, 0), Candidate("h1", "H200", 8, 0)]
    assert pick_nodes(8, "A100", nodes) == ["a1"]
    # The fewest nodes; among as few, those no running job would run into it on.
    assert pick_nodes(12, "A100", nodes) == ["a1", "a3"]
    assert pick_nodes(16, None, nodes) == ["a1", "a2"]
    with pytest.raises(ReservationError, match="no 32 GPUs of model A100"):
        pick_nodes(32, "A100", nodes)


def _in(name: str, flex: bool = False, limit: float | None = None) -> JobSpec:
    return replace(job("x", gpus=1, time_limit_s=limit).spec,
                   selector=NodeSelector(reservation=name, flex=flex))


def test_eligibility_inside_and_outside_a_reservation() -> None:
    before = replace(inventory("n1", gpus=4), reservations=(ReservationHold("r", 600.0),))
    during = replace(before, reservations=(ReservationHold("r", 0.0),))
    free = inventory("n2", gpus=4)
    outside = job("x", gpus=1, time_limit_s=300).spec
    assert eligible(outside, before) and not eligible(replace(outside, time_limit_s=900),
                                                        before)
    assert not eligible(job("x", gpus=1).spec, before)  # no limit: it could run into it
    assert not eligible(outside, during) and eligible(outside, during, now=False)
    mine = _in("r")
    assert not eligible(mine, before) and eligible(mine, during)  # once it has begun
    assert not eligible(mine, free) and not eligible(mine, free, now=False)  # its nodes only
    flexible = _in("r", flex=True)
    assert eligible(flexible, before) and eligible(flexible, free)
    assert not eligible(_in("other", limit=60.0), during)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_keeps_other_jobs_off_a_reserved_node(name: str) -> None:
    _, started = long_and_short(name, replace(
        inventory("a", gpus=4, cpus=16), reservations=(ReservationHold("course", 3540.0),)))
    assert started.get("long") == ("b",), started


def scenario(tmp_path: Path, clock: Clock, body: Any, **config: Any) -> None:
    through_rpc(tmp_path, lambda master, rpc, sessions: body(master, rpc, sessions),
                {"n1": (2, 4), "n2": (2, 4)}, clock, **config)


def submitted(**kw: Any) -> dict[str, Any]:
    return {"name": "j", "command": ["true"], "user": "alice", "kind": "training",
            "gpus": 2, "cpus": 1, **kw}


def test_a_reservation_through_the_master_and_after_a_restart(tmp_path: Path) -> None:
    clock = Clock(T)

    async def first(master: Master, rpc: Rpc, sessions: Any) -> None:
        call = rpc.call
        for params, why in (
            ({"nodes": "n1", "start": T + 3600}, "end or its duration_s"),
            ({"start": T + 3600, "duration_s": 60}, "nodes or a count of gpus"),
            ({"nodes": "n9", "start": T + 3600, "duration_s": 60, "users": ["alice"]},
             "never seen: n9"),
            ({"nodes": "n1", "start": T - 7200, "duration_s": 60, "users": ["alice"]},
             "in the past"),
        ):
            error = await refused(ADMIN, lambda p=params: call("reservation_create",
                                                              {"name": "course", **p}))
            assert error.code == "invalid_reservation" and why in error.message, error
        # Users list reservations; only admins change them.
        assert "reservation_list" in CLIENT_METHODS
        assert not {"reservation_create", "reservation_update",
                    "reservation_delete"} & CLIENT_METHODS
        made = (await as_(ADMIN, lambda: call("reservation_create", {
            "name": "course", "nodes": "n1", "start": T + 3600, "duration_s": 3600,
            "users": ["alice"], "reason": "deep learning course"})))["reservation"]
        assert (made["state"], made["end"], made["gpus"]) == ("planned", T + 7200, 2)
        # Bob may not use it; nobody may name one that does not exist.
        for who, name, why in ((BOB, "course", "is for user alice, not user 'bob'"),
                               (ALICE, "nope", "no reservation 'nope'")):
            error = await refused(who, lambda w=who, n=name: call("submit", {"job": submitted(
                user=w.name, selector={"reservation": n})}))
            assert error.code == "invalid_reservation" and why in error.message, error
        mine = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            selector={"reservation": "course"})})))["job"]
        long = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            time_limit_s=7200)})))["job"]
        short = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            time_limit_s=1800)})))["job"]
        master._run_pass()
        assert master.core.cluster.allocation(long["id"]).nodes == ("n2",)
        assert master.core.cluster.allocation(short["id"]).nodes == ("n1",)
        shown = (await as_(ALICE, lambda: call("job", {"id": mine["id"]})))["job"]
        assert shown["wait"] == "reservation" and "begins at" in shown["reason"], shown
        assert shown["reservation"] == "course"
        # It begins: the short job has left n1, the reservation's job starts there.
        await started(master, "n1", short["id"])
        await exited(master, "n1", short["id"])
        clock.now = T + 3600
        master._run_pass()
        assert master.node_status("n1") == "reserved"
        assert master.core.cluster.allocation(mine["id"]).nodes == ("n1",)
        listed = (await as_(ALICE, lambda: call("reservation_list", {})))["reservations"]
        assert [(r["name"], r["state"], r["jobs"]) for r in listed] == [
            ("course", "active", [mine["id"]])]
        assert "deep learning course" in show_reservations(listed)
        await started(master, "n1", mine["id"])

    scenario(tmp_path, clock, first)

    async def second(master: Master, rpc: Rpc, sessions: Any) -> None:
        # A new master over the same journal: the reservation holds; at its end its job is
        # stopped into timeout, as at a time limit.
        master._run_pass()
        assert master.node_status("n1") == "reserved"
        mine = next(j for j in master.core.jobs.values() if j.spec.selector.reservation)
        clock.now = T + 7200
        master._run_pass()
        await until("the stop", lambda: sessions["n1"].commands("stop_job"))
        await exited(master, "n1", mine.id, None, 15)
        await until("timeout", lambda: mine.state is JobState.TIMEOUT)
        assert "reservation course ended" in (mine.reason or "")
        assert master.node_status("n1") == "ready"
        kinds = await journalled(rpc, "reservation_ended")
        assert "reservation_created" in kinds, kinds
        # Its job's stop is journalled before the reservation is forgotten: a master dying
        # in between ends the reservation (and stops the job) again when restored.
        assert kinds.index("stop_requested") < kinds.index("reservation_ended"), kinds
        assert (await as_(ADMIN, lambda: rpc.call("reservation_list", {})))[
            "reservations"] == []

    scenario(tmp_path, clock, second)


def test_jobs_running_into_it_refuse_it_unless_ignored_and_updates_and_deletes(
        tmp_path: Path) -> None:
    clock = Clock(T)

    async def body(master: Master, rpc: Rpc, sessions: Any) -> None:
        call = rpc.call
        endless = (await as_(ALICE, lambda: call("submit", {"job": submitted()})))["job"]
        master._run_pass()
        node = master.core.cluster.allocation(endless["id"]).nodes[0]
        asked = {"name": "demo", "nodes": node, "start": T + 600, "duration_s": 600,
                 "accounts": ["default"]}
        error = await refused(ADMIN, lambda: call("reservation_create", asked))
        assert endless["id"] in error.message and "ignore_jobs" in error.message, error
        made = (await as_(ADMIN, lambda: call("reservation_create", {
            **asked, "flags": ["ignore_jobs"]})))["reservation"]
        assert made["running_across"] == [endless["id"]]
        # An update is checked whole; a refused one changes nothing.
        error = await refused(ADMIN, lambda: call("reservation_update", {
            "name": "demo", "end": T + 100}))
        assert "ends before it starts" in error.message
        moved = (await as_(ADMIN, lambda: call("reservation_update", {
            "name": "demo", "start": T + 1200, "duration_s": 1200})))["reservation"]
        assert (moved["start"], moved["end"]) == (T + 1200, T + 2400)
        # The account's jobs may use it (accounts off: the tenant as named).
        queued = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            selector={"reservation": "demo"})})))["job"]
        await as_(ADMIN, lambda: call("reservation_delete", {"name": "demo"}))
        shown = (await as_(ALICE, lambda: call("job", {"id": queued["id"]})))["job"]
        assert shown["wait"] == "reservation" and "over or was deleted" in shown["reason"]
        kinds = await journalled(rpc, "reservation_deleted")
        assert "reservation_updated" in kinds

    scenario(tmp_path, clock, body)


def test_a_count_of_gpus_and_a_flex_job(tmp_path: Path) -> None:
    clock = Clock(T)

    async def body(master: Master, rpc: Rpc, sessions: Any) -> None:
        call = rpc.call
        made = (await as_(ADMIN, lambda: call("reservation_create", {
            "name": "demo", "gpus": 2, "start": T + 3600, "duration_s": 600,
            "users": ["alice"], "flags": ["flex"]})))["reservation"]
        assert made["nodes"] in ("n1", "n2") and made["gpus"] == 2
        error = await refused(ADMIN, lambda: call("reservation_create", {
            "name": "big", "gpus": 8, "start": T + 3600, "duration_s": 600,
            "users": ["alice"]}))
        assert "no 8 GPUs" in error.message
        # A flex job need not wait for it to begin.
        flex = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            selector={"reservation": "demo"})})))["job"]
        master._run_pass()
        assert master.core.cluster.allocation(flex["id"]) is not None
        assert master.core.jobs[flex["id"]].spec.selector.flex

    scenario(tmp_path, clock, body)


def test_reservation_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    def jobs(*argv: str) -> list[dict[str, Any]]:
        args = build_parser().parse_args(["submit", "--user", "nobody", *argv])
        return jobs_from_args(args)[0]

    assert jobs("--reservation", "course", "--", "true")[0]["selector"] == {
        "reservation": "course"}
    with pytest.raises(UsageError, match="--reservation 'a b': not a reservation name"):
        jobs("--reservation", "a b", "--", "true")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --reservation=demo\ntrue\n")
    assert jobs(str(script))[0]["selector"] == {"reservation": "demo"}
    monkeypatch.setenv("SBATCH_RESERVATION", "course")
    assert jobs(str(script))[0]["selector"] == {"reservation": "course"}


class _Client:
    """Records what trellisctl asks the master and answers as it would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.calls.append((method, params or {}))
        view = {"name": "course", "nodes": "n[1-2]", "gpus": 16, "start": T, "end": T + 60,
                "users": [], "accounts": ["course"], "flags": [], "reason": "",
                "state": "planned", "jobs": [], "running_across": []}
        if method == "reservation_list":
            return {"reservations": [view]}
        if method == "reservation_delete":
            return {"reservation": params["name"] if params else ""}
        return {"reservation": view}


def test_trellisctl_reservation_reads_times_and_names() -> None:
    def run(*argv: str) -> tuple[_Client, str]:
        client = _Client()
        args = build_parser().parse_args(["reservation", *argv])
        _, text = run_reservation(client, args, now=T)  # type: ignore[arg-type]
        return client, text

    client, text = run("create", "course", "--nodes", "n[1-2]", "--start", "now+1:00:00",
                       "--duration", "2:00:00", "--accounts", "course,lab",
                       "--flags", "ignore_jobs")
    assert client.calls == [("reservation_create", {
        "name": "course", "start": T + 3600, "duration_s": 7200.0,
        "accounts": ["course", "lab"], "flags": ["ignore_jobs"], "nodes": "n[1-2]"})]
    assert text.startswith("reservation course created: n[1-2] (16 GPUs)")
    client, _ = run("create", "demo", "--gpus", "8", "--gpu-model", "H200", "--start", "now",
                    "--end", "now+30:00", "--users", "alice")
    assert client.calls[0][1] == {"name": "demo", "start": T, "end": T + 1800,
                                  "users": ["alice"], "gpus": 8, "gpu_model": "H200"}
    client, _ = run("update", "course", "--reason", "moved", "--end", "now+3:00:00")
    assert client.calls == [("reservation_update", {"name": "course", "end": T + 10800,
                                                    "reason": "moved"})]
    client, text = run("list")
    assert "account:course" in text
    with pytest.raises(UsageError, match="--start 'soon'"):
        run("create", "x", "--nodes", "n1", "--start", "soon", "--duration", "1:00:00")


def test_a_job_in_a_reservation_is_not_confined_to_the_default_partition(
        tmp_path: Path) -> None:
    """With partitions, a job naming a reservation and no partition runs where the
    reservation is: the default partition is not written into it (the reservation here is
    on the debug partition's node)."""
    from tests.unit.test_partitions import CONFIG

    clock = Clock(T)

    async def body(master: Master, rpc: Rpc, sessions: Any) -> None:
        call = rpc.call
        await as_(ADMIN, lambda: call("reservation_create", {
            "name": "demo", "nodes": "n3", "start": T, "duration_s": 3600,
            "users": ["alice"]}))
        job_view = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            gpus=8, selector={"reservation": "demo"})})))["job"]
        assert job_view["partition"] == "" and job_view["reservation"] == "demo"
        master._run_pass()
        assert master.core.cluster.allocation(job_view["id"]).nodes == ("n3",)
        # Naming a partition still confines it: gpu's nodes hold no part of demo.
        error = await refused(ALICE, lambda: call("submit", {"job": submitted(
            gpus=1, selector={"reservation": "demo", "partitions": ["gpu"]})}))
        assert error.code == "unsatisfiable", error

    through_rpc(tmp_path, lambda master, rpc, sessions: body(master, rpc, sessions),
                {"n1": (4, 8), "n2": (4, 8), "n3": (8, 8)}, clock, partitions=CONFIG)
