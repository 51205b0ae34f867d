"""Quota admission (masterd/core/quotas.py) driven through the SchedulingCore: caps and
ceilings close the quota gate, borrowing runs on idle resources, reclaim preempts the newest
borrowers for an owner within its quota, and a parent's limits bound its subtree."""

from __future__ import annotations

from masterd.core.policies import make_policy
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.policy import Preempt, Start
from masterd.core.quotas import QuotaAdmission
from masterd.core.scheduler import SchedulingCore
from shared.accounts import Account, AccountCaps, AccountTree, Resources
from shared.model import JobState
from tests.unit.helpers import inventory, job


def make(accounts: list[Account], nodes: int = 1, gpus: int = 4) -> SchedulingCore:
    core = SchedulingCore(FifoPolicy(backfill=True))
    for i in range(nodes):
        core.node_up(inventory(f"n{i}", gpus=gpus, cpus=16))
    core.set_admission(QuotaAdmission(AccountTree.of(accounts)))
    return core


def started(decisions: list) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Start)]


def preempted(decisions: list) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, Preempt)]


def run(core: SchedulingCore, ids: list[str], now: float) -> None:
    for job_id in ids:
        core.node_started(job_id, core.jobs[job_id].placement.nodes[0], now)


def finish(core: SchedulingCore, job_id: str, now: float) -> None:
    for node in list(core.jobs[job_id].node_states):
        core.node_exited(job_id, node, 0, None, now)


def test_running_jobs_cap_gates_with_reason_quota_and_opens_when_a_job_ends() -> None:
    core = make([Account("a", caps=AccountCaps(running_jobs=2))])
    for i in range(3):
        core.submit(job(f"j{i}", gpus=1, t=i, tenant="a"))
    assert started(core.schedule(1)) == ["j0", "j1"]
    waiting = core.jobs["j2"]
    assert waiting.state is JobState.QUEUED and waiting.wait == "quota"
    assert "running_jobs cap (2)" in waiting.reason
    run(core, ["j0", "j1"], 2)
    finish(core, "j0", 3)
    assert started(core.schedule(4)) == ["j2"]


def test_one_pass_never_starts_more_than_the_ceiling() -> None:
    # Each job alone fits the account's quota + borrowing limit; the three together do not.
    core = make([Account("a", quota=Resources(gpus=1), borrowing_limit=Resources(gpus=1))])
    for i in range(3):
        core.submit(job(f"j{i}", gpus=1, t=i, tenant="a"))
    assert started(core.schedule(1)) == ["j0", "j1"]
    assert "over its quota + borrowing limit (2)" in core.jobs["j2"].reason


def test_hard_quota_leaves_resources_idle_borrowing_uses_them() -> None:
    hard = make([Account("a", quota=Resources(gpus=2), borrowing_limit=Resources(gpus=0)),
                 Account("b", quota=Resources(gpus=2), borrowing_limit=Resources(gpus=0))])
    soft = make([Account("a", quota=Resources(gpus=2)), Account("b", quota=Resources(gpus=2))])
    for core in (hard, soft):
        for i in range(4):
            core.submit(job(f"j{i}", gpus=1, t=i, tenant="a"))
    assert started(hard.schedule(1)) == ["j0", "j1"]
    assert started(soft.schedule(1)) == ["j0", "j1", "j2", "j3"]


def test_reclaim_preempts_the_newest_borrowers_for_an_owner_within_quota() -> None:
    core = make([Account("a", quota=Resources(gpus=2)), Account("b", quota=Resources(gpus=2))])
    for i in range(4):
        core.submit(job(f"a{i}", gpus=1, t=i, tenant="a"))
    started(core.schedule(1))
    run(core, ["a0", "a1"], 1)
    run(core, ["a2"], 2)
    run(core, ["a3"], 3)  # a3 is the newest borrower
    core.submit(job("b0", gpus=1, t=5, tenant="b"))
    decisions = core.schedule(5)
    assert started(decisions) == []
    assert preempted(decisions) == ["a3"]
    assert core.jobs["a3"].reason.startswith("preempted: reclaimed: account 'b'")
    # The owner moved to the head of the queue; the victim is not preempted twice.
    assert core.queue()[0].id == "b0"
    assert preempted(core.schedule(6)) == []
    core.node_exited("a3", "n0", None, 15, 7)
    a3 = core.jobs["a3"]
    assert a3.state is JobState.QUEUED and "reclaimed" in a3.reason
    # The requeued victim goes behind the owner: b0 starts on what a3 freed.
    assert started(core.schedule(8))[0] == "b0"
    # The owner started: borrowing may resume once resources are idle again.
    assert core.admission is not None and not core.admission.reclaiming
    assert core.jobs["a3"].wait == ""


