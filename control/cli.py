"""``trellisctl``: the operators' command line, speaking msgpack RPC to the master.

Exit status: 0 success, 1 the master refused the request, 2 bad usage or input,
3 the master could not be reached (or is shutting down), 130 interrupted. ``--watch`` and
``events --follow`` run until Ctrl-C and then exit 0.
"""

from __future__ import annotations

import argparse
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
    submit.add_argument("--batch", type=int)
    submit.add_argument("--iterations", type=int)
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
    return p


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
                "qos", "model_type", "batch", "iterations", "workdir"):
        value = getattr(args, key)
        if value is not None:
            job[key] = value
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
    lines.append("Events:")
    for e in result.get("events", []):
        detail = ", ".join(f"{k}={v}" for k, v in e["detail"].items() if v not in (None, ""))
        lines.append(f"  {_fmt_time(e['time'])}  {e['kind']:<14} {e['node'] or '':<10} {detail}")
    return "\n".join(lines)


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
