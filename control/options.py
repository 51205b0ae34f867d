"""Every option of a submission, once (Slurm keeps its own so in ``slurm_opt.c``).

One :class:`Option` per value a submission may set: trellisctl's spellings and help, the
request field it sets, and each way a batch script or sbatch's environment names it
(:class:`Spelling`: ``#SBATCH``'s long name and letter, or a ``#TRELLIS``-only name, the
``SBATCH_*`` input variable, the parser of its value and what that value counts: the whole
job, each node, each task or each CPU). From this one table come:

* trellisctl's ``submit``/``run`` arguments (:func:`add_submit_arguments`);
* the options ``#SBATCH`` and ``#TRELLIS`` lines may give, and how each is resolved into
  the command line's values (control/sbatch.py, with the line of every error);
* the spec fields the command line copies as they are (:data:`SPEC_OPTIONS`).

Plain data and no imports beyond the standard library's cheapest: trellisctl builds its
parser from it on every ``submit``.
"""

from __future__ import annotations

# Not `from typing import TYPE_CHECKING`: typing stays off trellisctl's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

QOS_CLASSES = ("urgent", "prior", "normal")
KINDS = ("training", "inference", "cpu")

# What a script's value counts (Trellis runs one task per node, and a spec holds totals).
JOB, NODE, TASK, CPU = "job", "node", "task", "cpu"


class Spelling:
    """One way a batch script (or sbatch's environment) names an option."""

    __slots__ = ("env", "flag", "name", "parse", "per", "sbatch", "short")

    def __init__(self, name: str, parse: str, *, short: str = "", flag: bool = False,
                 per: str = JOB, sbatch: bool = True, env: str = "") -> None:
        self.name = name  # the long name, without "--"
        self.parse = parse  # how its value reads: a key of control.sbatch.PARSERS
        self.short = short  # sbatch's one-letter spelling, or ""
        self.flag = flag  # takes no value (--requeue)
        self.per = per  # JOB, NODE, TASK or CPU: the value is multiplied up to a total
        self.sbatch = sbatch  # an sbatch spelling (#SBATCH and #TRELLIS lines), or #TRELLIS only
        self.env = env  # sbatch's input variable for it ("SBATCH_TIMELIMIT"), or ""


class Option:
    """One value a submission sets, with every spelling of it."""

    __slots__ = ("argparse", "dest", "field", "flags", "script")

    def __init__(self, dest: str | None, flags: tuple[str, ...] = (), *, field: str = "",
                 script: tuple[Spelling, ...] = (), **argparse_kw: Any) -> None:
        self.dest = dest  # the command line's value (argparse dest); None: a check only
        self.flags = flags  # trellisctl's spellings; () when only a script has it
        self.field = field  # the request field it sets ("spec.gpus", "stop.grace_s", ...)
        # The script's spellings, the winner first when a script gives several (#TRELLIS
        # names before sbatch's, a total before a per-node count).
        self.script = script
        self.argparse = argparse_kw


S = Spelling

