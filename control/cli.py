"""``trellisctl``: the operators' command line, speaking msgpack RPC to the master.

Exit status: 0 success, 1 the master refused the request, 2 bad usage or input,
3 the master could not be reached (or is shutting down), 130 interrupted. ``--watch`` and
``events --follow`` run until Ctrl-C and then exit 0.
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import json
import os
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from control.client import MasterClient, RpcError, Unreachable
from control.completion import bash_script
from control.credentials import add_arguments, credentials
from control.tables import render_table
from shared.auth import AuthError
from shared.cpulist import format_cpu_list

CONFIG_PATHS = (Path("~/.config/trellis/trellisctl.toml").expanduser(),
                Path("/etc/trellis/trellisctl.toml"))
DEFAULT_MASTER = "http://127.0.0.1:7400"
WATCH_PERIOD_S = 2.0
FOLLOW_PERIOD_S = 0.5
# Errors that mean "the master is not there to serve you now", like an unreachable one.
UNAVAILABLE_CODES = frozenset({"shutting_down"})


class UsageError(Exception):
    pass


def master_url(flag: str | None) -> str:
    """--master, else $TRELLIS_MASTER, else the config file, else localhost."""
    if flag:
        return flag
    if os.environ.get("TRELLIS_MASTER"):
        return os.environ["TRELLIS_MASTER"]
    for path in CONFIG_PATHS:
        if path.is_file():
            try:
                with open(path, "rb") as f:
                    value = tomllib.load(f).get("master")
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise UsageError(f"{path}: {exc}") from None
            if isinstance(value, str):
                return value
    return DEFAULT_MASTER


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trellisctl", description="Administer a Trellis cluster.")
    p.add_argument("--master", help=f"master URL (default $TRELLIS_MASTER, config, "
                                    f"{DEFAULT_MASTER})")
    p.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table",
                   help="output format: table, wide (more columns) or json")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the master")
    add_arguments(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    nodes = sub.add_parser("nodes", help="list nodes")
    nodes.add_argument("-w", "--watch", action="store_true",
                       help=f"refresh every {WATCH_PERIOD_S:g} s until Ctrl-C")
    node = sub.add_parser("node", help="one node in detail: GPUs, cores, jobs")
    node.add_argument("node", help="node name")
    node.add_argument("-w", "--watch", action="store_true",
                      help=f"refresh every {WATCH_PERIOD_S:g} s until Ctrl-C")
    jobs = sub.add_parser("jobs", help="list jobs")
    jobs.add_argument("--state", help="only jobs in this state (active: starting or running)",
                      choices=("queued", "starting", "running", "finished", "failed",
                               "cancelled", "active"))
    jobs.add_argument("--tenant", help="only this tenant's jobs")
    jobs.add_argument("--node", help="only jobs placed on this node")
    jobs.add_argument("-w", "--watch", action="store_true",
                      help=f"refresh every {WATCH_PERIOD_S:g} s until Ctrl-C")
    events = sub.add_parser("events", help="the master's journal of events")
    events.add_argument("--job", help="only events of this job")
    events.add_argument("--after", type=int, metavar="SEQ",
                        help="events after this sequence number, oldest first")
    events.add_argument("-n", "--tail", type=int, default=50,
                        help="without --after: the newest N events (default 50)")
    events.add_argument("--limit", type=int, default=1000, help="at most this many (--after)")
    events.add_argument("-f", "--follow", action="store_true",
                        help=f"keep printing new events (polls every {FOLLOW_PERIOD_S:g} s) "
                             "until Ctrl-C")

    submit = sub.add_parser("submit", help="submit a job")
    submit.add_argument("-f", "--file", help="job description (TOML or JSON)")
    submit.add_argument("--name")
    submit.add_argument("--id", help="job id to use (makes retries idempotent)")
    submit.add_argument("--kind", choices=("training", "inference", "cpu"))
    submit.add_argument("--gpus", type=int)
    submit.add_argument("--cpus", type=int)
    submit.add_argument("--memory-mib", type=int)
    submit.add_argument("--gpu-model")
    submit.add_argument("--user", help="Unix user the job runs as (default: you)")
    submit.add_argument("--tenant")
    submit.add_argument("--qos", choices=("urgent", "prior", "normal"))
    submit.add_argument("--model-type")
    submit.add_argument("--model-family", help="e.g. cnn, rnn: finds a similar profiled model")
    submit.add_argument("--model-params-m", type=float, help="millions of parameters")
    submit.add_argument("--batch", type=int)
    submit.add_argument("--iterations", type=int)
    submit.add_argument("--deadline", help="seconds from now (600, 90s, 10m, 2h, 1d) or an ISO "
                                           "time (2030-01-31T18:00, local unless it has a zone)")
    submit.add_argument("--max-nodes", type=int, help="most nodes the job may span")
    submit.add_argument("--workdir")
    submit.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("job_command", nargs=argparse.REMAINDER,
                        help="-- followed by the command to run")

    for name, text in (("cancel", "cancel a job"), ("show", "describe a job")):
        c = sub.add_parser(name, help=text)
        c.add_argument("job_id", help="job id")
    for name, text in (("drain", "stop placing jobs on a node"),
                       ("undrain", "place jobs on a node again")):
        c = sub.add_parser(name, help=text)
        c.add_argument("node", help="node name")
    comp = sub.add_parser("completion", help="print a bash completion script (completion "
                                             "bash), or job ids / node names (completion "
                                             "words jobs|nodes)")
    comp.add_argument("what", choices=("bash", "words"), help="bash script, or words")
    comp.add_argument("source", nargs="?", choices=("jobs", "nodes"),
                      help="with words: job ids or node names")
    add_genie_commands(sub)
    return p


def add_genie_commands(sub: Any) -> None:
    """GENIE's model database and profiler, SODA's pools."""
    models = sub.add_parser("models", help="list prediction models, or load them from a file")
    actions = models.add_subparsers(dest="models_action", metavar="ACTION")
    load = actions.add_parser("load", help="load a .json/.toml model database (see README)")
    load.add_argument("file")

    prof = sub.add_parser("profile", help="profile a model type with B + N + G real runs")
    # An option, not a positional: a positional before the command would swallow the options.
    prof.add_argument("--model-type", required=True, help="the model type to profile")
    prof.add_argument("--gpu-model", help="GPU model to profile on (default: the only one)")
    prof.add_argument("--kind", choices=("training", "inference"), default="training")
    prof.add_argument("--batches", help="single-GPU batch sizes, e.g. 8,16,32,64")
    prof.add_argument("--global-batch", type=int, help="batch of the N + G multi-GPU runs")
    prof.add_argument("--iterations", type=int, help="iterations per run (default 100)")
    prof.add_argument("--max-nodes", type=int, help="most nodes of the N runs")
    prof.add_argument("--max-gpus-per-node", type=int, help="most GPUs of the G runs")
    prof.add_argument("--cpus-per-gpu", type=int)
    prof.add_argument("--family", help="model family (cnn, rnn, ...) stored with the fit")
    prof.add_argument("--params-m", type=float, help="millions of parameters, stored")
    prof.add_argument("--user", help="Unix user the runs run as (default: you)")
    prof.add_argument("--tenant")
    prof.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    prof.add_argument("job_command", nargs=argparse.REMAINDER,
                      help="-- then the command; {batch}, {iterations}, {d_node}, {d_gpn} "
                           "are replaced per run")
    profiles = sub.add_parser("profiles", help="list profiling campaigns, or show one")
    profiles.add_argument("profile_id", nargs="?")

    pools = sub.add_parser("pools", help="SODA's arrays: sizes, use, loans (soda-arrays)")
    pools.add_argument("--resize", action="store_true",
                       help="re-derive array sizes from recent demand now")


def job_from_args(args: argparse.Namespace) -> dict[str, Any]:
    job: dict[str, Any] = {}
    if args.file:
        path = Path(args.file)
        try:
            raw = path.read_bytes()
            job = tomllib.loads(raw.decode()) if path.suffix == ".toml" else json.loads(raw)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: {exc}") from None
        if not isinstance(job, dict):
            raise UsageError(f"{path}: a job description must be a table/object")
    command = list(args.job_command)
    if command and command[0] == "--":
        command = command[1:]
    if command:
        job["command"] = command
    for key in ("name", "kind", "gpus", "cpus", "memory_mib", "gpu_model", "user", "tenant",
                "qos", "model_type", "model_family", "model_params_m", "batch", "iterations",
                "workdir", "max_nodes"):
        value = getattr(args, key)
        if value is not None:
            job[key] = value
    if args.deadline is not None:
        job["deadline"] = parse_deadline(args.deadline, time.time())
    if args.env:
        env = dict(job.get("env", {}))
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep:
                raise UsageError(f"--env {item!r}: expected KEY=VALUE")
            env[key] = value
        job["env"] = env
    if "command" not in job:
        raise UsageError("submit needs a command: trellisctl submit [options] -- CMD ARGS...")
    job.setdefault("name", Path(str(job["command"][0])).name.replace(".", "-")[:63] or "job")
    job.setdefault("user", getpass.getuser())
    if "kind" not in job:
        job["kind"] = "training" if job.get("gpus") else "cpu"
    return job


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_deadline(text: str, now: float) -> float:
    """Seconds since the epoch from "600", "+600", "90s", "10m", "2h", "1d" (from now) or an
    ISO 8601 time (local time unless it names a zone)."""
    raw = text.strip()
    body = raw[1:] if raw.startswith("+") else raw
    unit = 1.0
    if body and body[-1] in _UNITS:
        unit, body = _UNITS[body[-1]], body[:-1]
    try:
        seconds = float(body) * unit
    except ValueError:
        seconds = None
    if seconds is not None:
        if not seconds > 0 or seconds != seconds or seconds == float("inf"):
            raise UsageError(f"--deadline {text!r}: must be a positive number of seconds")
        return now + seconds
    try:
        moment = datetime.datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(
            f"--deadline {text!r}: not seconds from now (600, 10m, 2h) nor an ISO time "
            "(2030-01-31T18:00)") from None
    deadline = moment.timestamp()  # a naive time is local time
    if deadline <= now:
        raise UsageError(f"--deadline {text!r} is in the past")
    return deadline


def _fmt_time(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def _fmt_seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f}s"


def show_jobs(jobs: list[dict[str, Any]]) -> str:
    rows = [[j["id"], j["state"], j["kind"], j["tenant"], j["qos"], str(j["gpus"]),
             str(j["cpus"]), ",".join(j["nodes"]) or "-", _fmt_seconds(j["queued_s"]),
             "-" if j["exit_code"] is None and j["signal"] is None
             else (f"sig{j['signal']}" if j["signal"] is not None else str(j["exit_code"]))]
            for j in jobs]
    return render_table(["ID", "STATE", "KIND", "TENANT", "QOS", "GPUS", "CPUS", "NODES",
                         "QUEUED", "EXIT"], rows)


def _exit(j: dict[str, Any]) -> str:
    if j["exit_code"] is None and j["signal"] is None:
        return "-"
    return f"sig{j['signal']}" if j["signal"] is not None else str(j["exit_code"])


def show_jobs_wide(jobs: list[dict[str, Any]]) -> str:
    rows = [[j["id"], j["name"], j["state"], j["kind"], j["tenant"], j["user"], j["qos"],
             str(j["gpus"]), str(j["cpus"]), str(j["memory_mib"]),
             " ".join(f"{a['node']}:g{','.join(map(str, a['gpus'])) or '-'}"
                      f":c{_cpus(a['cpus'])}" for a in j["placement"]) or "-",
             _fmt_time(j["submit_time"]), _fmt_time(j["start_time"]), _fmt_time(j["end_time"]),
             _fmt_seconds(j["queued_s"]), str(j["attempts"]), _exit(j), j["reason"] or "-"]
            for j in jobs]
    return render_table(["ID", "NAME", "STATE", "KIND", "TENANT", "USER", "QOS", "GPUS", "CPUS",
                         "MEM MIB", "PLACEMENT", "SUBMITTED", "STARTED", "ENDED", "QUEUED",
                         "ATTEMPTS", "EXIT", "REASON"], rows)


def _cpus(cpus: list[int]) -> str:
    return format_cpu_list(cpus) or "-"


def _util(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def show_nodes(nodes: list[dict[str, Any]]) -> str:
    rows = [[n["name"], n["status"], n["gpu_model"] or "-",
             f"{n['gpus'] - n['gpus_free']}/{n['gpus']}", f"{n['cpus'] - n['cpus_free']}/"
             f"{n['cpus']}", ",".join(map(str, n["gpus_unhealthy"])) or "-", str(len(n["jobs"]))]
            for n in nodes]
    return render_table(["NODE", "STATUS", "GPU MODEL", "GPUS USED", "CPUS USED", "UNHEALTHY",
                         "JOBS"], rows)


def show_nodes_wide(nodes: list[dict[str, Any]]) -> str:
    rows = []
    for n in nodes:
        utils = [g["utilization_pct"] for g in n["gpu_detail"]
                 if g.get("utilization_pct") is not None]
        rows.append([
            n["name"], n["status"], n["address"], n["gpu_model"] or "-",
            f"{n['gpus'] - n['gpus_free']}/{n['gpus']}",
            _util(sum(utils) / len(utils)) if utils else "-",
            f"{n['cpus'] - n['cpus_free']}/{n['cpus']}",
            f"{n['memory_mib'] - n['memory_free_mib']}/{n['memory_mib']}",
            ",".join(map(str, n["gpus_unhealthy"])) or "-", ",".join(n["jobs"]) or "-"])
    return render_table(["NODE", "STATUS", "ADDRESS", "GPU MODEL", "GPUS USED", "GPU UTIL",
                         "CPUS USED", "MEM USED MIB", "UNHEALTHY", "JOBS"], rows)


def show_node(result: dict[str, Any], wide: bool = False) -> str:
    n = result["node"]
    lines = [
        f"{'Node:':<10}{n['name']} ({n['status']}) address {n['address']}",
        f"{'GPUs:':<10}{n['gpus']} x {n['gpu_model'] or '-'}, {n['gpus_free']} free",
        f"{'Cores:':<10}{n['cpus']}, {n['cpus_free']} free",
        f"{'Memory:':<10}{n['memory_mib']} MiB, {n['memory_free_mib']} MiB free",
    ]
    rdt = result.get("rdt") or {}
    if any(rdt.values()):
        lines.append(f"{'RDT:':<10}" + " ".join(f"{k}={'yes' if v else 'no'}"
                                                for k, v in rdt.items()))
    # Sections other features add to the reply (tc shaping, contention, ...) print as they
    # come: key=value per section.
    for key, value in result.items():
        if key in ("node", "jobs", "rdt") or not isinstance(value, dict) or not value:
            continue
        lines.append(f"{key.upper() + ':':<10}" + " ".join(f"{k}={v}" for k, v in value.items()))
    header = ["GPU", "UTIL", "HEALTH", "JOB"]
    gpu_rows = []
    for g in n["gpu_detail"]:
        row = [str(g["index"]), _util(g.get("utilization_pct")),
               "ok" if g["healthy"] else "unhealthy", g.get("job") or "-"]
        if wide:
            row += [g["uuid"], g["model"], str(g["memory_mib"]), str(g["numa_node"]),
                    g.get("pci_bus_id") or "-"]
        gpu_rows.append(row)
    if wide:
        header += ["UUID", "MODEL", "MEM MIB", "NUMA", "PCI"]
    lines += ["", render_table(header, gpu_rows), ""]
    job_rows = [[j["id"], j["state"], j["tenant"], j["user"], j["qos"],
                 ",".join(map(str, j["gpus"])) or "-", _cpus(j["cpus"]), str(j["memory_mib"])]
                for j in result["jobs"]]
    lines.append(render_table(["JOB", "STATE", "TENANT", "USER", "QOS", "GPUS", "CORES",
                               "MEM MIB"], job_rows) if job_rows else "no jobs")
    return "\n".join(lines)


def show_events(events: list[dict[str, Any]], header: bool = True) -> str:
    rows = [[str(e["seq"]), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"])),
             e["job"] or "-", e["node"] or "-", e["kind"],
             " ".join(f"{k}={_detail(v)}" for k, v in e["detail"].items()
                      if v not in (None, ""))]
            for e in events]
    text = render_table(["SEQ", "TIME", "JOB", "NODE", "KIND", "DETAIL"], rows)
    return text if header else "\n".join(text.split("\n")[1:])


def _detail(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else \
        str(value)


def show_job(result: dict[str, Any]) -> str:
    j = result["job"]
    lines = [f"{k + ':':<12}{v}" for k, v in (
        ("Job", j["id"]), ("Name", j["name"]), ("State", j["state"]), ("Kind", j["kind"]),
        ("Tenant", j["tenant"]), ("User", j["user"]), ("QoS", j["qos"]),
        ("Resources", f"{j['gpus']} GPU(s), {j['cpus']} core(s), {j['memory_mib']} MiB"),
        ("Command", " ".join(j["command"])), ("Submitted", _fmt_time(j["submit_time"])),
        ("Started", _fmt_time(j["start_time"])), ("Ended", _fmt_time(j["end_time"])),
        ("Queued", _fmt_seconds(j["queued_s"])), ("Exit code", j["exit_code"]),
        ("Signal", j["signal"]), ("Reason", j["reason"] or "-"), ("Attempts", j["attempts"]),
    )]
    for a in j["placement"]:
        lines.append(f"{'Placement:':<12}{a['node']} gpus={a['gpus']} cpus={a['cpus']}")
    lines.extend(show_prediction(result.get("prediction")))
    metrics = result.get("metrics") or {}
    if metrics:
        lines.append(f"{'Metrics:':<12}" + ", ".join(
            f"{name}={m['last']:.6g} (mean {m['value']:.6g}, {m['count']} reports)"
            for name, m in metrics.items()))
    lines.append("Events:")
    for e in result.get("events", []):
        detail = ", ".join(f"{k}={v}" for k, v in e["detail"].items() if v not in (None, ""))
        lines.append(f"  {_fmt_time(e['time'])}  {e['kind']:<14} {e['node'] or '':<10} {detail}")
    return "\n".join(lines)


def _num(x: float | None, fmt: str = ".4g") -> str:
    return "-" if x is None else format(x, fmt)


def show_prediction(p: dict[str, Any] | None) -> list[str]:
    """GENIE's view of the job: model, fallback, predicted latency, ECT and allowance."""
    if not p:
        return []
    lines = ["Prediction:"]
    model = p.get("model")
    what = f"type {p['model_type'] or '(none)'}, batch {p['batch'] or '-'}, " \
           f"{p['iterations'] or '-'} iterations ({p['kind']})"
    lines.append(f"  {'Task:':<16}{what}")
    if model:
        lines.append(f"  {'Model:':<16}{model['model_type']} on {model['gpu_model']}; "
                     f"source: {model['source'] or '-'}")
        c = model["coefficients"]
        lines.append(f"  {'Coefficients:':<16}k0={_num(c['k0'])} k1={_num(c['k1'])} "
                     f"k2={_num(c['k2'])} gamma={_num(c['gamma'])} lambda={_num(c['lam'])} "
                     f"nu={_num(c['nu'])}")
    else:
        lines.append(f"  {'Model:':<16}none")
    fallback = "FALLBACK: " + p["fallback_reason"] if p["fallback"] else "no (profiled model)"
    lines.append(f"  {'Fallback:':<16}{fallback}")
    place = p.get("placement")
    if place:
        cer = f", CER {place['cer']:.4g}" if place.get("cer") is not None else ""
        rate = f"{place['rate']:.1f} samples/s" if place.get("rate") else "infeasible"
        lines.append(f"  {'Placement:':<16}{place['d_node']} node(s) x {place['d_gpn']} GPU(s)"
                     f" of {place['gpu_model']}: {rate}{cer}")
    lines.append(f"  {'Latency:':<16}{_num(p['predicted_latency_s'], '.1f')}s predicted "
                 f"(one GPU: {_num(p['single_gpu_latency_s'], '.1f')}s)")
    if "actual_latency_s" in p:
        err = p.get("prediction_error")
        lines.append(f"  {'Actual:':<16}{p['actual_latency_s']:.1f}s"
                     + (f" (prediction off by {100 * err:+.1f}%)" if err is not None else ""))
    deadline = "deadline" if p.get("deadline") is not None else f"ECT of QoS {p['qos']}"
    lines.append(f"  {'Expected by:':<16}{_fmt_time(p['ect'])} ({deadline})")
    if p.get("waiting_allowance_s") is not None:
        meets = "meets its ECT" if p["meets_ect"] else "cannot meet its ECT"
        lines.append(f"  {'Allowance:':<16}{p['waiting_allowance_s']:.1f}s "
                     f"({meets}; {p['explained_by']} order)")
    return lines


