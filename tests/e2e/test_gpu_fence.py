"""Hard GPU isolation, proved by the kernel: real masterd and noded, emulated GPUs whose device
files are real character devices (195:N) in the node's scratch dev_dir, real cgroups.

A job given one GPU that opens the other GPU's device file gets EPERM from the device fence,
while its own answers ENXIO (no driver behind major 195 here): the fence let it through. A job
given no GPU can open none. The fence goes with the job's group.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from demo.cluster import TREE, LocalCluster, default_job_user
from demo.gpu_escape import open_answer
from noded.cgroups.mounts import find_mounts
from tests.conftest import needs_root

pytestmark = [needs_root, pytest.mark.root]

PROBE = str(TREE / "demo" / "gpu_escape.py")
DRIVER_ABSENT = ("ENXIO", "ENODEV")


def _probe_job(name: str, gpus: int, out: Path) -> dict:
    # The probe runs as a child of the job's shell: the fence holds for every process of the
    # group, not only the one the shim started.
    script = f'echo "$CUDA_VISIBLE_DEVICES" > {out}.gpus; python3 {PROBE} > {out}'
    return {"name": name, "user": default_job_user(), "kind": "cpu" if not gpus else "training",
            "gpus": gpus, "cpus": 1, "command": ["sh", "-c", script]}


def _results(out: Path) -> dict[str, str]:
    return json.loads(out.read_text().splitlines()[-1])["results"]


def test_a_job_opens_only_its_own_gpus_and_the_fence_goes_with_it(
        make_cluster: Callable[..., LocalCluster], shared_dir: Path) -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=2)
    client = cluster.client()
    node = cluster.node_name(1)
    dev = cluster.root / node / "gpu-dev"
    devices = find_mounts().v1.get("devices")
    outs = {name: shared_dir / f"{name}.out" for name in ("one", "other", "none")}
    ids = {name: client.call("submit", {"job": _probe_job(name, gpus, out)})["job"]["id"]
           for (name, out), gpus in zip(outs.items(), (1, 1, 0), strict=True)}

    def finished(job_id: str) -> Callable[[], bool]:
        def check() -> bool:
            state = client.call("job", {"id": job_id})["job"]["state"]
            assert state not in ("failed", "cancelled"), client.call("job", {"id": job_id})
            return state == "finished"
        return check

    for name, job_id in ids.items():
        cluster.wait_for(f"job {name} to finish", finished(job_id), timeout=60)
    # noded says at start which fence it uses (the whole log: cluster.log gives its tail).
    log = (cluster.root / f"{node}.log").read_text()
    assert "gpu_fence=devices cgroups=v1" in log or "gpu_fence=bpf cgroups=v2" in log, log[:3000]

    every = {str(dev / "nvidia0"), str(dev / "nvidia1"), str(dev / "nvidiactl")}
    given = set()
    for name in ("one", "other"):
        results = _results(outs[name])
        assert set(results) == every, results
        mine = int(Path(f"{outs[name]}.gpus").read_text().strip())
        given.add(mine)
        own, theirs = str(dev / f"nvidia{mine}"), str(dev / f"nvidia{1 - mine}")
        assert results[own] in DRIVER_ABSENT, results  # let through to the (absent) driver
        assert results[str(dev / "nvidiactl")] in DRIVER_ABSENT, results
        assert results[theirs] == "EPERM", results  # refused by the fence
    assert given == {0, 1}  # the two jobs held different GPUs, each fenced from the other's
    # A job given no GPU can open none, not even the control file.
    assert _results(outs["none"]) == dict.fromkeys(every, "EPERM")

    # The fence went with each job's group; outside any job nothing is refused.
    if devices is not None:
        for job_id in ids.values():
            assert not (devices / node / job_id).exists()
    assert {open_answer(path) for path in every} <= set(DRIVER_ABSENT)
    assert oct(os.stat(dev / "nvidia1").st_mode & 0o777) == "0o666"


def test_without_the_fence_the_kernel_lets_a_job_reach_every_gpu(
        make_cluster: Callable[..., LocalCluster], shared_dir: Path) -> None:
    """The control: with gpu.fence = off the same probe reaches the other GPU's device file
    (ENXIO from the absent driver), so the EPERM above is the fence's doing."""
    cluster = make_cluster(nodes=1, gpus_per_node=2, node_sections={"gpu": {"fence": "off"}})
    client = cluster.client()
    node = cluster.node_name(1)
    out = shared_dir / "unfenced.out"
    job_id = client.call("submit", {"job": _probe_job("unfenced", 1, out)})["job"]["id"]
    cluster.wait_for("the job to finish", lambda: client.call(
        "job", {"id": job_id})["job"]["state"] in ("finished", "failed"), timeout=60)
    assert "gpu_fence=off reason='gpu.fence = off'" in (cluster.root / f"{node}.log").read_text()
    results = _results(out)
    assert len(results) == 3 and set(results.values()) <= set(DRIVER_ABSENT), results
