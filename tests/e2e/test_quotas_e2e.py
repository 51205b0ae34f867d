"""Accounts and quotas end to end, real master and node daemons, real job processes: accounts
changed at run time by an admin (trellisctl account), a job over its account's running_jobs
cap waiting with reason quota until the cap frees, the tree surviving a master restart,
what a client credential sees, bad input refused with a sentence; and reclaim: a job of an
account within its quota preempting the newest borrower of another account."""

from __future__ import annotations

from typing import Any

from demo.cluster import LocalCluster, default_job_user
from tests.e2e.cli import ctl

USER = default_job_user()
OTHER = "daemon"  # a second Unix user that exists on any Debian system
SLEEP = ["--", "sleep", "300"]


def as_role(cluster: LocalCluster, role: str, *args: str) -> tuple[int, Any, str]:
    return ctl(cluster, "--token-file", str(cluster.token_file(role)), *args)


def admin(cluster: LocalCluster, *args: str) -> Any:
    code, out, err = as_role(cluster, "admin", *args)
    assert code == 0, err
    return out


def refused(cluster: LocalCluster, role: str, *args: str) -> str:
    code, _, err = as_role(cluster, role, *args)
    assert code != 0
    return err


def job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    return cluster.client().call("job", {"id": job_id})["job"]


def state_is(cluster: LocalCluster, job_id: str, state: str, timeout: float = 30) -> dict:
    return cluster.wait_for(f"{job_id} {state}", lambda: (
        (found := job(cluster, job_id))["state"] == state and found), timeout)


def test_accounts_at_run_time_caps_restart_and_visibility(make_cluster) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=4, auth=True,
                                         extra_master={"clients_may_submit": True})
    assert admin(cluster, "account", "list")["accounts"] == []  # accounts off until added
    admin(cluster, "account", "add", "org")
    admin(cluster, "account", "add", "vision", "--parent", "org", "--users",
          f"{USER},{OTHER}", "--default-for", USER, "--max-running", "1")
    admin(cluster, "account", "add", "nlp", "--parent", "org", "--users", OTHER,
          "--default-for", OTHER)
    admin(cluster, "account", "set", "vision", "--max-gpus-per-job", "2")

    # Bad input: one sentence each, nothing applied.
    assert "unknown parent 'nope'" in refused(cluster, "admin", "account", "add", "x",
                                              "--parent", "nope")
    assert "cycle" in refused(cluster, "admin", "account", "set", "org", "--parent", "vision")
    assert "admin-only" in refused(cluster, "client", "account", "add", "mine")
    assert f"user {USER!r} is not in account 'nlp'" in refused(
        cluster, "client", "submit", "--user", USER, "-A", "nlp", *SLEEP)
    assert "allows 2 per job (gpus_per_job)" in refused(
        cluster, "client", "submit", "--user", USER, "--gpus", "3", *SLEEP)
    listed = {a["name"]: a for a in admin(cluster, "account", "list")["accounts"]}
    assert set(listed) == {"org", "vision", "nlp"} and listed["org"]["parent"] is None

    # Over the running_jobs cap: the second waits with reason quota.
    first = as_role(cluster, "client", "submit", "--user", USER, "--gpus", "1", *SLEEP)[1]
    second = as_role(cluster, "client", "submit", "--user", USER, "--gpus", "1", *SLEEP)[1]
    first_id, second_id = first["job"]["id"], second["job"]["id"]
    assert first["job"]["tenant"] == "vision"  # the user's default account
    state_is(cluster, first_id, "running")
    waiting = job(cluster, second_id)
    assert waiting["state"] == "queued" and waiting["wait"] == "quota"
    assert "running_jobs cap (1)" in waiting["reason"]

    # The tree changed at run time survives a restart; the job still waits.
    cluster.restart_master()
    cluster.wait_nodes(1)
    vision = admin(cluster, "account", "show", "vision")["account"]
    assert vision["caps"]["running_jobs"] == 1 and vision["caps"]["gpus_per_job"] == 2
    assert vision["usage"]["running_jobs"] == 1 and vision["usage"]["queued_jobs"] == 1
    waiting = cluster.wait_for("the quota gate after the restart", lambda: (
        (found := job(cluster, second_id))["wait"] == "quota" and found), 15)
    assert waiting["state"] == "queued"

    # The cap frees: the waiting job starts.
    admin(cluster, "cancel", first_id)
    state_is(cluster, second_id, "running")

    # Visibility: the client (USER, in vision) sees vision's jobs, not nlp's.
    theirs = admin(cluster, "submit", "--user", OTHER, "-A", "nlp", *SLEEP)["job"]
    shared = admin(cluster, "submit", "--user", OTHER, "-A", "vision", *SLEEP)["job"]
    assert theirs["tenant"] == "nlp" and shared["tenant"] == "vision"
    code, seen, err = as_role(cluster, "client", "jobs")
    assert code == 0, err
    ids = {j["id"] for j in seen["jobs"]}
    assert {second_id, shared["id"]} <= ids and theirs["id"] not in ids
    assert "forbidden" in refused(cluster, "client", "show", theirs["id"])
    assert as_role(cluster, "client", "show", shared["id"])[0] == 0
    # ... and may not cancel another user's job of its account.
    assert "forbidden" in refused(cluster, "client", "cancel", shared["id"])
    code, mine, err = as_role(cluster, "client", "account", "list")
    assert code == 0 and {a["name"] for a in mine["accounts"]} == {"vision"}, err
    assert "forbidden" in refused(cluster, "client", "account", "show", "nlp")
    # Fair share follows the tree changed at run time; a client sees its accounts' rows.
    everything = {r["account"] for r in admin(cluster, "share")["accounts"]}
    assert {"org", "vision", "nlp"} <= everything, everything
    code, share, err = as_role(cluster, "client", "share")
    assert code == 0, err
    assert {r["account"] for r in share["accounts"]} == {"vision"}, share
    code, report, err = as_role(cluster, "client", "report", "--by", "account")
    assert code == 0, err
    # Only its own jobs: the ended first one, in vision (nlp's jobs are another user's).
    assert report["rows"] and {r["account"] for r in report["rows"]} == {"vision"}, report
    # An account with jobs is not removed.
    assert "queued or running" in refused(cluster, "admin", "account", "remove", "nlp")
    for job_id in (second_id, theirs["id"], shared["id"]):
        admin(cluster, "cancel", job_id)


