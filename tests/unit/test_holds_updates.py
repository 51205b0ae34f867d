"""Holds, releases, updates and QoS permissions in an in-process master, per caller: the RPC
methods through masterd.api.rpc.Rpc with the caller set as the HTTP layer sets it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from masterd.api.caller import CALLER
from masterd.api.rpc import Rpc
from masterd.core.permissions import qos_refusal, update_refusal
from masterd.service.master import Master
from shared.auth import Principal
from shared.model import JobKind, JobSpec, QosClass
from shared.protocol import ProtocolError
from tests.unit.master_fakes import Clock, make_master

ALICE = Principal(role="client", name="alice", via="token")
BOB = Principal(role="client", name="bob", via="token")
ADMIN = Principal(role="admin", name="ops", via="token")
NODE = {"n1": (0, 2)}


def job(user: str = "alice", **kw: Any) -> dict[str, Any]:
    return {"name": "j", "command": ["true"], "user": user, "kind": "cpu", "cpus": 1, **kw}


async def as_(who: Principal | None, call: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``call`` as the HTTP layer would for a request of ``who``."""
    async def served() -> Any:
        CALLER.set(who)
        return await call()
    return await asyncio.get_running_loop().create_task(served())


def scenario(tmp_path: Path, body: Callable[[Master, Rpc], Awaitable[None]],
             **config: Any) -> None:
    async def run() -> None:
        # Jobs run as existing Unix users: alice and bob stand for "nobody" there.
        master, _ = make_master(tmp_path, Clock(), NODE, **config)
        master.check_user = lambda user: None  # type: ignore[method-assign]
        try:
            await body(master, Rpc(master))
        finally:
            await master.close()

    asyncio.run(run())


async def refused(who: Principal | None, call: Callable[[], Awaitable[Any]]) -> ProtocolError:
    with pytest.raises(ProtocolError) as exc:
        await as_(who, call)
    return exc.value


