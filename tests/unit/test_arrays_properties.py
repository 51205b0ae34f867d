"""Property tests: random clusters and event sequences driven through a SchedulingCore.

After every pass: no unit is given twice, every start outside a job's array is a loan from an
allowed lender (and says so), quotas hold, and no owner job waits on units a borrower holds
unless that borrower is already being preempted. Preempted jobs come back at the queue's head.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masterd.core.arrays import ArrayConfig, ArrayPolicy
from masterd.core.arrays.accounting import allocs, holdings, tenant_usage
from masterd.core.arrays.layout import GPU_CPU, ArrayId
from masterd.core.arrays.policy import _release
from masterd.core.arrays.views import Scratch, ViewBuilder
from masterd.core.placement import FreePool, pack
from masterd.core.policies import soda_arrays
from masterd.core.policy import Preempt, Start
from masterd.core.scheduler import JobError, SchedulingCore
from shared.model import Job, JobSpec, JobState, NodeInventory
from tests.unit.arrays_fixtures import complete_preemption, cpu_node, gpu_node, job

INNER = st.sampled_from(["fifo", {"name": "fifo", "backfill": True}, "drf"])


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeInventory]:
    nodes = [
        gpu_node(f"g{i}", draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from(["A", "B"])),
                 draw(st.sampled_from([8, 12])), memory_mib=draw(st.sampled_from([64, 256])))
        for i in range(draw(st.integers(2, 4)))
    ]
    if draw(st.booleans()):
        nodes.append(cpu_node("c0", cores=draw(st.sampled_from([4, 8])), memory_mib=256))
    return nodes


@st.composite
def configs(draw: st.DrawFn) -> dict[str, object]:
    quota: dict[str, object] = {}
    if draw(st.booleans()):
        quota["small"] = {"gpus": draw(st.integers(1, 6))}
    if draw(st.booleans()):
        quota["cpu"] = {"cores": draw(st.integers(1, 6))}
    return {
        "models": {"*": {
            "large": draw(st.sampled_from([0.0, 0.3, 0.5, 1.0, 8])),
            "cpu_job_cores": draw(st.integers(0, 4)),
        }},
        "inner": {"small": draw(INNER), "large": draw(INNER), "cpu": draw(INNER)},
        "tenants": {"t1": {"quota": quota, "borrow_over_quota": draw(st.booleans())}},
        "lending": draw(st.sampled_from(["idle", "free"])),
    }


actions = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from([0, 1, 1, 2, 3, 4, 8]),
                  st.integers(1, 4), st.sampled_from(["A", "B", None]),
                  st.sampled_from(["t1", "t2"]), st.sampled_from([0, 0, 16, 48])),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("exit"), st.integers(0, 50)),
    ),
    min_size=4,
    max_size=30,
)


def may_lend(spec: JobSpec, job_array: ArrayId) -> set[ArrayId]:
    """SODA's loans, written out independently of the code under test."""
    models = ["A", "B"]
    if job_array.kind == "cpu":  # CPU jobs borrow the GPU-job cores
        return {ArrayId(GPU_CPU, m) for m in models}
    other = "large" if job_array.kind == "small" else "small"
    out = {ArrayId(other, job_array.gpu_model)}  # small <-> large of one model
    if spec.gpu_model is None:  # no model named: any model's GPU arrays and their cores
        out |= {ArrayId(k, m) for k in ("small", "large") for m in models}
        out |= {ArrayId(GPU_CPU, m) for m in models}
        out -= {job_array, ArrayId(GPU_CPU, job_array.gpu_model)}
    return out


def _stopping(j: Job) -> bool:
    return j.reason.startswith("preempted")


def check_pass(pol: ArrayPolicy, core: SchedulingCore, now: float,
               borrowed_at_start: dict[str, bool]) -> None:
    snapshot, queue = core.snapshot(), core.queue()
    result = pol.plan(snapshot, queue, now)
    amap = pol.array_map(snapshot)
    queued = {j.id: j for j in queue}
    free_gpus = {n: set(v.free_gpus) for n, v in snapshot.nodes.items() if v.schedulable}
    free_cpus = {n: set(v.free_cpus) for n, v in snapshot.nodes.items() if v.schedulable}
    free_mem = {n: v.free_memory_mib for n, v in snapshot.nodes.items() if v.schedulable}
    for d in result.decisions:
        if isinstance(d, Preempt):
            assert d.job_id in snapshot.running
            continue
        assert d.job_id in queued
        for alloc in d.placement.allocations:
            # Never twice, never a busy or unschedulable unit, never more memory than free.
            assert set(alloc.gpus) <= free_gpus[alloc.node]
            assert set(alloc.cpus) <= free_cpus[alloc.node]
            free_gpus[alloc.node] -= set(alloc.gpus)
            free_cpus[alloc.node] -= set(alloc.cpus)
            free_mem[alloc.node] -= alloc.memory_mib
            assert free_mem[alloc.node] >= 0
        spec = queued[d.job_id].spec
        home = amap.home(spec)
        assert home is not None
        lent = amap.borrowed_units(allocs(d.placement), home)
        if lent:
            assert result.notes[d.job_id].startswith("borrowing")
            assert set(lent) <= may_lend(spec, home.job_array), (lent, spec)
    applied = core.schedule(now)
    assert [d for d in applied if isinstance(d, Start)] == [
        d for d in result.decisions if isinstance(d, Start)
    ]
    for d in applied:
        if isinstance(d, Start):
            borrowed_at_start[d.job_id] = d.job_id in result.notes and result.notes[
                d.job_id].startswith("borrowing")
            for node in d.placement.nodes:
                core.node_started(d.job_id, node, now)


