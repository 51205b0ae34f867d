"""Study: Liquid (seeds/liquid.md §7): its testbed in batch mode against the placements it was
compared with, its resource model's accuracy on measured data, and its fine-grained GPU
sharing on openb with the fractional GPU requests honoured.

Every mechanism runs through the code the master runs: the ``liquid`` policy (best fit, the
grouping GA, sharing) and the baselines are the registered policies, the batch windows wake
the replay as they wake the master (``SchedulingCore.wake_at``), and the resource model is
``masterd.features.liquid.forest``. Pre-scheduling and event-driven reports are not part of
these replays (no job phases or report delays are simulated): ``bench/event_latency.py``
measures them on live daemons.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from masterd.core.policies import make_policy
from sim.colocation import COLOCATION_FILE, ColocationTable
from sim.engine import SimConfig, SimResult
from sim.liquid_history import History, ModelAnnotator, train
from sim.liquid_rf import PairR2, pair_r2
from sim.liquid_sim import LiquidSimulator
from sim.metrics import mean, percentile, time_weighted
from sim.psnet import PsNetwork, SyncProfile, calibrate, lone_worker_mbps
from sim.studies.common import ReportError, Section, Study, title
from sim.tables import Table
from sim.truth import TruthConfig, TruthModel
from sim.workloads import openb
from sim.workloads.base import LoadOptions, Workload
from sim.workloads.liquid import SYNC_PROFILES, LiquidTestbed, build_testbed, testbed_truth

# The paper's own figures, quoted next to ours (never computed here).
LIQUID_PAPER = {
    "source": "Liquid §7.2 and §7.4 (seeds/liquid.md), Fig. 19d: 20 nodes × 2 T4",
    "makespan_reduction_pct": {"random": 24.0, "even-spread": 23.0, "least-requested": 23.0,
                               "buddy-cells": 22.0},
    "jct_reduction_pct": {"random": 24.0, "even-spread": 25.0, "least-requested": 22.0,
                          "buddy-cells": 18.0},
    "rf_r2": 0.86,
}
BASELINES = ("random", "even-spread", "least-requested", "buddy-cells")
BASELINE_TITLES = {"random": "random", "even-spread": "even spread",
                   "least-requested": "Kubernetes-like least requested",
                   "buddy-cells": "HiveD-like buddy cells"}
LOCAL_MBPS = 10_000.0  # a worker beside its PS exchanges through the host (PCIe, memory)
# Liquid §5.1, Fig. 4: "in a distributed VGG-16 model training job, the communication
# bandwidth of one worker can reach 200 MB/s" — the traffic model's calibration (sim.psnet).
PAPER_WORKER_MBPS = 200.0
PAPER_WORKER_MODEL = "vgg16"


@dataclass(frozen=True)
class LiquidStudy:
    testbed_nodes: tuple[int, ...] = (5, 10, 15, 20)
    testbed: LiquidTestbed = field(default_factory=LiquidTestbed)
    history: History = field(default_factory=History)
    pair_r2: PairR2 = field(default_factory=PairR2)
    openb_since_day: float = 145.0
    openb_arrival_scale: float = 20.0
    openb_node_stride: int = 40
    openb_soda: bool = True
    # Calibrate the PS traffic to this per-worker rate of PAPER_WORKER_MODEL (None: exchange
    # the models' full sizes every iteration, uncalibrated).
    worker_mbps: float | None = PAPER_WORKER_MBPS
    seed: int = 1


def tiny() -> LiquidStudy:
    return replace(LiquidStudy(), testbed_nodes=(5,), history=History(runs=60),
                   pair_r2=PairR2(seeds=1, test_jobs=10), openb_since_day=0.0,
                   openb_arrival_scale=1.0, openb_node_stride=1)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--liquid-testbed-nodes", help="comma-separated node counts (5, 10...)")


def apply_options(study: LiquidStudy, args: argparse.Namespace) -> LiquidStudy:
    text = getattr(args, "liquid_testbed_nodes", None)
    if text:
        try:
            nodes = tuple(int(t) for t in text.split(",") if t.strip())
        except ValueError:
            raise ReportError(f"--liquid-testbed-nodes: {text!r} is not a list of "
                              "integers") from None
        if not nodes or any(n < 5 or n % 5 for n in nodes):
            raise ReportError("--liquid-testbed-nodes: each must be a multiple of 5")
        study = replace(study, testbed_nodes=nodes)
    return study


def reduction(base: float | None, ours: float | None) -> float | None:
    if base is None or ours is None or base <= 0:
        return None
    return 100.0 * (base - ours) / base


def batch_stats(result: SimResult) -> dict[str, Any]:
    done = [r for r in result.records if r.state == "finished"]
    if not done:
        return {"finished": 0, "makespan_s": None, "jct_s": None, "nodes_per_job": None}
    begin = min(r.first_start for r in done if r.first_start is not None)
    return {
        "finished": len(done),
        "makespan_s": max(r.end for r in done if r.end is not None) - begin,
        "jct_s": mean([r.jct for r in done if r.jct is not None]),
        "nodes_per_job": mean([float(r.nodes_used) for r in done]),
    }


def traffic(study: LiquidStudy, worker_mbps: float | None
            ) -> tuple[dict[str, SyncProfile], dict[str, Any]]:
    """The PS traffic profiles at a calibration (None: uncalibrated), and what it is."""
    nic = study.testbed.nic_mbps / 8.0
    profiles, scale = dict(SYNC_PROFILES), 1.0
    if worker_mbps is not None:
        profiles, scale = calibrate(SYNC_PROFILES, PAPER_WORKER_MODEL, worker_mbps, nic)
    return profiles, {
        "target_worker_mb_per_s": worker_mbps, "reference_model": PAPER_WORKER_MODEL,
        "nic_mb_per_s": nic, "bytes_scale": scale,
        "exchanged_mb_per_iteration": {k: round(2 * p.gradient_mb, 2)
                                       for k, p in profiles.items()},
        "lone_worker_mb_per_s": {k: round(lone_worker_mbps(p, nic), 1)
                                 for k, p in profiles.items()},
    }


def run_testbed(study: LiquidStudy, nodes: int, model: Any, network: bool,
                profiles: dict[str, SyncProfile] | None = None) -> dict[str, dict[str, Any]]:
    profiles = profiles if profiles is not None else traffic(study, study.worker_mbps)[0]
    config = replace(study.testbed, nodes=nodes, seed=study.seed)
    workload = build_testbed(config)
    sim_config = SimConfig(seed=study.seed, truth=testbed_truth(config.launch_s))
    runs: dict[str, dict[str, Any]] = {}
    variants: list[tuple[str, str, dict[str, Any]]] = [
        ("liquid", "liquid", {"seed": study.seed}),
        ("liquid-immediate", "liquid", {"seed": study.seed, "batch": False}),
        *[(b, b, {"seed": study.seed} if b == "random" else {}) for b in BASELINES],
    ]
    for key, policy, options in variants:
        net = PsNetwork(config.nic_mbps / 8.0, LOCAL_MBPS, profiles) if network else None
        started = time.monotonic()
        sim = LiquidSimulator(workload, make_policy(policy, **options), sim_config,
                              annotator=ModelAnnotator(model) if policy == "liquid" else None,
                              network=net)
        result = sim.run()
        runs[key] = {**batch_stats(result), "wall_s": time.monotonic() - started,
                     "passes": result.passes, "wakes": sim.wakes}
    return runs


def _cuts(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    ours = runs["liquid"]
    return {b: {"makespan": reduction(runs[b]["makespan_s"], ours["makespan_s"]),
                "jct": reduction(runs[b]["jct_s"], ours["jct_s"])} for b in BASELINES}


def _calibration_text(calibration: dict[str, Any], full: dict[str, Any]) -> str:
    model = calibration["reference_model"]
    target = calibration["target_worker_mb_per_s"]
    if target is None:
        return ("Traffic uncalibrated: every worker pushes and pulls its model's full size "
                "each iteration.")
    rates = ", ".join(f"{k} {v:.0f}" for k, v in calibration["lone_worker_mb_per_s"].items())
    return (
        f"Calibration: Liquid measured that a {model} worker's traffic \"can reach "
        f"{target:.0f} MB/s\" (§5.1, Fig. 4); full model-size exchanges would give a lone "
        f"{model} worker {full['lone_worker_mb_per_s'][model]:.0f} MB/s on these NICs, so every "
        f"model's exchanged bytes are scaled by B / (t + B/NIC) = {target:.0f} MB/s, i.e. "
        f"B = {target:.0f} · {SYNC_PROFILES[model].compute_s} s / (1 − {target:.0f}/"
        f"{calibration['nic_mb_per_s']:.0f}) = "
        f"{calibration['exchanged_mb_per_iteration'][model]:.0f} MB per iteration, a factor "
        f"of {calibration['bytes_scale']:.3f} (lone workers, MB/s: {rates}); compute times "
        "unchanged. Table `liquid-why` shows the uncalibrated model too."
    )


def _window_pct(result: SimResult, window: tuple[float, float], index: int) -> float | None:
    if not result.total_gpus:
        return None
    series = [(entry[0], entry[index]) for entry in result.usage]
    value = time_weighted(series, *window)
    return None if value is None else 100.0 * value / result.total_gpus


def run_openb(study: LiquidStudy, trace_dir: Path) -> tuple[Workload, dict[str, Any]]:
    truth = TruthModel(TruthConfig(), study.seed)
    workload = openb.load(trace_dir, LoadOptions(seed=study.seed), truth,
                          arrival_scale=study.openb_arrival_scale,
                          node_stride=study.openb_node_stride,
                          since=study.openb_since_day * 86400.0, honour_fractional=True)
    table = ColocationTable.load(trace_dir / COLOCATION_FILE)
    window = (workload.jobs[0].submit, workload.jobs[-1].submit) if workload.jobs else (0, 0)
    variants: list[tuple[str, str, dict[str, Any]]] = [
        ("whole", "liquid", {"sharing": False, "seed": study.seed}),
        ("sharing", "liquid", {"seed": study.seed}),
    ]
    if study.openb_soda:
        variants.append(("soda-arrays", "soda-arrays",
                         {"inner": {"small": "drf", "large": "drf", "cpu": "drf"}}))
    runs: dict[str, Any] = {}
    for key, policy, options in variants:
        started = time.monotonic()
        sim = LiquidSimulator(workload, make_policy(policy, **options), SimConfig(
            seed=study.seed), colocation=table)
        result = sim.run()
        gpu = [r for r in result.records if r.state == "finished" and r.gpus]
        delays = [r.queue_delay for r in gpu if r.queue_delay is not None]
        runs[key] = {
            "policy": policy, "options": options,
            "gpu_alloc_pct": _window_pct(result, window, 1),
            "gpu_util_pct": _window_pct(result, window, 2),
            "gpu_jobs": len(gpu),
            "queue_avg_s": mean(delays), "queue_p99_s": percentile(delays, 99),
            "jct_avg_s": mean([r.jct for r in gpu if r.jct is not None]),
            "shared_starts": sim.shared_starts,
            "unfinished": sum(r.state == "unfinished" for r in result.records),
            "wall_s": time.monotonic() - started,
        }
    return workload, {"runs": runs, "window_s": list(window),
                      "colocation_rows": table.rows, "colocation_profiles": len(table.profiles)}


def run(study: LiquidStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    section = Section("liquid", "Liquid (TPDS'22 §7)")
    started = time.monotonic()
    profiles, calibration = traffic(study, study.worker_mbps)
    model, history = train(profiles, replace(study.testbed, seed=study.seed),
                           replace(study.history, seed=study.seed))
    testbeds = {n: run_testbed(study, n, model, True, profiles) for n in study.testbed_nodes}
    headline = max(study.testbed_nodes)
    ablation = run_testbed(study, headline, model, False, profiles)
    full_profiles, full = traffic(study, None)
    uncalibrated = (run_testbed(study, headline, model, True, full_profiles)
                    if study.worker_mbps is not None else testbeds[headline])
    measured = pair_r2(trace_dir, study.pair_r2)
    workload, ob = run_openb(study, trace_dir)

    tb = study.testbed
    section.text(
        f"**Setup (generated).** Liquid's testbed: nodes of 2 T4 GPUs (15 Gbps), per five "
        f"nodes four ResNet-50, two Inception V3 and two VGG-16 jobs, each one parameter server "
        f"and {', '.join(map(str, tb.workers))} workers (seeded), {tb.iterations[0]}–"
        f"{tb.iterations[1]} iterations, arriving within {tb.arrival_spread_s:g} s (one batch). "
        "Every policy queues first come, first served and lets later jobs past one that does "
        "not fit; they differ in where tasks go. Liquid (batch) waits for its 15 s window and "
        "places the batch with its grouping GA, its network cost weighted by the bandwidth its "
        f"resource model predicts (trained on the usage of {history['runs']} past runs of the "
        "same models, placed at random on the same cluster by the same ground truth and metered "
        "part by part through noded's accumulators and the master's labels, with measurement "
        "noise apart from the truth — sim/liquid_meter.py; "
        f"{history['rows']} reports, held-out R² "
        + ", ".join(f"{k} {v:.2f}" for k, v in history["r2"].items())
        + "). Ground truth: computing at fixed per-iteration times (Eq. 1: synchronisation "
        "adds to computing), parameter-server traffic sharing the NICs (sim/psnet.py). "
        + _calibration_text(calibration, full)
        + " Pre-scheduling and event-driven reports are not replayed: bench/event_latency.py "
        "measures them live."
    )
    main = section.table(Table(
        "liquid-testbed",
        ["nodes", "policy", "makespan s", "avg JCT s", "nodes per job",
         "Liquid's makespan cut %", "paper %", "Liquid's JCT cut %", "paper %"],
        ["{:d}", "{}", "{:.0f}", "{:.0f}", "{:.2f}", "{:.1f}", "{:.0f}", "{:.1f}", "{:.0f}"],
        caption=f"Theirs: {LIQUID_PAPER['source']}; Kubernetes and HiveD are their systems, "
                "ours are placements like theirs (docs/results-notes/liquid.md).",
    ))
    reductions: dict[int, dict[str, dict[str, float | None]]] = {}
    for n in study.testbed_nodes:
        runs = testbeds[n]
        ours = runs["liquid"]
        reductions[n] = {}
        for key in ("liquid", "liquid-immediate", *BASELINES):
            r = runs[key]
            cut_m = reduction(r["makespan_s"], ours["makespan_s"]) if key in BASELINES else None
            cut_j = reduction(r["jct_s"], ours["jct_s"]) if key in BASELINES else None
            if key in BASELINES:
                reductions[n][key] = {"makespan": cut_m, "jct": cut_j}
            paper_on = n == 20 and key in BASELINES
            main.add(n, BASELINE_TITLES.get(key, title(key)), r["makespan_s"], r["jct_s"],
                     r["nodes_per_job"], cut_m,
                     LIQUID_PAPER["makespan_reduction_pct"].get(key) if paper_on else None,
                     cut_j, LIQUID_PAPER["jct_reduction_pct"].get(key) if paper_on else None)
    why = section.table(Table(
        "liquid-why",
        ["policy", "makespan s calibrated", "without PS traffic", "full-size exchanges",
         "avg JCT s calibrated", "without", "full-size"],
        ["{}", "{:.0f}", "{:.0f}", "{:.0f}", "{:.0f}", "{:.0f}", "{:.0f}"],
        caption=f"{headline} nodes, the same jobs: the traffic calibrated to the paper's "
                "measured worker (the main table), no parameter-server traffic in the ground "
                "truth (what is left is packing alone), and uncalibrated full model-size "
                f"exchanges (a lone VGG-16 worker at "
                f"{full['lone_worker_mb_per_s'][PAPER_WORKER_MODEL]:.0f} MB/s).",
    ))
    for key in ("liquid", "liquid-immediate", *BASELINES):
        w, wo, wf = testbeds[headline][key], ablation[key], uncalibrated[key]
        why.add(BASELINE_TITLES.get(key, title(key)), w["makespan_s"], wo["makespan_s"],
                wf["makespan_s"], w["jct_s"], wo["jct_s"], wf["jct_s"])
    rf = section.table(Table(
        "liquid-rf",
        ["data", "label", "rows", "test rows", "R² mean", "min", "max", "paper (best)"],
        ["{}", "{}", "{:d}", "{:d}", "{:.3f}", "{:.3f}", "{:.3f}", "{:.2f}"],
        caption="Liquid's forests (70 trees, depth 13, split 10, leaf 5) on held-out rows: "
                "Lucid's measured pairs, and the final usage reports (one per job part) the "
                "testbed's simulated nodes metered of earlier runs.",
    ))
    for label, stats in measured["r2"].items():
        if stats is not None:
            rf.add("Lucid co-location pairs (measured)", label, measured["rows"],
                   measured["test_jobs"], stats["mean"], stats["min"], stats["max"],
                   LIQUID_PAPER["rf_r2"])
    for label, value in history["r2"].items():
        rf.add("testbed history (metered)", label, history["rows"], history["test_rows"], value,
               value, value, None)
    notes = workload.notes
    section.text(
        f"**openb with fractional GPUs (generated).** The openb replay's pods "
        f"({len(workload.jobs)} pods from trace day {study.openb_since_day:g}, creation times "
        f"divided by {study.openb_arrival_scale:g}, every {study.openb_node_stride}th node: "
        f"{notes['gpus']} GPUs) with their fractional requests honoured "
        f"({notes.get('fractional_gpu_pods_honoured', 0)} pods): whole-GPU rounding (Liquid's "
        "policy with sharing off), Liquid's sharing (predicted utilisation below 1.3, memory "
        "fitting; the prediction is the request, openb having no usage history), and SODA's "
        "arrays (which round up). Jobs sharing a GPU run at the speeds Lucid measured for "
        f"such pairs ({ob['colocation_rows']} rows; each pod given one of "
        f"{ob['colocation_profiles']} measured jobs, seeded). GPU allocation counts a shared "
        "pod as its share, a rounded one as its GPU; utilisation counts a fractional pod as its "
        "share at the speed it gets; both averaged over the arrival window."
    )
    ot = section.table(Table(
        "liquid-openb",
        ["placement", "GPU allocation %", "GPU utilisation %", "GPU jobs: avg queueing s",
         "p99 s", "avg JCT s", "shared starts"],
        ["{}", "{:.1f}", "{:.1f}", "{:.0f}", "{:.0f}", "{:.0f}", "{:d}"],
    ))
    labels = {"whole": "whole-GPU rounding", "sharing": "Liquid sharing",
              "soda-arrays": "SODA arrays (rounded)"}
    for key, r in ob["runs"].items():
        ot.add(labels[key], r["gpu_alloc_pct"], r["gpu_util_pct"], r["queue_avg_s"],
               r["queue_p99_s"], r["jct_avg_s"], r["shared_starts"])
    section.data = {
        "config": asdict(study),
        "paper": LIQUID_PAPER,
        "history": history,
        "testbed": {str(n): runs for n, runs in testbeds.items()},
        "ablation_no_ps_traffic": ablation,
        "calibration": calibration,
        "uncalibrated": {"traffic": full, "runs": uncalibrated,
                         "reductions": _cuts(uncalibrated)},
        "reductions": {str(n): r for n, r in reductions.items()},
        # Liquid batch against Liquid immediate (and the baselines against immediate).
        "immediate_reductions": {
            str(n): {"liquid-batch": {
                "makespan": reduction(runs["liquid-immediate"]["makespan_s"],
                                      runs["liquid"]["makespan_s"]),
                "jct": reduction(runs["liquid-immediate"]["jct_s"], runs["liquid"]["jct_s"])}}
            for n, runs in testbeds.items()},
        "rf_pairs": measured,
        "openb": ob,
        "openb_notes": notes,
    }
    section.wall_s = time.monotonic() - started
    return section


STUDY = Study(name="liquid", label="Liquid", config=LiquidStudy, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options)
