"""End-to-end GENIE: profile a model type with real runs, then schedule a QoS workload with it.

The runs are demo/trainer.py --emulate with known coefficients: each runs at the rate GENIE's
model gives for its placement and reports samples/second on the metrics channel, so the fit
must recover the coefficients from what really happened on the (emulated) cluster.
"""

from __future__ import annotations

import json

from demo.cluster import TRAINER, LocalCluster, default_job_user
from tests.e2e.cli import ctl

USER = default_job_user()
GPU = "A100-SXM4-40GB"
# The emulated truth: sPR(b) = 40 + 12 b - 0.05 b^2 samples/s, gamma 0.8, lambda 0.3.
TRUTH = (40.0, 12.0, -0.05, 0.8, 0.3)
EMULATE = ",".join(str(x) for x in TRUTH)


def submit(cluster: LocalCluster, *args: str) -> str:
    code, out, err = ctl(cluster, "submit", "--user", USER, *args)
    assert code == 0, err
    return out["job"]["id"]


def spr(k0: float, k1: float, k2: float, b: float) -> float:
    return k0 + k1 * b + k2 * b * b


def test_profile_fits_emulated_truth_then_swaf_runs_mixed_qos(make_cluster) -> None:
    cluster = make_cluster(
        nodes=2, gpus_per_node=4, policy="swaf",
        extra_node={1: {"job_metrics_interval_s": 0.2}, 2: {"job_metrics_interval_s": 0.2}},
    )
    # -- 1. a profiling campaign: 4 single-GPU batches, <1,2>, <1,3>, <1,4>, <2,1> ---------
    code, out, err = ctl(
        cluster, "profile", "--model-type", "emu-net", "--user", USER, "--batches", "8,16,32,64",
        "--global-batch", "64", "--iterations", "16", "--family", "cnn", "--params-m", "25",
        "--", "python3", TRAINER, "--emulate", EMULATE, "--batch", "{batch}",
        "--iterations", "{iterations}", "--report-s", "0.2",
    )
    assert code == 0, err
    campaign = out["profile"]
    assert campaign["gpu_model"] == GPU
    shapes = sorted((r["d_node"], r["d_gpn"], r["batch"]) for r in campaign["runs"])
    assert shapes == [(1, 1, 8), (1, 1, 16), (1, 1, 32), (1, 1, 64), (1, 2, 64), (1, 3, 64),
                      (1, 4, 64), (2, 1, 64)]

    def settled() -> dict | None:
        code, out, err = ctl(cluster, "profiles", campaign["id"])
        assert code == 0, err
        c = out["profiles"][0]
        return c if c["state"] != "running" else None

    done = cluster.wait_for("the profiling campaign", settled, 120)
    assert done["state"] == "fitted", json.dumps(done, indent=1) + cluster.log("master")
    fit = done["fit"]
    # The fit error is reported, and small: the runs really ran at the emulated rates.
    # (Tolerances allow for a busy shared test machine waking the emulated runs late.)
    assert fit["single_gpu_error"] < 0.04 and fit["placement_error"] < 0.04, fit
    for b in (8, 16, 32, 64):
        assert abs(spr(fit["k0"], fit["k1"], fit["k2"], b) / spr(*TRUTH[:3], b) - 1) < 0.05
    assert abs(fit["gamma"] - TRUTH[3]) < 0.15, fit
    assert abs(fit["lam"] - TRUTH[4]) < 0.15, fit
    for run in done["runs"]:
        assert run["state"] == "done" and run["reports"] >= 1, run
    # Each run is a real job that really ran.
    code, jobs, _ = ctl(cluster, "jobs", "--state", "finished")
    assert {r["job_id"] for r in done["runs"]} <= {j["id"] for j in jobs["jobs"]}

    code, models, err = ctl(cluster, "models")
    assert code == 0, err
    mine = [m for m in models["models"] if m["model_type"] == "emu-net"]
    assert len(mine) == 1 and mine[0]["gpu_model"] == GPU and mine[0]["stored"]
    assert mine[0]["source"].startswith(f"profiled by {campaign['id']}")
    code, table, _ = ctl(cluster, "profiles", json_out=False)
    assert code == 0 and "fitted" in table and "1-GPU" in table

    # -- 2. a SWAF workload of that type with mixed QoS classes -----------------------------
    def job(qos: str, gpus: int, batch: int, iterations: int, *extra: str) -> str:
        return submit(cluster, "--name", f"emu-{qos}", "--gpus", str(gpus), "--qos", qos,
                      "--model-type", "emu-net", "--batch", str(batch), "--iterations",
                      str(iterations), *extra, "--", "python3", TRAINER, "--emulate", EMULATE,
                      "--batch", str(batch), "--iterations", str(iterations))

    # A job with no model information takes exactly the GPUs it asks for: all of them, until
    # it is cancelled, so the workload below waits and SWAF explains its order.
    blocker = submit(cluster, "--name", "blocker", "--gpus", "8", "--", "python3", TRAINER,
                     "--iterations", "100000", "--load-ms", "1", "--gpu-ms", "100")
    cluster.wait_for("the blocker to start",
                     lambda: ctl(cluster, "show", blocker)[1]["job"]["state"] == "running", 30)
    ids = [
        job("normal", 4, 64, 20), job("urgent", 2, 32, 15), job("prior", 2, 64, 15),
        job("normal", 1, 16, 15), job("prior", 4, 64, 15),
        job("normal", 2, 32, 15, "--deadline", "600"),
    ]
    # Unknown to the database: the prediction is a fallback, flagged as such.
    mystery = submit(cluster, "--name", "mystery", "--gpus", "1", "--model-type",
                     "mystery-net", "--batch", "32", "--iterations", "10", "--",
                     "python3", TRAINER, "--iterations", "3", "--gpu-ms", "5")
    similar = submit(cluster, "--name", "similar", "--gpus", "1", "--model-type",
                     "cousin-net", "--model-family", "cnn", "--batch", "32",
                     "--iterations", "10", "--", "python3", TRAINER, "--iterations", "3",
                     "--gpu-ms", "5")

    code, shown, err = ctl(cluster, "show", ids[1])
    assert code == 0, err
    assert shown["job"]["state"] == "queued", shown["job"]
    p = shown["prediction"]
    assert p["model"]["model_type"] == "emu-net" and p["model"]["gpu_model"] == GPU
    assert p["fallback"] is False and p["model"]["source"].startswith("profiled by")
    assert p["predicted_latency_s"] > 0 and p["ect"] >= shown["job"]["submit_time"]
    # The waiting order's own account: SWAF's choice and the waiting allowance (Eq. 13).
    assert p["explained_by"] == "swaf" and isinstance(p["meets_ect"], bool)
    assert p["waiting_allowance_s"] is not None and p["placement"]["cer"] > 0
    code, text, _ = ctl(cluster, "show", ids[1], json_out=False)
    assert "Allowance:" in text and "swaf order" in text, text
    code, _, err = ctl(cluster, "cancel", blocker)
    assert code == 0, err
    code, shown, _ = ctl(cluster, "show", ids[5])
    assert abs(shown["prediction"]["deadline"] - (shown["job"]["submit_time"] + 600)) < 5

    def finished() -> dict | None:
        _, out, _ = ctl(cluster, "jobs")
        states = {j["id"]: j for j in out["jobs"]}
        wanted = [*ids, mystery, similar, blocker]
        if all(states[i]["state"] in ("finished", "failed", "cancelled") for i in wanted):
            return states
        return None

    states = cluster.wait_for("the workload", finished, 120)
    for i in [*ids, mystery, similar]:
        assert states[i]["state"] == "finished", (i, states[i])
    assert states[blocker]["state"] == "cancelled"
    assert {states[i]["qos"] for i in ids} == {"urgent", "prior", "normal"}

    code, shown, _ = ctl(cluster, "show", ids[0])
    p = shown["prediction"]
    assert p["fallback"] is False and p["actual_latency_s"] > 0
    # The emulated job ran as predicted, give or take start-up.
    assert abs(p["predicted_latency_s"] - p["actual_latency_s"]) < 1.5, p

    code, shown, _ = ctl(cluster, "show", mystery)
    p = shown["prediction"]
    assert p["fallback"] is True and "default rate" in p["fallback_reason"]
    code, shown, _ = ctl(cluster, "show", similar)
    p = shown["prediction"]
    assert p["fallback"] is True and "emu-net" in p["fallback_reason"]
    assert p["model"]["model_type"] == "emu-net"

    code, text, _ = ctl(cluster, "show", mystery, json_out=False)
    assert code == 0 and "FALLBACK: no prediction model" in text, text
    code, text, _ = ctl(cluster, "show", ids[2], json_out=False)
    assert "Fallback:       no (profiled model)" in text and "Model:          emu-net" in text
    assert "Metrics:" in text and "samples_per_sec=" in text, text
