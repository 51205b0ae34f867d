"""One answer to "may this request use this node" (masterd/core/eligibility.py), and no
placer writes its own."""

from __future__ import annotations

import re
from pathlib import Path

from masterd.core.eligibility import eligible, model_fits, placement_key
from shared.model import GpuInfo, JobKind, JobSpec, NodeInventory, NodeSelector

CORE = Path(__file__).resolve().parents[2] / "masterd" / "core"


def spec(gpus: int, model: str | None, features: tuple[str, ...] = ()) -> JobSpec:
    kind = JobKind.TRAINING if gpus else JobKind.CPU
    return JobSpec(name="j", command=("x",), user="u", kind=kind, gpus=gpus, cpus=1,
                   gpu_model=model, selector=NodeSelector(features=features))


def node(model: str | None, features: tuple[str, ...] = ()) -> NodeInventory:
    gpus = () if model is None else (GpuInfo(0, "GPU-0", model, 1024),)
    return NodeInventory(name="n", hostname="n", address="n", gpus=gpus, features=features)


def test_the_rule() -> None:
    assert eligible(spec(0, "A100"), node("H100"))  # no GPU asked: any node
    assert eligible(spec(2, None), node("H100")) and eligible(spec(2, None), node(None))
    assert eligible(spec(2, "A100"), node("A100")) and not eligible(spec(2, "A100"), node("H100"))
    assert not eligible(spec(1, "A100"), node(None))  # a node without GPUs has no model
    assert model_fits(None, "L4") and model_fits("L4", "L4") and not model_fits("L4", "T4")


def test_features_select_nodes_that_have_every_one() -> None:
    ib = node("A100", ("ib", "nvlink", "a100"))
    assert eligible(spec(2, "A100", ("ib",)), ib)
    assert eligible(spec(2, None, ("ib", "nvlink")), ib)
    assert not eligible(spec(2, None, ("ib", "hdr")), ib)  # all of them, not any
    assert not eligible(spec(0, None, ("ib",)), node(None))  # CPU jobs select too
    assert eligible(spec(0, None, ("ib",)), node(None, ("ib",)))
    # Placement caches keyed by placement_key never mix jobs that may use different nodes.
    assert placement_key(spec(2, None, ("ib",))) != placement_key(spec(2, None))


def test_no_placer_compares_a_nodes_gpu_model_itself() -> None:
    # A node's model (view.gpu_model, inventory.gpu_model) compared with a request's.
    pattern = re.compile(r"(view|v|views\[[^]]+\]|inventory|c\.inventory)\.gpu_model ==")
    found = [f"{p.relative_to(CORE)}:{n}" for p in CORE.rglob("*.py")
             if p.name != "eligibility.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
