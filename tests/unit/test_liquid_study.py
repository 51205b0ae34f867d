"""The Liquid study end to end on tiny traces (with fractional pods and measured pairs), the
replay's extensions (batch windows wake it, shared GPUs slow their jobs as measured, PS
traffic shares NICs) and what the notes may say."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from masterd.core.policies import make_policy
from shared.model import NodeAllocation, Placement
from sim.cli import main
from sim.colocation import ColocationTable, Profile
from sim.engine import SimConfig
from sim.liquid_sim import LiquidSimulator
from sim.psnet import PsNetwork, SyncProfile
from sim.studies import liquid
from sim.workloads.liquid import LiquidTestbed, build_testbed
from tests.unit.test_sim_results import assert_markdown_matches_json, write_traces


def traces(root: Path) -> Path:
    write_traces(root)
    pods = root / "openb-pods.csv"
    rows = pods.read_text().splitlines()
    for i in range(8):  # one-GPU pods asking for part of a GPU, arriving together
        rows.append(f"openb-frac-{i:02d},2000,4096,1,{300 + 50 * (i % 3)},,BE,Running,"
                    f"{60 + i},{2000 + 60 * i},{60 + i}")
    pods.write_text("\n".join(rows) + "\n")
    return root


def test_the_study_runs_on_tiny_traces_and_its_tables_are_its_json(tmp_path: Path) -> None:
    root = traces(tmp_path / "traces")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "liquid.md").write_text("The tables above say what happened.\n")
    out = tmp_path / "docs"
    assert main(["report", "--tiny", "--studies", "liquid", "--out", str(out), "--trace",
                 str(root), "--notes", str(notes)]) == 0
    text = (out / "results.md").read_text()
    document = json.loads((out / "results" / "results.json").read_text())
    assert assert_markdown_matches_json(text, document) > 20
    data = document["studies"]["liquid"]["data"]
    runs = data["testbed"]["5"]
    assert {r["finished"] for r in runs.values()} == {8}  # every job of the 5-node testbed
    assert runs["liquid"]["wakes"] >= 1  # the batch window woke the replay
    assert set(data["reductions"]["5"]) == set(liquid.BASELINES)
    ob = data["openb"]["runs"]
    assert ob["sharing"]["shared_starts"] == 8 and ob["whole"]["shared_starts"] == 0
    assert data["openb_notes"]["fractional_gpu_pods_honoured"] == 8
    assert data["rf_pairs"]["rows"] == 16
    assert "### Why (hand-written)" in text


def test_bad_testbed_options_are_refused(tmp_path: Path) -> None:
    code = main(["report", "--tiny", "--studies", "liquid", "--liquid-testbed-nodes", "7",
                 "--out", str(tmp_path / "o"), "--trace", str(tmp_path)])
    assert code != 0


def test_measured_pairs_slow_jobs_sharing_a_gpu(tmp_path: Path) -> None:
    table = ColocationTable.load(traces(tmp_path / "t") / "gpu-colocation.csv")
    a = Profile("ResNet18", "CIFAR-10", 32, 0)
    b = Profile("DCGAN", "LSUN", 64, 0)
    # Rows 0 and 12 measured this pair (0.6 and 0.84): averaged.
    assert abs(table.pair_speed(a, b) - 0.72) < 1e-9
    assert abs(table.speed(a, [b, b]) - 0.72 * 0.72) < 1e-9
    assert table.pair_speed(b, a) < 1.0
    unmeasured = Profile("ResNet18", "ImageNet", 512, 1)
    assert table.pair_speed(unmeasured, b) == table.by_model[("ResNet18", "DCGAN")]


def test_ps_traffic_shares_nics_and_local_workers_do_not() -> None:
    net = PsNetwork(1000.0, 10_000.0, {"m": SyncProfile(gradient_mb=500.0, compute_s=1.0)})
    packed = Placement((NodeAllocation("a", (0, 1)),))
    spread = Placement((NodeAllocation("a", ()), NodeAllocation("b", (0,)),
                        NodeAllocation("c", (0,))))
    net.start("p", "m", packed)
    assert abs(net.factor("p") - 1.0 / (1.0 + 2 * 500 * 2 / 10_000)) < 1e-9
    assert net.start("s", "m", spread) == set()
    # Two remote workers share the PS node's NIC: each flow gets half of it.
    assert abs(net.factor("s") - 1.0 / (1.0 + 1000 / 500)) < 1e-9
    assert net.start("t", "m", Placement((NodeAllocation("b", ()), NodeAllocation("d", (0,)))))
    assert net.neighbours("t") == {"s"}
    assert net.end("t") == {"s"}


def test_the_replay_of_the_testbed_is_seeded(tmp_path: Path) -> None:
    workload = build_testbed(replace(LiquidTestbed(), nodes=5))
    results = []
    for _ in range(2):
        sim = LiquidSimulator(workload, make_policy("liquid"), SimConfig(seed=3))
        results.append([(r.id, r.first_start, r.end) for r in sim.run().records])
    assert results[0] == results[1]


def test_traffic_is_calibrated_to_the_papers_measured_worker() -> None:
    from sim.psnet import calibrate, lone_worker_mbps
    from sim.workloads.liquid import SYNC_PROFILES

    assert lone_worker_mbps(SYNC_PROFILES["vgg16"], 1875.0) > 900  # uncalibrated: ~945 MB/s
    profiles, scale = calibrate(SYNC_PROFILES, "vgg16", 200.0, 1875.0)
    assert abs(lone_worker_mbps(profiles["vgg16"], 1875.0) - 200.0) < 1e-9
    assert 0 < scale < 1
    for name, p in profiles.items():  # one factor for every model; compute untouched
        assert abs(p.gradient_mb - scale * SYNC_PROFILES[name].gradient_mb) < 1e-9
        assert p.compute_s == SYNC_PROFILES[name].compute_s
    # The replay's network gives a lone worker (PS on another node) exactly that rate.
    net = PsNetwork(1875.0, 10_000.0, profiles)
    net.start("j", "vgg16", Placement((NodeAllocation("a", ()), NodeAllocation("b", (0,)))))
    step = profiles["vgg16"].compute_s / net.factor("j")
    assert abs(2 * profiles["vgg16"].gradient_mb / step - 200.0) < 1e-6
    for bad in (0.0, 1875.0):
        with pytest.raises(ValueError, match="NIC"):
            calibrate(SYNC_PROFILES, "vgg16", bad, 1875.0)


def test_the_history_is_what_the_simulated_nodes_metered() -> None:
    from sim.liquid_history import History, history_rows
    from sim.liquid_meter import MeterConfig
    from sim.psnet import calibrate
    from sim.workloads.liquid import SYNC_PROFILES

    profiles, _ = calibrate(SYNC_PROFILES, "vgg16", 200.0, 1875.0)
    testbed = replace(LiquidTestbed(), nodes=5)
    quiet = History(runs=12, meter=MeterConfig(util_noise_pct=0.0, bytes_noise=0.0,
                                               memory_noise=0.0))
    rows = history_rows(profiles, testbed, quiet)
    assert len(rows) >= 12  # a report per part: at least one per job
    for _features, labels in rows:
        assert labels["net_mbps"] >= 0
        if "gpu_util" in labels:  # a part with GPUs: launching dilutes the mean below 1
            assert 0.0 < labels["gpu_util"] < 1.0 and "gpu_mem_mib" in labels
    # Noise changes the measurements, not which runs there were.
    noisy = history_rows(profiles, testbed, replace(quiet, meter=MeterConfig()))
    assert [f for f, _ in noisy] == [f for f, _ in rows]
    assert [lab for _, lab in noisy] != [lab for _, lab in rows]
