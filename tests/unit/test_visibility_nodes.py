"""A client credential sees only its own user's jobs, also in the node listing: the free
resources still show what others hold, not which of their jobs hold it."""

from __future__ import annotations

from pathlib import Path

from masterd.api.rpc import Rpc
from masterd.service.master import Master
from tests.unit.master_fakes import until
from tests.unit.test_holds_updates import ADMIN, ALICE, as_, job, scenario


def test_nodes_name_only_the_callers_own_jobs(tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        mine = (await as_(ALICE, lambda: rpc.call("submit", {"job": job("alice")})))["job"]
        theirs = (await as_(ADMIN, lambda: rpc.call("submit", {"job": job("bob")})))["job"]
        await until("both placed", lambda: all(
            master.core.jobs[j["id"]].placement for j in (mine, theirs)))
        seen = (await as_(ALICE, lambda: rpc.call("nodes", {})))["nodes"][0]
        assert seen["jobs"] == [mine["id"]] and seen["cpus_free"] == 0
        everything = (await as_(ADMIN, lambda: rpc.call("nodes", {})))["nodes"][0]
        assert set(everything["jobs"]) == {mine["id"], theirs["id"]}

    scenario(tmp_path, body)


def test_a_client_follows_its_own_jobs_events_only(tmp_path: Path) -> None:
    from masterd.api.authn import CLIENT_METHODS
    from tests.unit.test_holds_updates import refused

    async def body(master: Master, rpc: Rpc) -> None:
        mine = (await as_(ALICE, lambda: rpc.call("submit", {"job": job("alice")})))["job"]
        theirs = (await as_(ADMIN, lambda: rpc.call("submit", {"job": job("bob")})))["job"]
        assert "events" in CLIENT_METHODS
        rows = (await as_(ALICE, lambda: rpc.call("events", {"job": mine["id"]})))["events"]
        assert rows and {r["job"] for r in rows} == {mine["id"]}
        error = await refused(ALICE, lambda: rpc.call("events", {"job": theirs["id"]}))
        assert error.code == "forbidden" and "its own jobs only" in error.message
        error = await refused(ALICE, lambda: rpc.call("events", {}))
        assert error.code == "forbidden" and "give job" in error.message
        # An admin reads them all.
        everything = (await as_(ADMIN, lambda: rpc.call("events", {})))["events"]
        assert {mine["id"], theirs["id"]} <= {r["job"] for r in everything}

    scenario(tmp_path, body)