def test_qos_permissions_at_submission(tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        submit = rpc.call
        error = await refused(ALICE, lambda: submit("submit", {"job": job(qos="urgent")}))
        assert error.code == "forbidden"
        assert "may not use qos urgent" in error.message
        assert not master.core.jobs
        # prior is everyone's by default; urgent is the admins' and the listed clients'.
        await as_(ALICE, lambda: submit("submit", {"job": job(qos="prior")}))
        await as_(ADMIN, lambda: submit("submit", {"job": job(qos="urgent")}))
        await as_(BOB, lambda: submit("submit", {"job": job("bob", qos="urgent")}))
        error = await refused(ALICE, lambda: submit("submit", {"job": job(priority=5)}))
        assert error.code == "forbidden" and "only an admin" in error.message
        # In a batch, the refused jobs are named by index.
        error = await refused(ALICE, lambda: submit("submit_many", {"jobs": [
            job(), job(qos="urgent")]}))
        assert error.code == "batch_refused"
        assert [r["index"] for r in error.detail["refused"]] == [1]  # type: ignore[index]
        assert error.detail["refused"][0]["code"] == "forbidden"  # type: ignore[index]

    scenario(tmp_path, body, qos_urgent_users=["bob"])


def test_hold_and_release_with_user_and_admin_holds(tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        master.core.set_drained("n1", True)  # jobs stay queued
        jid = (await as_(ALICE, lambda: rpc.call("submit", {"job": job()})))["job"]["id"]
        view = (await as_(ALICE, lambda: rpc.call("hold", {"id": jid})))["job"]
        assert (view["held"], view["wait"]) == ("user", "held")
        assert "release" in view["reason"]
        assert jid not in [j.id for j in master.core.queue()]
        error = await refused(BOB, lambda: rpc.call("hold", {"id": jid}))
        assert error.code == "forbidden" and "belongs to 'alice'" in error.message
        # An admin's hold replaces the user's; the user may not release it.
        view = (await as_(ADMIN, lambda: rpc.call("hold", {"id": jid})))["job"]
        assert view["held"] == "admin"
        error = await refused(ALICE, lambda: rpc.call("release", {"id": jid}))
        assert error.code == "forbidden" and "held by an admin" in error.message
        view = (await as_(ADMIN, lambda: rpc.call("release", {"id": jid})))["job"]
        assert (view["held"], view["wait"]) == ("", "no_fit")
        assert jid in [j.id for j in master.core.queue()]
        error = await refused(ALICE, lambda: rpc.call("release", {"id": jid}))
        assert error.code == "job_not_held"
        kinds = [(e.kind, e.detail.get("by")) for e in master.store.events(jid)
                 if e.kind in ("held", "released")]
        assert kinds == [("held", "user"), ("held", "admin"), ("released", "admin")]
        # A job that started cannot be held; unknown and ended ones are named as such.
        master.core.set_drained("n1", False)
        master.request_pass()
        await asyncio.sleep(0.05)
        error = await refused(ALICE, lambda: rpc.call("hold", {"id": jid}))
        assert error.code == "job_not_queued"
        error = await refused(None, lambda: rpc.call("hold", {"id": "nope"}))
        assert error.code == "unknown_job"

    scenario(tmp_path, body)


def test_a_user_may_only_lower_and_an_admin_may_change_anything(tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        master.core.set_drained("n1", True)
        first = (await as_(ALICE, lambda: rpc.call("submit", {"job": job(
            qos="prior", time_limit_s=3600)})))["job"]["id"]
        second = (await as_(ALICE, lambda: rpc.call("submit", {"job": job()})))["job"]["id"]
        assert [j.id for j in master.core.queue()] == [first, second]
        for change, words in (({"qos": "urgent"}, "raises the job's class"),
                              ({"priority": 1}, "raises it"),
                              ({"time_limit_s": 7200}, "lengthens it")):
            error = await refused(ALICE, lambda c=change: rpc.call(  # type: ignore[misc]
                "update", {"id": first, **c}))
            assert error.code == "forbidden" and words in error.message, error.message
        error = await refused(BOB, lambda: rpc.call("update", {"id": first, "priority": -1}))
        assert error.code == "forbidden"
        seen: list[tuple[str, QosClass]] = []
        master.events.job_updated.subscribe(lambda j, old: seen.append((j.id, old.qos)))
        view = (await as_(ALICE, lambda: rpc.call("update", {
            "id": first, "qos": "normal", "time_limit_s": 600, "priority": -5})))["job"]
        assert (view["qos"], view["priority"]) == ("normal", -5)
        assert master.core.jobs[first].spec.time_limit_s == 600
        assert [j.id for j in master.core.queue()] == [second, first]  # lower priority
        assert seen == [(first, QosClass.PRIOR)]
        # An admin raises anything, and the spec in the journal is the new one.
        await as_(ADMIN, lambda: rpc.call("update", {"id": first, "qos": "urgent",
                                                     "priority": 100}))
        assert [j.id for j in master.core.queue()] == [first, second]
        stored = master.store.load_job(first)
        assert stored is not None and stored.spec.priority == 100
        assert stored.spec.qos is QosClass.URGENT
        updates = [e.detail for e in master.store.events(first) if e.kind == "updated"]
        assert updates[0]["qos"] == ["prior", "normal"]
        assert updates[0]["time_limit_s"] == [3600, 600] and updates[0]["by"] == "user"
        assert updates[1]["priority"] == [-5, 100] and updates[1]["by"] == "admin"
        error = await refused(ALICE, lambda: rpc.call("update", {"id": first}))
        assert error.code == "invalid_params"

    scenario(tmp_path, body)


def test_the_rules_themselves() -> None:
    spec = JobSpec(name="j", command=("true",), user="a", kind=JobKind.CPU, cpus=1,
                   qos=QosClass.PRIOR, priority=0)
    assert update_refusal(spec, {"qos": QosClass.NORMAL}) is None
    assert update_refusal(spec, {"qos": QosClass.URGENT}) is not None
    assert update_refusal(spec, {"time_limit_s": 60}) is None  # from no limit to one
    assert update_refusal(replace(spec, time_limit_s=30), {"time_limit_s": 60}) is not None
    assert qos_refusal(QosClass.URGENT, "a", ["*"], []) is None
    assert qos_refusal(QosClass.PRIOR, "a", [], ["b"]) is not None
    assert qos_refusal(QosClass.NORMAL, "a", [], []) is None


def test_holds_and_updates_survive_a_restart(tmp_path: Path) -> None:
    async def before(master: Master, rpc: Rpc) -> None:
        master.core.set_drained("n1", True)
        await as_(ALICE, lambda: rpc.call("submit", {"job": job(), "id": "kept"}))
        await as_(ADMIN, lambda: rpc.call("hold", {"id": "kept"}))
        await as_(ALICE, lambda: rpc.call("update", {"id": "kept", "priority": -7}))

    async def after(master: Master, rpc: Rpc) -> None:
        kept = master.core.jobs["kept"]
        assert (kept.held, kept.wait) == ("admin", "held")
        assert kept.spec.priority == -7
        assert "kept" not in [j.id for j in master.core.queue()]
        error = await refused(ALICE, lambda: rpc.call("release", {"id": "kept"}))
        assert error.code == "forbidden"
        await as_(ADMIN, lambda: rpc.call("release", {"id": "kept"}))
        assert kept.held == "" and not kept.gates
        assert "kept" in [j.id for j in master.core.queue()] or kept.state.value == "starting"

    scenario(tmp_path, before)
    scenario(tmp_path, after)
