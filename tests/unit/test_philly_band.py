"""The Philly study's FIFO ÷ QSSF band: which VC scales it spans and how it is summarised."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sim.studies import philly as study
from tests.unit.test_sim_results import write_traces


def probe(scale: float, util: float, nodes: int) -> dict[str, float]:
    return {"vc_scale": scale, "node_util_pct": util, "nodes": nodes}


def test_nearest_scales_are_the_probes_nearest_the_target() -> None:
    probes = [probe(0.55, 30.0, 190), probe(0.325, 51.0, 114), probe(0.2125, 69.9, 76),
              probe(0.2688, 60.2, 95), probe(0.2406, 65.1, 85), probe(0.2266, 67.5, 80),
              probe(0.2195, 70.0, 78)]
    assert study.nearest_scales(probes, 69.0, 3) == [0.2125, 0.2195, 0.2266]
    # Two scales that round to the same node count are one scale.
    same = [probe(0.30, 69.0, 100), probe(0.301, 69.0, 100), probe(0.4, 60.0, 130)]
    assert study.nearest_scales(same, 69.0, 2) == [0.30, 0.4]
    assert study.nearest_scales([], 69.0, 3) == []


def test_the_band_always_holds_the_point_estimates_scale() -> None:
    config = replace(study.PhillyStudy(), band_scales=2)
    probes = [probe(0.3, 69.5, 100), probe(0.4, 68.0, 130), probe(0.2, 80.0, 70)]
    assert study.scales_of_band(probes, config, 0.3) == [0.3, 0.4]
    assert study.scales_of_band(probes, config, 0.2) == [0.2, 0.3]  # in place of the farthest
    assert study.scales_of_band([], config, 0.25) == [0.25]


def test_band_ignores_missing_ratios() -> None:
    assert study.band([5.1, None, 6.7, 5.2]) == (5.1, 6.7)
    assert study.band([None]) is None


def test_study_reports_point_and_band(tmp_path: Path) -> None:
    traces = write_traces(tmp_path / "traces")
    config = replace(study.tiny(), extra_scales=(), alignment=False, fixed_scale=0.5,
                     band_seeds=(1, 2, 3))
    (tmp_path / "out").mkdir()
    section = study.run(config, traces, tmp_path / "out", False)
    rows = section.data["ratio_band"]["rows"]
    assert [(r["seed"], r["vc_scale"]) for r in rows] == [(1, 0.5), (2, 0.5), (3, 0.5)]
    (ratios,) = [t for t in section.tables() if t.id == "philly-ratios"]
    jct = ratios.rows[0]
    point, low, high = jct[2], jct[3], jct[4]
    assert low == min(r["fifo_over_qssf_jct"] for r in rows)
    assert high == max(r["fifo_over_qssf_jct"] for r in rows)
    assert low <= point <= high and jct[5] == 3
    # The seed the study runs is the point estimate, replayed once and reused in the band.
    main = section.data["runs"]
    fifo = next(r for r in main if r["policy"] == "fifo")
    qssf = next(r for r in main if r["policy"] == "qssf")
    assert rows[0]["fifo_over_qssf_jct"] == pytest.approx(fifo["avg_jct_s"] / qssf["avg_jct_s"])