def test_reclaim_preempts_the_newest_borrower(make_cluster) -> None:
    accounts = [
        {"name": "a", "users": [USER], "default_for": [USER], "quota": {"gpus": 2}},
        {"name": "b", "users": [USER], "quota": {"gpus": 2}},
    ]
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=4,
                                         extra_master={"accounts": accounts})
    client = cluster.client()

    def submit(account: str) -> str:
        code, out, err = ctl(cluster, "submit", "--user", USER, "--gpus", "1", "--cpus", "0",
                             "-A", account, "--grace", "1", *SLEEP)
        assert code == 0, err
        return out["job"]["id"]

    # Account a takes all four GPUs: two within its quota, two borrowed from b.
    a_jobs = []
    for _ in range(4):
        a_jobs.append(submit("a"))
        state_is(cluster, a_jobs[-1], "running")
    shown = client.account("a")  # the SDK
    assert shown["usage"]["gpus"] == 4 and shown["usage"]["borrowing"] is True
    # b wants what it is owed: the newest borrower is preempted and requeued.
    b_job = submit("b")
    state_is(cluster, b_job, "running")
    newest = job(cluster, a_jobs[-1])
    assert newest["state"] == "queued"
    # Requeued; b runs, so borrowing may resume, but the cluster is full.
    assert newest["wait"] == "no_fit", newest
    events = client.call("job", {"id": a_jobs[-1]})["events"]
    preempted = [e for e in events if e["kind"] == "preempted"]
    assert preempted and "reclaimed: account 'b'" in preempted[0]["detail"]["reason"]
    assert all(job(cluster, j)["state"] == "running" for j in a_jobs[:-1])
    for job_id in [*a_jobs, b_job]:
        client.call("cancel", {"id": job_id})
