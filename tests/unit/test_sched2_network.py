"""SCHED²'s Q-network: the numpy forward pass, its files, and models that do not fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from masterd.core.policies import make_policy
from masterd.core.policies.sched2 import DEFAULT_MODEL, Sched2Policy
from masterd.core.sched2.network import ModelFileError, QNetwork, Shape, random_network
from masterd.core.scheduler import SchedulingCore
from tests.unit.helpers import inventory, job

ROOT = Path(__file__).resolve().parents[2]


def test_save_and_load_give_the_same_values(tmp_path: Path) -> None:
    net = random_network(Shape(3, 4, 5), seed=7)
    path = tmp_path / "m.npz"
    net.save(path)
    loaded = QNetwork.load(path)
    assert loaded.shape == net.shape and loaded.time_scale == net.time_scale
    rng = np.random.default_rng(1)
    servers = rng.random((3, 4), dtype=np.float32)
    jobs = rng.random(Shape(3, 4, 5).job_features, dtype=np.float32)
    assert np.array_equal(loaded.q_values(servers, jobs), net.q_values(servers, jobs))
    assert loaded.q_values(servers, jobs).shape == (6,)


def test_numpy_forward_equals_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is the optional extra 'rl'")
    from sim.rl.qnet import TorchQNet

    shape = Shape(15, 8, 10)
    torch.manual_seed(3)
    net = TorchQNet(shape)
    path = tmp_path / "m.npz"
    net.export(3600.0).save(path)
    numpy_net = QNetwork.load(path)
    rng = np.random.default_rng(2)
    for _ in range(20):
        servers = rng.uniform(-1, 4, (15, 8)).astype(np.float32)
        jobs = rng.uniform(0, 4, shape.job_features).astype(np.float32)
        with torch.no_grad():
            want = net(torch.from_numpy(servers[None]), torch.from_numpy(jobs[None]))[0]
        got = numpy_net.q_values(servers, jobs)
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-5)
    # and back: a numpy model loads into torch unchanged
    again = TorchQNet.from_numpy(numpy_net)
    with torch.no_grad():
        back = again(torch.from_numpy(servers[None]), torch.from_numpy(jobs[None]))[0]
    np.testing.assert_allclose(back.numpy(), got, atol=1e-5)


def test_a_model_for_another_cluster_or_window_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.npz"
    random_network(Shape(15, 8, 10)).save(path)
    with pytest.raises(ValueError, match=r"J=10 jobs; expected jobs 8 \(the model has 10\)"):
        Sched2Policy(model=path, jobs=8)
    with pytest.raises(ValueError, match=r"expected servers 16 \(the model has 15\)"):
        make_policy("sched2", model=str(path), servers=16)
    with pytest.raises(ModelFileError, match=r"gpus_per_server 4 \(the model has 8\)"):
        QNetwork.load(path).check(gpus_per_server=4)


def test_a_cluster_larger_than_the_model_waits_with_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "m.npz"
    random_network(Shape(2, 8, 10)).save(path)
    core = SchedulingCore(Sched2Policy(model=path))
    for name in ("a", "b", "c"):
        core.node_up(inventory(name, gpus=8))
    core.submit(job("j", gpus=1))
    assert core.schedule(1.0) == []
    reason = core.jobs["j"].reason
    assert "3 GPU servers" in reason and "2 servers × 8 GPUs" in reason
    core.node_down("c")  # still 3 servers: a down one keeps its row
    assert core.schedule(2.0) == []


@pytest.mark.parametrize("damage, message", [
    ("missing", "no such model file"),
    ("text", "not a readable .npz"),
    ("no_meta", "no metadata"),
    ("other_format", "not a SCHED² Q-network"),
    ("bad_shape", "f1_w is"),
    ("nan", "NaN"),
    ("missing_array", "missing weight arrays j2_b"),
])
def test_broken_files_are_named_and_explained(tmp_path: Path, damage: str,
                                              message: str) -> None:
    path = tmp_path / "m.npz"
    net = random_network(Shape(2, 4, 3))
    weights = {k: v.copy() for k, v in net.weights.items()}
    meta = {"format": "trellis-sched2-qnet", "version": 1, "servers": 2,
            "gpus_per_server": 4, "jobs": 3, "profiles": 4, "time_scale": 3600.0}
    if damage == "text":
        path.write_text("not a zip")
    elif damage != "missing":
        if damage == "other_format":
            meta["format"] = "something-else"
        if damage == "bad_shape":
            weights["f1_w"] = np.zeros((5, 5), dtype=np.float32)
        if damage == "nan":
            weights["s1_w"][0, 0] = np.nan
        if damage == "missing_array":
            del weights["j2_b"]
        arrays: dict[str, np.ndarray] = dict(weights)
        if damage != "no_meta":
            arrays["meta"] = np.array(json.dumps(meta))
        np.savez(path, **arrays)  # type: ignore[arg-type]
    with pytest.raises(ModelFileError, match=message) as info:
        QNetwork.load(path)
    assert str(path) in str(info.value)


def test_the_shipped_model_loads_and_fits_the_papers_cluster() -> None:
    net = QNetwork.load(DEFAULT_MODEL)
    # Trained with the learning fixes: the packing feature and canonical server order.
    assert net.shape == Shape(15, 8, 10, 4, packing=True, canonical=True)
    record = json.loads(DEFAULT_MODEL.with_suffix(".json").read_text())
    assert record["episodes"] >= 1 and "trellis-sim train sched2" in record["command"]
    assert Sched2Policy().network.shape == net.shape  # the default


def test_the_master_side_never_imports_torch(tmp_path: Path) -> None:
    path = tmp_path / "m.npz"
    random_network(Shape(2, 8, 10)).save(path)
    code = ("import sys, masterd.main, masterd.core.policies; "
            "from masterd.core.policies import make_policy; "
            f"make_policy('sched2', model={str(path)!r}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
