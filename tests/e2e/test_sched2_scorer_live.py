"""The per-job scorer (``policy = "sched2-scorer"``, the shipped model) in a live master with
real nodes: a queue longer than SCHED²'s window of ten runs to the end. (Where a job lands is
not asserted: these jobs name no model, so every placement predicts the same time and the
scorer may spread one.)"""

from __future__ import annotations

from demo.cluster import LocalCluster, default_job_user

USER = default_job_user()


def test_the_shipped_scorer_runs_a_queue_longer_than_the_window(make_cluster) -> None:
    cluster: LocalCluster = make_cluster(nodes=2, gpus_per_node=8, policy="sched2-scorer")
    client = cluster.client()
    jobs = [client.call("submit", {"job": {"name": f"s{i}", "command": ["sleep", "0.3"],
                                           "user": USER, "gpus": 1 + (i % 3 == 0) * 3,
                                           "cpus": 1}})["job"]["id"]
            for i in range(14)]

    def done() -> bool:
        states = [client.call("job", {"id": j})["job"]["state"] for j in jobs]
        return all(s == "finished" for s in states)

    cluster.wait_for("all fourteen jobs to finish", done)