def show_models(result: dict[str, Any]) -> str:
    rows = [[m["model_type"], m["gpu_model"], m["kind"], m["family"] or "-", _num(m["k0"]),
             _num(m["k1"]), _num(m["k2"]), _num(m["gamma"]), _num(m["lam"]), _num(m["nu"]),
             ("stored: " if m["stored"] else "") + (m["source"] or "-")]
            for m in result["models"]]
    text = render_table(["MODEL TYPE", "GPU MODEL", "KIND", "FAMILY", "K0", "K1", "K2", "GAMMA",
                         "LAMBDA", "NU", "SOURCE"], rows)
    if result.get("default_gpu_model"):
        text += f"\nUnprofiled GPU models fall back to {result['default_gpu_model']}."
    return text


def _fit_error(c: dict[str, Any]) -> str:
    fit = c.get("fit")
    if not fit:
        return "-"
    parts = [f"1-GPU {100 * fit['single_gpu_error']:.1f}%"]
    if fit.get("placement_error") is not None:
        parts.append(f"multi {100 * fit['placement_error']:.1f}%")
    return ", ".join(parts)


def show_profiles(result: dict[str, Any], detail: bool) -> str:
    rows = [[c["id"], c["model_type"], c["gpu_model"], c["kind"], c["state"],
             f"{c['runs_done']}/{len(c['runs'])}" + (f" ({c['runs_failed']} failed)"
                                                     if c["runs_failed"] else ""),
             _fit_error(c), c["error"] or "-"]
            for c in result["profiles"]]
    text = render_table(["ID", "MODEL TYPE", "GPU MODEL", "KIND", "STATE", "RUNS", "FIT ERROR",
                         "ERROR"], rows)
    if detail:
        for c in result["profiles"]:
            if c.get("fit"):
                f = c["fit"]
                text += (f"\nFit: k0={_num(f['k0'])} k1={_num(f['k1'])} k2={_num(f['k2'])} "
                         f"gamma={_num(f['gamma'])} lambda={_num(f['lam'])} nu={_num(f['nu'])}")
            runs = [[r["job_id"], r["phase"], f"<{r['d_node']}, {r['d_gpn']}>", str(r["batch"]),
                     r["state"], _num(r["rate"], ".2f"), _num(r["seconds"], ".1f"),
                     str(r["reports"]), r["reason"] or "-"] for r in c["runs"]]
            text += "\n" + render_table(["RUN", "PHASE", "SHAPE", "BATCH", "STATE",
                                          "SAMPLES/S", "SECONDS", "REPORTS", "REASON"], runs)
    return text


