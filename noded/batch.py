"""A job's launch details on this node: its batch script, output files and Slurm variables.

A job sent with a script (``LaunchSpec.script``, as sbatch sends it) has it written into its
directory as ``slurm_script`` (mode 0700, owned by the job's user) and runs the interpreter of
its shebang on it, the script's arguments after it (Linux's rule: what follows the
interpreter on the ``#!`` line is one argument). Output file patterns (``%j`` ...) are filled
in here, relative paths under the job's working directory; the shim opens them as the user.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from noded.slurmenv import slurm_variables
from shared.messages import PrepareJob
from shared.outputpattern import PatternFields, expand

SCRIPT_NAME = "slurm_script"
SLURM_ENV_MODES = ("requested", "always", "never")


def script_command(script: str, path: Path, args: list[str]) -> list[str]:
    """The interpreter of ``script``'s shebang, its one argument if any, the script, args."""
    first = script.split("\n", 1)[0][2:].strip()
    interpreter, _, argument = first.partition(" ")
    if not interpreter:
        raise ValueError("the script's shebang names no interpreter")
    argument = argument.strip()
    return [interpreter, *([argument] if argument else []), str(path), *args]


def write_script(jobdir: Path, script: str, uid: int, gid: int) -> Path:
    """The script in the job's directory, readable only by its user (who runs it)."""
    path = jobdir / SCRIPT_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o700)
    try:
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o700)
        data = memoryview(script.encode())
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    return path


def output_paths(prepare: PrepareJob, job_id: str, node: str, workdir: str
                 ) -> tuple[str | None, str | None]:
    """Where the part's stdout and stderr files are (None: the job log only); stderr is
    None when it goes with stdout."""
    spec = prepare.spec
    fields = PatternFields(job_id=job_id, name=spec.name, user=spec.user, node=node,
                           array_id=spec.array.id if spec.array else None,
                           array_index=spec.array.index if spec.array else None)

    def path(pattern: str | None) -> str | None:
        if pattern is None:
            return None
        return os.path.join(workdir, expand(pattern, fields))

    stdout, stderr = path(spec.launch.stdout), path(spec.launch.stderr)
    if stderr == stdout:
        stderr = None
    return stdout, stderr


def launch_fields(jobdir: Path, prepare: PrepareJob, job_id: str, node: str,
                  uid: int, gid: int, env: dict[str, str], workdir: str,
                  slurm_env: str = "requested") -> dict[str, Any]:
    """What the shim's launch.json gets beyond a plain command: the command running the
    script, the output files, the environment with Slurm's names (``slurm_env``: "requested"
    by the job's launch.slurm_env, "always" or "never")."""
    spec = prepare.spec
    fields: dict[str, Any] = {}
    if spec.launch.script is not None:
        path = write_script(jobdir, spec.launch.script, uid, gid)
        fields["command"] = script_command(spec.launch.script, path, list(spec.command[1:]))
    stdout, stderr = output_paths(prepare, job_id, node, workdir)
    if stdout is not None:
        fields["stdout_file"] = stdout
    if stderr is not None:
        fields["stderr_file"] = stderr
    if stdout is not None or stderr is not None:
        # Parts of a multi-node job may share the file: none truncates it (noded/outputfiles.py).
        fields["append_output"] = prepare.nnodes > 1
    if slurm_env == "always" or (slurm_env == "requested" and spec.launch.slurm_env):
        fields["env"] = {**slurm_variables(env, prepare, node), **env}
    return fields
