"""Fair share with a memory: decay, the classic factor down the tree, ordering, accounting."""

from __future__ import annotations

import math

import pytest

from masterd.core.accounting import percentile, report_jobs
from masterd.core.cluster import ClusterState
from masterd.core.fairorder import FACTOR_KEY, FairShareOrdering, fair_key
from masterd.core.fairshare import FairShare, UsageWeights, decayed
from masterd.core.policies.drf import DrfPolicy
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policies.qssf import QssfPolicy
from masterd.core.policy import Start
from masterd.journal.history import JobHistory, Run
from shared.accounts import Account, AccountTree
from tests.unit.arrays_fixtures import gpu_node, job

DAY = 86400.0
GPU_ONLY = UsageWeights(gpu=1.0, cpu=0.0, memory_gib=0.0)


def test_usage_halves_every_half_life() -> None:
    fs = FairShare(half_life_s=7 * DAY, weights=GPU_ONLY)
    # 1 GPU for one hour, ending at t=3600: one GPU-hour (a tiny decay within the hour).
    fs.charge("a", 1, 0, 0, 0.0, 3600.0)
    at_end = fs.usage(3600.0)["a"]
    assert at_end == pytest.approx(2 ** (-0.5 / 168), rel=1e-4)  # mean age: half an hour
    assert fs.usage(3600.0 + 7 * DAY)["a"] == pytest.approx(at_end / 2, rel=1e-9)
    assert fs.usage(3600.0 + 14 * DAY)["a"] == pytest.approx(at_end / 4, rel=1e-9)


def test_decayed_integral_matches_numeric_sum() -> None:
    h = 3600.0
    exact = decayed(2.0, 100.0, 5000.0, 9000.0, h)
    steps = 20000
    dt = 4900.0 / steps
    numeric = sum(2.0 * 2 ** (-(9000.0 - (100.0 + (i + 0.5) * dt)) / h) * dt
                  for i in range(steps))
    assert exact == pytest.approx(numeric, rel=1e-6)


def test_running_jobs_count_up_to_now_and_charge_once_stopped() -> None:
    fs = FairShare(half_life_s=1e12, weights=GPU_ONLY)  # no decay to speak of
    fs.started("j1", "a", 4, 0, 0, 0.0)
    assert fs.usage(1800.0)["a"] == pytest.approx(2.0)  # 4 GPUs × half an hour
    fs.stopped("j1", 3600.0)
    assert fs.usage(7200.0)["a"] == pytest.approx(4.0)
    fs.stopped("j1", 9000.0)  # a second stop charges nothing
    assert fs.usage(9000.0)["a"] == pytest.approx(4.0)


def test_weights_make_a_gpu_hour_worth_more_than_a_core_hour() -> None:
    w = UsageWeights(gpu=1.0, cpu=0.05, memory_gib=0.005)
    assert w.rate(1, 0, 0) * 3600 == pytest.approx(1.0)
    assert w.rate(0, 20, 0) * 3600 == pytest.approx(1.0)
    assert w.rate(0, 0, 200 * 1024) * 3600 == pytest.approx(1.0)


def test_flat_factor_is_one_idle_half_at_share_quarter_at_twice() -> None:
    fs = FairShare(half_life_s=1e12, weights=GPU_ONLY)
    fs.note("idle")
    fs.charge("a", 1, 0, 0, 0.0, 3600.0)   # a used 2/3, b 1/3 of the cluster's usage;
    fs.charge("b", 1, 0, 0, 0.0, 1800.0)   # three accounts: 1/3 share each
    f = fs.factors(3600.0)
    assert f["idle"] == 1.0
    assert f["b"] == pytest.approx(0.5)
    assert f["a"] == pytest.approx(0.25)
    assert all(0.0 <= v <= 1.0 for v in f.values())


