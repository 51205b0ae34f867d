"""``trellis-sim``: replay workloads through masterd's scheduling core and compare policies."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from masterd.core.policies import REGISTRY, make_policy
from masterd.core.policy import Policy
from sim.cluster import ClusterConfigError, NodeGroup, build_cluster, load_cluster_file
from sim.engine import FailureConfig, Outage, SimConfig, SimulationError, simulate
from sim.progress import ProgressBar
from sim.report import Run, comparison_table, make_run, write_outputs, write_plots
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
        return philly.load(resolve_trace(args.trace), options, truth, nodes_override=args.nodes)
    if args.workload == "openb":
        node_list = Path(args.node_list) if args.node_list else None
        return openb.load(resolve_trace(args.trace), options, truth, nodes_file=node_list)
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
    truth = TruthConfig(noise_sigma=args.noise, interference=not args.no_interference)
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
        failures=failures,
        sample_interval=args.sample_interval,
    )


def cmd_run(args: argparse.Namespace) -> int:
    policies = parse_policies(args.policies)
    policy_options = parse_policy_options(args.policy_option or [], policies)
    seeds = _csv_list(args.seeds, int, "--seeds")
    if args.workload == "genie":
        densities: list[float | None] = _csv_list(args.density, float, "--density")
    else:
        if args.density != "10":
            log.warning("density_ignored workload=%s", args.workload)
        densities = [None]
    for value, flag in ((args.noise, "--noise"), (args.prediction_error, "--prediction-error"),
                        (args.start_delay, "--start-delay")):
        if value < 0:
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
            for name in policies:
                policy = build_policy(name, policy_options[name])
                label = workload.name
                bar = None
                if not args.no_progress:
                    bar = ProgressBar(f"{label} {name} seed {seed}")
                result = simulate(workload, policy, config, bar)
                if bar is not None:
                    done = sum(r.state != "unfinished" for r in result.records)
                    bar.close(result.end_time, done, len(result.records))
                runs.append(make_run(label, density, result))
    print(comparison_table(runs))
    written = write_outputs(runs, out, notes, job_csv=args.job_csv)
    if not args.no_plots:
        written += write_plots(runs, out)
    print()
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
                     help="option passed to a policy's constructor (JSON value or string)")
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
    run.add_argument("--gpus-per-node", type=int)
    run.add_argument("--gpu-model")
    run.add_argument("--noise", type=float, default=0.03,
                     help="lognormal sigma of each job's true speed (0 = none)")
    run.add_argument("--prediction-error", type=float, default=0.0,
                     help="lognormal sigma on the iteration counts users declare")
    run.add_argument("--no-interference", action="store_true",
                     help="no PCIe/network interference in the truth model")
    run.add_argument("--node-mtbf-hours", type=float, help="mean time between node failures")
    run.add_argument("--node-repair-hours", type=float, help="hours a failed node stays down")
    run.add_argument("--outage", action="append", metavar="NODE:START_H:DURATION_H",
                     help="planned failure of one node (repeatable)")
    run.add_argument("--max-retries", type=int, default=3,
                     help="resubmissions of a job killed by a node failure")
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

    pol = sub.add_parser("policies", help="list registered scheduling policies")
    pol.set_defaults(func=cmd_policies)

    conv = sub.add_parser("convert-sacct", help="Slurm `sacct -P` output to a job CSV")
    conv.add_argument("source")
    conv.add_argument("target")
    conv.add_argument("--skip-bad-rows", action="store_true")
    conv.set_defaults(func=cmd_convert_sacct)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s %(message)s",
    )
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


if __name__ == "__main__":
    sys.exit(main())