OPTIONS: tuple[Option, ...] = (
    Option("file", ("-f", "--file"),
           help="job description (TOML or JSON); a [[jobs]] list (or a JSON list) submits "
                "them all at once"),
    Option("array", ("--array",), field="spec.array",
           script=(S("array", "array", short="a"),), metavar="SPEC",
           help="one job per index, Slurm's syntax: 0-999, 1,3,5-7, 0-99:2; each sees its "
                "index in $TRELLIS_ARRAY_INDEX and its name (and --id) ends in _INDEX"),
    Option("name", ("--name", "-J", "--job-name"), field="spec.name",
           script=(S("name", "text", sbatch=False),
                   S("job-name", "text", short="J", env="SBATCH_JOB_NAME"))),
    Option("id", ("--id",), help="job id to use (makes retries idempotent)"),
    Option("kind", ("--kind",), field="spec.kind", choices=KINDS,
           script=(S("kind", "str", sbatch=False),)),
    Option("gpus", ("--gpus",), field="spec.gpus", type=int,
           script=(S("gpus", "gpu_count", short="G", env="SBATCH_GPUS"),
                   S("gpus-per-node", "gpu_count", per=NODE, env="SBATCH_GPUS_PER_NODE"),
                   S("gpus-per-task", "gpu_count", per=TASK, env="SBATCH_GPUS_PER_TASK"),
                   S("gres", "gres", per=NODE, env="SBATCH_GRES"))),
    Option("gpu_milli", ("--gpu-milli",), field="spec.gpu_milli", type=int, metavar="N",
           script=(S("gpu-milli", "int", sbatch=False),),
           help="a share of one GPU in thousandths (1-999, with --gpus 1): the job may share "
                "its GPU with others (Liquid)"),
    Option("cpus", ("--cpus",), field="spec.cpus", type=int,
           script=(S("cpus", "int", sbatch=False),
                   S("cpus-per-task", "count", short="c", per=TASK))),
    Option("memory_mib", ("--memory-mib",), field="spec.memory_mib", type=int,
           script=(S("memory-mib", "int", sbatch=False),
                   S("mem", "mem", per=NODE, env="SBATCH_MEM_PER_NODE"),
                   S("mem-per-cpu", "mem", per=CPU, env="SBATCH_MEM_PER_CPU"))),
    # After gpus: a #TRELLIS --gpu-model wins over the TYPE of --gpus TYPE:N.
    Option("gpu_model", ("--gpu-model",), field="spec.gpu_model",
           script=(S("gpu-model", "str", sbatch=False),)),
    Option("constraint", ("-C", "--constraint"), field="spec.selector.features",
           metavar="FEATURES",
           script=(S("constraint", "constraint", short="C", env="SBATCH_CONSTRAINT"),),
           help="only nodes with every one of these features (a100&ib) or with any of them "
                "(a100|h100); `trellisctl nodes -o wide` lists each node's. Slurm's "
                "--constraint"),
    Option("nodelist", ("-w", "--nodelist"), field="spec.selector.only", metavar="NODES",
           script=(S("nodelist", "hostlist", short="w", env="SBATCH_NODELIST"),),
           help="only these nodes: gpu07 or gpu[01-04] (Slurm's --nodelist; Trellis places "
                "the job among them rather than on every one listed)"),
    Option("exclude", ("-x", "--exclude"), field="spec.selector.exclude", metavar="NODES",
           script=(S("exclude", "hostlist", short="x", env="SBATCH_EXCLUDE"),),
           help="never these nodes: gpu01,gpu07 or gpu[01-04,07] (Slurm's --exclude)"),
    Option("partition", ("-p", "--partition"), field="spec.selector.partitions",
           metavar="PARTITIONS",
           script=(S("partition", "partitions", short="p", env="SBATCH_PARTITION"),),
           help="the partition to run in, or several (a,b: any that admits the job); "
                "default: the cluster's default partition. `trellisctl partitions` lists "
                "them"),
    Option("reservation", ("--reservation",), field="spec.selector.reservation",
           metavar="NAME",
           script=(S("reservation", "reservation", env="SBATCH_RESERVATION"),),
           help="run in this reservation (on its nodes, while it lasts; `trellisctl "
                "reservation list` shows those you may use)"),
    Option("exclusive", ("--exclusive",), field="spec.selector.exclusive",
           action="store_const", const=True,
           script=(S("exclusive", "yes", flag=True, env="SBATCH_EXCLUSIVE"),),
           help="whole nodes to itself: only nodes running nothing else, with every GPU, "
                "core and byte of memory of them (Slurm's --exclusive)"),
    Option("user", ("--user",), field="spec.user",
           help="Unix user the job runs as (default: you)"),
    Option("tenant", ("-A", "--account", "--tenant"), field="spec.tenant", metavar="ACCOUNT",
           script=(S("tenant", "text", sbatch=False),
                   S("account", "text", short="A", env="SBATCH_ACCOUNT")),
           help="the account the job is charged to (Slurm's --account; default: the user's "
                "default account)"),
    Option("priority_class", ("--priority-class",), field="spec.priority_class",
           metavar="CLASS", script=(S("priority-class", "text", sbatch=False),),
           help="its priority class: higher classes queue first and may preempt lower ones "
                "(`trellisctl priority-classes` lists them; default: the cluster's default)"),
    Option("qos", ("--qos",), field="spec.qos", choices=QOS_CLASSES,
           script=(S("qos", "qos", short="q", env="SBATCH_QOS"),)),
    Option("model_type", ("--model-type",), field="spec.model_type"),
    Option("model_family", ("--model-family",), field="spec.model_family",
           help="e.g. cnn, rnn: finds a similar profiled model"),
    Option("model_params_m", ("--model-params-m",), field="spec.model_params_m", type=float,
           help="millions of parameters"),
    Option("batch", ("--batch",), field="spec.batch", type=int),
    Option("iterations", ("--iterations",), field="spec.iterations", type=int),
    Option("deadline", ("--deadline",), field="spec.deadline",
           script=(S("deadline", "str", sbatch=False),),
           help="seconds from now (600, 90s, 10m, 2h, 1d) or an ISO time (2030-01-31T18:00, "
                "local unless it has a zone)"),
    Option("max_nodes", ("--max-nodes",), field="spec.max_nodes", type=int,
           script=(S("max-nodes", "int", sbatch=False), S("nodes", "nodes", short="N")),
           help="most nodes the job may span"),
    Option("time", ("-t", "--time"), field="spec.time_limit_s", metavar="TIME",
           script=(S("time", "time", short="t", env="SBATCH_TIMELIMIT"),),
           help="time limit, Slurm's forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; "
                "at the limit the job is stopped and ends 'timeout' (default: the master's "
                "default_time_limit_s)"),
    Option("signal", ("--signal",), field="stop.warning", metavar="[B:]SIG[@SECONDS]",
           script=(S("signal", "signal", env="SBATCH_SIGNAL"),),
           help="send SIG (USR1, SIGUSR1 or a number) SECONDS (default 60) before the time "
                "limit; B: only to the job's leader process, not its children"),
    Option("grace", ("--grace",), field="stop.grace_s", type=float, metavar="SECONDS",
           script=(S("grace", "float", sbatch=False),),
           help="SIGTERM-to-SIGKILL grace when the job is stopped (capped by the master's "
                "max_grace_s; default its stop_grace_s)"),
    Option("workdir", ("--workdir",), field="spec.workdir",
           script=(S("chdir", "text", short="D"),)),
    Option("env", ("--env",), field="spec.env", action="append", default=[],
           metavar="KEY=VALUE", script=(S("env", "env", sbatch=False),)),
    Option("image", ("--image",), field="launch.image", metavar="REF",
           script=(S("container-image", "image"),),
           help="run in this OCI image (registry/name:tag), pulled by the node "
                "(docs/containers.md)"),
    Option("mount", ("--mount",), field="launch.mounts", action="append", default=[],
           metavar="SRC:DST[:ro]",
           help="bind a host path into the job's container (under the node's [containers] "
                "allowed_mounts)"),
    Option("after", ("-d", "--after", "--dependency"), field="spec.after",
           metavar="DEPENDENCY",
           script=(S("after", "dependency", sbatch=False), S("dependency", "dependency",
                                                               short="d")),
           help="start only after other jobs, Slurm's syntax: afterok:ID[:ID...] (and "
                "afterany, afternotok, aftercorr for arrays); terms separated by ',' must all "
                "hold. An array's id means the whole array"),
    Option("priority", ("--priority",), field="spec.priority", type=int,
           script=(S("priority", "int", sbatch=False),),
           help="order among otherwise equal jobs, higher first (default 0; only admins may "
                "go above 0)"),
    # --requeue and --no-requeue: one value; the last a script gives wins.
    Option("requeue", ("--requeue", "--no-requeue"), field="stop.requeue",
           script=(S("requeue", "yes", flag=True, env="SBATCH_REQUEUE"),
                   S("no-requeue", "no", flag=True, env="SBATCH_NO_REQUEUE"))),
    Option("stdout", ("--stdout",), field="launch.stdout", metavar="PATTERN",
           script=(S("stdout", "pattern", sbatch=False),
                   S("output", "pattern", short="o", env="SBATCH_OUTPUT")),
           help="also write the job's output to this file on its node (relative to the "
                "workdir; %%j %%x %%A %%a %%u %%N %%%%), sbatch's --output"),
    Option("stderr", ("--stderr",), field="launch.stderr", metavar="PATTERN",
           script=(S("stderr", "pattern", sbatch=False),
                   S("error", "pattern", short="e", env="SBATCH_ERROR")),
           help="write the job's stderr to this file instead (sbatch's --error)"),
    Option("ignore_unsupported", ("--ignore-unsupported",), action="store_true",
           help="a batch script's #SBATCH options Trellis does not support are reported and "
                "ignored instead of refusing the submission"),
    # sbatch's options Trellis reads only to check them: one task per node, no environment.
    Option(None, script=(S("ntasks", "ntasks", short="n"),
                         S("ntasks-per-node", "ntasks_per_node"),
                         S("export", "export", env="SBATCH_EXPORT"))),
)