def show_pools(result: dict[str, Any]) -> str:
    rows = [[a["name"], a["kind"], a["unit"], str(a["size"]), str(a["used"]),
             str(a["borrowed_out"]), str(a["borrowed_in"]), str(a["queued"])]
            for a in result["arrays"]]
    text = render_table(["ARRAY", "KIND", "UNIT", "SIZE", "USED", "LENT", "BORROWED", "QUEUED"],
                        rows)
    last, change = result.get("last_resize"), result.get("last_change")
    if last:
        text += (f"\nLast re-size {_fmt_time(last['time'])} from {last['jobs']} job(s): "
                 + ("changed" if last["changed"] else "unchanged"))
    if change and change != last:
        text += f"; sizes last changed {_fmt_time(change['time'])}"
    return text


def profile_params(args: argparse.Namespace) -> dict[str, Any]:
    command = list(args.job_command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("profile needs a command: trellisctl profile TYPE [options] -- CMD")
    params: dict[str, Any] = {"model_type": args.model_type, "command": command,
                              "user": args.user or getpass.getuser(), "kind": args.kind}
    if args.batches:
        try:
            params["batches"] = [int(b) for b in args.batches.split(",") if b.strip()]
        except ValueError:
            raise UsageError(f"--batches {args.batches!r}: expected e.g. 8,16,32,64") from None
    for key in ("gpu_model", "global_batch", "iterations", "max_nodes", "max_gpus_per_node",
                "cpus_per_gpu", "family", "params_m", "tenant"):
        value = getattr(args, key)
        if value is not None:
            params[key] = value
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    if env:
        params["env"] = env
    return params


def model_rows(path: str) -> dict[str, Any]:
    """A model database file, checked here so a typo is reported with its path."""
    from masterd.core.genie.modeldb import ROW_FIELDS, ModelDB, ModelDBError

    try:
        db = ModelDB.load(path)
    except ModelDBError as exc:
        raise UsageError(str(exc)) from None
    rows = [{k: v for k, v in zip(ROW_FIELDS, row, strict=True) if v is not None}
            for row in db.to_rows()]
    params: dict[str, Any] = {"rows": rows}
    if db.default_gpu_model is not None:
        params["default_gpu_model"] = db.default_gpu_model
    return params


def run_genie(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str] | None:
    cmd = args.command
    if cmd == "models":
        if args.models_action == "load":
            result = client.call("load_models", model_rows(args.file))
            return result, f"loaded {result['loaded']} model(s): {', '.join(result['models'])}"
        result = client.call("models")
        return result, show_models(result)
    if cmd == "profile":
        result = client.call("profile", profile_params(args))
        c = result["profile"]
        return result, (f"profiling {c['model_type']} on {c['gpu_model']} as {c['id']}: "
                        f"{len(c['runs'])} runs ({', '.join(r['job_id'] for r in c['runs'])})")
    if cmd == "profiles":
        params = {"id": args.profile_id} if args.profile_id else {}
        result = client.call("profiles", params)
        return result, show_profiles(result, detail=bool(args.profile_id))
    if cmd == "pools":
        if args.resize:
            client.call("resize_arrays")
        result = client.call("pools")
        return result, show_pools(result)
    return None


def emit(result: Any, text: str, output: str, stream_json: bool = False) -> None:
    if output == "json":
        # One document per line when several follow each other (--watch, --follow).
        print(json.dumps(result, sort_keys=True) if stream_json
              else json.dumps(result, indent=2, sort_keys=True))
    else:
        print(text)
    sys.stdout.flush()


def fetch_view(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str]:
    """One call and its rendering for the list-like commands (the ones --watch repeats)."""
    wide = args.output == "wide"
    if args.command == "nodes":
        result = client.call("nodes")
        return result, (show_nodes_wide if wide else show_nodes)(result["nodes"])
    if args.command == "node":
        result = client.call("node", {"node": args.node})
        return result, show_node(result, wide)
    params = {k: getattr(args, k) for k in ("state", "tenant", "node")
              if getattr(args, k) is not None}
    result = client.call("jobs", params)
    return result, (show_jobs_wide if wide else show_jobs)(result["jobs"])


def watch(client: MasterClient, args: argparse.Namespace,
          sleep: Callable[[float], None] = time.sleep) -> int:
    clear = args.output != "json" and sys.stdout.isatty()
    first = True
    while True:
        result, text = fetch_view(client, args)
        if args.output != "json":
            banner = f"every {WATCH_PERIOD_S:g}s: trellisctl {args.command}  " \
                     f"{time.strftime('%H:%M:%S')}"
            if clear:
                sys.stdout.write("\033[H\033[2J")
            elif not first:
                sys.stdout.write("\n")
            text = f"{banner}\n\n{text}"
        emit(result, text, args.output, stream_json=True)
        first = False
        sleep(WATCH_PERIOD_S)


def events(client: MasterClient, args: argparse.Namespace,
           sleep: Callable[[float], None] = time.sleep) -> int:
    if args.after is not None and args.after < 0:
        raise UsageError("--after must be 0 or more")
    base: dict[str, Any] = {"job": args.job} if args.job else {}
    if args.after is not None:
        result = client.call("events", {**base, "after": args.after, "limit": args.limit})
    else:
        result = client.call("events", {**base, "tail": args.tail})
    if not args.follow:
        emit(result, show_events(result["events"]), args.output)
        return 0
    cursor = result["last"]
    rows = result["events"]
    header = True
    while True:
        if rows:
            if args.output == "json":
                for row in rows:
                    emit(row, "", "json", stream_json=True)
            else:
                emit(rows, show_events(rows, header=header), args.output)
                header = False
        sleep(FOLLOW_PERIOD_S)
        result = client.call("events", {**base, "after": cursor, "limit": 1000})
        rows = result["events"]
        cursor = result["last"]


def make_client(args: argparse.Namespace) -> MasterClient:
    url = master_url(args.master)
    return MasterClient(url, timeout=args.timeout, **credentials(args, url, CONFIG_PATHS))


def completion(args: argparse.Namespace) -> int:
    if args.what == "bash":
        if args.source is not None:
            raise UsageError("completion bash takes no further argument")
        print(bash_script(build_parser()))
        return 0
    if args.source is None:
        raise UsageError("completion words needs jobs or nodes")
    client = make_client(args)
    if args.source == "nodes":
        words = [n["name"] for n in client.call("nodes")["nodes"]]
    else:
        words = [j["id"] for j in client.call("jobs")["jobs"]]
    print("\n".join(words))
    return 0


def run(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "completion":
        return completion(args)
    if args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    client = make_client(args)
    if cmd in ("nodes", "node", "jobs"):
        if args.watch:
            try:
                return watch(client, args)
            except KeyboardInterrupt:
                return 0
        result, text = fetch_view(client, args)
    elif cmd == "events":
        try:
            return events(client, args)
        except KeyboardInterrupt:
            return 0
    elif cmd == "submit":
        params: dict[str, Any] = {"job": job_from_args(args)}
        if args.id:
            params["id"] = args.id
        result = client.call("submit", params)
        text = f"submitted {result['job']['id']}"
    elif cmd in ("cancel", "show"):
        result = client.call("cancel" if cmd == "cancel" else "job", {"id": args.job_id})
        text = (f"cancelling {result['job']['id']} ({result['job']['state']})"
                if cmd == "cancel" else show_job(result))
    elif cmd in ("drain", "undrain"):
        result = client.call(cmd, {"node": args.node})
        text = f"node {result['node']} is {result['status']}"
    elif (genie := run_genie(client, args)) is not None:
        result, text = genie
    else:  # argparse rejects unknown commands before this
        raise UsageError(f"unknown command {cmd}")
    emit(result, text, args.output)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with a usage message on bad usage
    try:
        return run(args)
    except (UsageError, AuthError) as exc:
        print(f"trellisctl: {exc}", file=sys.stderr)
        return 2
    except Unreachable as exc:
        print(f"trellisctl: {exc}", file=sys.stderr)
        return 3
    except RpcError as exc:
        print(f"trellisctl: {exc.code}: {exc.message}", file=sys.stderr)
        return 3 if exc.code in UNAVAILABLE_CODES else 1
    except KeyboardInterrupt:
        print("trellisctl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (trellisctl ... | head): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