def test_tree_normalises_shares_and_passes_a_groups_debt_to_its_idle_accounts() -> None:
    tree = AccountTree.of([
        Account(name="physics", shares=3), Account(name="bio", shares=1),
        Account(name="hep", parent="physics", shares=1, users=("ann",)),
        Account(name="astro", parent="physics", shares=1, users=("bea",)),
        Account(name="lab", parent="bio", users=("cy",)),
    ])
    fs = FairShare(tree, half_life_s=1e12, weights=GPU_ONLY)
    fs.charge("hep", 1, 0, 0, 0.0, 3600.0)  # all the usage so far is hep's
    rows = {r.account: r for r in fs.rows(3600.0)}
    assert rows["physics"].norm_shares == pytest.approx(0.75)
    assert rows["hep"].norm_shares == pytest.approx(0.375)
    assert rows["lab"].norm_shares == pytest.approx(0.25)
    assert rows["physics"].raw_usage == pytest.approx(1.0)  # a parent's usage is its subtree's
    assert rows["physics"].effective_usage == pytest.approx(1.0)
    # astro used nothing but its group over-used: UE = 0 + (1 - 0) * 1/2.
    assert rows["astro"].effective_usage == pytest.approx(0.5)
    assert rows["astro"].factor == pytest.approx(2 ** (-0.5 / 0.375))
    assert rows["hep"].factor < rows["astro"].factor < rows["lab"].factor == 1.0
    # Parents come before their children.
    order = [r.account for r in fs.rows(3600.0)]
    assert order.index("physics") < order.index("hep")
    # A new tree swapped in (an admin's change) applies to the usage already charged.
    fs.set_tree(AccountTree.of([Account(name="hep", shares=1), Account(name="lab", shares=9)]))
    rows = {r.account: r for r in fs.rows(3600.0)}
    assert rows["hep"].norm_shares == pytest.approx(0.1)
    assert "physics" not in rows


def test_fair_key_is_empty_unless_annotated() -> None:
    j = job(gpus=1)
    assert fair_key(j) == ()
    j.annotations[FACTOR_KEY] = 0.5
    assert fair_key(j) == (0, 0, -10)


def _ordered(policy, queue, fs, now=10.0):  # type: ignore[no-untyped-def]
    state = ClusterState()
    state.upsert_node(gpu_node("n", gpus=1, cores=4))
    decisions = FairShareOrdering(policy, fs, recalc_s=0).decide(state.snapshot({}), queue, now)
    by_id = {j.id: j for j in queue}
    return [by_id[d.job_id].spec.tenant for d in decisions if isinstance(d, Start)]


def test_fifo_starts_the_job_of_the_account_that_used_less() -> None:
    fs = FairShare(half_life_s=DAY, weights=GPU_ONLY)
    fs.charge("heavy", 8, 0, 0, 0.0, 5.0)
    fs.note("light")
    queue = [job(gpus=1, tenant="heavy", submit=1.0), job(gpus=1, tenant="light", submit=2.0)]
    assert _ordered(FifoPolicy(), queue, fs) == ["light"]
    # Off (no wrapper), FIFO keeps submission order.
    state = ClusterState()
    state.upsert_node(gpu_node("n", gpus=1, cores=4))
    plain = [job(gpus=1, tenant="heavy", submit=1.0), job(gpus=1, tenant="light", submit=2.0)]
    first = FifoPolicy().decide(state.snapshot({}), plain, 10.0)[0]
    assert first.job_id == plain[0].id


def test_priority_keeps_precedence_over_the_factor() -> None:
    fs = FairShare(half_life_s=DAY, weights=GPU_ONLY)
    fs.charge("heavy", 8, 0, 0, 0.0, 5.0)
    fs.note("light")
    urgent = job(gpus=1, tenant="heavy", submit=1.0)
    object.__setattr__(urgent, "spec", _with_priority(urgent.spec, 5))
    queue = [urgent, job(gpus=1, tenant="light", submit=2.0)]
    assert _ordered(FifoPolicy(), queue, fs) == ["heavy"]


def _with_priority(spec, priority):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(spec, priority=priority)