def test_nothing_borrows_while_a_reclaim_is_pending() -> None:
    core = make([Account("a", quota=Resources(gpus=2)), Account("b", quota=Resources(gpus=2))])
    for i in range(4):
        core.submit(job(f"a{i}", gpus=1, t=i, tenant="a"))
    core.schedule(1)
    for i in range(4):
        run(core, [f"a{i}"], 1 + i)
    core.submit(job("b0", gpus=2, t=5, tenant="b"))
    assert sorted(preempted(core.schedule(5))) == ["a2", "a3"]
    core.node_exited("a3", "n0", None, 15, 6)  # a2 is still stopping: one GPU free
    core.submit(job("c0", gpus=1, t=6, tenant="a"))
    # Backfill would put a3 or c0 on the free GPU: both would take a over its quota.
    assert started(core.schedule(6)) == []
    held = [core.jobs[j] for j in ("a3", "c0") if core.jobs[j].wait == "quota"]
    assert held and all("being reclaimed (for b0)" in j.reason for j in held)
    core.node_exited("a2", "n0", None, 15, 7)
    assert started(core.schedule(7)) == ["b0"]
    # The reclaim is over: the held jobs are let go (and wait for room).
    assert all(core.jobs[j].wait != "quota" for j in ("a2", "a3", "c0"))


def test_reclaim_takes_only_what_the_owner_needs_and_never_below_a_quota() -> None:
    core = make([Account("a", quota=Resources(gpus=2)), Account("b", quota=Resources(gpus=3)),
                 Account("c", quota=Resources(gpus=3))], nodes=2, gpus=4)
    for i in range(4):
        core.submit(job(f"a{i}", gpus=1, t=i, tenant="a"))
    for i in range(4):
        core.submit(job(f"b{i}", gpus=1, t=10 + i, tenant="b"))
    assert len(started(core.schedule(20))) == 8
    for i, job_id in enumerate(["a0", "a1", "b0", "b1", "b2", "a2", "a3", "b3"]):
        run(core, [job_id], 20 + i)
    core.submit(job("c0", gpus=2, t=40, tenant="c"))
    # Borrowers: a (4 > 2, on n0) and b (4 > 3, on n1). c0 needs two GPUs of one node:
    # newest first b3, a3, then a2 frees two on n0; b3 is pruned (not needed). a may lose
    # two jobs (down to its quota), b only one.
    decisions = core.schedule(41)
    assert sorted(preempted(decisions)) == ["a2", "a3"]


def test_an_owner_over_its_own_quota_reclaims_nothing() -> None:
    core = make([Account("a", quota=Resources(gpus=2)), Account("b", quota=Resources(gpus=1))])
    for i in range(4):
        core.submit(job(f"a{i}", gpus=1, t=i, tenant="a"))
    core.schedule(1)
    run(core, ["a0", "a1", "a2", "a3"], 1)
    core.submit(job("b0", gpus=2, t=5, tenant="b"))  # 2 GPUs: over b's quota of 1
    assert preempted(core.schedule(5)) == []


def test_a_parents_limits_bound_its_subtree() -> None:
    core = make([Account("org", caps=AccountCaps(running_jobs=3),
                         quota=Resources(gpus=2), borrowing_limit=Resources(gpus=1)),
                 Account("x", parent="org"), Account("y", parent="org")], gpus=8)
    for i in range(2):
        core.submit(job(f"x{i}", gpus=1, t=i, tenant="x"))
        core.submit(job(f"y{i}", gpus=1, t=i + 0.5, tenant="y"))
    assert started(core.schedule(1)) == ["x0", "y0", "x1"]
    assert "account 'org'" in core.jobs["y1"].reason


def test_tree_changes_reopen_gates_and_jobs_outside_the_tree_are_unconstrained() -> None:
    core = make([Account("a", caps=AccountCaps(running_jobs=1))])
    core.submit(job("j0", gpus=1, tenant="a"))
    core.submit(job("j1", gpus=1, t=1, tenant="a"))
    core.submit(job("legacy", gpus=1, t=2, tenant="default"))
    assert started(core.schedule(1)) == ["j0", "legacy"]
    assert core.jobs["j1"].wait == "quota"
    assert core.admission is not None
    core.admission.set_tree(AccountTree.of([Account("a", caps=AccountCaps(running_jobs=2))]))
    assert core.jobs["j1"].wait == ""
    assert started(core.schedule(2)) == ["j1"]


def test_cancelling_a_gated_job_and_restoring_running_ones_keeps_the_counters() -> None:
    core = SchedulingCore(FifoPolicy())
    core.node_up(inventory("n0", gpus=4, cpus=16))
    running = job("r", gpus=1, tenant="a")
    running.state = JobState.RUNNING
    core.restore(running)
    core.submit(job("q", gpus=1, t=1, tenant="a"))
    # Attached after the restore: the running job is counted, the queued one gated.
    core.set_admission(QuotaAdmission(AccountTree.of([
        Account("a", caps=AccountCaps(running_jobs=1))])))
    assert core.jobs["q"].wait == "quota"
    core.cancel("q", 2)
    assert core.admission is not None
    assert core.admission.ledger.running("a") == 1
    core.set_admission(None)
    assert core.admission is None


