"""The hold rule (``policy = "sched2-hold"``) in a live master with real nodes: a job packing
would spread waits with GPUs free, a job that gets its best locality passes it, and the held
job starts packed once a server frees."""

from __future__ import annotations

from demo.cluster import LocalCluster, default_job_user

USER = default_job_user()


def submit(cluster: LocalCluster, name: str, gpus: int, seconds: float) -> str:
    job = {"name": name, "command": ["sleep", str(seconds)], "user": USER, "gpus": gpus,
           "cpus": 1}
    return cluster.client().call("submit", {"job": job})["job"]["id"]


def state(cluster: LocalCluster, job: str) -> dict:  # type: ignore[type-arg]
    return cluster.client().call("job", {"id": job})["job"]


def test_a_spread_job_is_held_until_it_packs(make_cluster) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, gpus_per_node=8, policy="sched2-hold",
                                         extra_master={"policy_options": {"window": 10}})
    big = [submit(cluster, f"six-{i}", 6, 600) for i in range(2)]
    for job in big:
        cluster.wait_for(f"{job} to run", lambda job=job: state(cluster, job)["state"]
                         == "running")
    assert [len(state(cluster, j)["nodes"]) for j in big] == [1, 1]  # one server each
    four = submit(cluster, "four", 4, 0.2)  # 2 + 2 GPUs free: only a spread placement
    one = submit(cluster, "one", 1, 0.2)  # arrives later, gets its best locality now
    cluster.wait_for("the one-GPU job to finish", lambda: state(cluster, one)["state"]
                     == "finished")
    assert state(cluster, four)["state"] == "queued"  # held, GPUs free, no spreading
    cluster.client().call("cancel", {"id": big[0]})
    cluster.wait_for("the held job to finish", lambda: state(cluster, four)["state"]
                     == "finished")
    assert len(state(cluster, four)["nodes"]) == 1  # packed on the freed server
    cluster.client().call("cancel", {"id": big[1]})
