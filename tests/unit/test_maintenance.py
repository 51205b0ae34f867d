"""Maintenance windows (shared/maintenance.py, masterd/features/maintenance.py): a window is
checked in one sentence per mistake; before it, only jobs whose time limit ends before it
may start on its nodes (under every policy: the eligibility test); inside it nothing starts
there and the node reads maintenance; afterwards it is gone from the journal; a restarted
master keeps it; trellisctl reads times as people write them."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from control.maintenance import parse_when, show_windows
from control.usage import UsageError
from masterd.api.rpc import Rpc
from masterd.core.eligibility import eligible
from masterd.core.policies import REGISTRY, make_policy
from masterd.core.policy import Start
from masterd.core.scheduler import SchedulingCore
from masterd.service.master import Master
from shared.maintenance import REFRESH_S, MaintenanceError, Window, check, horizons
from shared.model import NodeInventory
from tests.unit.helpers import inventory, job
from tests.unit.master_fakes import Clock, through_rpc
from tests.unit.test_holds_updates import ADMIN, ALICE, as_, refused

T = 1_000_000.0


def test_a_window_is_checked_in_one_sentence_per_mistake() -> None:
    known = ["n1", "n2", "n3"]
    planned = [Window("a", "n[1-2]", T + 100, T + 200)]
    for window, why in (
        (Window("b", "n1", T + 50, T + 40), "maintenance window 'b' ends before it starts"),
        (Window("b", "n1", T - 50, T - 10), "maintenance window 'b' is in the past"),
        (Window("b", "n[3-4]", T + 300, T + 400), "names node(s) the master has never "
                                                   "seen: n4"),
        (Window("b", "n2,n3", T + 150, T + 250), "overlaps window 'a' on n2"),
        (Window("a", "n3", T + 300, T + 400), "maintenance window 'a' exists already"),
        (Window("b", "n[2-", T + 300, T + 400), "maintenance window 'b': nodes 'n[2-'"),
    ):
        with pytest.raises(MaintenanceError, match=re.escape(why)):
            check(window, planned, known, T)
    check(Window("b", "n2,n3", T + 200, T + 300), planned, known, T)  # back to back


def test_horizons_are_conservative_between_refreshes() -> None:
    window = Window("a", "n1", T + 3600, T + 7200)
    (stamp, found), = horizons([window], T).values()
    assert found is window and stamp == 3540.0  # minutes, REFRESH_S short of the start
    # Whenever the next refresh comes, the true horizon is still at least the stamp.
    assert window.start - (T + REFRESH_S) >= stamp
    assert horizons([window], T + 3590)["n1"][0] == 0.0  # about to begin: nothing fits
    assert horizons([window], T + 7200) == {}


def long_and_short(name: str, blocked: NodeInventory) -> tuple[SchedulingCore, dict[str, Any]]:
    """Under policy ``name``: ``blocked`` (4 GPUs: every placer's best fit, with a block an
    hour ahead) beside b (8 GPUs); a 2-h and a 30-min job. Where each started."""
    core = SchedulingCore(make_policy(name))
    core.node_up(blocked)
    core.node_up(inventory("b", gpus=8, cpus=16))
    common: dict[str, Any] = {"iterations": 1000, "batch": 64, "model_type": "resnet50"}
    core.submit(job("long", gpus=2, t=0, time_limit_s=7200, **common))
    core.submit(job("short", gpus=4, t=1, time_limit_s=1800, **common))
    started: dict[str, tuple[str, ...]] = {}
    for now in (10.0, 20.0, 30.0):
        started.update({d.job_id: d.placement.nodes for d in core.schedule(now)
                        if isinstance(d, Start)})
    return core, started


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_keeps_long_jobs_off_a_node_before_its_window(name: str) -> None:
    core, started = long_and_short(name, replace(inventory("a", gpus=4, cpus=16),
                                                 maintenance_in_s=3540.0))
    assert started.get("long") == ("b",), started
    assert not eligible(job("x", time_limit_s=None).spec, core.cluster.node("a").inventory)
    assert eligible(job("x", time_limit_s=3540).spec, core.cluster.node("a").inventory)


def scenario(tmp_path: Path, clock: Clock, body: Any) -> None:
    through_rpc(tmp_path, lambda master, rpc, _: body(master, rpc),
                {"n1": (2, 4), "n2": (2, 4)}, clock)


def submitted(**kw: Any) -> dict[str, Any]:
    return {"name": "j", "command": ["true"], "user": "alice", "kind": "training",
            "gpus": 2, "cpus": 1, **kw}


def test_a_window_through_the_master_and_after_a_restart(tmp_path: Path) -> None:
    clock = Clock(T)

    async def first(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        error = await refused(ADMIN, lambda: call("maintenance_plan", {
            "name": "up", "nodes": "n1", "start": T + 3600}))
        assert error.code == "invalid_maintenance" and "end or its duration_s" in error.message
        planned = (await as_(ADMIN, lambda: call("maintenance_plan", {
            "name": "up", "nodes": "n1", "start": T + 3600, "duration_s": 7200,
            "reason": "kernel upgrade"})))["window"]
        assert (planned["state"], planned["end"]) == ("planned", T + 3600 + 7200)
        long = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            time_limit_s=7200)})))["job"]
        short = (await as_(ALICE, lambda: call("submit", {"job": submitted(
            time_limit_s=1800)})))["job"]
        master._run_pass()
        assert master.core.cluster.allocation(long["id"]).nodes == ("n2",)
        assert master.core.cluster.allocation(short["id"]).nodes == ("n1",)
        # The window begins: n1 takes no new work and says why.
        clock.now = T + 3600
        master.features.maintenance.refresh()
        assert master.node_status("n1") == "maintenance"
        assert [c.reason for c in master.core.node_conditions("n1")] == [
            "maintenance window up: kernel upgrade"]
        listed = (await as_(ALICE, lambda: call("maintenance_list", {})))["windows"]
        assert [(w["name"], w["state"]) for w in listed] == [("up", "active")]
        assert "kernel upgrade" in show_windows(listed)

    scenario(tmp_path, clock, first)

    async def second(master: Master, rpc: Rpc) -> None:
        # A new master over the same journal: the window holds (at the first pass: these
        # nodes joined without a hello).
        master._run_pass()
        assert master.node_status("n1") == "maintenance"
        clock.now = T + 3600 + 7200
        master.features.maintenance.refresh()
        assert master.node_status("n1") == "ready"
        assert (await as_(ADMIN, lambda: rpc.call("maintenance_list", {})))["windows"] == []
        kinds = await journalled(rpc, "maintenance_ended")
        assert "maintenance_planned" in kinds, kinds

    scenario(tmp_path, clock, second)


async def journalled(rpc: Rpc, kind: str, timeout: float = 10.0) -> list[str]:
    """The journal's event kinds, once one of ``kind`` is among them (written by a task the
    feature spawned)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        kinds = [e["kind"] for e in (await as_(ADMIN, lambda: rpc.call("events", {})))[
            "events"]]
        if kind in kinds:
            return kinds
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no {kind} event in {kinds}")
        await asyncio.sleep(0.01)


def test_times_as_people_write_them() -> None:
    assert parse_when("now+1:00:00", "--start", T) == T + 3600
    assert parse_when("now", "--start", T) == T
    assert parse_when("2026-12-06 02:00", "--start", T) > 0
    for text in ("tomorrow", "now+soon"):
        with pytest.raises(UsageError, match="--start"):
            parse_when(text, "--start", T)


def test_a_window_is_no_reason_to_refuse_a_job_and_its_wait_says_so() -> None:
    from masterd.core.waiting import WaitExplainer

    core = SchedulingCore(make_policy("fifo"))
    core.node_up(replace(inventory("a", gpus=4, cpus=16), maintenance_in_s=600.0))
    endless = job("endless", gpus=2, t=0)
    core.check_submittable(endless.spec)  # the window passes: it is not "never"
    core.submit(endless)
    assert core.schedule(1) == []
    assert WaitExplainer(core).why(core.jobs["endless"]) == (
        "no_fit", "without a time limit it would run into a maintenance window on every "
                  "node up now; it waits until it has passed (a shorter --time may fit "
                  "before it)")
