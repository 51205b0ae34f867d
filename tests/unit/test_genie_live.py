"""Unit tests of GENIE/SODA in the live master: profiling runs' priority, policy notes, the
model store, the profiler's fit, job metrics and the CLI's deadline parsing."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from control.cli import UsageError, parse_deadline
from demo.trainer import emulated_rate
from masterd.core.arrays.policy import ArrayPolicy, PassResult
from masterd.core.genie import model as perf
from masterd.core.genie.model import Coefficients
from masterd.core.genie.modeldb import ModelDB, ModelDBError, ModelEntry
from masterd.core.policies import soda_arrays
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policies.minmin import MinMinPolicy
from masterd.core.policies.swaf import SwafPolicy
from masterd.core.policy import Start
from masterd.core.profiling import ProfilingPolicy, unwrap
from masterd.features.genie.models import ModelStore, base_path, build_policy
from masterd.features.genie.profiler import (
    Campaign,
    Profiler,
    ProfileRun,
    measured_rate,
    substitute,
)
from masterd.journal.store import Store
from masterd.service.jobmetrics import MAX_NAMES, JobMetrics
from shared.messages import JobMetric
from shared.model import Job, JobState
from tests.unit.arrays_fixtures import (
    gpu_node,
    job,
    make_core,
    run_pass,
    starts,
)
from tests.unit.feature_context import FeatureHarness
from tests.unit.helpers import job as model_job

TRUTH = Coefficients(40.0, 12.0, -0.05, 0.8, 0.3)


# -- profiling runs at the lowest priority ---------------------------------------------------------
def profiling_job(job_id: str, d_node: int, d_gpn: int, submit: float = 0.0) -> Job:
    base = job(gpus=d_node * d_gpn, cpus=d_node, model="A100", submit=submit, job_id=job_id)
    return Job(id=job_id, spec=replace(base.spec, max_nodes=d_node), submit_time=submit)


class Recorder(FifoPolicy):
    def __init__(self) -> None:
        super().__init__(backfill=True)
        self.seen: list[list[str]] = []

    def decide(self, snapshot, queue, now):  # type: ignore[no-untyped-def]
        self.seen.append([j.id for j in queue])
        return super().decide(snapshot, queue, now)


def test_profiling_runs_use_only_what_no_waiting_job_can() -> None:
    runs = {"p-across", "p-one"}
    inner = Recorder()
    policy = ProfilingPolicy(inner, runs.__contains__, lambda: bool(runs))
    core = make_core(policy, [gpu_node("n1", gpus=4, cores=8), gpu_node("n2", gpus=4, cores=8)])
    core.submit(job(gpus=2, cpus=2, job_id="user-a", submit=1.0))
    core.submit(profiling_job("p-across", 2, 1, submit=0.0))  # submitted first, still last
    core.submit(job(gpus=8, cpus=1, job_id="user-big", submit=2.0))  # cannot fit now
    decisions = run_pass(core, 3.0)
    assert set(starts(decisions)) == {"user-a", "p-across"}
    # The wrapped policy never saw the profiling run.
    assert inner.seen and all("p-across" not in seen for seen in inner.seen)
    across = starts(decisions)["p-across"].placement
    assert sorted(a.node for a in across.allocations) == ["n1", "n2"]
    assert all(len(a.gpus) == 1 for a in across.allocations)  # exactly <2, 1>

    # User jobs that fit go first; a run takes what is left when no waiting job fits it.
    core.submit(profiling_job("p-one", 1, 1, submit=0.5))
    core.submit(job(gpus=3, cpus=1, job_id="user-c", submit=4.0))
    decisions = run_pass(core, 5.0)
    assert set(starts(decisions)) == {"user-c", "p-one"}
    assert core.jobs["user-big"].state is JobState.QUEUED


def test_a_held_back_user_job_keeps_profiling_waiting() -> None:
    class HoldAll(FifoPolicy):
        def decide(self, snapshot, queue, now):  # type: ignore[no-untyped-def]
            return []

    runs = {"p"}
    policy = ProfilingPolicy(HoldAll(), runs.__contains__, lambda: True)
    core = make_core(policy, [gpu_node("n1", gpus=4)])
    core.submit(job(gpus=1, job_id="held", submit=0.0))
    core.submit(profiling_job("p", 1, 1, submit=0.0))
    assert run_pass(core, 1.0) == []
    assert core.jobs["p"].reason.startswith("waiting: profiling runs only on resources")
    assert "held" in core.jobs["p"].reason
    assert unwrap(policy).name == "fifo"


# -- policy notes become job reasons ------------------------------------------------------------
class Noting(FifoPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.notes: dict[str, str] = {}

    def plan(self, snapshot, queue, now) -> PassResult:  # type: ignore[no-untyped-def]
        return PassResult(super().decide(snapshot, queue, now), dict(self.notes))


def test_scheduler_copies_plan_notes_into_reasons_and_drops_stale_ones() -> None:
    policy = Noting()
    core = make_core(policy, [gpu_node("n1", gpus=2)])
    core.submit(job(gpus=2, job_id="runs", submit=0.0))
    core.submit(job(gpus=2, job_id="waits", submit=1.0))
    policy.notes = {"runs": "borrowing 2 gpus of large:A100", "waits": "waiting: full"}
    run_pass(core, 2.0)
    assert core.jobs["runs"].reason == "borrowing 2 gpus of large:A100"
    assert core.jobs["waits"].reason == "waiting: full"
    policy.notes = {}
    core.submit(job(gpus=8, job_id="other", submit=3.0))  # any queued job: a pass happens
    run_pass(core, 4.0)
    assert core.jobs["waits"].reason == ""


def test_array_policy_notes_reach_jobs() -> None:
    policy = soda_arrays({"models": {"*": {"large": 0.5, "cpu_job_cores": 0}}})
    core = make_core(policy, [gpu_node("n1", gpus=4), gpu_node("n2", gpus=4)])
    for i in range(3):
        core.submit(job(gpus=2, model="A100", job_id=f"s{i}", submit=float(i)))
    run_pass(core, 5.0)
    assert core.jobs["s2"].state is JobState.RUNNING
    assert core.jobs["s2"].reason.startswith("borrowing 2 gpus of large:A100")


# -- the model store and the policies sharing it ------------------------------------------------
def entry(model_type: str, k0: float = 10.0, source: str = "") -> ModelEntry:
    return ModelEntry(model_type, "A100", "training", Coefficients(k0, 1.0, 0.0, 0.5, 0.2),
                      family="cnn", source=source)


def test_model_store_persists_rows_and_policies_share_the_database(tmp_path: Path) -> None:
    async def scenario() -> None:
        harness = FeatureHarness(tmp_path)
        models = ModelStore(harness.ctx, ModelDB.default())
        swaf = build_policy("swaf", {"theta": 0.3}, models.db)
        assert isinstance(swaf, SwafPolicy) and swaf.estimator.db is models.db
        assert swaf.settings.theta == 0.3
        minmin = build_policy("min-min", {}, models.db)
        assert isinstance(minmin, MinMinPolicy) and minmin._plans.estimator.db is models.db
        assert isinstance(build_policy("fifo", {"backfill": True}, models.db), FifoPolicy)
        arrays = build_policy("soda-arrays", {"inner": {"large": "fifo"}}, models.db)
        assert isinstance(arrays, ArrayPolicy)
        small = arrays.inner_for(next(a for a in _arrays(arrays) if a.kind == "small"))
        assert isinstance(small, SwafPolicy) and small.estimator.db is models.db
        large = arrays.inner_for(next(a for a in _arrays(arrays) if a.kind == "large"))
        assert isinstance(large, FifoPolicy)

        version = models.db.version
        await models.put([entry("net-a", source="bench")], "test", default_gpu_model="A100")
        assert models.db.version > version  # the policies re-plan
        await models.load_rows([{"model_type": "net-b", "gpu_model": "A100", "k0": 5,
                                 "k1": 1, "k2": 0}], "rpc")
        with pytest.raises(ModelDBError, match="row 0: k1"):
            await models.load_rows([{"model_type": "x", "gpu_model": "A100", "k0": 1,
                                     "k1": "fast", "k2": 0}], "rpc")
        await harness.close()

        harness = FeatureHarness(tmp_path)
        again = ModelStore(harness.ctx, ModelDB())
        got = {e.model_type: e for e in again.db.entries()}
        assert set(got) == {"net-a", "net-b"} and got["net-a"].source == "bench"
        assert got["net-a"].coefficients.gamma == 0.5
        assert again.db.default_gpu_model == "A100"
        assert {m["model_type"] for m in again.listing() if m["stored"]} == {"net-a", "net-b"}
        events = harness.store.events()
        assert [e.kind for e in events] == ["models_loaded", "models_loaded"]
        await harness.close()

    asyncio.run(scenario())


def _arrays(policy: ArrayPolicy):  # type: ignore[no-untyped-def]
    from masterd.core.cluster import ClusterState

    cluster = ClusterState()
    cluster.upsert_node(gpu_node("n1", gpus=4))
    cluster.upsert_node(gpu_node("n2", gpus=4))
    return policy.array_map(cluster.snapshot({})).arrays


def test_base_model_file_comes_from_the_policy_options() -> None:
    assert base_path("swaf", {"modeldb": "/etc/m.toml"}) == "/etc/m.toml"
    assert base_path("soda-arrays", {"inner": {"small": {"name": "swaf",
                                                         "modeldb": "/x.json"}}}) == "/x.json"
    assert base_path("soda-arrays", {"inner": {"small": "swaf"}}) is None
    assert base_path("fifo", {}) is None


# -- the profiler's arithmetic ------------------------------------------------------------------
def test_measured_rate_drops_the_warm_up_and_takes_the_median() -> None:
    assert measured_rate([]) is None
    assert measured_rate([5.0]) == 5.0
    assert measured_rate([1.0, 10.0, 11.0, 12.0]) == 11.0
    assert measured_rate([1.0, 100.0, 10.0]) == 55.0


def test_commands_get_each_runs_parameters() -> None:
    run = ProfileRun("p-r0", "gpus", 1, 2, 64)
    assert substitute(("train", "--bs={batch}", "-n", "{iterations}", "{d_node}x{d_gpn}"),
                      run, 30) == ("train", "--bs=64", "-n", "30", "1x2")


def test_fit_of_a_campaign_recovers_the_model_that_produced_its_rates() -> None:
    campaign = Campaign(
        id="profile-1", model_type="net", gpu_model="A100", kind="training", family=None,
        params_m=None, batches=[8, 16, 32, 64], global_batch=64, iterations=50,
        command=["x"], user="nobody", tenant="default", created=0.0,
    )
    shapes = [("batch", 1, 1, b) for b in (8, 16, 32, 64)] + [
        ("gpus", 1, 2, 64), ("gpus", 1, 4, 64), ("nodes", 2, 1, 64), ("nodes", 3, 1, 64)]
    for i, (phase, n, g, b) in enumerate(shapes):
        rate = perf.processing_rate(TRUTH, b, n, g)
        assert rate is not None
        campaign.runs.append(ProfileRun(f"r{i}", phase, n, g, b, state="done", rate=rate,
                                        seconds=b * 50 / rate + 0.7))
    campaign.runs.append(ProfileRun("r-bad", "gpus", 1, 3, 64, state="failed", reason="x"))
    result = Profiler._fit(campaign)
    c = result.coefficients
    assert c.k0 == pytest.approx(40.0, rel=1e-6) and c.k2 == pytest.approx(-0.05, rel=1e-6)
    assert c.gamma == pytest.approx(0.8, rel=1e-6) and c.lam == pytest.approx(0.3, rel=1e-6)
    assert c.nu == pytest.approx(0.7, rel=1e-6)
    assert result.single_gpu.mean_relative < 1e-9


def test_the_emulating_trainer_runs_at_the_models_rate() -> None:
    for n, g in ((1, 1), (1, 3), (2, 1), (2, 4)):
        assert emulated_rate([40.0, 12.0, -0.05, 0.8, 0.3], 64, n, g) == pytest.approx(
            perf.processing_rate(TRUTH, 64, n, g))


# -- job metrics in the master ---------------------------------------------------------------
def running(job_id: str, node: str = "n1") -> Job:
    j = model_job(job_id, gpus=1)
    j.state = JobState.RUNNING
    j.node_states = {node: "running"}
    return j


def metric(job_id: str, name: str = "samples_per_sec", value: float = 10.0) -> JobMetric:
    return JobMetric(job_id=job_id, name=name, value=value, last=value, count=2)


def test_job_metrics_are_rate_limited_and_bounded() -> None:
    now = [100.0]
    seen: list[str] = []
    metrics = JobMetrics(lambda: now[0], lambda j, n, m: seen.append(m.name),
                         min_interval_s=0.5, max_jobs=2)
    a = running("a")
    assert metrics.on_event("n1", metric("a"), a)
    assert not metrics.on_event("n1", metric("a", value=11.0), a)  # too soon
    now[0] += 0.6
    assert metrics.on_event("n1", metric("a", value=12.0), a)
    assert metrics.of("a")["samples_per_sec"]["last"] == 12.0
    assert metrics.of("a")["samples_per_sec"]["count"] == 4
    assert not metrics.on_event("n2", metric("a"), a)  # not running on n2
    assert not metrics.on_event("n1", metric("ghost"), None)
    for i in range(MAX_NAMES + 3):
        metrics.on_event("n1", metric("a", name=f"m{i}"), a)
    assert len(metrics.of("a")) == MAX_NAMES
    for other in ("b", "c"):
        metrics.on_event("n1", metric(other), running(other))
    assert metrics.of("a") == {}  # the least recently reporting job was forgotten
    assert seen.count("samples_per_sec") == 4


# -- trellisctl submit --deadline ------------------------------------------------------------------
def test_deadline_accepts_relative_and_iso_times() -> None:
    assert parse_deadline("600", 1000.0) == 1600.0
    assert parse_deadline("+90s", 0.0) == 90.0
    assert parse_deadline("10m", 0.0) == 600.0
    assert parse_deadline("1d", 0.0) == 86_400.0
    assert parse_deadline("2100-01-01T00:00:00+00:00", 0.0) == 4_102_444_800.0
    for bad in ("soon", "-5", "nan", "0", "1999-01-01T00:00"):
        with pytest.raises(UsageError, match="--deadline"):
            parse_deadline(bad, 1e9)


@pytest.mark.parametrize("runs", [set(), {"p"}], ids=["no-runs", "a-run-waiting"])
def test_starts_are_decisions(runs: set[str]) -> None:
    # Guard against the wrapper returning something the master cannot carry out, on both of
    # its paths (only the inner policy's decisions; those plus profiling runs' starts).
    policy = ProfilingPolicy(FifoPolicy(), runs.__contains__, lambda: bool(runs))
    core = make_core(policy, [gpu_node("n1", gpus=2)])
    core.submit(job(gpus=1, job_id="x"))
    if runs:
        core.submit(profiling_job("p", 1, 1))
    decisions = run_pass(core, 0.0)
    assert set(starts(decisions)) == {"x", *runs}
    assert all(isinstance(d, Start) for d in decisions)
    assert all(core.jobs[j].state is JobState.RUNNING for j in starts(decisions))


# -- a restarted master settles the campaigns it journalled ---------------------------------------
def test_restored_campaign_fails_runs_that_ended_unseen_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    from masterd.journal.profiles import create_tables, write_campaign

    store = Store(tmp_path / "master.db")
    create_tables(store)
    campaign = Campaign(
        id="profile-1", model_type="net", gpu_model="A100", kind="training", family=None,
        params_m=None, batches=[8, 16, 32], global_batch=32, iterations=10, command=["x"],
        user="nobody", tenant="default", created=1.0,
        runs=[ProfileRun("profile-1-r0", "batch", 1, 1, 8, state="done", rate=100.0),
              ProfileRun("profile-1-r1", "batch", 1, 1, 16),
              ProfileRun("profile-1-r2", "batch", 1, 1, 32)],
    )
    write_campaign(store, asdict(campaign), None)
    store.close()
    ended, still = model_job("profile-1-r1", gpus=1), running("profile-1-r2")
    ended.state = JobState.FINISHED
    harness = FeatureHarness(tmp_path)
    try:
        for job_ in (ended, still):
            harness.core.restore(job_)
        profiler = Profiler(harness.ctx, ModelStore(harness.ctx, ModelDB()))
        assert profiler.is_run("profile-1-r1") and profiler.is_run("profile-1-r2")
        harness.events.restored.emit()
        restored = profiler.get("profile-1")
        assert not profiler.is_run("profile-1-r1") and profiler.is_run("profile-1-r2")
        assert restored.runs[1].state == "failed"
        assert "while the master was down" in restored.runs[1].reason
        assert restored.state == "running" and not len(harness.tasks)  # r2 still runs
        assert profiler.view(restored)["runs_pending"] == 1
    finally:
        harness.journal.close()
        harness.store.close()


def test_profile_requests_are_checked_against_the_cluster(tmp_path: Path) -> None:
    from masterd.core.scheduler import JobError
    from masterd.features.genie.profiler import ProfileRequest, plan_runs

    harness = FeatureHarness(tmp_path)
    try:
        cluster = harness.core.cluster
        profiler = Profiler(harness.ctx, ModelStore(harness.ctx, ModelDB()))
        req = ProfileRequest(model_type="net", command=("train",), user="nobody")
        with pytest.raises(JobError, match="no GPU node"):
            profiler.check(req)
        cluster.upsert_node(gpu_node("n1", gpus=4, cores=2))
        with pytest.raises(JobError, match="2 or more nodes of A100; the cluster has 1"):
            profiler.check(req)
        cluster.upsert_node(gpu_node("n2", gpus=4, cores=2))
        checked, nodes, gpn, cores = profiler.check(req)
        assert (checked.gpu_model, checked.global_batch, nodes, gpn, cores) == (
            "A100", 64, 2, 4, 2)
        assert [(p, n, g) for p, n, g, _ in plan_runs(checked, nodes, gpn)] == [
            ("batch", 1, 1)] * 4 + [("gpus", 1, 2), ("gpus", 1, 3), ("gpus", 1, 4),
                                    ("nodes", 2, 1)]
        inference = replace(req, kind="inference")
        assert [p for p, *_ in plan_runs(profiler.check(inference)[0], 2, 4)] == ["batch"] * 4
        for bad, message in (
            (replace(req, batches=(8, 8, 16)), "3 or more distinct"),
            (replace(req, gpu_model="H100"), "no node with GPU model 'H100'"),
            (replace(req, global_batch=2), "global_batch 2"),
            (replace(req, max_gpus_per_node=1), "max_gpus_per_node allows 1"),
            (replace(req, model_type="--"), "letter or digit"),
        ):
            with pytest.raises(JobError, match=message):
                profiler.check(bad)
        # Cores per run are capped at what a node has: <1, 4> fits a 2-core node.
        campaign = Campaign(id="profile-9", model_type="net", gpu_model="A100",
                            kind="training", family=None, params_m=None, batches=[8],
                            global_batch=64, iterations=5, command=["x"], user="nobody",
                            tenant="default", created=0.0)
        spec = profiler._spec(checked, campaign, ProfileRun("r", "gpus", 1, 4, 64), cores)
        assert (spec.gpus, spec.cpus, spec.max_nodes, spec.batch) == (4, 2, 1, 64)
        assert spec.env["TRELLIS_BATCH"] == "64"
    finally:
        harness.journal.close()
        harness.store.close()
