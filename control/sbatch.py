"""Batch scripts as ``sbatch`` reads them: ``trellisctl submit script.sh [ARGS...]``.

The script's ``#SBATCH`` lines (and ``#TRELLIS`` lines, which win over them) give submission
options; options on trellisctl's command line win over both, as with sbatch. As in sbatch,
directives are read only before the first command: the first line that is neither blank nor a
comment ends them, and a directive after it is ignored with a warning. An option Trellis has
no meaning for is named with its line and refuses the submission (``--ignore-unsupported``:
a warning instead). Values are checked here, with the line they came from, by the parsers the
command line uses (shared/slurmtime.py, shared/dependency.py, ``submit --array``'s).

Plain synchronous code with no I/O but :func:`read_script`: docs/slurm.md is its user guide.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from control.options import CPU, NODE, OPTIONS, QOS_CLASSES, TASK, Option, Spelling, spellings
from control.usage import UsageError

PREFIXES = ("#SBATCH", "#TRELLIS")
MAX_SCRIPT_BYTES = 1 << 20  # LaunchSpec.script's bound
# Names a path given to ``submit`` without ``--`` has when it is a batch script although it
# does not exist (so that a typo is an error here, not a job that fails on its node).
SCRIPT_SUFFIXES = (".sh", ".bash", ".sbatch", ".slurm", ".job", ".batch")
DEFAULT_OUTPUT = "slurm-%j.out"  # sbatch's default output file, in the working directory
DEFAULT_ARRAY_OUTPUT = "slurm-%A_%a.out"

_SIZE = re.compile(r"(\d+)([KMGT]?)B?", re.IGNORECASE)
_MIB_PER = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "": 1}


@dataclass
class Directive:
    line: int
    prefix: str  # "#SBATCH" or "#TRELLIS"
    option: str  # the long name, e.g. "time"
    value: str | None
    spelled: str  # as written, for messages ("-t", "--time")


@dataclass
class ScriptOptions:
    """What a script asks for: submit's option values (argparse dests, as the command line
    would give them), its launch table, and what to tell the user."""

    values: dict[str, Any] = field(default_factory=dict)
    launch: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)  # "--mail-type (line 3)"


def looks_like_script(word: str) -> bool:
    """Whether ``submit WORD ...`` (no ``--``) means a batch script: a path that exists here,
    or a word shaped like one (a ``/`` in it, a script's suffix). ``submit sleep 10`` stays a
    command, as it always was."""
    return os.path.lexists(word) or "/" in word or word.endswith(SCRIPT_SUFFIXES)


def read_script(path: str) -> str:
    """The script's text; UsageError (one sentence) if it is not a readable text file with a
    shebang."""
    import stat

    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise UsageError(f"{path} is a directory, not a batch script")
        if not stat.S_ISREG(mode):  # a FIFO or a device would block or never end
            raise UsageError(f"{path} is not a regular file, so not a batch script")
        with open(path, "rb") as f:
            raw = f.read(MAX_SCRIPT_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such batch script (to run a command on the node, "
                         f"write: trellisctl submit -- {path})") from None
    except OSError as exc:
        raise UsageError(f"cannot read the batch script {path}: {exc.strerror or exc}") \
            from None
    if len(raw) > MAX_SCRIPT_BYTES:
        raise UsageError(f"{path} is larger than {MAX_SCRIPT_BYTES >> 20} MiB; a batch script "
                         "travels with its job")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text; is it a batch script?") from None
    if not text.startswith("#!"):
        raise UsageError(f"{path} has no shebang (#!) on its first line: name its "
                         "interpreter, e.g. #!/bin/bash")
    if "\0" in text:
        raise UsageError(f"{path} holds NUL bytes; is it a batch script?")
    if "\r\n" in text:  # as sbatch: the interpreter would be "/bin/bash\r"
        raise UsageError(f"{path} has DOS line breaks (\\r\\n); convert it first, e.g. with "
                         "dos2unix")
    return text


def directives(text: str, where: str) -> tuple[list[Directive], list[str], list[str]]:
    """The script's directives in order, the options it names that Trellis does not know
    (``--mail-type (line 3)``) and warnings (directives after the first command)."""
    found: list[Directive] = []
    unknown: list[str] = []
    warnings: list[str] = []
    in_header = True
    for number, line in enumerate(text.splitlines(), start=1):
        if number == 1:
            continue  # the shebang
        stripped = line.strip()
        prefix = next((p for p in PREFIXES if line.startswith(p)
                       and line[len(p):len(p) + 1] in ("", " ", "\t")), None)
        if not in_header:
            if prefix is not None:
                warnings.append(f"{where} line {number}: {prefix} after the first command is "
                                "ignored (as sbatch does)")
            continue
        if stripped and not stripped.startswith("#"):
            in_header = False
            continue
        if prefix is None:
            continue
        for item in _options(line[len(prefix):], prefix, number, where):
            if isinstance(item, str):
                unknown.append(item)
            else:
                found.append(item)
    return found, unknown, warnings


def _tokens(rest: str, where: str, number: int) -> list[str]:
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise UsageError(f"{where} line {number}: {exc} in {rest.strip()!r}") from None
    # A word starting with '#' begins a comment, as in a shell.
    for i, word in enumerate(words):
        if word.startswith("#"):
            return words[:i]
    return words


def _options(rest: str, prefix: str, number: int, where: str) -> list[Directive | str]:
    table = spellings(prefix)
    shorts = {short: name for name, (short, _) in table.items() if short}
    words = _tokens(rest, where, number)
    out: list[Directive | str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            spelled = "--" + name
            known = table.get(name)
            inline: str | None = value if eq else None
        elif word.startswith("-") and len(word) > 1:
            name = shorts.get(word[1], "")
            spelled = word[:2]
            known = table.get(name) if name else None
            inline = word[2:] or None
            if inline is not None and inline.startswith("="):
                inline = inline[1:]
        else:
            raise UsageError(f"{where} line {number}: {prefix} expects options, not "
                             f"{word!r}")
        if known is None:
            out.append(f"{spelled} (line {number})")
            # Skip the unknown option's value too when it is written apart and is one.
            if not (word.startswith("--") and "=" in word) and i < len(words) \
                    and not words[i].startswith("-"):
                i += 1
            continue
        takes_value = known[1]
        if takes_value and inline is None:
            if i >= len(words):
                raise UsageError(f"{where} line {number}: {spelled} needs a value")
            inline = words[i]
            i += 1
        elif not takes_value and inline is not None:
            raise UsageError(f"{where} line {number}: {spelled} takes no value")
        out.append(Directive(number, prefix, name, inline, spelled))
    return out


def parse_script(text: str, where: str, environ: Mapping[str, str] | None = None
                 ) -> ScriptOptions:
    """The options a script's directives give, checked, with #TRELLIS lines winning, and
    sbatch's input variables in ``environ`` (``SBATCH_TIMELIMIT``, ...) over both."""
    found, unknown, warnings = directives(text, where)
    ordered = [d for d in found if d.prefix == "#SBATCH"] + \
        [d for d in found if d.prefix == "#TRELLIS"]
    result = ScriptOptions(warnings=warnings, unsupported=unknown)
    chosen: dict[str, Directive] = {}
    for d in ordered:
        if d.option == "env":
            key, sep, value = (d.value or "").partition("=")
            if not sep or not key:
                raise _bad(where, d, "expected KEY=VALUE")
            result.env[key] = value
            continue
        if d.option in ("requeue", "no-requeue"):
            chosen.pop("requeue", None)
            chosen.pop("no-requeue", None)
        chosen[d.option] = d
    ctx = _resolve(chosen, result, where)
    from_env = environment_directives(environ or {})
    if from_env:  # per-node amounts still count the script's nodes
        _resolve(from_env, result, where, ctx)
    return result


def _bad(where: str, d: Directive, why: str) -> UsageError:
    shown = f"{d.spelled}={d.value}" if d.value is not None else d.spelled
    if d.prefix == "env":
        return UsageError(f"{shown} in the environment: {why}")
    return UsageError(f"{where} line {d.line}: {shown}: {why}")


def _count(where: str, d: Directive, low: int = 1) -> int:
    text = (d.value or "").strip()
    if not text.isdigit() or int(text) < low:
        raise _bad(where, d, f"expected a whole number of at least {low}")
    return int(text)


def _gpu_count(where: str, d: Directive) -> tuple[str | None, int]:
    """``N`` or ``TYPE:N`` (``--gpus``, ``--gpus-per-node``)."""
    kind, colon, number = (d.value or "").rpartition(":")
    if not number.isdigit():
        raise _bad(where, d, "expected N or TYPE:N GPUs")
    return (kind or None) if colon else None, int(number)


def _gres(where: str, d: Directive) -> tuple[str | None, int]:
    """``gpu``, ``gpu:N`` or ``gpu:TYPE:N``; other generic resources are not Trellis'."""
    items = [i.strip() for i in (d.value or "").split(",") if i.strip()]
    if len(items) != 1 or items[0].split(":")[0] != "gpu":
        raise _bad(where, d, "only gpu[:TYPE]:N is supported (Trellis schedules GPUs, CPUs "
                             "and memory, no other generic resources)")
    parts = items[0].split(":")[1:]
    if not parts:
        return None, 1
    if len(parts) > 2 or not parts[-1].isdigit():
        raise _bad(where, d, "expected gpu, gpu:N or gpu:TYPE:N")
    return (parts[0] if len(parts) == 2 else None), int(parts[-1])


def _mem_mib(where: str, d: Directive) -> int:
    match = _SIZE.fullmatch((d.value or "").strip())
    if match is None:
        raise _bad(where, d, "expected a size such as 4000, 16G or 512M (no unit: MB)")
    mib = int(match.group(1)) * _MIB_PER[match.group(2).upper()]
    return max(1, int(mib)) if mib else 0  # --mem=0: all of the node's, i.e. no limit


class _Context:
    """What a script's values are multiplied up by: its nodes, and CPUs per task."""

    def __init__(self, nodes: int | None = None, cpus_per_task: int | None = None) -> None:
        self.nodes = nodes
        self.cpus_per_task = cpus_per_task

    @property
    def per_node(self) -> int:
        return self.nodes or 1


def _checked(check: Any, where: str, d: Directive, partition: bool = False) -> str | None:
    """``d``'s value once ``check`` accepts it (its refusal, one sentence with the line)."""
    try:
        check(d.value or "")
    except (ValueError, UsageError) as exc:
        why = str(exc)
        if partition:  # the command line's parser names its option first: drop it
            why = why.partition(": ")[2] or why
        raise _bad(where, d, why) from None
    return d.value


def _converted(convert: Any) -> Any:
    def parse(where: str, d: Directive, ctx: _Context) -> Any:
        try:
            return convert(d.value or "")
        except ValueError:
            raise _bad(where, d, f"expected {convert.__name__}") from None
    return parse


def _nodes(where: str, d: Directive, ctx: _Context) -> int:
    low, dash, high = (d.value or "").partition("-")
    if dash and low != high:
        raise _bad(where, d, "a range of node counts is not supported; give one count")
    return _count(where, Directive(d.line, d.prefix, d.option, low, d.spelled))


def _time(where: str, d: Directive, ctx: _Context) -> str | None:
    from shared.slurmtime import parse_time_limit

    return _checked(parse_time_limit, where, d)


def _signal(where: str, d: Directive, ctx: _Context) -> str | None:
    from shared.slurmtime import parse_signal

    return _checked(parse_signal, where, d)


def _checked_by(name: str) -> Any:
    """A parser that checks the value with ``control.values.NAME(text, spelling)``, the
    command line's own check (imported when a script uses it)."""
    def parse(where: str, d: Directive, ctx: _Context) -> str | None:
        from control import values

        check = getattr(values, name)
        return _checked(lambda text: check(text, d.spelled), where, d, partition=True)
    return parse


def _array(where: str, d: Directive, ctx: _Context) -> str | None:
    from control.values import parse_array

    return _checked(parse_array, where, d, partition=True)


def _qos(where: str, d: Directive, ctx: _Context) -> str | None:
    if d.value not in QOS_CLASSES:
        raise _bad(where, d, f"Trellis' QoS classes are {', '.join(QOS_CLASSES)}")
    return d.value


def _pattern(key: str) -> Any:
    def parse(where: str, d: Directive, ctx: _Context) -> str | None:
        from shared.outputpattern import check_pattern

        return _checked(lambda text: check_pattern(text, key), where, d)
    return parse


def _image(where: str, d: Directive, ctx: _Context) -> str | None:
    if not d.value:
        raise _bad(where, d, "names no image")
    return d.value


def _ntasks(where: str, d: Directive, ctx: _Context) -> None:
    if _count(where, d) != ctx.per_node:
        raise _bad(where, d, f"Trellis runs one task per node and this job has "
                             f"{ctx.per_node} node(s); ask for -N {d.value} instead")


def _ntasks_per_node(where: str, d: Directive, ctx: _Context) -> None:
    if _count(where, d) != 1:
        raise _bad(where, d, "Trellis runs one task per node")


def _export(where: str, d: Directive, ctx: _Context) -> None:
    if (d.value or "").upper() != "NONE":
        raise _bad(where, d, "Trellis does not pass the submitting shell's environment on "
                             "(as --export=NONE); give variables with #TRELLIS --env KEY=VALUE")


# How each spelling's value reads (control.options.Spelling.parse names one).
PARSERS: dict[str, Any] = {
    "text": lambda where, d, ctx: d.value,
    "str": _converted(str), "int": _converted(int), "float": _converted(float),
    "count": lambda where, d, ctx: _count(where, d),
    "gpu_count": lambda where, d, ctx: _gpu_count(where, d),
    "gres": lambda where, d, ctx: _gres(where, d),
    "mem": lambda where, d, ctx: _mem_mib(where, d),
    "nodes": _nodes, "time": _time, "signal": _signal,
    "dependency": _checked_by("dependency_wire"), "constraint": _checked_by("parse_constraint"),
    "hostlist": _checked_by("parse_hostlist"), "partitions": _checked_by("parse_partitions"),
    "reservation": _checked_by("parse_reservation"),
    "array": _array, "qos": _qos, "image": _image,
    "yes": lambda where, d, ctx: True, "no": lambda where, d, ctx: False,
    "ntasks": _ntasks, "ntasks_per_node": _ntasks_per_node, "export": _export,
}


def _parse(where: str, option: Option, s: Spelling, d: Directive, ctx: _Context) -> Any:
    if s.parse == "pattern":
        return _pattern(option.field.rpartition(".")[2])(where, d, ctx)
    return PARSERS[s.parse](where, d, ctx)


def _total(value: int, s: Spelling, ctx: _Context) -> int:
    """A per-node, per-task or per-CPU amount as the job's total (one task per node)."""
    if s.per in (NODE, TASK):
        return value * ctx.per_node
    if s.per == CPU:
        return value * (ctx.cpus_per_task or 1) * ctx.per_node
    return value


def _resolve(chosen: dict[str, Directive], out: ScriptOptions, where: str,
             ctx: _Context | None = None) -> _Context:
    """Turn the chosen directives into submit's values, option by option (the table's
    order); every directive given is checked, and for each option the first of its
    spellings given wins (a #TRELLIS name over sbatch's, a total over a per-node count).
    Returns what per-node amounts were multiplied by (the script's nodes and CPUs)."""
    if ctx is None:
        ctx = _Context()
        if (d := chosen.get("nodes")) is not None:
            ctx.nodes = _nodes(where, d, ctx)
        if (d := chosen.get("cpus-per-task")) is not None:
            ctx.cpus_per_task = _count(where, d)
    values, launch = out.values, out.launch
    for option in OPTIONS:
        given = [(s, chosen[s.name]) for s in option.script if s.name in chosen]
        if not given or option.dest == "env":  # variables: parse_script gathers them all
            continue
        parsed = [(s, _parse(where, option, s, d, ctx)) for s, d in given]
        if option.dest is None:
            continue  # checks only
        s, value = parsed[0]
        if s.parse in ("gpu_count", "gres"):
            model, count = value
            values[option.dest] = _total(count, s, ctx)
            if model is not None:
                values["gpu_model"] = model
        elif option.field.startswith("launch."):
            launch[option.field.partition(".")[2]] = value
        elif isinstance(value, int) and not isinstance(value, bool):
            values[option.dest] = _total(value, s, ctx)
        else:
            values[option.dest] = value
    return ctx


def environment_directives(environ: Mapping[str, str]) -> dict[str, Directive]:
    """sbatch's input variables (``SBATCH_TIMELIMIT``, ...) set in ``environ``, as the
    directives they stand for; they win over the script's lines (sbatch's order: command
    line, then environment, then script)."""
    found: dict[str, Directive] = {}
    for option in OPTIONS:
        for s in option.script:
            if s.env and s.env in environ:
                found[s.name] = Directive(0, "env", s.name, environ[s.env], s.env)
    if "requeue" in found and "no-requeue" in found:
        del found["requeue"]  # sbatch: --no-requeue wins over --requeue
    return found


def script_job(args: Any) -> dict[str, Any] | None:
    """For ``submit script.sh [ARGS...]``: fill ``args`` from the script where the command
    line gave nothing, set the job's command to the script's name and arguments, and return
    the job fields only a script gives (its launch table, working directory, variables).
    None when the submission is a command (``--``, or a first word that is no script)."""
    words = list(getattr(args, "job_command", None) or [])
    if not words or words[0] == "--" or not looks_like_script(words[0]):
        return None
    path, script_args = words[0], words[1:]
    if getattr(args, "file", None):
        raise UsageError(f"a batch script ({path}) and -f {args.file} cannot be combined")
    text = read_script(path)
    where = path
    parsed = parse_script(text, where, os.environ)
    import sys

    for warning in parsed.warnings:
        print(f"trellisctl: warning: {warning}", file=sys.stderr)
    if parsed.unsupported:
        listed = ", ".join(parsed.unsupported)
        if not getattr(args, "ignore_unsupported", False):
            raise UsageError(f"{where}: Trellis does not support {listed}; remove them or "
                             "submit with --ignore-unsupported")
        print(f"trellisctl: warning: {where}: ignoring unsupported {listed}", file=sys.stderr)
    for dest, value in parsed.values.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)
    args.job_command = [os.path.basename(path), *script_args]
    launch: dict[str, Any] = {"script": text, "slurm_env": True, **parsed.launch}
    for key in ("stdout", "stderr"):
        given = getattr(args, key, None)
        if given is not None:
            launch[key] = given
    if "stdout" not in launch:
        launch["stdout"] = DEFAULT_ARRAY_OUTPUT if args.array else DEFAULT_OUTPUT
    submit_dir = os.getcwd()
    if args.workdir is None:
        args.workdir = submit_dir  # sbatch runs a script where it was submitted
    if not args.name:
        args.name = _job_name(path)
    return {"launch": launch, "env": {**parsed.env, "TRELLIS_SUBMIT_DIR": submit_dir}}


def _job_name(path: str) -> str:
    """sbatch names a job after its script; Trellis' names allow letters, digits, - and _."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", os.path.basename(path)).lstrip("-_")[:63]
    return name or "script"
