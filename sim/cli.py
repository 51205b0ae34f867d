"""``trellis-sim``: replay workloads through masterd's scheduling core and compare policies."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from masterd.core.helios.estimate import ESTIMATE_KEY, QssfEstimator
from masterd.core.policies import REGISTRY, make_policy
from masterd.core.policy import Policy
from sim import results, studies
from sim.cluster import ClusterConfigError, NodeGroup, build_cluster, load_cluster_file
from sim.engine import Annotator, FailureConfig, Outage, SimConfig, SimulationError
from sim.engines import engine_for
from sim.oracle import oracle_modeldb
from sim.partition import simulate_partitioned
from sim.philly_run import (
    DEFAULT_NOISE,
    apply_helios_setup,
    helios_policy_options,
    nothing_waited,
)
from sim.progress import ProgressBar
from sim.report import Run, comparison_table, make_run, write_outputs, write_plots
from sim.rl import command as rl_command
from sim.truth import TruthConfig, TruthModel
from sim.workloads import genie, jobfile, openb, philly, sacct
from sim.workloads.base import LoadOptions, TraceError, Workload

log = logging.getLogger("trellis.sim.cli")

WORKLOADS = ("genie", "philly", "openb", "file", "sacct")
DEFAULT_TRACE_DIR = Path("../shared/traces")


class UsageError(ValueError):
    """Bad command-line input: reported as one sentence, exit status 2."""


def _csv_list(text: str, convert: type, what: str) -> list[Any]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{what}: give at least one value")
    try:
        return [convert(t) for t in items]
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a comma-separated list of numbers") from None


def parse_policies(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise UsageError("--policies: give at least one policy name")
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise UsageError(
            f"unknown polic{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
            f"registered: {', '.join(sorted(REGISTRY))}"
        )
    return list(dict.fromkeys(names))


def parse_policy_options(items: Sequence[str], policies: Sequence[str]) -> dict[str, dict]:
    options: dict[str, dict[str, Any]] = {p: {} for p in policies}
    for item in items:
        key, sep, raw = item.partition("=")
        policy, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise UsageError(f"--policy-option {item!r}: expected POLICY.OPTION=VALUE")
        if policy not in options:
            raise UsageError(f"--policy-option {item!r}: policy {policy!r} is not being run")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw  # a bare string such as a path
        options[policy][name] = value
    return options


def build_policy(name: str, options: dict[str, Any]) -> Policy:
    try:
        return make_policy(name, **options)
    except TypeError as exc:
        raise UsageError(f"policy {name}: bad option: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"policy {name}: {exc}") from None


def with_oracle(options: dict[str, Any], truth: TruthConfig, workload: Workload
                ) -> dict[str, Any]:
    """``modeldb=oracle``: the simulator's true coefficients as the model database (SJF with
    perfect knowledge, as Helios' SJF), built for this workload's GPU model."""
    if options.get("modeldb") != "oracle":
        return options
    model = next((n.gpu_model for n in workload.nodes if n.gpu_model), None)
    if model is None:
        raise UsageError("modeldb=oracle needs a workload with GPU nodes")
    return {**options, "modeldb": oracle_modeldb(truth, model)}


def qssf_annotator(name: str, workload: Workload) -> Annotator | None:
    """QSSF's estimate: a workload may carry one per job (Philly: Helios' error model);
    otherwise the rolling estimate from users' finished jobs with similar names, learnt as
    the replay goes (the master's estimator without its ML part)."""
    if name != "qssf" or all(ESTIMATE_KEY in j.annotations for j in workload.jobs):
        return None
    return QssfEstimator()


def trace_dir_if_any(arg: str | None) -> Path | None:
    """The trace directory, or None where there is none (a genie workload needs none)."""
    try:
        return resolve_trace(arg)
    except UsageError:
        return None


def resolve_trace(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    if DEFAULT_TRACE_DIR.is_dir():
        return DEFAULT_TRACE_DIR
    beside_repo = Path(__file__).resolve().parents[2] / "shared" / "traces"
    if beside_repo.is_dir():
        return beside_repo
    raise UsageError(
        f"no trace directory at {DEFAULT_TRACE_DIR} (relative to {Path.cwd()}); pass --trace"
    )


def explicit_cluster(args: argparse.Namespace) -> list | None:
    if args.cluster:
        return build_cluster(load_cluster_file(Path(args.cluster)))
    if args.node_list:
        return openb.load_nodes(Path(args.node_list), LoadOptions(), [])
    if args.nodes is not None or args.gpus_per_node is not None:
        if args.nodes is None or args.gpus_per_node is None:
            raise UsageError("--nodes and --gpus-per-node go together")
        base = genie.GENIE_PLATFORM
        group = NodeGroup(
            count=args.nodes, gpus_per_node=args.gpus_per_node,
            gpu_model=args.gpu_model or base.gpu_model, cpu_cores=base.cpu_cores,
            sockets=base.sockets, gpus_per_switch=base.gpus_per_switch,
            memory_mib=base.memory_mib, prefix="node",
        )
        return build_cluster([group])
    return None


def build_workload(
    args: argparse.Namespace, seed: int, density: float | None, truth: TruthModel
) -> Workload:
    options = LoadOptions(seed=seed, skip_bad_rows=args.skip_bad_rows, limit=args.limit)
    if args.workload == "genie":
        workload = genie.generate(
            genie.GenieOptions(density=density or 10.0, hours=args.hours, seed=seed)
        )
        nodes = explicit_cluster(args)
        if nodes is not None:
            workload.nodes = nodes
        if args.limit is not None:
            workload.jobs = workload.jobs[: args.limit]
        return workload
    if args.workload == "philly":
        if args.per_vc and args.nodes is not None:
            raise UsageError("--per-vc sizes each VC from philly-vcs.csv: drop --nodes")
        if args.vc_scale is not None and not args.per_vc:
            raise UsageError("--vc-scale needs --per-vc")
        return philly.load(
            resolve_trace(args.trace), options, truth, nodes_override=args.nodes,
            per_vc=args.per_vc, since=_date_arg(args.since, "--since"),
            until=_date_arg(args.until, "--until"),
            vc_scale=1.0 if args.vc_scale is None else args.vc_scale,
        )
    if args.workload == "openb":
        node_list = Path(args.node_list) if args.node_list else None
        since = None if args.since_day is None else args.since_day * 86400.0
        return openb.load(resolve_trace(args.trace), options, truth, nodes_file=node_list,
                          arrival_scale=args.arrival_scale, node_stride=args.node_stride,
                          since=since)
    if not args.trace:
        raise UsageError(f"--workload {args.workload} needs --trace FILE")
    nodes = explicit_cluster(args)
    if nodes is None:
        raise UsageError(
            f"--workload {args.workload} needs a cluster: --cluster FILE, --node-list CSV "
            "or --nodes N --gpus-per-node G"
        )
    path = Path(args.trace)
    if args.workload == "file":
        return jobfile.load(path, options, nodes)
    # sacct history goes through the documented job-file format, kept beside the results.
    Path(args.out).mkdir(parents=True, exist_ok=True)
    converted = Path(args.out) / f"{path.stem}.jobs.csv"
    count, skipped = sacct.convert(path, converted, options)
    workload = jobfile.load(converted, LoadOptions(seed=seed, limit=args.limit), nodes)
    workload.skipped = skipped + workload.skipped
    workload.notes["sacct_jobs"] = count
    workload.notes["sacct_skipped"] = len(skipped)
    return workload


def _date_arg(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected a date, YYYY-MM-DD[ HH:MM:SS] (UTC)") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def parse_outage(item: str) -> Outage:
    node, sep, rest = item.partition(":")
    start, sep2, duration = rest.partition(":")
    try:
        if not (sep and sep2 and node):
            raise ValueError
        return Outage(node, float(start) * 3600.0, float(duration) * 3600.0)
    except ValueError as exc:
        detail = f": {exc}" if str(exc) else ""
        raise UsageError(
            f"--outage {item!r}: expected NODE:START_HOURS:DURATION_HOURS{detail}"
        ) from None


def sim_config(args: argparse.Namespace, seed: int) -> SimConfig:
    noise = DEFAULT_NOISE if args.noise is None else args.noise
    truth = TruthConfig(noise_sigma=noise, interference=not args.no_interference)
    failures = None
    if args.node_mtbf_hours is not None:
        failures = FailureConfig(args.node_mtbf_hours, args.node_repair_hours)
    outages = tuple(parse_outage(item) for item in args.outage or [])
    return SimConfig(
        seed=seed,
        outages=outages,
        truth=truth,
        prediction_error=args.prediction_error,
        start_delay=args.start_delay,
        preempt_keeps_progress=args.preempt_keeps_progress,
        max_retries=args.max_retries,
        requeue_default=not getattr(args, "no_requeue", False),
        failures=failures,
        sample_interval=args.sample_interval,
    )


def cmd_run(args: argparse.Namespace) -> int:
    policies = parse_policies(args.policies)
    policy_options = parse_policy_options(args.policy_option or [], policies)
    helios = apply_helios_setup(args)
    if helios is not None:
        print(helios)
        policy_options = helios_policy_options(policies, policy_options)
    seeds = _csv_list(args.seeds, int, "--seeds")
    if args.workload == "genie":
        densities: list[float | None] = _csv_list(args.density, float, "--density")
    else:
        if args.density != "10":
            log.warning("density_ignored workload=%s", args.workload)
        densities = [None]
    if args.workload != "philly":
        for flag, value, default in (("--per-vc", args.per_vc, False),
                                     ("--since", args.since, None),
                                     ("--until", args.until, None),
                                     ("--vc-scale", args.vc_scale, None)):
            if value != default:
                raise UsageError(f"{flag} applies to --workload philly only")
    if args.workload != "openb":
        for flag, value, default in (("--arrival-scale", args.arrival_scale, 1.0),
                                     ("--node-stride", args.node_stride, 1),
                                     ("--since-day", args.since_day, None)):
            if value != default:
                raise UsageError(f"{flag} applies to --workload openb only")
    for value, flag in ((args.noise, "--noise"), (args.prediction_error, "--prediction-error"),
                        (args.start_delay, "--start-delay")):
        if value is not None and value < 0:
            raise UsageError(f"{flag} must not be negative")
    if args.node_mtbf_hours is not None and args.node_repair_hours is None:
        raise UsageError("--node-mtbf-hours needs --node-repair-hours")
    out = Path(args.out)
    runs: list[Run] = []
    notes: dict[str, Any] = {"workload": args.workload, "skipped_rows": []}
    for density in densities:
        for seed in seeds:
            config = sim_config(args, seed)
            workload = build_workload(args, seed, density, TruthModel(config.truth, seed))
            notes.setdefault("workload_notes", {})[workload.name] = workload.notes
            notes["skipped_rows"].extend(workload.skipped)
            built = {name: build_policy(name, with_oracle(policy_options[name], config.truth,
                                                          workload))
                     for name in policies}
            # Every policy of the comparison on one engine, so that all face the same truth.
            engine = engine_for(built.values(), trace_dir_if_any(args.trace))
            said = engine.note()
            if said is not None and said not in notes.setdefault("engine_notes", []):
                notes["engine_notes"].append(said)
            for name, policy in built.items():
                options = with_oracle(policy_options[name], config.truth, workload)
                label = workload.name
                bar = None
                if not args.no_progress:
                    bar = ProgressBar(f"{label} {name} seed {seed}")
                if args.per_vc:
                    # One core per VC (its own queue), as Helios schedules Philly.
                    result = simulate_partitioned(
                        workload,
                        lambda name=name, options=options: build_policy(name, options),
                        config, bar,
                        (lambda name=name, w=workload: qssf_annotator(name, w))  # type: ignore
                        if qssf_annotator(name, workload) is not None else None,
                        engine,
                    )
                else:
                    result = engine.replay(workload, policy, config, bar,
                                           qssf_annotator(name, workload))
                if bar is not None:
                    done = sum(r.state != "unfinished" for r in result.records)
                    bar.close(result.end_time, done, len(result.records))
                runs.append(make_run(label, density, result))
    print(comparison_table(runs))
    for note in notes.get("engine_notes", []):
        print(f"engine: {note}")
    idle = nothing_waited([r.summary for r in runs])
    if idle is not None:
        print(idle)
    written = write_outputs(runs, out, notes, job_csv=args.job_csv)
    if not args.no_plots:
        written += write_plots(runs, out)
    print()
    for path in written:
        print(f"wrote {path}")
    return 0


def report_config(args: argparse.Namespace, argv_text: str) -> results.ReportConfig:
    out, trace = Path(args.out), resolve_trace(args.trace)
    notes = Path(args.notes) if args.notes else results.NOTES_DIR
    if args.tiny:
        config = results.tiny_config(out, trace, notes)
    else:
        config = results.ReportConfig(out=out, trace_dir=trace, notes_dir=notes)
    chosen = [s.strip() for s in args.studies.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in results.STUDIES]
    if unknown or not chosen:
        raise UsageError(f"--studies: expected some of {', '.join(results.STUDIES)}, "
                         f"got {args.studies!r}")
    # Every study's options are checked, also those of studies not chosen.
    configured = {study.name: study.apply_options(config.studies[study.name], args)
                  for study in studies.REGISTRY if study.name in config.studies}
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if args.serial and (args.scheduler or args.workers is not None):
        raise UsageError("--serial runs in this process: drop --scheduler/--workers")
    if args.scheduler and args.workers is not None:
        raise UsageError("--workers sizes a local Dask cluster; the cluster behind "
                         "--scheduler brings its own workers")
    # --tiny runs serially unless a Dask cluster is asked for.
    serial = args.serial or (config.serial and not (args.scheduler or args.workers))
    return replace(
        config,
        studies={name: c for name, c in configured.items() if name in chosen},
        progress=not args.no_progress and not args.tiny,
        command=argv_text,
        scheduler=args.scheduler or None,
        workers=args.workers,
        serial=serial,
    )


def cmd_report(args: argparse.Namespace) -> int:
    config = report_config(args, "trellis-sim " + " ".join(args.argv))
    try:
        written = results.run_report(config)
    except results.ReportError as exc:
        raise UsageError(str(exc)) from None
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    for name in sorted(REGISTRY):
        print(name)
    return 0


def cmd_convert_sacct(args: argparse.Namespace) -> int:
    count, skipped = sacct.convert(
        Path(args.source), Path(args.target), LoadOptions(skip_bad_rows=args.skip_bad_rows)
    )
    for entry in skipped:
        print(f"skipped {entry}", file=sys.stderr)
    print(f"wrote {count} jobs to {args.target}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    return rl_command.run(args, resolve_trace(args.trace), "trellis-sim " + " ".join(args.argv))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trellis-sim",
        description="Trace-driven simulator driving masterd's scheduling core.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="replay a workload under one or more policies")
    run.add_argument("--workload", choices=WORKLOADS, required=True)
    run.add_argument("--trace", help="trace directory (philly, openb; default "
                     "../shared/traces) or job file (file, sacct)")
    run.add_argument("--policies", default="fifo",
                     help="comma-separated names from the policy registry")
    run.add_argument("--policy-option", action="append", metavar="POLICY.OPTION=VALUE",
                     help="option passed to a policy's constructor (JSON value or string); "
                     "POLICY.modeldb=oracle gives a GENIE-family policy the simulator's true "
                     "coefficients (perfect knowledge)")
    run.add_argument("--seeds", default="1", help="comma-separated seeds")
    run.add_argument("--density", default="10",
                     help="genie: comma-separated arrival densities, jobs/hour")
    run.add_argument("--hours", type=float, default=24.0, help="genie: arrival window, hours")
    run.add_argument("--out", default="sim-out", help="output directory")
    run.add_argument("--limit", type=int, help="keep the first N jobs by submission time")
    run.add_argument("--skip-bad-rows", action="store_true",
                     help="skip malformed trace rows (reported) instead of stopping")
    run.add_argument("--cluster", help="cluster file (TOML/JSON node groups)")
    run.add_argument("--node-list", help="node list CSV in openb format (sn,cpu_milli,...)")
    run.add_argument("--nodes", type=int, help="node count (genie/file: with --gpus-per-node; "
                     "philly: overrides the size from philly-vcs.csv)")
    run.add_argument("--per-vc", action="store_true",
                     help="philly: every VC on its own nodes with its own scheduling core")
    run.add_argument("--vc-scale", type=float,
                     help="philly --per-vc: multiply every VC's node count (below 1: heavier "
                          "load; default 1, or 0.2125 when no cluster is given)")
    run.add_argument("--since", help="philly: keep jobs submitted from this UTC date on")
    run.add_argument("--until", help="philly: keep jobs submitted before this UTC date")
    run.add_argument("--arrival-scale", type=float, default=1.0,
                     help="openb: divide pod creation times by this factor (compress time)")
    run.add_argument("--node-stride", type=int, default=1,
                     help="openb: keep every k-th node of the node list")
    run.add_argument("--since-day", type=float,
                     help="openb: keep pods created from this trace day on")
    run.add_argument("--gpus-per-node", type=int)
    run.add_argument("--gpu-model")
    run.add_argument("--noise", type=float,
                     help="lognormal sigma of each job's true speed (0 = none; default 0.03, "
                          "0 for philly without a cluster given)")
    run.add_argument("--prediction-error", type=float, default=0.0,
                     help="lognormal sigma on the iteration counts users declare")
    run.add_argument("--no-interference", action="store_true",
                     help="no PCIe/network interference in the truth model")
    run.add_argument("--node-mtbf-hours", type=float, help="mean time between node failures")
    run.add_argument("--node-repair-hours", type=float, help="hours a failed node stays down")
    run.add_argument("--outage", action="append", metavar="NODE:START_H:DURATION_H",
                     help="planned failure of one node (repeatable)")
    run.add_argument("--max-requeues", "--max-retries", dest="max_retries", type=int,
                     default=3, help="requeues of a job whose node failed (the master's "
                                     "max_requeues); then it ends node_lost")
    run.add_argument("--no-requeue", action="store_true",
                     help="jobs that do not ask (stop.requeue) are not requeued after a "
                          "node failure (the master's requeue_default = false)")
    run.add_argument("--start-delay", type=float, default=0.0,
                     help="seconds from a Start decision to the job running")
    run.add_argument("--preempt-keeps-progress", action="store_true",
                     help="a preempted job resumes where it stopped (default: restarts)")
    run.add_argument("--sample-interval", type=float,
                     help="seconds between utilisation/fragmentation samples")
    run.add_argument("--job-csv", action="store_true", help="also write per-job CSV files")
    run.add_argument("--no-plots", action="store_true")
    run.add_argument("--no-progress", action="store_true")
    run.set_defaults(func=cmd_run)

    labels = [study.label for study in studies.REGISTRY]
    named = " and ".join(filter(None, [", ".join(labels[:-1]), labels[-1]]))
    rep = sub.add_parser("report", help=f"run the {named} studies; write results.md and plots")
    rep.add_argument("--out", default="docs",
                     help="directory for results.md (plots and JSON go to OUT/results/)")
    rep.add_argument("--trace", help="trace directory (default ../shared/traces)")
    rep.add_argument("--studies", default=",".join(results.STUDIES),
                     help="comma-separated subset of " + ", ".join(results.STUDIES))
    rep.add_argument("--notes", help="directory of the hand-written explanations "
                     "(<study>.md; default docs/results-notes)")
    rep.add_argument("--tiny", action="store_true",
                     help="a configuration that runs in seconds (checks the pipeline)")
    for study in studies.REGISTRY:
        study.add_options(rep)
    rep.add_argument("--scheduler", metavar="ADDRESS",
                     help="run the replays on the Dask cluster whose scheduler is at ADDRESS "
                     "(e.g. tcp://10.0.0.5:8786; its workers need Trellis installed); default: "
                     "a local Dask cluster of one worker process per core")
    rep.add_argument("--workers", type=int,
                     help="worker processes of the local Dask cluster (default: one per core)")
    rep.add_argument("--serial", action="store_true",
                     help="run every replay in this process, one after the other (no Dask)")
    rep.add_argument("--no-progress", action="store_true")
    rep.set_defaults(func=cmd_report)

    pol = sub.add_parser("policies", help="list registered scheduling policies")
    pol.set_defaults(func=cmd_policies)

    conv = sub.add_parser("convert-sacct", help="Slurm `sacct -P` output to a job CSV")
    conv.add_argument("source")
    conv.add_argument("target")
    conv.add_argument("--skip-bad-rows", action="store_true")
    conv.set_defaults(func=cmd_convert_sacct)

    rl_command.add_parser(sub, str(DEFAULT_TRACE_DIR)).set_defaults(func=cmd_train)

    what = sub.add_parser("whatif", help="replay the cluster's own history (a master's "
                          "journal) under other policies, beside what really happened")
    what.add_argument("--journal", required=True, metavar="PATH_OR_URL",
                      help="the master's journal: its SQLite file (state_dir/journal.db) or "
                      "its postgresql:// URL; read only")
    what.add_argument("--since", help="only jobs submitted from this date, YYYY-MM-DD[ "
                      "HH:MM:SS] (UTC)")
    what.add_argument("--policies", default="fifo",
                      help="comma-separated names from the policy registry")
    what.add_argument("--policy-option", action="append", metavar="POLICY.OPTION=VALUE",
                      help="option passed to a policy's constructor (JSON value or string)")
    what.add_argument("--fairshare", action="store_true",
                      help="replay each policy with fair share ordering (masterd/core/"
                      "fairorder.py), usage charged as the replay runs")
    what.add_argument("--half-life-days", type=float, default=7.0,
                      help="fair share's usage half-life (with --fairshare)")
    what.add_argument("--plots", metavar="DIR", help="write PNG plots here")
    what.add_argument("--json", metavar="PATH", help="write the table's figures as JSON")
    what.set_defaults(func=cmd_whatif)
    return parser


def cmd_whatif(args: argparse.Namespace) -> int:
    from sim import whatif

    policies = parse_policies(args.policies)
    options = parse_policy_options(args.policy_option or [], policies)
    if not args.half_life_days > 0:
        raise UsageError("--half-life-days must be positive")
    try:
        data = whatif.load_journal(args.journal, _date_arg(args.since, "--since"))
    except whatif.WhatIfError as exc:
        raise UsageError(str(exc)) from None
    built = [(name, build_policy(name, options[name])) for name in policies]
    outcomes = whatif.replay(data, built, args.fairshare, args.half_life_days * 86400.0)
    print(whatif.table(outcomes, data.notes))
    if args.json:
        Path(args.json).write_text(json.dumps(whatif.as_json(outcomes, data.notes), indent=2))
        print(f"wrote {args.json}")
    if args.plots:
        for path in whatif.write_plots(outcomes, Path(args.plots)):
            print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s %(message)s",
    )
    # The master's inference placer runs inside the replays: a service short of resources is
    # the replay's data (counted in its tables), not a problem of this command's user, and a
    # month of DLRM traffic says so hundreds of times.
    placer_log = logging.getLogger("trellis.inference")
    placer_level = placer_log.level
    if not args.verbose:
        placer_log.setLevel(logging.ERROR)
    try:
        return args.func(args)
    except (UsageError, TraceError, ClusterConfigError) as exc:
        print(f"trellis-sim: error: {exc}", file=sys.stderr)
        return 2
    except SimulationError as exc:
        print(f"trellis-sim: simulation failed: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"trellis-sim: error: {exc}", file=sys.stderr)
        return 2
    finally:
        placer_log.setLevel(placer_level)


if __name__ == "__main__":
    sys.exit(main())
