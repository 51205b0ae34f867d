"""noded's tuning loop (SODA §V-B2) against a modelled job: which cores, which events, restarts.

The loop's real parts (cgroup cpusets, the emulated GPU's progress meter, a real trainer) are
exercised by tests/e2e/test_soda_tuning.py; here the job is a model whose GPU utilisation
follows the cores it is pinned to, so every decision can be checked exactly.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from noded.cgroups import GroupLimits, GroupNotFoundError
from noded.gpu.base import GpuSample
from noded.jobs import JobPart
from noded.tuning import STATE_FILE, CoreTuning, rank_cores
from shared.config import TunerConfig
from shared.messages import CorePlan, PrepareJob
from shared.model import GpuInfo, JobSpec, NodeAllocation

FAST = TunerConfig(window_s=0.02, sample_interval_s=0.005, settle_s=0.0, warmup_s=0.0,
                   tolerance=2.0, noise=0.0, reference_windows=2, max_windows=3)
NUMA = {c: 0 if c < 4 else 1 for c in range(8)}  # cores 0-3 on NUMA 0, 4-7 on NUMA 1


class FakeCgroups:
    kind = "v1"

    def __init__(self) -> None:
        self.cpus: dict[str, tuple[int, ...]] = {}
        self.updates: list[tuple[str, tuple[int, ...]]] = []
        self.fail = False

    def limits(self, job_id: str) -> GroupLimits:
        if job_id not in self.cpus:
            raise GroupNotFoundError(f"job {job_id!r} has no cgroup")
        return GroupLimits(cpus=self.cpus[job_id], memory_bytes=1 << 30)

    def update(self, job_id: str, limits: GroupLimits) -> None:
        if self.fail:
            raise GroupNotFoundError(f"job {job_id!r} has no cgroup")
        assert limits.memory_bytes == 1 << 30  # the other limits are kept
        self.cpus[job_id] = limits.cpus
        self.updates.append((job_id, limits.cpus))


class ModelGpus:
    """GPU 1 (NUMA 1) runs the job; utilisation rises with its cores up to ``knee``."""

    name = "model"

    def __init__(self, cgroups: FakeCgroups, job_id: str, knee: int) -> None:
        self.cgroups, self.job_id, self.knee = cgroups, job_id, knee

    def inventory(self) -> tuple[tuple[GpuInfo, ...], Any]:
        gpus = tuple(GpuInfo(index=i, uuid=f"GPU-{i}", model="A100", memory_mib=1, numa_node=i)
                     for i in range(2))
        return gpus, ()

    def sample(self) -> list[GpuSample]:
        cores = len(self.cgroups.cpus.get(self.job_id, ()))
        util = 90.0 * min(cores, self.knee) / self.knee
        return [GpuSample(0, 0.0, 0, 1, (), True), GpuSample(1, util, 0, 1, (), True)]


class Runner:
    def __init__(self) -> None:
        self.parts: dict[str, JobPart] = {}


def part(tmp: Path, job_id: str, cpus: tuple[int, ...], plan: CorePlan | None) -> JobPart:
    spec = JobSpec(name=job_id, command=("train",), user="nobody", gpus=1, cpus=len(cpus))
    prep = PrepareJob(job_id=job_id, spec=spec,
                      allocation=NodeAllocation("n1", (1,), cpus, 0), cores=plan)
    (tmp / job_id).mkdir(exist_ok=True)
    p = JobPart(job_id, prep, tmp / job_id)
    p.state = "running"
    return p


def setup(tmp: Path, knee: int, plan: CorePlan | None,
          config: TunerConfig = FAST) -> tuple[CoreTuning, FakeCgroups, list[dict[str, Any]]]:
    cgroups = FakeCgroups()
    cpus = tuple(range(8))
    cgroups.cpus["j1"] = cpus
    runner = Runner()
    runner.parts["j1"] = part(tmp, "j1", cpus, plan)
    sent: list[dict[str, Any]] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        assert type_ == "cores_changed"
        sent.append(body)

    tuning = CoreTuning(runner, ModelGpus(cgroups, "j1", knee), cgroups, config,  # type: ignore[arg-type]
                        send, numa_of=NUMA, connected=asyncio.Event())
    return tuning, cgroups, sent


async def finish(tuning: CoreTuning, job_id: str = "j1") -> None:
    tuning.sync()
    task = tuning.tunings[job_id].task
    await asyncio.wait_for(task, 10)


def test_cores_on_the_gpus_numa_node_come_first() -> None:
    assert rank_cores(range(8), NUMA, {1}) == [4, 5, 6, 7, 0, 1, 2, 3]
    assert rank_cores([3, 1, 2], NUMA, set()) == [1, 2, 3]


async def test_tunes_to_the_knee_handing_cores_back_as_it_goes(tmp_path: Path) -> None:
    tuning, cgroups, sent = setup(tmp_path, knee=3, plan=CorePlan(n_start=5, launch_cores=5))
    await finish(tuning)
    assert tuning.results == {"j1": 3}
    # First the launch at N_start: the GPU's NUMA node's cores, then the nearest others.
    assert cgroups.updates[0] == ("j1", (0, 4, 5, 6, 7))
    last = sent[-1]
    assert last["converged"] and last["pinned"] == [4, 5, 6] and last["cpus"] == [4, 5, 6]
    assert cgroups.cpus["j1"] == (4, 5, 6)
    assert sent[0]["reason"] == "launch at N_start" and sent[0]["step"] == 0
    held = [len(e["cpus"]) for e in sent]
    assert held == sorted(held, reverse=True)  # cores only ever go back
    for event in sent:
        assert set(event["pinned"]) <= set(event["cpus"])
        # Always a prefix of the ranking: shrinking and growing move as little as possible.
        order = [4, 5, 6, 7, 0, 1, 2, 3]
        assert sorted(event["pinned"]) == sorted(order[:len(event["pinned"])])
    assert any(len(e["pinned"]) == 8 for e in sent[:-1])  # the plateau reference was measured
    saved = json.loads((tmp_path / "j1" / STATE_FILE).read_text())
    assert saved["converged"] and saved["pinned"] == [4, 5, 6]


async def test_a_restarted_node_does_not_retune_and_resumes_within_what_it_holds(
    tmp_path: Path,
) -> None:
    tuning, cgroups, _sent = setup(tmp_path, knee=2, plan=CorePlan(n_start=4, launch_cores=4))
    await finish(tuning)
    first = len(cgroups.updates)
    # A new noded over the same job directory: converged parts stay as they are.
    again, _, sent_again = setup(tmp_path, knee=2, plan=CorePlan(n_start=4, launch_cores=4))
    again.cgroups = cgroups
    await finish(again)
    assert again.results == {"j1": 2} and sent_again == [] and len(cgroups.updates) == first

    # An unfinished tuning resumes inside the cores it still held.
    state = tmp_path / "j1" / STATE_FILE
    data = json.loads(state.read_text())
    state.write_text(json.dumps({**data, "converged": False, "cpus": [4, 5, 6, 7],
                                 "pinned": [4, 5, 6]}))
    third, cg3, sent3 = setup(tmp_path, knee=2, plan=CorePlan(n_start=4, launch_cores=4))
    cg3.cpus["j1"] = (4, 5, 6)
    await finish(third)
    assert third.results == {"j1": 2}
    assert all(set(e["cpus"]) <= {4, 5, 6, 7} for e in sent3)


async def test_reconnect_resends_the_last_event(tmp_path: Path) -> None:
    tuning, _, sent = setup(tmp_path, knee=1, plan=CorePlan(n_start=2, launch_cores=2))
    await finish(tuning)
    count = len(sent)
    await tuning.resend()
    assert len(sent) == count + 1
    assert sent[-1]["converged"] and sent[-1]["reason"] == "resync after reconnect"


async def test_a_part_that_exits_stops_its_tuning(tmp_path: Path) -> None:
    slow = replace(FAST, warmup_s=30.0)
    tuning, cgroups, _sent = setup(tmp_path, knee=3, plan=CorePlan(n_start=8, launch_cores=8),
                                  config=slow)
    tuning.sync()
    task = tuning.tunings["j1"].task
    await asyncio.sleep(0.05)
    tuning.runner.parts["j1"].state = "exited"
    tuning.sync()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and "j1" not in tuning.tunings and cgroups.updates == []
    # Forgotten parts are forgotten by the tuner too.
    del tuning.runner.parts["j1"]
    tuning.sync()
    assert tuning.done == set()


async def test_a_vanished_cgroup_ends_tuning_quietly(tmp_path: Path) -> None:
    tuning, cgroups, sent = setup(tmp_path, knee=3, plan=CorePlan(n_start=4, launch_cores=4))
    cgroups.fail = True
    await finish(tuning)
    assert sent == [] and "j1" in tuning.done and tuning.results == {}


async def test_parts_without_a_plan_are_left_alone(tmp_path: Path) -> None:
    tuning, cgroups, _sent = setup(tmp_path, knee=3, plan=None)
    tuning.sync()
    assert tuning.tunings == {} and cgroups.updates == []
