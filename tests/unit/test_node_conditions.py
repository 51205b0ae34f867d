"""Node conditions (masterd.core.conditions): a node is schedulable exactly when it has none,
whoever set them and in whatever order they come and go."""

from __future__ import annotations

import itertools

import pytest

from masterd.core.conditions import DISCONNECTED, DRAINED, POWER, NodeConditions
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.scheduler import JobError, SchedulingCore
from masterd.core.waiting import WaitExplainer
from tests.unit.helpers import inventory, job


def test_conditions_are_kept_per_kind_and_shown_most_fundamental_first() -> None:
    conditions = NodeConditions()
    assert conditions.schedulable("n1") and conditions.of("n1") == ()
    conditions.set("n1", POWER, "powered_off: idle", 5.0)
    conditions.set("n1", DISCONNECTED, "the node is not connected to the master")
    conditions.set("n1", DRAINED, "drained by an operator")
    assert [c.kind for c in conditions.of("n1")] == [DISCONNECTED, DRAINED, POWER]
    assert conditions.of("n1")[2].since == 5.0 and str(conditions.of("n1")[2]) == \
        "powered_off: idle"
    conditions.clear("n1", DISCONNECTED)
    conditions.clear("n1", DRAINED)
    assert not conditions.schedulable("n1") and conditions.has("n1", POWER)
    conditions.clear("n1", POWER)
    conditions.clear("n1", POWER)  # clearing twice is harmless
    assert conditions.schedulable("n1") and dict(conditions.closed()) == {}
    with pytest.raises(ValueError, match="node condition 'rebooting' is not one of "
                                         "disconnected, drained, maintenance, power"):
        conditions.set("n1", "rebooting", "why")


def test_every_order_of_setting_and_clearing_ends_schedulable_only_with_none_left() -> None:
    kinds = (DISCONNECTED, DRAINED, POWER)
    for order in itertools.permutations(kinds):
        core = SchedulingCore(FifoPolicy())
        core.node_up(inventory("n1", gpus=2, cpus=4))
        for kind in order:
            core.set_condition("n1", kind, f"{kind} for a test")
            assert not core.cluster.node("n1").schedulable  # type: ignore[union-attr]
        for i, kind in enumerate(reversed(order)):
            core.set_condition("n1", kind, None)
            left = len(order) - i - 1
            assert core.cluster.node("n1").schedulable == (left == 0)  # type: ignore[union-attr]


def test_undraining_a_disconnected_node_does_not_open_it() -> None:
    """The master once had to remember to close it again itself (node_down after undrain)."""
    core = SchedulingCore(FifoPolicy())
    core.node_up(inventory("n1", gpus=2, cpus=4))
    core.set_drained("n1", True, "new fans")
    core.node_down("n1")
    core.set_drained("n1", False)
    core.submit(job("j", gpus=1, t=0))
    assert core.schedule(1) == []
    assert [c.kind for c in core.node_conditions("n1")] == [DISCONNECTED]
    core.node_up(inventory("n1", gpus=2, cpus=4))  # reconnects
    assert [d.job_id for d in core.schedule(2)] == ["j"]


def test_an_inventory_update_keeps_the_nodes_conditions() -> None:
    core = SchedulingCore(FifoPolicy())
    core.node_up(inventory("n1", gpus=2, cpus=4))
    core.node_down("n1")
    core.update_inventory(inventory("n1", gpus=2, cpus=4))  # a GPU's health changed
    assert not core.cluster.node("n1").schedulable  # type: ignore[union-attr]
    with pytest.raises(JobError, match="node 'nx' is not registered"):
        core.set_drained("nx", True)


def test_the_wait_explainer_counts_the_closed_nodes_the_job_could_use() -> None:
    core = SchedulingCore(FifoPolicy())
    for name in ("a", "b", "c"):
        core.node_up(inventory(name, gpus=4, cpus=8, model="A100"))
    core.node_up(inventory("v", gpus=4, cpus=8, model="V100"))
    core.set_drained("a", True, "new fans")
    core.set_drained("b", True)
    core.node_down("c")
    core.node_down("v")  # another model: not one the job could use
    core.submit(job("j", gpus=2, t=0, gpu_model="A100"))
    core.schedule(1)
    explained = WaitExplainer(core).why(core.jobs["j"])
    assert explained == ("no_fit", "no node of A100 is up and schedulable now "
                                   "(2 drained, 1 not connected)")
    assert core.node_conditions("a")[0].reason == "drained by an operator: new fans"


def test_a_job_on_a_given_placement_passes_the_node_filter_and_the_permit() -> None:
    """Inference replicas bypass the queue and the policy, not a closed node or a quota."""
    from masterd.core.quotas import QuotaAdmission
    from shared.accounts import Account, AccountTree, Resources
    from shared.model import JobState, NodeAllocation, Placement

    core = SchedulingCore(FifoPolicy())
    core.node_up(inventory("a", gpus=2, cpus=4))
    core.node_up(inventory("b", gpus=2, cpus=4))
    core.set_admission(QuotaAdmission(AccountTree.of(
        [Account("svc", quota=Resources(gpus=1), borrowing_limit=Resources(gpus=0))])))
    core.set_drained("b", True, "new fans")

    def replica(job_id: str, node: str, gpu: int) -> object:
        placed = job(job_id, gpus=1, t=0, tenant="svc")
        placed.state = JobState.STARTING
        placed.placement = Placement((NodeAllocation(node, (gpu,), (gpu,), 0),))
        return placed

    with pytest.raises(JobError, match="node b takes no new work: drained by an operator: "
                                       "new fans") as closed:
        core.start_placed(replica("r1", "b", 0))  # type: ignore[arg-type]
    assert closed.value.code == "node_closed" and "r1" not in core.jobs
    core.start_placed(replica("r2", "a", 0))  # type: ignore[arg-type]
    assert core.cluster.allocation("r2") is not None and core.jobs["r2"].state is \
        JobState.STARTING
    with pytest.raises(JobError, match="account 'svc' would use 2 GPUs, over its quota") as over:
        core.start_placed(replica("r3", "a", 1))  # type: ignore[arg-type]
    assert over.value.code == "quota" and core.cluster.allocation("r3") is None
    with pytest.raises(JobError, match="cannot take its placement"):
        core.set_admission(None)
        core.start_placed(replica("r4", "a", 0))  # type: ignore[arg-type]  # r2 holds GPU 0
