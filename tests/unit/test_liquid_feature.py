"""Liquid's resources feature on a real journal and a real worker process: usage reports are
journalled with features and labels, the forests are trained off the event loop, jobs get
predictions the policy reads, and a post phase lends a job's GPUs."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from masterd.core.liquid.demand import GPU_MEM, GPU_UTIL, NET, POST_S, POST_SINCE, PRE_S
from masterd.core.policies.liquid import LiquidPolicy
from masterd.core.scheduler import SchedulingCore
from masterd.features.liquid.feature import LiquidResources
from masterd.features.liquid.forest import MIN_ROWS, fit
from masterd.features.liquid.jobfeatures import command_flags, features_of, labels_of
from masterd.journal.liquid import training_rows
from shared.messages import JobPhase, JobUsage
from shared.model import Job, JobSpec
from sim.cluster import NodeGroup, build_node
from tests.unit.feature_context import FeatureHarness


def spec(name: str, batch: int, gpus: int = 1) -> JobSpec:
    return JobSpec(name=name, command=("python3", "train.py", "--batch-size", str(batch),
                                       "--lr=0.01", "--model", "resnet50"),
                   user="nobody", gpus=gpus, cpus=2, model_type="resnet50", batch=batch)


def test_command_line_hyperparameters_become_features() -> None:
    flags = command_flags(("python", "t.py", "--batch-size", "64", "--lr=1e-3", "-e", "3",
                           "--amp", "--arch", "vgg16", "--bias", "-0.5"))
    assert flags["batch_size"] == 64 and flags["lr"] == 1e-3 and flags["e"] == 3
    assert flags["amp"] == 1.0 and flags["bias"] == -0.5 and 0 <= flags["arch"] < 1
    f = features_of(spec("a", 64))
    assert f["hp_batch"] == 64 and f["hp_lr"] == 0.01 and f["gpus"] == 1
    assert f["hp_model"] == features_of(spec("b", 32))["hp_model"]  # same string, same hash


def test_labels_are_per_task() -> None:
    usage = {"seconds": 10.0, "gpu_util_mean": 60.0, "gpu_util_std": 5.0, "cpu_peak": 4.0,
             "memory_peak_mib": 2048.0, "gpu_memory_peak_mib": 9000.0,
             "net_tx_bytes": 300_000_000, "net_rx_bytes": 100_000_000}
    labels = labels_of(usage, workers=2)
    assert labels == {"gpu_util": 0.6, "gpu_util_std": 0.05, "gpu_mem_mib": 9000.0,
                      "cpu": 2.0, "mem_mib": 1024.0, "net_mbps": 20.0}
    # Phase lengths are the part's, not per task.
    phases = labels_of({**usage, "pre_s": 4.0, "post_s": 30.0}, workers=2)
    assert phases is not None and phases["pre_s"] == 4.0 and phases["post_s"] == 30.0
    assert labels_of({**usage, "seconds": 0}, 1) is None


def test_the_numpy_forest_predicts_what_scikit_learn_fitted() -> None:
    rng = random.Random(3)
    rows = []
    for i in range(120):
        batch = rng.choice([16, 32, 64, 128])
        rows.append((features_of(spec(f"j{i}", batch)),
                     {"gpu_util": 0.2 + batch / 200 + rng.gauss(0, 0.02)}))
    model = fit(rows, seed=1)
    assert model is not None and model.test_rows == 24 and model.r2["gpu_util"] > 0.8
    from sklearn.ensemble import RandomForestRegressor

    from masterd.features.liquid.forest import RF_SETTINGS
    from masterd.features.liquid.jobfeatures import vector

    x = np.asarray([vector(f) for f, _ in rows])
    y = np.asarray([lab["gpu_util"] for _, lab in rows])
    reference = RandomForestRegressor(random_state=1, **RF_SETTINGS).fit(x, y)
    ours = np.asarray([p["gpu_util"] for p in model.predict_many([f for f, _ in rows])])
    assert np.allclose(ours, reference.predict(x))
    assert fit(rows[:MIN_ROWS - 1]) is None


def test_usage_training_predictions_and_post_phase(tmp_path: Path) -> None:
    async def scenario() -> None:
        core = SchedulingCore(LiquidPolicy(batch=False))
        core.node_up(build_node("n1", NodeGroup(count=1, gpus_per_node=2, gpu_model="T4")))
        harness = FeatureHarness(tmp_path, core=core)
        liquid = LiquidResources(harness.ctx)
        harness.events.restored.emit()
        try:
            # Jobs run and report: usage grows with the batch, as the model should learn.
            rng = random.Random(7)
            for i in range(30):
                batch = rng.choice([16, 32, 64, 128])
                job = Job(id=f"done-{i}", spec=spec(f"done-{i}", batch), submit_time=0.0)
                core.submit(job)
                [start] = core.schedule(harness.now)
                core.node_started(job.id, "n1", harness.now)
                await harness.events.node_event.emit("n1", JobUsage(
                    job_id=job.id, seconds=100.0, samples=100, cpu_peak=1.0 + batch / 64,
                    memory_peak_mib=1000.0, gpu_util_mean=20 + batch / 2, gpu_util_std=4.0,
                    gpu_memory_peak_mib=1000.0 + 40 * batch, net_tx_bytes=10**8,
                    net_rx_bytes=10**8, final=True))
                core.node_exited(job.id, "n1", 0, None, harness.now)
                assert start.job_id == job.id
            rows = await harness.ctx.journal.call(training_rows, 100)
            assert len(rows) == 30 and rows[0][1]["net_mbps"] == 2.0
            assert (await liquid.usage_of("done-0"))[0]["final"] is True

            outcome = await liquid.retrain()
            assert outcome["version"] == 1 and outcome["test_rows"] == 6
            summary = liquid.summary()
            assert summary["rows"] == 30 and summary["r2"]["gpu_util"] is not None

            waiting = Job(id="new", spec=spec("new", 128), submit_time=harness.now)
            core.submit(waiting)
            harness.events.before_pass.emit()
            notes = core.jobs["new"].annotations
            assert 0.7 < notes[GPU_UTIL] <= 1.0 and notes[GPU_MEM] > 4000
            assert notes[NET] == pytest.approx(2.0)

            # The waiting job starts; its node says it entered its post phase.
            [start] = core.schedule(harness.now)
            core.node_started("new", "n1", harness.now)
            await harness.events.node_event.emit("n1", JobPhase(job_id="new", phase="post",
                                                                gpu_util=3.0))
            view = core.cluster.node("n1")
            gpu = start.placement.allocations[0].gpus[0]
            assert view is not None and dict(view.shared_gpus) == {gpu: 1}
            assert core.jobs["new"].annotations[POST_SINCE] == harness.now
        finally:
            await harness.close()

    asyncio.run(scenario())


def test_a_model_update_repredicts_running_jobs(tmp_path: Path) -> None:
    async def scenario() -> None:
        core = SchedulingCore(LiquidPolicy(batch=False))
        core.node_up(build_node("n1", NodeGroup(count=1, gpus_per_node=2, gpu_model="T4")))
        harness = FeatureHarness(tmp_path, core=core)
        harness.config = replace(harness.config, liquid=replace(harness.config.liquid,
                                                                retrain_s=0.0))
        liquid = LiquidResources(harness.ctx)
        try:
            running = Job(id="r", spec=spec("r", 32), submit_time=0.0)
            core.submit(running)
            core.schedule(0.0)
            core.node_started("r", "n1", 0.0)
            outcome = await liquid.retrain()
            assert "skipped" in outcome  # nothing to learn from yet
            rows = [(features_of(spec(f"x{i}", 32)), {"gpu_util": 0.5}) for i in range(12)]
            model = fit(rows)
            assert model is not None
            liquid.model, liquid.version = model, 1
            liquid.predict_all()
            assert core.jobs["r"].annotations[GPU_UTIL] == pytest.approx(0.5)
        finally:
            await harness.close()

    asyncio.run(scenario())


def test_measured_phase_lengths_become_predictions_that_time_pre_scheduling(
        tmp_path: Path) -> None:
    """Liquid §6.1 live: noded's final reports carry the phases it measured, the model learns
    them, and a lent GPU waits for Liquid's rule (remaining post phase within 15 s)."""
    async def scenario() -> None:
        core = SchedulingCore(LiquidPolicy(batch=False))
        core.node_up(build_node("n1", NodeGroup(count=1, gpus_per_node=1, gpu_model="T4")))
        harness = FeatureHarness(tmp_path, core=core)
        liquid = LiquidResources(harness.ctx)
        try:
            rng = random.Random(3)
            for i in range(14):
                job = Job(id=f"done-{i}", spec=spec(f"done-{i}", 64), submit_time=0.0)
                core.submit(job)
                core.schedule(harness.now)
                core.node_started(job.id, "n1", harness.now)
                await harness.events.node_event.emit("n1", JobUsage(
                    job_id=job.id, seconds=200.0, samples=200, gpu_util_mean=70.0,
                    gpu_util_std=9.0, pre_s=5.0 + rng.uniform(-0.5, 0.5),
                    post_s=60.0 + rng.uniform(-2, 2), final=True))
                core.node_exited(job.id, "n1", 0, None, harness.now)
            outcome = await liquid.retrain()
            assert outcome["version"] == 1

            holder = Job(id="holder", spec=spec("holder", 64), submit_time=harness.now)
            core.submit(holder)
            harness.events.before_pass.emit()
            notes = core.jobs["holder"].annotations
            assert notes[PRE_S] == pytest.approx(5.0, abs=0.6)
            assert notes[POST_S] == pytest.approx(60.0, abs=2.5)
            [start] = core.schedule(harness.now)
            core.node_started("holder", "n1", harness.now)
            await harness.events.node_event.emit("n1", JobPhase(
                job_id="holder", phase="post", gpu_util=3.0, pre_s=5.0))
            since = harness.now
            core.submit(Job(id="next", spec=spec("next", 64), submit_time=harness.now))
            harness.events.before_pass.emit()
            # Its GPU is lent, but the holder has ~60 s of saving left: not yet.
            assert core.schedule(since + 1.0) == []
            eligible = since + notes[POST_S] - 15.0
            assert core.wake_at == pytest.approx(eligible)
            assert [d.job_id for d in core.schedule(eligible)] == ["next"]
            assert start.job_id == "holder"
        finally:
            await harness.close()

    asyncio.run(scenario())
