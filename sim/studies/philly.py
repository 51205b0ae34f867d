"""Study 2: the Philly trace as Helios replayed it (Helios §4.2.3, Tables 3 and 4).

Helios' simulator on Philly: the 11 VCs of ``philly-vcs.csv``, jobs submitted 2017-10-01 to
2017-11-30, each VC scheduled on its own nodes with its own queue, consolidated placement
(one node for a job of up to 8 GPUs, else whole free nodes), no backfill; FIFO, SJF ranking by
the recorded duration and QSSF ranking by GPUs × an estimate with Helios' error model. Each of
those rules is a policy or placement option here (``placement=consolidate``, ``sjf``'s
``rank=recorded`` and ``backfill=false``), and every replay below uses them.

Helios sized each VC "corresponding to its workloads" and reports 69.0% node utilisation for
Philly (Table 5); the trace here (the Pollux preprocessing) carries less work than theirs, so
the VCs as sized by ``philly-vcs.csv`` sit mostly idle. The study therefore searches the VC
scale (each VC gets round(scale × its nodes) nodes) at which FIFO's node utilisation equals
69.0% — on utilisation, never on JCT — and reports Tables 3 and 4 there, beside the paper.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from masterd.core.helios.estimate import RECORDED_KEY
from masterd.core.policies import make_policy
from masterd.core.policy import Policy
from sim.engine import SimConfig, SimResult
from sim.metrics import mean, percentile, summarise
from sim.oracle import oracle_modeldb
from sim.studies.common import (
    QUEUED_THRESHOLD_S,
    ReportError,
    Section,
    Study,
    csv_list,
    finished,
    plot_cdf,
    pyplot,
    queue_stats,
    replay,
    save_figure,
    title,
)
from sim.tables import Table, fmt
from sim.truth import TruthConfig, TruthModel
from sim.workloads import philly
from sim.workloads.base import LoadOptions, Workload

# The paper's own figures, quoted next to ours (never computed here).
HELIOS_PHILLY = {
    "source": "Helios §4.2.3, Tables 3 and 4 (Philly column), Table 5 (seeds/helios.md)",
    "avg_jct_s": {"fifo": 86072, "sjf": 34272, "qssf": 37324},
    "avg_queue_s": {"fifo": 56531, "sjf": 4731, "qssf": 7783},
    "queued_jobs": {"fifo": 30282, "sjf": 21437, "qssf": 22026},
    # Table 4: FIFO ÷ QSSF average queueing delay per duration group.
    "fifo_over_qssf_queue": {"short": 26.95, "middle": 5.54, "long": 1.70},
    "node_util_pct": 69.0,
    "avg_duration_s": 28329,  # Table 2, the whole Philly trace Helios used
    "avg_gpus": 1.75,
}
POLICIES = ("fifo", "sjf", "qssf")
# Helios' rules as options: consolidated placement, SJF by recorded duration without backfill.
ALIGNED: dict[str, dict[str, Any]] = {
    "fifo": {"placement": "consolidate"},
    "sjf": {"rank": "recorded", "backfill": False, "placement": "consolidate"},
    "qssf": {},
}
# Table 4's groups by recorded duration (Helios: short < 15 min, middle 15 min – 6 h, long).
GROUPS = (("short", 0.0, 900.0), ("middle", 900.0, 21600.0), ("long", 21600.0, math.inf))
SIZES = (("1 GPU", 1, 1), ("2–4 GPUs", 2, 4), ("5–8 GPUs", 5, 8), ("> 8 GPUs", 9, 1 << 30))


@dataclass(frozen=True)
class PhillyStudy:
    since: str = "2017-10-01"  # Helios' Philly evaluation period: October and November 2017
    until: str = "2017-12-01"
    seed: int = 1
    target_util_pct: float = 69.0  # Helios Table 5, Philly's node utilisation
    scale_low: float = 0.1
    scale_high: float = 1.0
    util_tolerance_pct: float = 0.5  # stop searching when FIFO's utilisation is this close
    scale_resolution: float = 0.002  # ... or the scale bracket is this narrow
    fixed_scale: float | None = None  # skip the search, replay at this scale
    extra_scales: tuple[float, ...] = (1.0,)  # also replayed with the three policies
    alignment: bool = True  # what each Helios rule changes, at the found scale
    limit: int | None = None
    # The FIFO ÷ QSSF ratios as a band: every seed of Helios' error model (which also fills
    # each job's model and batch) at each of the VC scales whose FIFO utilisation came nearest
    # the target in the search (one point of the search is too fragile to quote alone).
    band_seeds: tuple[int, ...] = (1, 2, 3)
    band_scales: int = 3


def tiny() -> PhillyStudy:
    return replace(PhillyStudy(), scale_low=0.5, scale_high=1.0, util_tolerance_pct=100.0,
                   extra_scales=(0.5, 1.0), band_seeds=(1, 2), band_scales=1)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--philly-since", help="first submission date kept (default 2017-10-01)")
    parser.add_argument("--philly-until", help="end of the window (default 2017-12-01)")
    parser.add_argument("--philly-scale", type=float,
                        help="replay at this VC scale instead of searching the one at which "
                             "FIFO's node utilisation is --philly-target-util")
    parser.add_argument("--philly-target-util", type=float,
                        help="node utilisation %% the VC scale is searched for (default 69.0, "
                             "Helios Table 5)")
    parser.add_argument("--philly-extra-scales",
                        help="comma-separated VC scales also replayed (default 1; empty: none)")
    parser.add_argument("--no-philly-alignment", action="store_true",
                        help="skip the replays without Helios' placement and SJF rules")
    parser.add_argument("--philly-band-seeds",
                        help="comma-separated seeds of Helios' error model the FIFO ÷ QSSF "
                             "band spans (default 1,2,3)")


def apply_options(study: PhillyStudy, args: argparse.Namespace) -> PhillyStudy:
    if getattr(args, "philly_since", None):
        study = replace(study, since=args.philly_since)
    if getattr(args, "philly_until", None):
        study = replace(study, until=args.philly_until)
    scale = getattr(args, "philly_scale", None)
    if scale is not None:
        if not scale > 0:
            raise ReportError(f"--philly-scale must be positive, got {scale:g}")
        study = replace(study, fixed_scale=scale)
    target = getattr(args, "philly_target_util", None)
    if target is not None:
        if not 0 < target < 100:
            raise ReportError(f"--philly-target-util must be within (0, 100), got {target:g}")
        study = replace(study, target_util_pct=target)
    extra = getattr(args, "philly_extra_scales", None)
    if extra is not None:
        study = replace(study, extra_scales=tuple(
            csv_list(extra, float, "--philly-extra-scales")) if extra.strip() else ())
    if getattr(args, "no_philly_alignment", False):
        study = replace(study, alignment=False)
    seeds = getattr(args, "philly_band_seeds", None)
    if seeds:
        study = replace(study, band_seeds=tuple(
            csv_list(seeds, int, "--philly-band-seeds")))
    return study


def _day(text: str, what: str) -> float:
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ReportError(f"{what}: {text!r} is not a date (YYYY-MM-DD)") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def command(study: PhillyStudy, scale: float, policies: tuple[str, ...] = POLICIES,
            aligned: bool = True) -> str:
    """The ``trellis-sim run`` line that replays these policies at this scale."""
    parts = ["trellis-sim run --workload philly --per-vc", f"--since {study.since}",
             f"--until {study.until}", f"--vc-scale {scale:g}", "--noise 0 --no-interference",
             f"--seeds {study.seed}", f"--policies {','.join(policies)}"]
    for name in policies:
        options = ALIGNED[name] if aligned else ({"modeldb": "oracle"} if name == "sjf" else {})
        for key, value in options.items():
            text = str(value).lower() if isinstance(value, bool) else value
            parts.append(f"--policy-option {name}.{key}={text}")
    if study.limit is not None:
        parts.append(f"--limit {study.limit}")
    return " ".join(parts)


@dataclass
class Setup:
    study: PhillyStudy
    trace_dir: Path
    truth: TruthModel
    config: SimConfig
    since: float
    until: float
    show: bool
    workloads: dict[float, Workload]

    def workload(self, scale: float) -> Workload:
        if scale not in self.workloads:
            self.workloads[scale] = philly.load(
                self.trace_dir, LoadOptions(seed=self.study.seed, limit=self.study.limit),
                self.truth, per_vc=True, since=self.since, until=self.until, vc_scale=scale)
        return self.workloads[scale]

    def factory(self, name: str, aligned: bool = True) -> Callable[[], Policy]:
        if aligned:
            options = ALIGNED[name]
            return lambda: make_policy(name, **options)
        if name == "sjf":  # as before alignment: GENIE's oracle prediction, skips misfits
            oracle = oracle_modeldb(self.config.truth, philly.philly_node_group(1).gpu_model)
            return lambda: make_policy("sjf", modeldb=oracle)
        return lambda: make_policy(name)

    def run(self, name: str, scale: float, aligned: bool = True) -> tuple[SimResult, float]:
        label = f"philly x{scale:g} {name}{'' if aligned else ' (unaligned)'}"
        return replay(label, self.workload(scale), self.factory(name, aligned), self.config,
                      self.show, partitioned=True)


def stats(result: SimResult, workload: Workload) -> dict[str, Any]:
    done = finished(result)
    q = queue_stats(done)
    jct = [r.jct for r in done if r.jct is not None]
    summary = summarise(result)
    recorded = {j.id: j.annotations.get(RECORDED_KEY, 0.0) for j in workload.jobs}
    by_group = {}
    for group, low, high in GROUPS:
        delays = [r.queue_delay for r in done
                  if r.queue_delay is not None and low <= recorded.get(r.id, 0.0) < high]
        by_group[group] = {"jobs": len(delays), "avg_queue_s": mean(delays)}
    by_size = {}
    for label, low, high in SIZES:
        delays = [r.queue_delay for r in done
                  if r.queue_delay is not None and low <= r.gpus <= high]
        by_size[label] = {"jobs": len(delays), "avg_queue_s": mean(delays)}
    util = summary["node_utilisation"]
    return {
        "jobs": len(result.records),
        "finished": len(done),
        "rejected": sum(r.state == "rejected" for r in result.records),
        "unfinished": sum(r.state == "unfinished" for r in result.records),
        "avg_jct_s": mean(jct),
        "p99_jct_s": percentile(jct, 99),
        "avg_queue_s": q["avg_s"],
        "queued_jobs": q["queued"],
        "node_util_pct": None if util is None else 100 * util,
        "gpu_active_pct": None if summary["gpu_active_rate"] is None
        else 100 * summary["gpu_active_rate"],
        "by_duration": by_group,
        "by_size": by_size,
        "per_vc_avg_queue_s": {t: v["avg_queue_s"] for t, v in summary["queue_by_tenant"].items()},
    }


def search_scale(setup: Setup, log: list[dict[str, Any]]) -> float:
    """The VC scale at which FIFO's node utilisation is closest to the target: bisection
    (utilisation falls as the VCs grow), stopping within the tolerance or when the bracket is
    narrower than the resolution. Every probe is kept in ``log``."""
    study = setup.study
    target = study.target_util_pct
    low, high = study.scale_low, study.scale_high
    best: tuple[float, float] | None = None  # (|util - target|, scale)
    seen: set[int] = set()  # node counts replayed: rounding per VC makes scales share them
    while True:
        scale = round((low + high) / 2, 4)
        nodes = setup.workload(scale).notes["nodes"]
        if nodes in seen:  # nothing new between the bracket's ends
            assert best is not None
            return best[1]
        seen.add(nodes)
        result, wall = setup.run("fifo", scale)
        st = stats(result, setup.workload(scale))
        util = st["node_util_pct"] or 0.0
        log.append({"vc_scale": scale, "node_util_pct": util, "wall_s": wall,
                    "nodes": setup.workload(scale).notes["nodes"],
                    "avg_jct_s": st["avg_jct_s"], "avg_queue_s": st["avg_queue_s"],
                    "queued_jobs": st["queued_jobs"]})
        if best is None or abs(util - target) < best[0]:
            best = (abs(util - target), scale)
        if abs(util - target) <= study.util_tolerance_pct or high - low <= study.scale_resolution:
            return best[1]
        if util > target:  # too busy: more nodes
            low = scale
        else:
            high = scale
        setup.workloads.pop(scale, None)  # a probe's workload is loaded again if chosen


def nearest_scales(probes: list[dict[str, Any]], target: float, count: int) -> list[float]:
    """The ``count`` probed VC scales whose FIFO utilisation came nearest ``target``, nearest
    first (ties: the smaller scale); scales sharing a node count are one scale."""
    seen_nodes: set[int] = set()
    out: list[float] = []
    for p in sorted(probes, key=lambda p: (abs(p["node_util_pct"] - target), p["vc_scale"])):
        if p["nodes"] in seen_nodes:
            continue
        seen_nodes.add(p["nodes"])
        out.append(p["vc_scale"])
        if len(out) == count:
            break
    return out


def scales_of_band(probes: list[dict[str, Any]], study: PhillyStudy, scale: float
                   ) -> list[float]:
    """The VC scales the band spans: the probes nearest the target (``nearest_scales``),
    always with ``scale`` (the point estimate's) in place of the farthest; ``scale`` alone
    without probes."""
    scales = nearest_scales(probes, study.target_util_pct, study.band_scales) or [scale]
    return scales if scale in scales else [scale, *scales[:-1]]


def band(values: list[float | None]) -> tuple[float, float] | None:
    """[low, high] of the values that exist; None when there are none."""
    kept = [v for v in values if v is not None]
    return (min(kept), max(kept)) if kept else None


def seeded_setup(study: PhillyStudy, trace_dir: Path, seed: int, show: bool = False) -> Setup:
    """A replay setup for one seed of Helios' error model, with the study's truth (every job
    runs its recorded duration: no noise, no interference)."""
    truth_config = TruthConfig(noise_sigma=0.0, interference=False)
    seeded = replace(study, seed=seed)
    return Setup(seeded, trace_dir, TruthModel(truth_config, seed),
                 SimConfig(seed=seed, truth=truth_config), _day(study.since, "philly since"),
                 _day(study.until, "philly until"), show, {})


def ratio_band(study: PhillyStudy, trace_dir: Path, scales: list[float],
               known: dict[tuple[int, float], dict[str, Any]],
               progress: Callable[[dict[str, Any]], None] | None = None,
               show: bool = False) -> list[dict[str, Any]]:
    """FIFO and QSSF at every (seed, scale) of the band: one row each with both averages and
    the ratios. ``known`` holds replays already made ({(seed, scale): {policy: stats}})."""
    rows: list[dict[str, Any]] = []
    for seed in study.band_seeds:
        setup = seeded_setup(study, trace_dir, seed, show)
        for scale in scales:
            done = known.get((seed, scale), {})
            got: dict[str, dict[str, Any]] = {}
            for name in ("fifo", "qssf"):
                if name in done:
                    got[name] = done[name]
                else:
                    result, _ = setup.run(name, scale)
                    got[name] = stats(result, setup.workload(scale))
            fifo, qssf = got["fifo"], got["qssf"]
            row = {
                "seed": seed, "vc_scale": scale, "nodes": setup.workload(scale).notes["nodes"],
                "fifo_node_util_pct": fifo["node_util_pct"],
                "fifo_avg_jct_s": fifo["avg_jct_s"], "qssf_avg_jct_s": qssf["avg_jct_s"],
                "fifo_avg_queue_s": fifo["avg_queue_s"],
                "qssf_avg_queue_s": qssf["avg_queue_s"],
                "fifo_over_qssf_jct": _ratio(fifo["avg_jct_s"], qssf["avg_jct_s"]),
                "fifo_over_qssf_queue": _ratio(fifo["avg_queue_s"], qssf["avg_queue_s"]),
            }
            rows.append(row)
            if progress is not None:
                progress(row)
            setup.workloads.pop(scale, None)  # one scale's workload at a time in memory
    return rows


def run(study: PhillyStudy, trace_dir: Path, out_dir: Path, show: bool) -> Section:
    since, until = _day(study.since, "philly since"), _day(study.until, "philly until")
    if until <= since:
        raise ReportError(f"philly: the window {study.since} to {study.until} is empty")
    if not 0 < study.scale_low < study.scale_high:
        raise ReportError("philly: the scale search needs 0 < low < high")
    section = Section("philly", "Philly trace as Helios replayed it (Helios §4.2.3, Tables 3–4)")
    started = time.monotonic()
    # Helios' simulator runs each job for exactly its recorded duration.
    setup = seeded_setup(study, trace_dir, study.seed, show)
    probes: list[dict[str, Any]] = []
    scale = study.fixed_scale if study.fixed_scale is not None else search_scale(setup, probes)
    results: dict[tuple[str, float], dict[str, Any]] = {}
    curves: dict[str, list[float]] = {}
    for s in dict.fromkeys([scale, *study.extra_scales]):
        for name in POLICIES:
            result, wall = setup.run(name, s)
            results[(name, s)] = dict(stats(result, setup.workload(s)), wall_s=wall)
            if s == scale:
                curves[name] = [r.jct for r in finished(result) if r.jct is not None]
    unaligned: dict[str, dict[str, Any]] = {}
    if study.alignment:
        for name in ("fifo", "sjf"):
            result, wall = setup.run(name, scale, aligned=False)
            unaligned[name] = dict(stats(result, setup.workload(scale)), wall_s=wall)
    band_scales = scales_of_band(probes, study, scale)
    # Replays already made: the search's FIFO probes and both policies at the chosen scale.
    known: dict[tuple[int, float], dict[str, Any]] = {
        (study.seed, p["vc_scale"]): {"fifo": p} for p in probes}
    known[(study.seed, scale)] = {"fifo": results[("fifo", scale)],
                                  "qssf": results[("qssf", scale)]}
    band_rows = ratio_band(study, trace_dir, band_scales, known, show=show)
    base = setup.workload(scale)
    window = {
        "jobs": len(base.jobs),
        "avg_duration_s": mean([j.annotations.get(RECORDED_KEY, 0.0) for j in base.jobs]),
        "avg_gpus": mean([float(j.spec.gpus) for j in base.jobs]),
    }
    notes = base.notes
    fifo, qssf = results[("fifo", scale)], results[("qssf", scale)]
    searched = (f"found by bisection on FIFO's node utilisation ({len(probes)} probes, "
                f"target {fmt(study.target_util_pct, '{:.1f}')} %, tolerance "
                f"{fmt(study.util_tolerance_pct, '{:.1f}')} points)"
                if study.fixed_scale is None else "given with --philly-scale")
    section.text(
        f"**Setup (generated).** `philly-jobs.csv` jobs submitted from {study.since} to "
        f"{study.until} (Helios' Philly period): {window['jobs']} of {notes['jobs_in_trace']} "
        f"jobs, mean recorded duration {fmt(window['avg_duration_s'], '{:.0f}')} s on "
        f"{fmt(window['avg_gpus'], '{:.2f}')} GPUs. Each of the {notes['virtual_clusters']} VCs "
        "of `philly-vcs.csv` is scheduled on its own nodes with its own queue (one scheduling "
        "core per VC). Helios' rules, each an option of our policies: consolidated placement "
        "(a job of up to 8 GPUs waits for one node that holds it, a larger one for whole free "
        "nodes), no backfill (a pass stops at the first job that does not fit), SJF ranking "
        "by the recorded duration, QSSF ranking by GPUs × an estimate drawn from Helios' error "
        f"model (seed {study.seed}). Jobs run exactly their recorded duration. Node "
        "utilisation: the time-weighted share of nodes running at least one job between the "
        f"first and the last submission. VC scale {fmt(scale, '{:g}')} ({notes['nodes']} nodes "
        f"of 8 GPUs) is {searched}: there FIFO's node utilisation is "
        f"{fmt(fifo['node_util_pct'], '{:.1f}')} % against Helios' "
        f"{fmt(HELIOS_PHILLY['node_util_pct'], '{:.1f}')} %. Jobs of VCs missing from "
        f"`philly-vcs.csv` ({', '.join(notes['vcs_without_size']) or 'none'}): "
        f"{notes['jobs_in_vcs_without_size']}, rejected as never fitting; jobs larger than "
        f"their scaled VC: {notes['jobs_larger_than_vc']}. Queued jobs: jobs that waited at "
        f"least {QUEUED_THRESHOLD_S:g} s."
    )
    if probes:
        search = section.table(Table(
            "philly-scale-search", ["VC scale", "nodes", "FIFO node utilisation %", "wall s"],
            ["{:g}", "{:d}", "{:.1f}", "{:.0f}"],
            caption="The search for the VC scale, in probe order.",
            command=command(study, probes[0]["vc_scale"], ("fifo",))
            .replace(f"--vc-scale {probes[0]['vc_scale']:g}", "--vc-scale SCALE"),
        ))
        for p in probes:
            search.add(p["vc_scale"], p["nodes"], p["node_util_pct"], p["wall_s"])

    t3 = section.table(Table(
        "philly-table3",
        ["metric", "policy", "Helios Table 3", f"ours, VC scale {scale:g}"],
        ["{}", "{}", "{:.0f}", "{:.0f}"],
        caption=f"Theirs: {HELIOS_PHILLY['source']}. Ours: Helios' rules, per-VC scheduling.",
        command=command(study, scale),
    ))
    for metric, key in (("avg JCT s", "avg_jct_s"), ("avg queueing s", "avg_queue_s"),
                        ("queued jobs", "queued_jobs")):
        for name in POLICIES:
            theirs = HELIOS_PHILLY[key][name]  # type: ignore[index]
            t3.add(metric, title(name), theirs, results[(name, scale)][key])
    seeds_text = ", ".join(map(str, study.band_seeds))
    scales_text = ", ".join(f"{s:g}" for s in band_scales)
    ratios = section.table(Table(
        "philly-ratios", ["ratio", "Helios", f"ours (seed {study.seed}, scale {scale:g})",
                          "ours, band low", "ours, band high", "replays in the band"],
        ["{}", "{:.2f}", "{:.2f}", "{:.2f}", "{:.2f}", "{:d}"],
        caption="FIFO ÷ QSSF, as Helios' text quotes it (2.3× JCT, 7.3× queueing): the point "
                f"estimate, and the band over error-model seeds {seeds_text} × the VC scales "
                f"{scales_text} (the search's nearest to the utilisation target).",
        command=command(study, scale, ("fifo", "qssf")),
    ))
    ratio_bands: dict[str, Any] = {}
    for label, key, short in (("avg JCT", "avg_jct_s", "jct"),
                              ("avg queueing", "avg_queue_s", "queue")):
        theirs = HELIOS_PHILLY[key]  # type: ignore[index]
        ours = _ratio(fifo[key], qssf[key])
        spread = band([r[f"fifo_over_qssf_{short}"] for r in band_rows])
        ratio_bands[f"fifo_over_qssf_{short}"] = {"point": ours,
                                                 "band": list(spread) if spread else None}
        ratios.add(f"FIFO ÷ QSSF {label}", theirs["fifo"] / theirs["qssf"], ours,
                   spread[0] if spread else None, spread[1] if spread else None,
                   len(band_rows))
    band_table = section.table(Table(
        "philly-band",
        ["seed", "VC scale", "nodes", "FIFO node util %", "FIFO avg JCT s", "QSSF avg JCT s",
         "FIFO ÷ QSSF JCT", "FIFO ÷ QSSF queueing"],
        ["{:d}", "{:g}", "{:d}", "{:.1f}", "{:.0f}", "{:.0f}", "{:.2f}", "{:.2f}"],
        caption="Every replay behind the band. The seed draws Helios' estimate error and also "
                "fills in each job's model type and batch, which the ground truth reads, so "
                "FIFO's figures move with it too.",
    ))
    for r in band_rows:
        band_table.add(r["seed"], r["vc_scale"], r["nodes"], r["fifo_node_util_pct"],
                       r["fifo_avg_jct_s"], r["qssf_avg_jct_s"], r["fifo_over_qssf_jct"],
                       r["fifo_over_qssf_queue"])
    t4 = section.table(Table(
        "philly-table4", ["job group", "Helios Table 4", "ours", "jobs"],
        ["{}", "{:.2f}", "{:.2f}", "{:d}"],
        caption="FIFO ÷ QSSF average queueing delay by recorded duration: short < 15 min, "
                "middle 15 min – 6 h, long > 6 h.",
        command=f"trellis-sim report --studies philly --philly-scale {scale:g} "
                "--philly-extra-scales '' --no-philly-alignment --out OUT",
    ))
    for group, _, _ in GROUPS:
        f, q = fifo["by_duration"][group], qssf["by_duration"][group]
        t4.add(group, HELIOS_PHILLY["fifo_over_qssf_queue"][group],  # type: ignore[index]
               _ratio(f["avg_queue_s"], q["avg_queue_s"]), q["jobs"])
    main = section.table(Table(
        "philly-main",
        ["VC scale", "nodes", "policy", "avg JCT s", "avg queueing s", "queued jobs",
         "p99 JCT s", "node util %", "GPU active %", "rejected"],
        ["{:g}", "{:d}", "{}", "{:.0f}", "{:.0f}", "{:d}", "{:.0f}", "{:.1f}", "{:.1f}", "{:d}"],
        caption="Every replay with Helios' rules.",
        command=" ; ".join(command(study, s) for s in dict.fromkeys([scale,
                                                                        *study.extra_scales])),
    ))
    for (name, s), st in results.items():
        main.add(s, setup.workload(s).notes["nodes"], title(name), st["avg_jct_s"],
                 st["avg_queue_s"], st["queued_jobs"], st["p99_jct_s"], st["node_util_pct"],
                 st["gpu_active_pct"], st["rejected"])
    if unaligned:
        align = section.table(Table(
            "philly-alignment",
            ["policy", "placement", "misfit", "ranks by", "avg JCT s", "avg queueing s",
             "queued jobs"],
            ["{}", "{}", "{}", "{}", "{:.0f}", "{:.0f}", "{:d}"],
            caption=f"What Helios' rules change, at VC scale {scale:g}: without them a job "
                    "may be split over partly used nodes, and SJF skips a job that does not "
                    "fit (a backfill) and ranks by the model's predicted latency.",
            command=command(study, scale, ("fifo", "sjf"), aligned=False),
        ))
        for name in ("fifo", "sjf"):
            for aligned, st in ((False, unaligned[name]), (True, results[(name, scale)])):
                ranks = ("submission" if name == "fifo" else
                         "recorded duration" if aligned else "predicted latency (oracle)")
                misfit = "stops" if aligned or name == "fifo" else "skips"
                align.add(title(name), "consolidate" if aligned else "pack", misfit, ranks,
                          st["avg_jct_s"], st["avg_queue_s"], st["queued_jobs"])
    workload_table = section.table(Table(
        "philly-workload", ["workload", "jobs", "avg duration s", "avg GPUs"],
        ["{}", "{:d}", "{:.0f}", "{:.2f}"],
        caption="What was replayed against what Helios replayed (their Table 2: the whole "
                "Philly trace, about 103k jobs).",
    ))
    workload_table.add("Helios (Table 2)", None, HELIOS_PHILLY["avg_duration_s"],
                       HELIOS_PHILLY["avg_gpus"])
    workload_table.add(f"ours, {study.since} to {study.until}", window["jobs"],
                       window["avg_duration_s"], window["avg_gpus"])
    _plots(section, out_dir, scale, results, curves)
    section.data = {
        "config": asdict(study),
        "paper": HELIOS_PHILLY,
        "vc_scale": scale,
        "scale_search": probes,
        "window": window,
        "workload_notes": {f"{s:g}": setup.workload(s).notes for s in
                           dict.fromkeys([scale, *study.extra_scales])},
        "runs": [dict(policy=n, vc_scale=s, **st) for (n, s), st in results.items()],
        "ratio_band": {"seeds": list(study.band_seeds), "vc_scales": band_scales,
                       "rows": band_rows, **ratio_bands},
        "unaligned": unaligned,
        "commands": {"table3": command(study, scale)},
    }
    section.wall_s = time.monotonic() - started
    return section


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _plots(section: Section, out_dir: Path, scale: float,
           results: dict[tuple[str, float], dict[str, Any]],
           curves: dict[str, list[float]]) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for name in POLICIES:
        plot_cdf(ax, curves.get(name, []), title(name), log_x=True)
    ax.set_xscale("log")
    ax.set_xlabel("JCT (s)")
    ax.set_ylabel("CDF of jobs")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(plt, fig, out_dir / "philly_jct_cdf.png")
    section.figures.append(("philly_jct_cdf.png", f"Philly: JCT CDF at VC scale {scale:g} "
                            "(log scale; cf. Helios Fig. 11)."))
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    labels = [label for label, _, _ in SIZES]
    width = 0.8 / len(POLICIES)
    for k, name in enumerate(POLICIES):
        by_size = results[(name, scale)]["by_size"]
        ax.bar([x + (k - 1) * width for x in range(len(labels))],
               [(by_size[lab]["avg_queue_s"] or 0.0) / 3600 for lab in labels], width=width,
               label=title(name))
    ax.set_xticks(list(range(len(labels))))
    ax.set_xticklabels(labels)
    ax.set_ylabel("avg queueing (h)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(plt, fig, out_dir / "philly_queue_by_size.png")
    section.figures.append(("philly_queue_by_size.png", f"Philly: average queueing delay by "
                            f"job size at VC scale {scale:g}."))
    queues = {n: results[(n, scale)]["per_vc_avg_queue_s"] for n in POLICIES}
    top = sorted(queues["fifo"], key=lambda v: -(queues["fifo"][v] or 0.0))[:10]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for k, name in enumerate(POLICIES):
        ax.bar([x + (k - 1) * width for x in range(len(top))],
               [(queues[name].get(v) or 0.0) / 3600 for v in top], width=width,
               label=title(name))
    ax.set_xticks(list(range(len(top))))
    ax.set_xticklabels(top, rotation=30, fontsize=7)
    ax.set_ylabel("avg queueing (h)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(plt, fig, out_dir / "philly_vc_queue.png")
    section.figures.append(("philly_vc_queue.png", f"Philly: average queueing delay of the "
                            f"ten most-queued VCs at VC scale {scale:g} (cf. Helios Fig. 13)."))


STUDY = Study(name="philly", label="Philly (Helios)", config=PhillyStudy, run=run, tiny=tiny,
              add_options=add_options, apply_options=apply_options)