def check_state(pol: ArrayPolicy, core: SchedulingCore,
                borrowed_at_start: dict[str, bool]) -> None:
    snapshot, queue = core.snapshot(), core.queue()
    amap = pol.array_map(snapshot)
    held = holdings(amap, snapshot.running)
    # A running job is outside its array only if it started as a loan.
    for job_id, h in held.items():
        if h.is_borrower:
            assert borrowed_at_start[job_id], job_id
    # Quotas hold.
    usage = tenant_usage(amap, held)
    for (tenant, array), (g, c) in usage.items():
        quota = pol.config.tenant(tenant).quota_for(array.name, array.kind)
        assert quota.gpus is None or g <= quota.gpus
        assert quota.cores is None or c <= quota.cores
    # No owner waits on units a borrower holds unless a borrower is on its way out.
    views = ViewBuilder()
    scratch = Scratch(snapshot)
    for array in amap.arrays:
        if array.kind == GPU_CPU:
            continue
        allowed = (frozenset({array}) if array.kind == "cpu"
                   else frozenset({array, ArrayId(GPU_CPU, array.gpu_model)}))
        view = views.view(snapshot, amap, allowed, scratch, {}, gpu_view=array.holds_gpus)
        pool = FreePool(view)
        owners = []
        for j in queue:
            home = amap.home(j.spec)
            if home is None or home.job_array != array:
                continue
            quota = pol.config.tenant(j.spec.tenant).quota_for(array.name, array.kind)
            g, c = usage.get((j.spec.tenant, array), [0, 0])
            if quota.allows(g, c, j.spec.gpus, j.spec.cpus) and pack(j.spec, pool) is None:
                owners.append(j)
        if not owners:
            continue
        borrowers = [h for h in held.values() if set(h.borrowed) & allowed]
        for h in borrowers:
            _release(pool, h, +1)
        if pack(owners[0].spec, pool) is not None:
            assert any(_stopping(h.job) for h in borrowers), (
                f"{owners[0].id} waits in {array.name} on loans to "
                f"{[h.job.id for h in borrowers]}"
            )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), configs(), actions)
def test_random_sequences_keep_the_array_invariants(
    nodes: list[NodeInventory], table: dict[str, object], steps: list[tuple]  # type: ignore[type-arg]
) -> None:
    pol = soda_arrays(ArrayConfig.from_table(table))
    core = SchedulingCore(pol)
    for inv in nodes:
        core.node_up(inv)
    borrowed_at_start: dict[str, bool] = {}
    serial = 0
    for step, action in enumerate(steps):
        now = float(step + 1)
        if action[0] == "submit":
            _, gpus, cpus, model, tenant, memory = action
            serial += 1
            j = job(gpus=gpus, cpus=cpus, model=model if gpus else None, tenant=tenant,
                    memory_mib=memory, submit=now, job_id=f"x{serial}")
            try:
                core.check_submittable(j.spec)
            except JobError:
                continue
            core.submit(j)
        else:
            active = sorted(core.running())
            stopping = [i for i in active if _stopping(core.jobs[i])]
            if action[0] == "finish":
                live = [i for i in active if i not in stopping]
                if not live:
                    continue
                victim = core.jobs[live[action[1] % len(live)]]
                assert victim.placement is not None
                for node in victim.placement.nodes:
                    core.node_exited(victim.id, node, 0, None, now)
                assert victim.state is JobState.FINISHED
            else:
                if not stopping:
                    continue
                victim = core.jobs[stopping[action[1] % len(stopping)]]
                complete_preemption(core, victim.id, now)
                # Back at the head: nobody ahead of it was re-queued fewer times.
                order = core.queue()
                ahead = order[: order.index(victim)]
                assert all(a.requeue_priority >= victim.requeue_priority for a in ahead)
        check_pass(pol, core, now, borrowed_at_start)
        check_state(pol, core, borrowed_at_start)
