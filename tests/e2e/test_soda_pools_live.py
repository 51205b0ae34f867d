"""End-to-end SODA pools: trellisctl pools, borrowing and preemption visible in show, re-sizing."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from demo.cluster import TRAINER, LocalCluster, default_job_user
from tests.e2e.cli import ctl

USER = default_job_user()
SMALL = "small:A100-SXM4-40GB"
LARGE = "large:A100-SXM4-40GB"


def submit(cluster: LocalCluster, name: str, gpus: int, seconds: float, *extra: str) -> str:
    iterations = max(1, int(seconds / 0.05))
    code, out, err = ctl(cluster, "submit", "--user", USER, "--name", name, "--gpus", str(gpus),
                         *extra, "--", "python3", TRAINER, "--iterations", str(iterations),
                         "--load-ms", "1", "--gpu-ms", "50")
    assert code == 0, err
    return out["job"]["id"]


def job(cluster: LocalCluster, job_id: str) -> dict[str, Any]:
    code, out, err = ctl(cluster, "show", job_id)
    assert code == 0, err
    return out


def arrays(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    code, out, err = ctl(cluster, "pools")
    assert code == 0, err
    return {a["name"]: a for a in out["arrays"]}


OPTIONS = {
    "borrowing": True,
    # Every core of a GPU node serves GPU jobs (this machine's nodes have few cores).
    "models": {"*": {"large": 0.5, "cpu_job_cores": 0}},
    "tenants": {"capped": {"quota": {"small": {"gpus": 2}}}},
}


def test_pools_borrowing_and_preemption_are_visible(make_cluster) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4, policy="soda-arrays",
                           extra_master={"policy_options": OPTIONS,
                                         "array_resize_interval_s": 0})
    pools = arrays(cluster)
    assert pools[SMALL]["size"] == 4 and pools[LARGE]["size"] == 4, pools
    code, table, _ = ctl(cluster, "pools", json_out=False)
    assert code == 0 and SMALL in table and "BORROWED" in table

    a = submit(cluster, "a", 2, 60, "--cpus", "1")
    b = submit(cluster, "b", 2, 60, "--cpus", "1")
    cluster.wait_for("a and b running", lambda: all(
        job(cluster, j)["job"]["state"] == "running" for j in (a, b)))
    c = submit(cluster, "c", 2, 60, "--cpus", "1")

    def borrowing() -> dict | None:
        shown = job(cluster, c)
        return shown if shown["job"]["state"] == "running" else None

    shown = cluster.wait_for("c borrowing", borrowing)
    assert shown["job"]["reason"].startswith("borrowing 2 gpus of " + LARGE), shown["job"]
    pools = arrays(cluster)
    assert pools[LARGE]["borrowed_out"] == 2 and pools[SMALL]["borrowed_in"] == 2, pools
    assert pools[SMALL]["used"] == 4

    # Over its tenant's quota a job waits, and says why.
    capped = submit(cluster, "capped", 3, 5, "--cpus", "1", "--tenant", "capped")
    assert "over quota of tenant capped" in cluster.wait_for(
        "the quota note", lambda: job(cluster, capped)["job"]["reason"])

    # The large array's owner needs its GPUs back: the borrower is preempted and re-queued.
    big = submit(cluster, "big", 4, 60, "--cpus", "1")

    def preempted() -> dict | None:
        shown = job(cluster, c)
        kinds = [e["kind"] for e in shown["events"]]
        return shown if "preempted" in kinds and shown["job"]["state"] == "queued" else None

    shown = cluster.wait_for("c preempted", preempted)
    event = next(e for e in shown["events"] if e["kind"] == "preempted")
    assert f"{LARGE} needs its resources back for job {big}" in event["detail"]["reason"]
    cluster.wait_for("big running", lambda: job(cluster, big)["job"]["state"] == "running")
    # Waiting again, with the reason of this pass (not a stale one).
    assert job(cluster, c)["job"]["reason"].startswith("waiting"), job(cluster, c)["job"]
    code, text, _ = ctl(cluster, "show", c, json_out=False)
    assert "preempted" in text and "Reason:     waiting" in text, text

    for j in (a, b, c, big, capped):
        ctl(cluster, "cancel", j)


def test_periodic_resize_follows_demand_and_is_journalled(make_cluster) -> None:
    cluster = make_cluster(nodes=2, gpus_per_node=4, policy="soda-arrays",
                           extra_master={"policy_options": OPTIONS,
                                         "array_resize_interval_s": 1.0,
                                         "array_history_days": 1.0})
    assert arrays(cluster)[LARGE]["size"] == 4
    # Only small jobs in the window: the large array's share of the GPUs goes to its minimum.
    ids = [submit(cluster, f"s{i}", 1, 0.5, "--cpus", "1") for i in range(3)]
    cluster.wait_for("small jobs finished", lambda: all(
        job(cluster, j)["job"]["state"] == "finished" for j in ids))

    def resized() -> dict | None:
        pools = arrays(cluster)
        return pools if pools[LARGE]["size"] == 0 else None

    pools = cluster.wait_for("the periodic re-size", resized, 30)
    assert pools[SMALL]["size"] == 8
    code, out, err = ctl(cluster, "pools")
    assert code == 0, err
    assert out["last_change"]["after"][LARGE] == 0 and out["history_days"] == 1.0
    assert out["last_resize"]["time"] >= out["last_change"]["time"]
    db = sqlite3.connect(cluster.root / "master" / "master.db")
    try:
        rows = db.execute(
            "SELECT detail FROM events WHERE kind='arrays_resized' ORDER BY seq").fetchall()
    finally:
        db.close()
    assert rows, "no arrays_resized event in the journal"
    detail = json.loads(rows[-1][0])
    assert detail["before"][LARGE] == 4 and detail["after"][LARGE] == 0, detail
    assert detail["jobs"] >= 1
