"""One answer to "may this request use this node" (masterd/core/eligibility.py), and no
placer writes its own."""

from __future__ import annotations

import re
from pathlib import Path

from masterd.core.eligibility import eligible, model_fits
from shared.model import JobKind, JobSpec

CORE = Path(__file__).resolve().parents[2] / "masterd" / "core"


def spec(gpus: int, model: str | None) -> JobSpec:
    kind = JobKind.TRAINING if gpus else JobKind.CPU
    return JobSpec(name="j", command=("x",), user="u", kind=kind, gpus=gpus, cpus=1,
                   gpu_model=model)


def test_the_rule() -> None:
    assert eligible(spec(0, "A100"), "H100")  # no GPU asked: any node
    assert eligible(spec(2, None), "H100") and eligible(spec(2, None), None)
    assert eligible(spec(2, "A100"), "A100") and not eligible(spec(2, "A100"), "H100")
    assert not eligible(spec(1, "A100"), None)  # a node without GPUs has no model
    assert model_fits(None, "L4") and model_fits("L4", "L4") and not model_fits("L4", "T4")


def test_no_placer_compares_a_nodes_gpu_model_itself() -> None:
    # A node's model (view.gpu_model, inventory.gpu_model) compared with a request's.
    pattern = re.compile(r"(view|v|views\[[^]]+\]|inventory|c\.inventory)\.gpu_model ==")
    found = [f"{p.relative_to(CORE)}:{n}" for p in CORE.rglob("*.py")
             if p.name != "eligibility.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
