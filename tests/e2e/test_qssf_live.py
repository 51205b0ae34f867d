"""QSSF in a live master: jobs that finish teach the estimator, a later job gets a rolling
estimate from its user's similar job names, and trellisctl shows it (show, estimator)."""

from __future__ import annotations

from demo.cluster import LocalCluster, default_job_user
from tests.e2e.cli import ctl

USER = default_job_user()


def submit(cluster: LocalCluster, name: str, seconds: float) -> str:
    job = {"name": name, "command": ["sleep", str(seconds)], "user": USER, "gpus": 1,
           "cpus": 1}
    return cluster.client().call("submit", {"job": job})["job"]["id"]


def test_estimates_from_finished_jobs_and_trellisctl(make_cluster) -> None:
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=2, policy="qssf")
    first = [submit(cluster, "eval-resnet", 0.2), submit(cluster, "train-resnet", 1.5)]
    for job in first:
        cluster.wait_for(f"{job} to finish", lambda job=job: cluster.client().call(
            "job", {"id": job})["job"]["state"] == "finished")
    later = submit(cluster, "eval-resnet", 0.1)
    code, out, err = ctl(cluster, "show", later, json_out=False)
    assert code == 0, err
    assert "Estimate:" in out and "user-similar-name (eval-resnet)" in out
    estimate = cluster.client().call("job", {"id": later})["estimate"]
    assert estimate["rolling_source"] == "user-similar-name"
    assert 0 < estimate["value_s"] < 1.0  # the eval ran ~0.2 s, not the training's 1.5 s
    assert estimate["ml_s"] is None  # too few jobs for a model: the rolling part alone
    cluster.wait_for("the later job to finish", lambda: cluster.client().call(
        "job", {"id": later})["job"]["state"] == "finished")
    code, out, err = ctl(cluster, "estimator", json_out=False)
    assert code == 0, err
    assert "3 finished jobs" in out and "Accuracy:" in out
    accuracy = cluster.client().call("estimator")["accuracy"]
    assert accuracy["rolling_mae_s"] is not None and accuracy["rolling_mae_s"] < 1.0
    code, out, err = ctl(cluster, "power", json_out=False)
    assert code == 1 and "[master.power]" in err  # off by default: a clear refusal
