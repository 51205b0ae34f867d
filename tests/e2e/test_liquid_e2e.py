"""End-to-end Liquid on real daemons: a job's node reports what it used and when it entered its
post phase, the master journals both, lends the job's GPU, and the next job is pre-scheduled
onto it while the first still saves; ``trellisctl show`` prints the usage."""

from __future__ import annotations

from pathlib import Path

from demo.cluster import default_job_user
from tests.e2e.cli import ctl

USER = default_job_user()
JOB = str(Path(__file__).resolve().parents[2] / "demo" / "liquid_job.py")


def submit(cluster, *args: str) -> str:  # type: ignore[no-untyped-def]
    code, out, err = ctl(cluster, "submit", "--user", USER, "--gpus", "1", "--",
                         "python3", JOB, *args)
    assert code == 0, err
    return out["job"]["id"]


def test_usage_and_pre_scheduling_on_a_live_cluster(make_cluster) -> None:
    cluster = make_cluster(
        nodes=1, gpus_per_node=1, policy="liquid",
        node_settings={"usage_interval_s": 0.2, "phase_samples": 2},
        node_sections={"gpu": {"busy_util": 1.0, "busy_memory_mib": 0}},
    )
    first = submit(cluster, "--pre", "1", "--train", "3", "--post", "6", "--util", "80",
                   "--gpu-mem-mib", "5000")
    second = submit(cluster, "--pre", "0.5", "--train", "1", "--post", "0.5", "--util", "60",
                    "--gpu-mem-mib", "3000")

    def ended() -> dict | None:
        code, out, err = ctl(cluster, "jobs")
        assert code == 0, err
        jobs = {j["id"]: j for j in out["jobs"]}
        done = all(jobs[j]["state"] in ("finished", "failed") for j in (first, second))
        return jobs if done else None

    jobs = cluster.wait_for("both jobs to end", ended, 90)
    assert jobs[first]["state"] == jobs[second]["state"] == "finished", cluster.log("master")
    code, a, err = ctl(cluster, "show", first)
    assert code == 0, err
    code, b, err = ctl(cluster, "show", second)
    assert code == 0, err
    kinds = [e["kind"] for e in a["events"]]
    assert "post_phase" in kinds, kinds
    # Pre-scheduled: the second job started on the lent GPU before the first ended.
    assert b["job"]["start_time"] < a["job"]["end_time"], (a["job"], b["job"])
    assert b["job"]["placement"][0]["gpus"] == a["job"]["placement"][0]["gpus"]

    def reported() -> list | None:
        code, out, _ = ctl(cluster, "show", first)
        usage = out["usage"] if code == 0 else []
        return usage if usage and usage[0]["final"] else None

    usage = cluster.wait_for("the first job's final usage", reported, 30)[0]
    assert usage["gpu_memory_peak_mib"] == 5000
    assert 10 < usage["gpu_util_mean"] < 80 and usage["gpu_util_std"] > 10
    assert usage["seconds"] >= 9 and usage["memory_peak_mib"] > 1
    # The phases the node measured (Liquid §6.1), which the model learns phase lengths from:
    # 1 s launching, 6 s saving, give or take the 0.2 s samples and the exit.
    assert 0.5 < usage["pre_s"] < 2.5 and 4.5 < usage["post_s"] < 8.0, usage
    code, text, err = ctl(cluster, "show", first, json_out=False)
    assert code == 0 and "Usage:" in text and "gpu mem peak=5000 MiB" in text, text
    assert "phases pre=" in text and " post=" in text, text
