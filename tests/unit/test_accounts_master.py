"""The accounts feature in an in-process master, through the RPC as each caller: a job's
account resolved (default, named, refused), caps refused with the cap's name (a batch counts
as many jobs), changes validated whole and against what runs, journalled and read back by
the next master over the same journal, which the configuration then no longer seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from masterd.api.rpc import Rpc
from masterd.service.master import Master
from tests.unit.master_fakes import through_rpc
from tests.unit.test_holds_updates import ADMIN, ALICE, as_, refused

ACCOUNTS = [
    {"name": "org", "caps": {"gpus_per_job": 2}},
    {"name": "vision", "parent": "org", "users": ["alice", "bob"], "default_for": ["alice"],
     "caps": {"submitted_jobs": 2, "time_limit_s": 600}},
    {"name": "nlp", "parent": "org", "users": ["bob"], "default_for": ["bob"]},
]


def job(user: str = "alice", **kw: Any) -> dict[str, Any]:
    return {"name": "j", "command": ["true"], "user": user, "kind": "cpu", "cpus": 1, **kw}


def run(tmp_path: Path, body: Any, accounts: list[dict[str, Any]]) -> None:
    through_rpc(tmp_path, lambda master, rpc, _: body(master, rpc), {"n1": (4, 8)},
                accounts=accounts)


def test_submission_resolves_the_account_and_checks_caps(tmp_path: Path) -> None:
    async def body(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        first = await as_(ALICE, lambda: call("submit", {"job": job()}))
        assert first["job"]["tenant"] == "vision"  # alice's default
        assert first["job"]["time_limit_s"] == 600  # the account's MaxWall as its limit
        error = await refused(ALICE, lambda: call("submit", {"job": job(tenant="nlp")}))
        assert error.code == "forbidden" and "'alice' is not in account 'nlp'" in error.message
        error = await refused(ALICE, lambda: call("submit", {"job": job(gpus=3, kind="training")}))
        assert error.code == "over_cap" and "account 'org' allows 2 per job" in error.message
        error = await refused(ALICE, lambda: call("submit", {"job": job(time_limit_s=601)}))
        assert "allows 600 s (time_limit_s)" in error.message
        # submitted_jobs 2: one queued already, a batch of two is refused as a whole.
        error = await refused(ALICE, lambda: call("submit_many", {"jobs": [job(), job()]}))
        assert error.code == "batch_refused" and "submitted_jobs cap (2)" in error.message
        assert len(master.core.jobs) == 1
        bob = await as_(ADMIN, lambda: call("submit", {"job": job(user="bob")}))
        assert bob["job"]["tenant"] == "nlp"

    run(tmp_path, body, ACCOUNTS)


def test_changes_are_validated_whole_journalled_and_survive_a_new_master(
        tmp_path: Path) -> None:
    async def first(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        error = await refused(ALICE, lambda: call("account_set", {"name": "nlp",
                                                                  "running_jobs": 1}))
        assert error.code == "forbidden"
        error = await refused(ADMIN, lambda: call("account_set", {"name": "org",
                                                                  "parent": "vision"}))
        assert error.code == "invalid_account" and "cycle" in error.message
        await as_(ADMIN, lambda: call("account_set", {"name": "nlp", "running_jobs": 1,
                                                      "quota_gpus": 2}))
        await as_(ADMIN, lambda: call("account_add_user", {"name": "nlp", "user": "carol"}))
        # A cap below what runs: refused unless forced.
        await as_(ADMIN, lambda: call("submit", {"job": job(user="bob")}))
        master._run_pass()  # start it now
        assert master.features.accounts.admission.ledger.running("nlp") == 1
        error = await refused(ADMIN, lambda: call("account_set", {"name": "nlp",
                                                                  "running_jobs": 0}))
        assert "more than the running_jobs cap 0" in error.message
        error = await refused(ADMIN, lambda: call("account_remove", {"name": "nlp"}))
        assert "queued or running" in error.message
        shown = (await as_(ALICE, lambda: call("account_list", {})))["accounts"]
        assert [a["name"] for a in shown] == ["vision"]  # a client: its own accounts

    run(tmp_path, first, ACCOUNTS)

    async def second(master: Master, rpc: Rpc) -> None:
        nlp = (await as_(ADMIN, lambda: rpc.call("account_show", {"name": "nlp"})))["account"]
        assert nlp["caps"]["running_jobs"] == 1 and nlp["quota"]["gpus"] == 2
        assert "carol" in nlp["users"]
        assert nlp["usage"]["running_jobs"] == 1  # the restored job, charged again
        # The configuration no longer seeds the tree: the journal's holds.
        assert "extra" not in master.features.accounts.tree

    # The next master over the same journal, with a configuration that differs.
    run(tmp_path, second, [*ACCOUNTS, {"name": "extra"}])


def test_a_job_larger_than_its_accounts_quota_and_borrowing_is_refused_not_queued(
        tmp_path: Path) -> None:
    """Honest waiting: no end of other jobs would ever let it in."""
    accounts = [{"name": "lab", "users": ["alice"], "default_for": ["alice"],
                 "quota": {"gpus": 2}, "borrowing_limit": {"gpus": 1}}]

    async def body(master: Master, rpc: Rpc) -> None:
        call = rpc.call
        error = await refused(ALICE, lambda: call("submit", {"job": job(
            gpus=4, kind="training")}))
        assert error.code == "unsatisfiable" and error.message == (
            "job j asks for 4 GPUs, more than account 'lab' may ever use (its quota + "
            "borrowing limit is 3)")
        ok = await as_(ALICE, lambda: call("submit", {"job": job(gpus=3, kind="training")}))
        assert ok["job"]["state"] in ("queued", "starting")
        assert len(master.core.jobs) == 1

    run(tmp_path, body, accounts)
