"""SchedulingCore.unsatisfiable caches fits_cluster per spec shape: the cached answer must
follow nodes joining, leaving and changing inventory, and errors must name their job."""

from __future__ import annotations

import random

import pytest

from masterd.core.placement import fits_cluster
from masterd.core.policies.fifo import FifoPolicy
from masterd.core.scheduler import JobError, SchedulingCore
from shared.model import JobKind, JobSpec
from tests.unit.helpers import inventory, job


@pytest.fixture
def core() -> SchedulingCore:
    c = SchedulingCore(FifoPolicy())
    c.node_up(inventory("a", gpus=8))
    return c


def test_answer_follows_nodes_joining_and_leaving(core: SchedulingCore) -> None:
    big = job("big", gpus=16).spec
    reason = core.unsatisfiable(big)
    assert reason is not None and "16 GPUs" in reason
    with pytest.raises(JobError) as info:
        core.check_submittable(big)
    assert info.value.code == "unsatisfiable"
    assert str(info.value).startswith("job big: ")

    core.node_up(inventory("b", gpus=8))
    assert core.unsatisfiable(big) is None
    core.check_submittable(big)

    core.cluster.remove_node("b")
    assert core.unsatisfiable(big) is not None
    with pytest.raises(JobError, match=r"^job big: "):
        core.check_submittable(big)


def test_answer_follows_an_inventory_change(core: SchedulingCore) -> None:
    big = job("big", gpus=16).spec
    assert core.unsatisfiable(big) is not None
    core.node_up(inventory("a", gpus=16))  # the same node re-registers with more GPUs
    assert core.unsatisfiable(big) is None
    core.node_up(inventory("a", gpus=8))
    assert core.unsatisfiable(big) is not None

    h100 = job("h", gpus=4, gpu_model="H100").spec
    assert core.unsatisfiable(h100) == "no node of model H100 is registered"
    core.node_up(inventory("a", gpus=8, model="H100"))
    assert core.unsatisfiable(h100) is None
    assert core.unsatisfiable(job("x", gpus=4, gpu_model="A100").spec) is not None


def test_draining_does_not_change_the_answer(core: SchedulingCore) -> None:
    small = job("small", gpus=8).spec
    assert core.unsatisfiable(small) is None
    core.set_drained("a", True)
    core.node_down("a")
    assert core.unsatisfiable(small) is None
    assert fits_cluster(small, core.cluster.snapshot({})) is None


def test_the_message_names_each_job_of_a_cached_shape(core: SchedulingCore) -> None:
    names = []
    for name in ("first", "second", "third"):
        with pytest.raises(JobError) as info:
            core.check_submittable(job(name, gpus=16).spec)
        names.append(str(info.value).split(":", 1)[0])
    assert names == ["job first", "job second", "job third"]


def test_cpu_jobs_are_keyed_by_cores(core: SchedulingCore) -> None:
    def cpu(name: str, cpus: int) -> JobSpec:
        return JobSpec(name=name, command=("true",), user="nobody", kind=JobKind.CPU,
                       gpus=0, cpus=cpus)

    assert core.unsatisfiable(cpu("small", 16)) is None
    assert core.unsatisfiable(cpu("large", 17)) is not None
    core.node_up(inventory("wide", gpus=0, cpus=64))
    assert core.unsatisfiable(cpu("large", 17)) is None
    assert core.unsatisfiable(cpu("huge", 65)) is not None


def test_cached_answers_equal_a_fresh_scan() -> None:
    """Random node churn: every answer equals fits_cluster on the cluster of that moment."""
    rng = random.Random(755)
    core = SchedulingCore(FifoPolicy())
    specs = [
        job(f"s{i}", gpus=g, max_nodes=m, gpu_model=model).spec
        for i, (g, m, model) in enumerate(
            (g, m, model) for g in (1, 3, 4, 8, 12, 16, 24, 32) for m in (None, 1, 2)
            for model in (None, "A100", "H100"))
    ] + [JobSpec(name=f"c{c}", command=("true",), user="nobody", kind=JobKind.CPU, gpus=0,
                 cpus=c) for c in (1, 8, 16, 17, 40)]
    names = [f"n{i}" for i in range(6)]
    for _ in range(150):
        op = rng.random()
        name = rng.choice(names)
        if op < 0.5:
            core.node_up(inventory(name, gpus=rng.choice((0, 2, 4, 8, 16)),
                                   cpus=rng.choice((8, 16, 32)),
                                   model=rng.choice(("A100", "H100"))))
        elif op < 0.8:
            core.cluster.remove_node(name)
        elif core.cluster.node(name) is not None:
            core.set_drained(name, rng.random() < 0.5)
        for spec in rng.sample(specs, 12):
            assert core.unsatisfiable(spec) == fits_cluster(spec, core.cluster.snapshot({}))
