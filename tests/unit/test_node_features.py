"""Node features and a job's --constraint (masterd.core.eligibility): every policy places a
job that selects features only on nodes that have all of them, the core refuses a start a
policy got wrong, a feature no node has is refused at submission, and trellisctl and batch
scripts spell it as Slurm does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from control.cli import build_parser
from control.submit import jobs_from_args
from control.usage import UsageError
from control.values import parse_constraint
from masterd.core.policies import REGISTRY, make_policy
from masterd.core.policy import Decision, Start
from masterd.core.scheduler import JobError, SchedulingCore
from masterd.core.waiting import WaitExplainer
from shared.model import Job, NodeAllocation, NodeSelector, Placement
from shared.schema import decode
from tests.unit.helpers import inventory, job

IB = NodeSelector(features=("ib",))


def cluster(policy: object) -> SchedulingCore:
    """``a`` is every placer's best fit (fewest free GPUs); only ``b`` has the feature."""
    core = SchedulingCore(policy)  # type: ignore[arg-type]
    core.node_up(inventory("a", gpus=4, cpus=16))
    core.node_up(replace(inventory("b", gpus=8, cpus=16), features=("ib", "nvlink")))
    return core


def genie(job_id: str, t: float, **kw: object) -> Job:
    # What GENIE's and SCHED²'s predictions read, so every policy can place it.
    return job(job_id, gpus=2, t=t, iterations=1000, batch=64, model_type="resnet50", **kw)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_places_a_selecting_job_only_on_nodes_with_its_features(
        name: str) -> None:
    core = cluster(make_policy(name))
    core.submit(genie("ib", 0, selector=IB))
    core.submit(job("cpu", gpus=0, cpus=2, t=1, selector=NodeSelector(("nvlink", "ib"))))
    core.submit(genie("plain", 2))
    started: dict[str, tuple[str, ...]] = {}
    for now in (10.0, 20.0, 30.0):
        started.update({d.job_id: d.placement.nodes for d in core.schedule(now)
                        if isinstance(d, Start)})
    assert started.get("ib") == ("b",) and started.get("cpu") == ("b",), started


class _Stubborn:
    """A policy that searched by GPU model alone: it puts everything on node a."""

    def decide(self, snapshot: object, queue: list[Job], now: float) -> list[Decision]:
        return [Start(j.id, Placement((NodeAllocation("a", (0,), (0,), 0),)))
                for j in queue[:1]]


def test_the_core_refuses_a_start_on_a_node_the_job_may_not_use() -> None:
    core = cluster(_Stubborn())
    core.submit(job("ib", gpus=1, t=0, selector=IB))
    assert core.schedule(1) == []
    assert core.jobs["ib"].state.value == "queued" and core.cluster.allocation("ib") is None


def test_a_feature_no_node_has_is_refused_with_one_sentence() -> None:
    core = cluster(make_policy("fifo"))
    with pytest.raises(JobError, match=r"no node has the feature hdr$"):
        core.check_submittable(job("x", gpus=1, selector=NodeSelector(("ib", "hdr"))).spec)
    with pytest.raises(JobError, match=r"no node has the features hdr, gpu80$"):
        core.check_submittable(job("x", gpus=1, selector=NodeSelector(("hdr", "gpu80"))).spec)
    core.node_up(replace(inventory("c", gpus=4, cpus=16), features=("hdr",)))
    with pytest.raises(JobError, match="no node has all of the features ib&hdr"):
        core.check_submittable(job("x", gpus=1, selector=NodeSelector(("ib", "hdr"))).spec)
    with pytest.raises(JobError, match="asks for 16 GPUs but the nodes with the features ib "
                                       "have 8"):
        core.check_submittable(job("x", gpus=16, selector=IB).spec)
    core.check_submittable(job("x", gpus=8, selector=IB).spec)  # fits b when it is free


def test_a_waiting_job_is_told_which_nodes_it_waits_for() -> None:
    core = cluster(make_policy("fifo"))
    core.submit(job("big", gpus=8, t=0, selector=IB))
    core.schedule(1)
    core.submit(job("more", gpus=2, t=2, selector=IB))
    core.schedule(3)
    assert WaitExplainer(core).why(core.jobs["more"]) == (
        "no_fit", "no node with ib has 2 free GPUs now")


def test_constraint_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_constraint("a100&ib&a100") == ["a100", "ib"]
    for text, why in (("a|b", "only features joined by & are supported"),
                      ("[a|b]", "not '\\|'"), ("a*2", "not '\\*'"), ("a&&b", "'' is not a"),
                      ("a b", "'a b' is not a feature name"), (" ", "names no feature")):
        with pytest.raises(UsageError, match=why):
            parse_constraint(text)
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["submit", "--user", "nobody", "-C", "a100&ib", "--gpus",
                                      "1", "--", "true"])
    (wire,), _ = jobs_from_args(args)
    assert wire["selector"] == {"features": ["a100", "ib"]}
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --constraint=nvlink&ib\n#SBATCH -G 1\ntrue\n")
    args = build_parser().parse_args(["submit", "--user", "nobody", str(script)])
    (wire,), _ = jobs_from_args(args)
    assert wire["selector"] == {"features": ["nvlink", "ib"]}
    spec = decode(type(job("x").spec), {**wire, "user": "nobody"})
    assert spec.selector.features == ("nvlink", "ib")
    script.write_text("#!/bin/bash\n#SBATCH -C a|b\ntrue\n")
    args = build_parser().parse_args(["submit", "--user", "nobody", str(script)])
    with pytest.raises(UsageError, match=r"job.sh line 2: -C=a\|b: only features joined by &"):
        jobs_from_args(args)
