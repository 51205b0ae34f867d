"""``trellisctl``: the operators' command line, speaking msgpack RPC to the master.

Exit status: 0 success, 1 the master refused the request, 2 bad usage or input,
3 the master could not be reached (or is shutting down), 130 interrupted. ``--watch`` and
``events --follow`` run until Ctrl-C and then exit 0.

Global options (``--master``, ``-o``, ``--timeout``, credentials) go anywhere on the line,
before or after the command, as with kubectl. Start-up time matters (the CLI runs in shell
loops): modules a command does not need are imported inside the functions that need them,
and tests/unit/test_cli_imports.py holds a simple command to that.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from control.output import FORMATS, emit, structured
from control.usage import UsageError

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from control.client import MasterClient

CONFIG_PATHS = (os.path.expanduser("~/.config/trellis/trellisctl.toml"),
                "/etc/trellis/trellisctl.toml")
DEFAULT_MASTER = "http://127.0.0.1:7400"
WATCH_PERIOD_S = 2.0
FOLLOW_PERIOD_S = 0.5
# Errors that mean "the master is not there to serve you now", like an unreachable one.
UNAVAILABLE_CODES = frozenset({"shutting_down"})
JOB_STATES = ("queued", "starting", "running", "finished", "failed", "cancelled", "timeout",
              "node_lost",
              "active")

CSV_COMMANDS = ("report", "share")

__all__ = ["UsageError", "build_parser", "main", "parse_deadline"]


def parse_deadline(text: str, now: float) -> float:
    """See :func:`control.submit.parse_deadline` (kept here for existing callers)."""
    from control.submit import parse_deadline as parse

    return parse(text, now)


def master_url(flag: str | None) -> str:
    """--master, else $TRELLIS_MASTER, else the config file, else localhost."""
    if flag:
        return flag
    if os.environ.get("TRELLIS_MASTER"):
        return os.environ["TRELLIS_MASTER"]
    from control.credentials import read_config

    value = read_config(CONFIG_PATHS).get("master")
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return ",".join(value)  # several masters, one leading (docs/high-availability.md)
    return value if isinstance(value, str) else DEFAULT_MASTER


def add_global_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """The options every command takes. On the top-level parser they carry the defaults; on
    each subcommand their default is SUPPRESS, so a subcommand that is not given one keeps
    what was given before the command (argparse copies a subparser's values over)."""
    from control.credentials import add_arguments

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    g = parser.add_argument_group("global options (before or after the command)")
    g.add_argument("--master", default=default(None),
                   help=f"master URL (default $TRELLIS_MASTER, config, {DEFAULT_MASTER})")
    g.add_argument("-o", "--output", choices=FORMATS, default=default("table"),
                   help="output format: table, wide (more columns), json or yaml")
    g.add_argument("--timeout", type=float, default=default(30.0),
                   help="seconds to wait for the master")
    add_arguments(g, default=default(None))
    if not top:
        # Listed once, in `trellisctl --help` (and the man page), not under every command.
        for action in g._group_actions:  # argparse has no public API for this
            action.help = argparse.SUPPRESS


class Formatter(argparse.HelpFormatter):
    """argparse's help formatter, told the terminal's width: argparse builds one per
    add_argument and, not told, imports shutil (and with it zlib, bz2 and lzma) to ask."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_columns() - 2)


def _columns() -> int:
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


GLOBAL_NOTE = ("Global options (--master, -o/--output, --timeout, --token-file, --ca-file, "
               "--cert-file, --key-file) go before or after the command: trellisctl --help.")
# Global options that take a value (the next word, or after "=" / attached to "-o").
_VALUED = frozenset({"--master", "-o", "--output", "--timeout", "--token-file", "--ca-file",
                     "--cert-file", "--key-file"})


def command_word(argv: list[str]) -> str | None:
    """The command ``argv`` names, if that is certain without argparse: only known global
    options (spelled in full) may come before it. None: build every command's parser."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word.startswith("-"):
            name = word.split("=", 1)[0]
            if name in _VALUED:
                skip = "=" not in word
            elif not (word.startswith("-o") and len(word) > 2):  # -ojson
                return None  # --help, an abbreviation, a typo: argparse decides
        else:
            return word if word in COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` the parser of that one command (what a run of
    ``trellisctl`` needs: building all of them costs more than a simple command's imports)."""
    p = argparse.ArgumentParser(prog="trellisctl", description="Administer a Trellis cluster.",
                                formatter_class=Formatter)
    add_global_options(p, top=True)

    def command(group: Any, name: str, **kw: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = group.add_parser(
            name, formatter_class=Formatter, epilog=GLOBAL_NOTE, **kw)
        add_global_options(parser, top=False)
        return parser

    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (text, add) in COMMANDS.items():
        if only is None or name == only:
            add(command(sub, name, help=text), command)
    return p


_WATCH_HELP = f"refresh every {WATCH_PERIOD_S:g} s until Ctrl-C"
Builder = Callable[[argparse.ArgumentParser, Callable[..., argparse.ArgumentParser]], None]


def _nodes(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("-w", "--watch", action="store_true", help=_WATCH_HELP)


def _node(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("node", help="node name")
    p.add_argument("-w", "--watch", action="store_true", help=_WATCH_HELP)


def _jobs(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("--state", choices=JOB_STATES,
                   help="only jobs in this state (active: starting or running)")
    p.add_argument("--tenant", help="only this tenant's jobs")
    p.add_argument("--node", help="only jobs placed on this node")
    p.add_argument("-w", "--watch", action="store_true", help=_WATCH_HELP)


def _events(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("--job", help="only events of this job")
    p.add_argument("--after", type=int, metavar="SEQ",
                   help="events after this sequence number, oldest first")
    p.add_argument("-n", "--tail", type=int, default=50,
                   help="without --after: the newest N events (default 50)")
    p.add_argument("--limit", type=int, default=1000, help="at most this many (--after)")
    p.add_argument("-f", "--follow", action="store_true",
                   help=f"keep printing new events (polls every {FOLLOW_PERIOD_S:g} s) until "
                        "Ctrl-C")


def _submit(p: argparse.ArgumentParser, _: Any) -> None:
    """``trellisctl submit``'s options: control/options.py holds each, with its Slurm
    spellings."""
    from control.options import add_submit_arguments

    add_submit_arguments(p)


def _run(p: argparse.ArgumentParser, command: Any) -> None:
    """``trellisctl run``: submit's options, and --pty (docs/interactive.md)."""
    p.add_argument("--pty", action="store_true",
                   help="run the command on a terminal on its node, attached to this one "
                        "(srun --pty): e.g. run --gpus 1 --pty -- bash")
    _submit(p, command)


def _port_forward(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("job_id", help="a running job of yours")
    p.add_argument("ports", metavar="LOCAL[:REMOTE]",
                   help="listen on 127.0.0.1:LOCAL here; each connection reaches the job's "
                        "port REMOTE (default LOCAL) on its node")


def _update(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("job_id", help="job id")
    p.add_argument("--qos", choices=("urgent", "prior", "normal"), help="new QoS class")
    p.add_argument("--time", help="new time limit: MM, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]")
    p.add_argument("--priority", type=int, help="new priority")


def _job_id(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("job_id", help="job id")


def _logs(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("job_id", help="job id")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing output as it comes until the job ends (or Ctrl-C)")
    p.add_argument("-n", "--tail", type=int, metavar="N",
                   help="begin N lines before the end of each node's part")
    p.add_argument("--node", help="only the part that ran on this node (default: every "
                                  "part, each line prefixed with [node] when there are "
                                  "several)")


def _node_name(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("node", help="node name")


def _drain(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("node", help="node name")
    p.add_argument("--reason", default="", help="why, shown with the node's state (Slurm's "
                                                "scontrol ... Reason=)")


def _completion(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("what", choices=("bash", "words"), help="bash script, or words")
    p.add_argument("source", nargs="?", choices=("jobs", "nodes"),
                   help="with words: job ids or node names")


def _models(p: argparse.ArgumentParser, command: Any) -> None:
    actions = p.add_subparsers(dest="models_action", metavar="ACTION")
    load = command(actions, "load", help="load a .json/.toml model database (see "
                                         "docs/policies/genie.md)")
    load.add_argument("file")


def _profile(p: argparse.ArgumentParser, _: Any) -> None:
    # An option, not a positional: a positional before the command would swallow the options.
    p.add_argument("--model-type", required=True, help="the model type to profile")
    p.add_argument("--gpu-model", help="GPU model to profile on (default: the only one)")
    p.add_argument("--kind", choices=("training", "inference"), default="training")
    p.add_argument("--batches", help="single-GPU batch sizes, e.g. 8,16,32,64")
    p.add_argument("--global-batch", type=int, help="batch of the N + G multi-GPU runs")
    p.add_argument("--iterations", type=int, help="iterations per run (default 100)")
    p.add_argument("--max-nodes", type=int, help="most nodes of the N runs")
    p.add_argument("--max-gpus-per-node", type=int, help="most GPUs of the G runs")
    p.add_argument("--cpus-per-gpu", type=int)
    p.add_argument("--family", help="model family (cnn, rnn, ...) stored with the fit")
    p.add_argument("--params-m", type=float, help="millions of parameters, stored")
    p.add_argument("--user", help="Unix user the runs run as (default: you)")
    p.add_argument("--tenant")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("job_command", nargs=argparse.REMAINDER,
                   help="-- then the command; {batch}, {iterations}, {d_node}, {d_gpn} are "
                        "replaced per run")


def _profiles(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("profile_id", nargs="?")


def _pools(p: argparse.ArgumentParser, _: Any) -> None:
    p.add_argument("--resize", action="store_true",
                   help="re-derive array sizes from recent demand now")


# Every command: its one-line help and what adds its arguments (in --help's order).
COMMANDS: dict[str, tuple[str, Builder]] = {
    "nodes": ("list nodes", _nodes),
    "node": ("one node in detail: GPUs, cores, jobs", _node),
    "jobs": ("list jobs", _jobs),
    "events": ("the master's journal of events", _events),
    "submit": ("submit a job, or many (--array, a file of jobs)", _submit),
    "cancel": ("cancel a job", _job_id),
    "hold": ("keep a queued job from starting until released", _job_id),
    "release": ("let a held job start again", _job_id),
    "update": ("change a job's QoS, time limit or priority (users may only lower them)",
               _update),
    "show": ("describe a job", _job_id),
    "run": ("run a job and wait for it, its output here (srun): --pty for a terminal on "
            "its node", _run),
    "attach": ("attach this terminal to a running job's terminal again (run --pty)",
               _job_id),
    "port-forward": ("relay a local port to a TCP port of a running job (JOB LOCAL[:REMOTE])",
                     _port_forward),
    "logs": ("a job's output (stdout and stderr), from every node it ran on", _logs),
    "drain": ("stop placing jobs on a node (running ones stay): drain NODE --reason TEXT",
              _drain),
    "gpu": ("return a GPU that is out of service to service (gpu reset NODE INDEX)",
            lambda p, c: _failures().add_gpu(p, c)),
    "undrain": ("place jobs on a node again", _node_name),
    "completion": ("print a bash completion script (completion bash), or job ids / node "
                   "names (completion words jobs|nodes)", _completion),
    "models": ("list prediction models, or load them from a file", _models),
    "profile": ("profile a model type with B + N + G real runs", _profile),
    "profiles": ("list profiling campaigns, or show one", _profiles),
    "pools": ("SODA's arrays: sizes, use, loans (soda-arrays)", _pools),
    "partitions": ("partitions: their nodes, limits, accounts, free GPUs and jobs (sinfo)",
                   lambda p, c: None),
    "partition": ("admins: partition update NAME --state up|down|drain|inactive",
                  lambda p, c: _partition().add_partition(p, c)),
    "priority-classes": ("priority classes: who queues first and who may preempt whom",
                         lambda p, c: None),
    "maintenance": ("maintenance windows: list; admins: plan, remove",
                    lambda p, c: _maintenance().add_maintenance(p, c)),
    "reservation": ("reservations: list; admins: create, update, delete",
                    lambda p, c: _reservations().add_reservation(p, c)),
    "account": ("accounts: list, show; admins: add, set, remove, add-user, remove-user",
                lambda p, c: _accounts().add_account(p, c)),
    "estimator": ("QSSF's duration estimator: accuracy, last training (qssf)",
                  lambda p, c: _helios().add_estimator(p, c)),
    "power": ("Cluster Energy Saving: powered-down nodes, wake-ups",
              lambda p, c: _helios().add_power(p, c)),
    "share": ("fair share: each account's shares, decayed usage and factor",
              lambda p, c: _fairshare().add_share(p, c)),
    "report": ("accounting: GPU-hours, jobs by end state, waits, requeues by account, user "
               "or GPU model", lambda p, c: _fairshare().add_report(p, c)),
}


def _fairshare() -> Any:
    from control import fairshare

    return fairshare


def _helios() -> Any:
    from control import helios

    return helios


def _maintenance() -> Any:
    from control import maintenance

    return maintenance


def _partition() -> Any:
    from control import partitions

    return partitions


def _reservations() -> Any:
    from control import reservations

    return reservations


def _accounts() -> Any:
    from control import accounts

    return accounts


def _failures() -> Any:
    from control import failures

    return failures


def fetch_view(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str]:
    """One call and its rendering for the list-like commands (the ones --watch repeats)."""
    text = not structured(args.output)
    wide = args.output == "wide"
    if text:
        from control import views
    if args.command == "nodes":
        result = client.call("nodes")
        if not text:
            return result, ""
        return result, (views.show_nodes_wide if wide else views.show_nodes)(result["nodes"])
    if args.command == "node":
        result = client.call("node", {"node": args.node})
        return result, views.show_node(result, wide) if text else ""
    params = {k: getattr(args, k) for k in ("state", "tenant", "node")
              if getattr(args, k) is not None}
    result = client.call("jobs", params)
    if not text:
        return result, ""
    return result, (views.show_jobs_wide if wide else views.show_jobs)(result["jobs"])


def watch(client: MasterClient, args: argparse.Namespace,
          sleep: Callable[[float], None] = time.sleep) -> int:
    clear = not structured(args.output) and sys.stdout.isatty()
    first = True
    while True:
        result, text = fetch_view(client, args)
        if not structured(args.output):
            banner = f"every {WATCH_PERIOD_S:g}s: trellisctl {args.command}  " \
                     f"{time.strftime('%H:%M:%S')}"
            if clear:
                sys.stdout.write("\033[H\033[2J")
            elif not first:
                sys.stdout.write("\n")
            text = f"{banner}\n\n{text}"
        emit(result, text, args.output, stream=True)
        first = False
        sleep(WATCH_PERIOD_S)


def events(client: MasterClient, args: argparse.Namespace,
           sleep: Callable[[float], None] = time.sleep) -> int:
    from control.views import show_events

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
            if structured(args.output):
                for row in rows:
                    emit(row, "", args.output, stream=True)
            else:
                emit(rows, show_events(rows, header=header), args.output)
                header = False
        sleep(FOLLOW_PERIOD_S)
        result = client.call("events", {**base, "after": cursor, "limit": 1000})
        rows = result["events"]
        cursor = result["last"]


def logs(client: MasterClient, args: argparse.Namespace) -> int:
    """The job's output as bytes on stdout; ``-f`` until the job ends, or Ctrl-C (exit 130,
    quietly: stopping a follow is how it is used)."""
    from control.logs import run_cli

    try:
        return run_cli(client, args.job_id, args.follow, args.tail, args.node,
                       sys.stdout.buffer)
    except KeyboardInterrupt:
        return 130


def make_client(args: argparse.Namespace) -> MasterClient:
    from control.credentials import credentials
    from control.failover import connect  # several masters, comma-separated: the leader's

    try:
        url = master_url(args.master)
        return connect(url, timeout=args.timeout,  # type: ignore[return-value]
                       **credentials(args, url, CONFIG_PATHS))
    except ValueError as exc:  # a bad URL, config file or credential (AuthError)
        raise UsageError(str(exc)) from None


def completion(args: argparse.Namespace) -> int:
    if args.what == "bash":
        from control.completion import bash_script

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


def submit(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str]:
    """One job with ``submit``, several (an array, a file of jobs) with one ``submit_many``."""
    from control.submit import jobs_from_args

    jobs, ids = jobs_from_args(args)
    if len(jobs) == 1 and not args.array:
        params: dict[str, Any] = {"job": jobs[0]}
        if ids[0]:
            params["id"] = ids[0]
        result = client.call("submit", params)
        return result, f"submitted {result['job']['id']}"
    many: dict[str, Any] = {"jobs": jobs}
    if any(i is not None for i in ids):
        many["ids"] = ids
    result = client.call("submit_many", many)
    done = [j["id"] for j in result["jobs"]]
    shown = ", ".join(done) if len(done) <= 4 else f"{done[0]}, {done[1]} ... {done[-1]}"
    array = result["jobs"][0].get("array") if args.array else None
    named = f" (array {array['id']})" if array else ""
    return result, f"submitted {len(done)} jobs{named}: {shown}"


def control(client: MasterClient, args: argparse.Namespace) -> tuple[Any, str]:
    """hold, release and update: one call each, the job's view back."""
    cmd = args.command
    params: dict[str, Any] = {"id": args.job_id}
    if cmd == "update":
        if args.time is not None:
            from shared.slurmtime import parse_time_limit

            try:
                params["time_limit_s"] = parse_time_limit(args.time)
            except ValueError as exc:
                raise UsageError(f"--time: {exc}") from None
        if args.qos is not None:
            params["qos"] = args.qos
        if args.priority is not None:
            params["priority"] = args.priority
        if len(params) == 1:
            raise UsageError("update needs at least one of --qos, --time, --priority")
    job = client.call(cmd, params)["job"]
    if cmd == "hold":
        return {"job": job}, f"{job['id']} is held ({job['held']})"
    if cmd == "release":
        return {"job": job}, f"{job['id']} is released ({job['state']})"
    return {"job": job}, (f"{job['id']} updated: qos {job['qos']}, priority "
                          f"{job['priority']}")


def run(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "completion":
        return completion(args)
    if args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    if cmd == "logs" and args.tail is not None and args.tail < 0:
        raise UsageError(f"--tail must be 0 or more lines, got {args.tail}")
    if args.output == "csv" and cmd not in CSV_COMMANDS:
        raise UsageError(f"-o csv is for {' and '.join(CSV_COMMANDS)}; {cmd} prints table, "
                         "wide, json or yaml")
    client = make_client(args)
    if cmd == "logs":
        return logs(client, args)
    if cmd in ("run", "attach", "port-forward"):
        from control import interactive

        if cmd == "run":
            return interactive.run(client, args)
        if cmd == "attach":
            return interactive.attach(client, args.job_id)
        return interactive.port_forward(client, args.job_id, args.ports)
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
        result, text = submit(client, args)
    elif cmd in ("hold", "release", "update"):
        result, text = control(client, args)
    elif cmd in ("cancel", "show"):
        result = client.call("cancel" if cmd == "cancel" else "job", {"id": args.job_id})
        if cmd == "cancel":
            text = f"cancelling {result['job']['id']} ({result['job']['state']})"
        else:
            from control.views import show_job

            text = "" if structured(args.output) else show_job(result)
    elif cmd in ("drain", "undrain"):
        params = {"node": args.node}
        if cmd == "drain" and args.reason:
            params["reason"] = args.reason
        result = client.call(cmd, params)
        text = f"node {result['node']} is {result['status']}"
    elif cmd == "gpu":
        result, text = _failures().run_gpu(client, args)
    elif cmd == "share":
        result, text = _fairshare().run_share(client, args)
    elif cmd == "report":
        result, text = _fairshare().run_report(client, args)
    elif cmd == "account":
        result, text = _accounts().run_account(client, args)
    elif cmd == "partitions":
        from control.views import show_partitions

        result = client.call("partitions")
        text = show_partitions(result["partitions"])
    elif cmd == "partition":
        result, text = _partition().run_partition(client, args)
    elif cmd == "maintenance":
        result, text = _maintenance().run_maintenance(client, args)
    elif cmd == "reservation":
        result, text = _reservations().run_reservation(client, args)
    elif cmd == "priority-classes":
        from control.views import show_priority_classes

        result = client.call("priority_classes")
        text = show_priority_classes(result["classes"])
    elif cmd in ("estimator", "power"):
        found = _helios().run_helios(client, args)
        assert found is not None
        result, text = found
    else:
        from control.genie import run_genie

        genie = run_genie(client, args)
        if genie is None:  # argparse rejects unknown commands before this
            raise UsageError(f"unknown command {cmd}")
        result, text = genie
    emit(result, text, args.output)
    return 0


def main(argv: list[str] | None = None) -> int:
    from control.client import RpcError, Unreachable

    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=command_word(words))
    args = parser.parse_args(words)  # exits 2 with a usage message on bad usage
    try:
        return run(args)
    except UsageError as exc:
        print(f"trellisctl: {exc}", file=sys.stderr)
        return 2
    except Unreachable as exc:
        print(f"trellisctl: {exc}", file=sys.stderr)
        return 3
    except RpcError as exc:
        refused = (exc.detail or {}).get("refused")
        if isinstance(refused, list):  # a batch: a summary, then one line per refused job
            accepted = exc.detail.get("accepted") or []  # type: ignore[union-attr]
            kept = (f"{len(accepted)} job(s) were stored and queued all the same" if accepted
                    else "no job was submitted")
            print(f"trellisctl: {exc.code}: {len(refused)} of {exc.detail.get('jobs', '?')} "  # type: ignore[union-attr]
                  f"job(s) refused; {kept}", file=sys.stderr)
            for r in refused:
                print(f"  jobs[{r.get('index')}]: {r.get('code')}: {r.get('message')}",
                      file=sys.stderr)
        else:
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
