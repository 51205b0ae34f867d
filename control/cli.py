"""``trellisctl``: the operators' command line, speaking msgpack RPC to the master.

Exit status: 0 success, 1 the master refused the request, 2 bad usage or input,
3 the master could not be reached.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from control.client import MasterClient, RpcError, Unreachable
from control.credentials import add_arguments, credentials
from control.tables import render_table
from shared.auth import AuthError

CONFIG_PATHS = (Path("~/.config/trellis/trellisctl.toml").expanduser(),
                Path("/etc/trellis/trellisctl.toml"))
DEFAULT_MASTER = "http://127.0.0.1:7400"


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
    p.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="output format")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the master")
    add_arguments(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("nodes", help="list nodes")
    jobs = sub.add_parser("jobs", help="list jobs")
    jobs.add_argument("--state", help="queued, starting, running, finished, failed, cancelled "
                                      "or active")
    jobs.add_argument("--tenant")
    jobs.add_argument("--node")

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
        c.add_argument("job_id")
    for name, text in (("drain", "stop placing jobs on a node"),
                       ("undrain", "place jobs on a node again")):
        c = sub.add_parser(name, help=text)
        c.add_argument("node")
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


def show_nodes(nodes: list[dict[str, Any]]) -> str:
    rows = [[n["name"], n["status"], n["gpu_model"] or "-",
             f"{n['gpus'] - n['gpus_free']}/{n['gpus']}", f"{n['cpus'] - n['cpus_free']}/"
             f"{n['cpus']}", ",".join(map(str, n["gpus_unhealthy"])) or "-", str(len(n["jobs"]))]
            for n in nodes]
    return render_table(["NODE", "STATUS", "GPU MODEL", "GPUS USED", "CPUS USED", "UNHEALTHY",
                         "JOBS"], rows)


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


def run(args: argparse.Namespace) -> int:
    url = master_url(args.master)
    client = MasterClient(url, timeout=args.timeout, **credentials(args, url, CONFIG_PATHS))
    cmd = args.command
    if cmd == "nodes":
        result = client.call("nodes")
        text = show_nodes(result["nodes"])
    elif cmd == "jobs":
        params = {k: getattr(args, k) for k in ("state", "tenant", "node")
                  if getattr(args, k) is not None}
        result = client.call("jobs", params)
        text = show_jobs(result["jobs"])
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
    if args.output == "json":
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
        return 1


if __name__ == "__main__":
    sys.exit(main())