BY_DEST = {o.dest: o for o in OPTIONS if o.dest is not None}
# Options whose command-line value is the spec field of the same name, copied as it is.
SPEC_OPTIONS = tuple(o.dest for o in OPTIONS
                     if o.dest is not None and o.field == f"spec.{o.dest}"
                     and o.dest not in ("array", "deadline", "after", "env"))


def spellings(prefix: str) -> dict[str, tuple[str, bool]]:
    """What a ``#SBATCH`` (sbatch's spellings) or ``#TRELLIS`` line (those and Trellis'
    own) may give: long name -> (one-letter spelling or "", takes a value)."""
    return {s.name: (s.short, not s.flag) for o in OPTIONS for s in o.script
            if s.sbatch or prefix == "#TRELLIS"}


def spelling(name: str) -> tuple[Option, Spelling]:
    """The option a script's long name belongs to, and that spelling."""
    for option in OPTIONS:
        for s in option.script:
            if s.name == name:
                return option, s
    raise KeyError(name)


def add_submit_arguments(p: argparse.ArgumentParser) -> None:
    """trellisctl submit's (and run's) options, in the table's order; the job's command
    comes last."""
    import argparse

    for option in OPTIONS:
        if not option.flags:
            continue
        if option.dest == "requeue":
            group = p.add_mutually_exclusive_group()
            group.add_argument("--requeue", dest="requeue", action="store_const", const=True,
                               help="if its node is lost or a GPU of it fails, queue the job "
                                    "again in its place (it sees $TRELLIS_RESTART_COUNT; "
                                    "default: the master's requeue_default)")
            group.add_argument("--no-requeue", dest="requeue", action="store_const",
                               const=False, help="if its node is lost or a GPU of it fails, "
                                                 "end the job node_lost")
            continue
        p.add_argument(*option.flags, dest=option.dest, **option.argparse)
    p.add_argument("job_command", nargs=argparse.REMAINDER,
                   help="-- followed by the command to run, or a batch script (a file "
                        "starting with #!) and its arguments: docs/slurm.md")
