"""How well Liquid's resource model predicts on measured data: Lucid's co-location profiles.

``traces/gpu-colocation.csv`` is the one public set of measured GPU usage of real DL jobs
this project has: for ~1,400 pairs of training jobs sharing a GPU, the GPU utilisation and
memory the pair used, with each job's model, dataset, batch size and AMP setting. Taken as
jobs to predict (the pair is the unit that ran), it gives Liquid's model its task on real
measurements: from the jobs' parameters (strings hashed, as Liquid's code hashes them),
predict GPU utilisation and GPU memory. R² is measured as Liquid measured it (§7.2): a random
test set of 50, the rest for training, with the forests' settings of Liquid's code; repeated
over seeds, because one split of 50 is noisy.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from masterd.features.liquid.forest import fit
from masterd.features.liquid.jobfeatures import stable_hash
from sim.colocation import COLOCATION_FILE, ColocationError

PAIR_FEATURES = ("model1", "dataset1", "batch1", "amp1", "gpus1", "model2", "dataset2",
                 "batch2", "amp2", "gpus2")
PAIR_LABELS = ("gpu_util", "gpu_mem_mib")


@dataclass(frozen=True)
class PairR2:
    seeds: int = 10
    test_jobs: int = 50


def pair_rows(path: Path) -> list[tuple[dict[str, float], dict[str, float]]]:
    rows = []
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise ColocationError(f"{path}: cannot open: {exc.strerror}") from None
    with handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                features = {
                    "model1": stable_hash(row["model1"]), "dataset1": stable_hash(row["dataset1"]),
                    "batch1": float(row["batchsize1"]), "amp1": float(row["amp1"]),
                    "gpus1": float(row["gpu_num1"]),
                    "model2": stable_hash(row["model2"]), "dataset2": stable_hash(row["dataset2"]),
                    "batch2": float(row["batchsize2"]), "amp2": float(row["amp2"]),
                    "gpus2": float(row["gpu_num2"]),
                }
                labels = {"gpu_util": float(row["gpu_util"]) / 100.0,
                          "gpu_mem_mib": float(row["gmem"])}
            except (KeyError, ValueError) as exc:
                raise ColocationError(f"{path}:{line}: {exc}") from None
            rows.append((features, labels))
    return rows


def pair_r2(trace_dir: Path, config: PairR2) -> dict[str, Any]:
    """Held-out R² per label over ``seeds`` random splits: mean, min, max, and their mean."""
    rows = pair_rows(trace_dir / COLOCATION_FILE)
    per_label: dict[str, list[float]] = {label: [] for label in PAIR_LABELS}
    for seed in range(config.seeds):
        model = fit(rows, seed=seed, test_jobs=config.test_jobs, features=PAIR_FEATURES,
                    labels=PAIR_LABELS, serve=False)
        if model is None:
            continue
        for label, value in model.r2.items():
            if not math.isnan(value):
                per_label[label].append(value)
    summary = {label: ({"mean": sum(v) / len(v), "min": min(v), "max": max(v)} if v else None)
               for label, v in per_label.items()}
    means = [s["mean"] for s in summary.values() if s is not None]
    return {"rows": len(rows), "seeds": config.seeds, "test_jobs": config.test_jobs,
            "r2": summary, "mean_r2": sum(means) / len(means) if means else None}
