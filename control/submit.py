"""What ``trellisctl submit`` sends: one job, or many in one ``submit_many`` call.

Many jobs come from ``--array SPEC`` (Slurm's syntax: ``0-999``, ``1,3,5-7``, ``0-99:2``;
each job gets its index in ``TRELLIS_ARRAY_INDEX`` and its name, and its id with ``--id``,
ends in ``_INDEX``) or from a job file with a ``jobs`` list (TOML ``[[jobs]]`` tables, or a
JSON list or ``{"jobs": [...]}``). Keys beside ``jobs`` are defaults for every job; options
on the command line override both.
"""

from __future__ import annotations

import argparse
import os
import time

from control.options import SPEC_OPTIONS
from control.usage import UsageError
from control.values import dependency_wire, parse_array

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ARRAY_INDEX_ENV = "TRELLIS_ARRAY_INDEX"
ARRAY_COUNT_ENV = "TRELLIS_ARRAY_COUNT"


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
    import datetime

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


def read_job_file(path: str) -> dict[str, Any] | list[Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if path.endswith(".toml"):
            import tomllib

            return tomllib.loads(raw.decode())
        import json

        return json.loads(raw)  # type: ignore[no-any-return]
    except (OSError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError included
        raise UsageError(f"{path}: {exc}") from None


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The job fields the command line sets (they win over the file)."""
    job: dict[str, Any] = {}
    command = list(args.job_command)
    if command and command[0] == "--":
        command = command[1:]
    if command:
        job["command"] = command
    for key in SPEC_OPTIONS:
        value = getattr(args, key)
        if value is not None:
            job[key] = value
    if args.deadline is not None:
        job["deadline"] = parse_deadline(args.deadline, time.time())
    if args.after is not None:
        job["after"] = dependency_wire(args.after)
    selector = selector_options(args)
    if selector:
        job["selector"] = selector
    job.update(time_options(args))
    stop = stop_options(args)
    if stop:
        job["stop"] = stop
    launch = launch_options(args)
    for key in ("stdout", "stderr"):
        pattern = getattr(args, key, None)
        if pattern is None:
            continue
        from shared.outputpattern import check_pattern

        try:
            check_pattern(pattern, key)
        except ValueError as exc:
            raise UsageError(f"--{key}: {exc}") from None
        launch[key] = pattern
    if launch:
        job["launch"] = launch
    return job


def selector_options(args: argparse.Namespace) -> dict[str, Any]:
    """--constraint, --nodelist, --exclude, --partition, --reservation and --exclusive as
    the spec's selector (only what the command line gives)."""
    from control.values import (
        parse_constraint,
        parse_hostlist,
        parse_partitions,
        parse_reservation,
    )

    selector: dict[str, Any] = {}
    if getattr(args, "constraint", None) is not None:
        selector.update(parse_constraint(args.constraint))
    if getattr(args, "nodelist", None) is not None:
        selector["only"] = parse_hostlist(args.nodelist, "--nodelist")
    if getattr(args, "exclude", None) is not None:
        selector["exclude"] = parse_hostlist(args.exclude)
    if getattr(args, "partition", None) is not None:
        selector["partitions"] = parse_partitions(args.partition)
    if getattr(args, "reservation", None) is not None:
        selector["reservation"] = parse_reservation(args.reservation)
    if getattr(args, "exclusive", None):
        selector["exclusive"] = True
    return selector


def parse_mount(text: str) -> dict[str, Any]:
    """``SRC:DST[:ro|rw]`` as a LaunchSpec mount."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise UsageError(f"--mount {text!r}: expected SRC:DST or SRC:DST:ro")
    if len(parts) == 3 and parts[2] not in ("ro", "rw"):
        raise UsageError(f"--mount {text!r}: the third field must be ro or rw")
    if not parts[0].startswith("/") or not parts[1].startswith("/"):
        raise UsageError(f"--mount {text!r}: both paths must be absolute")
    return {"source": parts[0], "target": parts[1],
            "read_only": len(parts) == 3 and parts[2] == "ro"}


def launch_options(args: argparse.Namespace) -> dict[str, Any]:
    """--image and --mount as the spec's launch (docs/containers.md)."""
    from shared.imageref import ImageRefError, parse_image

    launch: dict[str, Any] = {}
    image = getattr(args, "image", None)
    mounts = getattr(args, "mount", None) or []
    if image is not None:
        try:
            parse_image(image)
        except ImageRefError as exc:
            raise UsageError(f"--image: {exc}") from None
        launch["image"] = image
    if mounts:
        if image is None:
            raise UsageError("--mount needs --image: only a container job has mounts")
        launch["mounts"] = [parse_mount(m) for m in mounts]
    return launch


MAX_GRACE_S = 3600.0  # StopRules.grace_s's bound


def time_options(args: argparse.Namespace) -> dict[str, Any]:
    """--time as the spec's time_limit_s."""
    from shared.slurmtime import parse_time_limit

    job: dict[str, Any] = {}
    text = getattr(args, "time", None)
    if text is not None:
        try:
            job["time_limit_s"] = parse_time_limit(text)
        except ValueError as exc:
            raise UsageError(f"--time: {exc}") from None
    return job


def stop_options(args: argparse.Namespace) -> dict[str, Any]:
    """--signal, --grace and --requeue/--no-requeue as the spec's stop rules (its ``stop``:
    warning, grace_s, requeue); only what the command line gives."""
    from shared.slurmtime import parse_signal

    stop: dict[str, Any] = {}
    text = getattr(args, "signal", None)
    if text is not None:
        try:
            warning = parse_signal(text)
        except ValueError as exc:
            raise UsageError(f"--signal: {exc}") from None
        stop["warning"] = {"signal": warning.signal, "seconds": warning.seconds,
                           "batch_only": warning.batch_only}
    grace = getattr(args, "grace", None)
    if grace is not None:
        if not 0 <= grace <= MAX_GRACE_S:
            raise UsageError(f"--grace {grace:g}: must be 0 to {MAX_GRACE_S:g} seconds")
        stop["grace_s"] = grace
    requeue = getattr(args, "requeue", None)
    if requeue is not None:  # --requeue / --no-requeue
        stop["requeue"] = requeue
    return stop


def _layered(*layers: dict[str, Any]) -> dict[str, Any]:
    """Job maps, later ones winning, with their ``stop`` tables merged key by key (a file's
    ``stop = {grace_s = 60}`` keeps its grace under ``--no-requeue``)."""
    job: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            below = job.get(key)
            if key in ("stop", "launch") and isinstance(value, dict) and \
                    isinstance(below, dict):
                job[key] = {**below, **value}
            else:
                job[key] = value
    return job


def _env_items(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    return env


def _complete(job: dict[str, Any], env: dict[str, str], where: str) -> dict[str, Any]:
    """Defaults every job gets: a name from its command, the submitter as user, a kind."""
    if env:
        base = job.get("env", {})
        if not isinstance(base, dict):
            raise UsageError(f"{where}env must be a table of KEY = VALUE")
        job["env"] = {**base, **env}
    command = job.get("command")
    if not command:
        raise UsageError(f"{where}submit needs a command: trellisctl submit [options] -- CMD "
                         "ARGS...")
    if isinstance(command, str):
        raise UsageError(f"{where}command must be a list of words, e.g. [\"python3\", "
                         "\"train.py\"]")
    if isinstance(job.get("after"), str):  # Slurm's syntax, on the command line or in a file
        job["after"] = dependency_wire(job["after"], f"{where}after")
    job.setdefault("name", os.path.basename(str(command[0])).replace(".", "-")[:63] or "job")
    if "user" not in job:
        import getpass

        job["user"] = getpass.getuser()
    if "kind" not in job:
        job["kind"] = "training" if job.get("gpus") else "cpu"
    return job


def job_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The one job of ``trellisctl submit`` (without --array and a one-job file)."""
    jobs, _ = jobs_from_args(args)
    if len(jobs) != 1:
        raise UsageError(f"{args.file}: holds {len(jobs)} jobs; this needs exactly one")
    return jobs[0]


def jobs_from_args(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str | None]]:
    """Every job ``submit`` sends and the id each asks for (None: the master picks)."""
    from control.sbatch import script_job

    scripted = script_job(args)  # submit script.sh [ARGS...]: fills args from the script
    defaults: dict[str, Any] = {}
    listed: list[Any] | None = None
    if args.file:
        content = read_job_file(args.file)
        if isinstance(content, list):
            listed = content
        elif isinstance(content, dict):
            if "jobs" in content:
                if not isinstance(content["jobs"], list):
                    raise UsageError(f"{args.file}: jobs must be a list of jobs")
                listed = content["jobs"]
                defaults = {k: v for k, v in content.items() if k != "jobs"}
            else:
                defaults = content
        else:
            raise UsageError(f"{args.file}: a job description must be a table/object")
    overrides = _overrides(args)
    env = _env_items(args.env)
    if listed is None:
        jobs = [_layered(defaults, scripted or {}, overrides)]
        ids: list[str | None] = [args.id]
    else:
        if not listed:
            raise UsageError(f"{args.file}: the jobs list is empty")
        if args.id or args.array:
            raise UsageError(f"{args.file}: --id and --array apply to one job, and this file "
                             "lists several (give each an id in the file)")
        jobs, ids = [], []
        for i, item in enumerate(listed):
            if not isinstance(item, dict):
                raise UsageError(f"{args.file}: jobs[{i}] is not a table/object")
            job = _layered(defaults, item, overrides)
            job_id = job.pop("id", None)
            if job_id is not None and not isinstance(job_id, str):
                raise UsageError(f"{args.file}: jobs[{i}].id must be a string")
            jobs.append(job)
            ids.append(job_id)
    where = (lambda i: f"{args.file}: jobs[{i}]: ") if listed is not None else (lambda i: "")
    jobs = [_complete(job, env, where(i)) for i, job in enumerate(jobs)]
    if args.array:
        return expand_array(jobs[0], ids[0], parse_array(args.array))
    return jobs, ids


def expand_array(job: dict[str, Any], base_id: str | None, indices: list[int]
                 ) -> tuple[list[dict[str, Any]], list[str | None]]:
    """One job per index: name and id end in ``_INDEX``, the environment carries the index
    and the array's size, and the spec its array task: the array's id is ``--id`` when
    given, else the master names the array after its first task (the name only groups the
    tasks until then)."""
    jobs: list[dict[str, Any]] = []
    ids: list[str | None] = []
    count = str(len(indices))
    name = str(job["name"])
    for index in indices:
        suffix = f"_{index}"
        env = {**job.get("env", {}), ARRAY_INDEX_ENV: str(index), ARRAY_COUNT_ENV: count}
        jobs.append({**job, "name": name[:63 - len(suffix)] + suffix, "env": env,
                     "array": {"id": base_id or name, "index": index}})
        ids.append(None if base_id is None else base_id + suffix)
    return jobs, ids
