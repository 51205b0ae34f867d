"""--exclusive (NodeSelector.exclusive): a job gets whole nodes that run nothing else, every
GPU, core and byte of memory of them, and nothing else is placed there while it runs; the
core holds every policy to it (a start on a busy node is refused, one on an idle node is
widened), and the wait reason says what it waits for. The spellings of trellisctl and of
batch scripts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from control.cli import build_parser
from control.submit import jobs_from_args
from masterd.core.policies import REGISTRY, make_policy
from masterd.core.policy import Start
from masterd.core.scheduler import SchedulingCore
from masterd.core.waiting import WaitExplainer
from shared.model import NodeSelector
from tests.unit.helpers import inventory, job

COMMON: dict[str, Any] = {"iterations": 1000, "batch": 64, "model_type": "resnet50"}


def exclusive(name: str, gpus: int, t: float) -> Any:
    made = job(name, gpus=gpus, t=t, cpus=1, **COMMON)
    return replace(made, spec=replace(made.spec, selector=NodeSelector(exclusive=True)))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_gives_an_exclusive_job_whole_idle_nodes(name: str) -> None:
    core = SchedulingCore(make_policy(name))
    core.node_up(inventory("a", gpus=4, cpus=8))
    core.node_up(inventory("b", gpus=4, cpus=8))
    core.submit(job("small", gpus=1, t=0, cpus=1, **COMMON))
    started: dict[str, Any] = {}
    for now in (1.0, 2.0, 3.0):
        started.update({d.job_id: d.placement for d in core.schedule(now)
                        if isinstance(d, Start)})
    if "small" not in started:
        pytest.skip(f"{name} starts nothing here (it profiles or batches first)")
    busy = started["small"].nodes[0]
    core.submit(exclusive("whole", gpus=1, t=5))
    core.submit(job("after", gpus=1, t=6, cpus=1, **COMMON))
    for now in (10.0, 20.0, 30.0, 40.0):
        started.update({d.job_id: d.placement for d in core.schedule(now)
                        if isinstance(d, Start)})
    whole = started.get("whole")
    assert whole is not None, (name, started)
    (alloc,) = whole.allocations
    assert alloc.node != busy, (name, whole)
    assert (len(alloc.gpus), len(alloc.cpus)) == (4, 8), (name, whole)
    # Nothing shares a node with the exclusive job.
    if "after" in started:
        assert whole.nodes[0] not in started["after"].nodes, (name, started)


def test_an_exclusive_job_waits_for_an_idle_node_and_says_so() -> None:
    core = SchedulingCore(make_policy("fifo"))
    core.node_up(inventory("a", gpus=4, cpus=8))
    core.submit(job("small", gpus=1, t=0, cpus=1))
    assert [d.job_id for d in core.schedule(1.0) if isinstance(d, Start)] == ["small"]
    core.submit(exclusive("whole", gpus=1, t=2))
    assert core.schedule(3.0) == []
    assert WaitExplainer(core).why(core.jobs["whole"]) == (
        "no_fit", "no node (whole nodes) is idle now (--exclusive takes whole nodes that run "
                  "nothing else)")


def test_a_policy_start_on_a_busy_node_is_refused_by_the_core() -> None:
    """A policy that placed an exclusive job beside another (its own search) gets its start
    refused: the job stays queued, the node keeps its one job."""
    core = SchedulingCore(make_policy("fifo"))
    core.node_up(inventory("a", gpus=4, cpus=8))
    core.submit(job("small", gpus=1, t=0, cpus=1))
    (first,) = [d for d in core.schedule(1.0) if isinstance(d, Start)]
    core.submit(exclusive("whole", gpus=1, t=2))
    whole = core.jobs["whole"]
    taken = set(first.placement.allocations[0].gpus)
    free = [g for g in range(4) if g not in taken]
    placement = replace(first.placement, allocations=(replace(
        first.placement.allocations[0], gpus=(free[0],), cpus=(7,)),))
    assert core._whole_nodes(placement) is None
    assert whole.state.value == "queued"


def test_exclusive_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    def jobs(*argv: str) -> list[dict[str, Any]]:
        args = build_parser().parse_args(["submit", "--user", "nobody", *argv])
        return jobs_from_args(args)[0]

    assert jobs("--exclusive", "--", "true")[0]["selector"] == {"exclusive": True}
    assert "selector" not in jobs("--", "true")[0]
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --exclusive\ntrue\n")
    assert jobs(str(script))[0]["selector"] == {"exclusive": True}