def test_qssf_and_drf_rank_by_the_factor_first() -> None:
    fs = FairShare(half_life_s=DAY, weights=GPU_ONLY)
    fs.charge("heavy", 8, 0, 0, 0.0, 5.0)
    fs.note("light")
    short = job(gpus=1, tenant="heavy", submit=1.0)
    short.annotations["duration_estimate_s"] = 10.0
    long = job(gpus=1, tenant="light", submit=2.0)
    long.annotations["duration_estimate_s"] = 10_000.0
    assert _ordered(QssfPolicy(placement="pack"), [short, long], fs) == ["light"]
    # Without fair share QSSF runs the short job first.
    for j in (short, long):
        j.annotations.pop(FACTOR_KEY)
    state = ClusterState()
    state.upsert_node(gpu_node("n", gpus=1, cores=4))
    assert QssfPolicy(placement="pack").decide(state.snapshot({}), [short, long],
                                               10.0)[0].job_id == short.id
    queue = [job(gpus=1, tenant="heavy", submit=1.0), job(gpus=1, tenant="light", submit=2.0)]
    assert _ordered(DrfPolicy(), queue, fs) == ["light"]


def _hist(jid: str, account: str, runs: list[Run], state: str = "finished",
          submit: float = 0.0, util: float | None = None, requeued: list[float] | None = None,
          user: str = "u", model: str | None = "A100") -> JobHistory:
    end = runs[-1].end if runs and state != "running" else None
    return JobHistory(id=jid, account=account, user=user, name=jid, kind="training",
                      gpus=runs[0].gpus if runs else 1, cpus=1, memory_mib=0, gpu_model=model,
                      submit=submit, state=state, end=end, runs=runs,
                      requeued_at=requeued or [], gpu_util=util)


def _h(x: float) -> object:
    return pytest.approx(x, abs=1e-4)  # the report rounds to 4 decimals


def test_report_aggregates_gpu_hours_states_waits_and_requeues() -> None:
    jobs = [
        _hist("a1", "phys", [Run(100.0, 3700.0, 2, 1, 0)], submit=0.0, util=0.5),
        _hist("a2", "phys", [Run(1000.0, 2000.0, 1, 1, 0), Run(3000.0, 6600.0, 1, 1, 0)],
              state="failed", submit=900.0, requeued=[2000.0]),
        _hist("b1", "bio", [Run(500.0, None, 4, 1, 0)], state="running", submit=200.0),
        _hist("b2", "bio", [], state="cancelled", submit=300.0),
        _hist("late", "bio", [Run(9000.0, 9500.0, 8, 1, 0)], submit=8000.0),
    ]
    rows = {r["account"]: r for r in report_jobs(jobs, "account", 0.0, 7200.0)}
    phys, bio = rows["phys"], rows["bio"]
    assert phys["gpu_hours_allocated"] == _h(2.0 + (1000 + 3600) / 3600)
    assert phys["gpu_hours_busy"] == _h(1.0)  # a1 only: 2 GPU-h at 50%
    assert phys["gpu_hours_measured"] == _h(2.0)
    assert phys["jobs"]["finished"] == 1 and phys["jobs"]["failed"] == 1
    assert phys["wait_p50_s"] == 100.0 and phys["wait_p95_s"] == 100.0
    assert phys["requeues"] == 1
    assert bio["gpu_hours_allocated"] == _h(4 * (7200 - 500) / 3600)
    assert bio["gpu_hours_busy"] is None
    assert bio["running"] == 1 and bio["jobs"]["cancelled"] == 0  # b2 never ended in window
    # The window clips runs: only the second hour.
    clipped = {r["account"]: r for r in report_jobs(jobs, "account", 3600.0, 7200.0)}
    assert clipped["phys"]["gpu_hours_allocated"] == _h((2 * 100 + 3000) / 3600)
    by_model = report_jobs(jobs, "gpu-model", 0.0, 7200.0)
    assert [r["gpu_model"] for r in by_model] == ["A100"]
    with pytest.raises(ValueError, match="--by"):
        report_jobs(jobs, "colour", 0.0, 1.0)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile([], 50) is None
    assert math.isclose(percentile([3.0], 95) or 0, 3.0)
