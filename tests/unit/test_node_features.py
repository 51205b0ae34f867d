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
from control.values import parse_constraint, parse_hostlist
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
    with pytest.raises(JobError, match="asks for 16 GPUs but the nodes it selects \\(with ib\\) "
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


def test_constraint_and_exclude_spellings(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_constraint("a100&ib&a100") == {"features": ["a100", "ib"]}
    assert parse_constraint("a100|h100") == {"any_features": ["a100", "h100"]}
    for text, why in (("a&b|c", "& and \\| cannot be mixed"),
                      ("[a|b]", "not '\\['"), ("a*2", "not '\\*'"), ("a&&b", "'' is not a"),
                      ("a b", "'a b' is not a feature name"), (" ", "names no feature")):
        with pytest.raises(UsageError, match=why):
            parse_constraint(text)
    assert parse_hostlist("gpu[01-03,07],cpu1") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]
    for text, why in (("gpu[a-b]", "'a-b' in \\[...\\] is not N or N-M"),
                      ("a,,b", "an empty name between commas"), ("g[3-1]", "is empty"),
                      ("gp u", "'gp u' is not a node name"), ("", "names no node")):
        with pytest.raises(UsageError, match=why):
            parse_hostlist(text)
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["submit", "--user", "nobody", "-C", "a100&ib", "-x",
                                      "n[1-2]", "--gpus", "1", "--", "true"])
    (wire,), _ = jobs_from_args(args)
    assert wire["selector"] == {"features": ["a100", "ib"], "exclude": ["n1", "n2"]}
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --constraint=nvlink|ib\n#SBATCH -G 1\n"
                      "#SBATCH --exclude=gpu03\ntrue\n")
    args = build_parser().parse_args(["submit", "--user", "nobody", str(script)])
    (wire,), _ = jobs_from_args(args)
    assert wire["selector"] == {"any_features": ["nvlink", "ib"], "exclude": ["gpu03"]}
    spec = decode(type(job("x").spec), {**wire, "user": "nobody"})
    assert spec.selector.any_features == ("nvlink", "ib") and spec.selector.exclude == ("gpu03",)
    assert str(spec.selector) == "with nvlink|ib, not gpu03"
    script.write_text("#!/bin/bash\n#SBATCH -C a&b|c\ntrue\n")
    args = build_parser().parse_args(["submit", "--user", "nobody", str(script)])
    with pytest.raises(UsageError, match=r"job.sh line 2: -C=a&b\|c: & and \| cannot be mixed"):
        jobs_from_args(args)
    monkeypatch.setenv("SBATCH_EXCLUDE", "gpu[1-2")
    script.write_text("#!/bin/bash\n#SBATCH -G 1\ntrue\n")
    args = build_parser().parse_args(["submit", "--user", "nobody", str(script)])
    with pytest.raises(UsageError, match=r"SBATCH_EXCLUDE.*is not a node name"):
        jobs_from_args(args)


def test_any_of_features_and_excluded_nodes_select_nodes() -> None:
    core = cluster(make_policy("fifo"))
    core.node_up(replace(inventory("c", gpus=4, cpus=16), features=("h100",)))
    core.submit(job("any", gpus=4, t=0, selector=NodeSelector(any_features=("h100", "ib"))))
    core.submit(job("notb", gpus=4, t=1, selector=NodeSelector(exclude=("b",))))
    started = {d.job_id: d.placement.nodes for d in core.schedule(1) if isinstance(d, Start)}
    # a (4 GPUs, no feature) is everyone's best fit: "any" takes c, "notb" takes a.
    assert started == {"any": ("c",), "notb": ("a",)}
    with pytest.raises(JobError, match=r"no node has the feature hdr\|gpu80$"):
        core.check_submittable(job("x", gpus=1,
                                   selector=NodeSelector(any_features=("hdr", "gpu80"))).spec)
    with pytest.raises(JobError, match=r"no node matches what it selects \(not a,b,c\)"):
        core.check_submittable(job("x", gpus=1, selector=NodeSelector(exclude=("a", "b", "c"))
                                   ).spec)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_places_a_job_only_on_the_nodes_it_lists(name: str) -> None:
    core = cluster(make_policy(name))  # a is every placer's best fit
    core.submit(genie("listed", 0, selector=NodeSelector(only=("b",))))
    started: dict[str, tuple[str, ...]] = {}
    for now in (10.0, 20.0, 30.0):
        started.update({d.job_id: d.placement.nodes for d in core.schedule(now)
                        if isinstance(d, Start)})
    assert started.get("listed") == ("b",), started


def test_nodelist_spellings_and_a_node_that_does_not_exist(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["submit", "--user", "nobody", "-w", "n[1-2]", "--gpus",
                                      "1", "--", "true"])
    (wire,), _ = jobs_from_args(args)
    assert wire["selector"] == {"only": ["n1", "n2"]}
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --nodelist=gpu07\n#SBATCH -G 1\ntrue\n")
    args = build_parser().parse_args(["submit", "--user", "nobody", str(script)])
    (wire,), _ = jobs_from_args(args)
    assert wire["selector"] == {"only": ["gpu07"]}
    spec = decode(type(job("x").spec), {**wire, "user": "nobody"})
    assert str(spec.selector) == "on gpu07"
    with pytest.raises(UsageError, match=r"--nodelist 'gpu\[3-1\]': range '3-1' is empty"):
        jobs_from_args(build_parser().parse_args(["submit", "--user", "nobody", "-w",
                                                  "gpu[3-1]", "--", "true"]))
    core = cluster(make_policy("fifo"))
    with pytest.raises(JobError, match=r"no node matches what it selects \(on gpu07\)$"):
        core.check_submittable(spec)