def test_a_shared_gpu_charges_its_share() -> None:
    core = SchedulingCore(make_policy("liquid"))  # a policy that shares GPUs
    core.node_up(inventory("n0", gpus=4, cpus=16))
    core.set_admission(QuotaAdmission(AccountTree.of(
        [Account("a", quota=Resources(gpus=1), borrowing_limit=Resources(gpus=0))])))
    for i in range(3):
        core.submit(job(f"s{i}", gpus=1, t=i, tenant="a", gpu_milli=400))
    # 400 + 400 fit one GPU's quota, a third share would pass it.
    assert started(core.schedule(1)) == ["s0", "s1"]
    assert all(core.jobs[j].placement.allocations[0].shared for j in ("s0", "s1"))
    assert "would use 1.2 GPUs, over its quota + borrowing limit (1)" in core.jobs["s2"].reason
    assert core.admission is not None and core.admission.ledger.used("a")[0] == 800


def test_a_share_given_a_whole_gpu_charges_the_whole_gpu() -> None:
    """fifo does not share: a 400-milli job holds a GPU nobody else may use, and its account
    is charged that GPU (it was once charged 0.4, so five such jobs held five GPUs on a
    quota of two)."""
    core = make([Account("a", quota=Resources(gpus=1), borrowing_limit=Resources(gpus=0))])
    for i in range(3):
        core.submit(job(f"s{i}", gpus=1, t=i, tenant="a", gpu_milli=400))
    assert started(core.schedule(1)) == ["s0"]
    assert not core.jobs["s0"].placement.allocations[0].shared
    assert "would use 2 GPUs, over its quota + borrowing limit (1)" in core.jobs["s1"].reason
    assert core.admission is not None and core.admission.ledger.used("a")[0] == 1000
    run(core, ["s0"], 2)
    finish(core, "s0", 3)  # its whole GPU is given back
    assert core.admission.ledger.used("a")[0] == 0
    assert started(core.schedule(4)) == ["s1"]


def test_victims_not_needed_are_spared() -> None:
    # b's 2-GPU job needs one whole node. Newest first, the borrowers chosen are a6 (on n0,
    # where a0 still runs), a5 and a4 (n2, which then has room): a6 is not needed and keeps
    # running.
    core = make([Account("a", quota=Resources(gpus=2)), Account("b", quota=Resources(gpus=2))],
                nodes=3, gpus=2)
    for i in range(6):
        core.submit(job(f"a{i}", gpus=1, t=i, tenant="a"))
    core.schedule(1)
    on = {f"a{i}": core.jobs[f"a{i}"].placement.nodes[0] for i in range(6)}
    run(core, list(on), 2)
    finish(core, "a1", 3)  # frees one GPU beside a0
    core.submit(job("a6", gpus=1, t=3, tenant="a"))
    assert started(core.schedule(3)) == ["a6"]
    run(core, ["a6"], 4)
    assert core.jobs["a6"].placement.nodes[0] == on["a0"]
    core.submit(job("b0", gpus=2, t=20, tenant="b", max_nodes=1))
    victims = sorted(preempted(core.schedule(21)))
    assert victims == ["a4", "a5"] and on["a4"] == on["a5"] != on["a0"]


def test_an_owner_goes_ahead_of_a_borrowing_fifo_head_that_blocks_it() -> None:
    core = SchedulingCore(FifoPolicy())  # strict: the head blocks everything behind it
    core.node_up(inventory("n0", gpus=4, cpus=16))
    core.set_admission(QuotaAdmission(AccountTree.of([
        Account("a", quota=Resources(gpus=2)), Account("b", quota=Resources(gpus=2))])))
    core.submit(job("a0", gpus=2, t=0, tenant="a"))
    assert started(core.schedule(1)) == ["a0"]
    run(core, ["a0"], 1)
    core.submit(job("a1", gpus=4, t=2, tenant="a"))  # would borrow, does not fit: blocks
    core.submit(job("b0", gpus=1, t=3, tenant="b"))  # within b's quota, fits
    assert started(core.schedule(3)) == []
    assert core.queue()[0].id == "b0"  # moved ahead of the borrowing head
    assert started(core.schedule(4)) == ["b0"]


def test_a_queued_job_its_account_shrank_under_says_it_can_never_run_as_is() -> None:
    core = make([Account("a", quota=Resources(gpus=4), borrowing_limit=Resources(gpus=0))])
    core.submit(job("big", gpus=4, t=0, tenant="a"))
    core.submit(job("run", gpus=1, t=0, tenant="a"))
    assert core.admission is not None
    core.admission.set_tree(AccountTree.of(
        [Account("a", quota=Resources(gpus=2), borrowing_limit=Resources(gpus=0))]))
    assert started(core.schedule(1)) == ["run"]
    waiting = core.jobs["big"]
    assert waiting.wait == "quota" and waiting.reason == (
        "it asks for 4 GPUs, more than account 'a' may ever use (its quota + borrowing limit "
        "is 2); it runs only once that limit is raised")
