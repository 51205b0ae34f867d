"""An image job's launch: ``python -m noded.containers.launch JOBDIR``.

The shim runs this as the job's command (as root, inside the job's cgroups; the job's own
processes run as the submitting user inside the container). It reads ``JOBDIR/container.json``
(written by noded/containers/launcher.py), checks the mounts, pulls the image into the node's
cache, checks its architecture, keeps the cache under its cap, and execs ``podman run``: podman
stays the job's leader process (the shim's signals reach it; it forwards them to the container)
and the container's output is the job's output.

Anything that stops the launch is one sentence in ``JOBDIR/container-error.json`` (the job's
reason) and on stderr (its log), exit status 125, and nothing left behind: no container, no
half-pulled layer, no image of the wrong architecture.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from noded.containers.cache import ImageCache, PullFailed
from noded.containers.credentials import CredentialsError, read_credentials, write_authfile
from noded.containers.mounts import MountRefused, check_mounts
from noded.containers.podman import Podman, node_architecture, rlimit_flags
from shared.imageref import ImageRefError, parse_image
from shared.model import Mount

EXIT_LAUNCH_FAILED = 125  # podman's own status for "the container could not be started"
ERROR_FILE = "container-error.json"
# Where podman writes the container's process id once it runs (podman run --pidfile).
CONTAINER_PIDFILE = "container.pid"
# Where a container job finds its metrics channel (TRELLIS_METRICS_FILE points into it).
METRICS_DIR = "/run/trellis-metrics"


class LaunchFailed(Exception):
    pass


def prepare(jobdir: Path, cfg: dict) -> list[str]:
    """Everything before the container runs; returns podman's argv."""
    image = cfg["image"]
    if cfg.get("unavailable"):
        raise LaunchFailed(f"node {cfg['node']} cannot run images: {cfg['unavailable']}")
    if cfg.get("refused"):
        raise LaunchFailed(cfg["refused"])
    try:
        ref = parse_image(image)
    except ImageRefError as exc:
        raise LaunchFailed(str(exc)) from None
    try:
        volumes = check_mounts(tuple(Mount(s, t, ro) for s, t, ro in cfg["mounts"]),
                               tuple(cfg["allowed_mounts"]))
    except MountRefused as exc:
        raise LaunchFailed(str(exc)) from None
    podman = Podman(Path(cfg["storage"]), cfg["runtime"])
    cache = ImageCache(podman, int(cfg["cache_max_bytes"]), float(cfg["pull_timeout_s"]),
                       int(cfg["pull_retries"]), record=jobdir / "pull.json",
                       metric=metrics_writer(cfg))
    authfile = None
    try:
        creds = read_credentials(Path(cfg["credentials_dir"]), ref.registry)
    except CredentialsError as exc:
        raise LaunchFailed(str(exc)) from None
    if creds is not None:
        authfile = jobdir / "auth.json"
        write_authfile(authfile, ref.registry, *creds)
    try:
        image_id = cache.ensure(image, ref.registry, authfile, cfg["tls_verify"])
    except PullFailed as exc:
        raise LaunchFailed(str(exc)) from None
    finally:
        if authfile is not None:
            authfile.unlink(missing_ok=True)
    if cache.pulled:  # a cached image was checked when it was pulled
        arch, mine = cache.architecture(image_id), node_architecture()
        if arch and arch != mine:
            cache.remove(image_id)  # not a usable cache entry on this node
            raise LaunchFailed(f"image {image} is built for {arch}; node {cfg['node']} is "
                               f"{mine}")
    cache.touch(image_id)
    if cache.pulled:  # only a pull grows the cache past its cap
        cache.evict(keep=image_id)
    return run_argv(podman, cfg, image_id, volumes)


def metrics_writer(cfg: dict) -> Callable[[str, float], None]:
    """Lines for the job's metrics file (its channel to the master), written as the job's
    user would: the file is created for it and handed to it, links never followed."""
    path = cfg.get("metrics_file", "")
    uid, gid = (int(x) for x in cfg["user"].split(":"))

    def write(name: str, value: float) -> None:
        if not path:
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError:
            return
        try:
            if os.geteuid() == 0 and os.fstat(fd).st_uid != uid:
                os.fchown(fd, uid, gid)
            os.write(fd, f"{name} {value:g}\n".encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    return write


def run_argv(podman: Podman, cfg: dict, image_id: str, volumes: list[str]) -> list[str]:
    args = [
        # Not --rm: noded asks podman whether the OOM killer ended it (its group, where the
        # kernel counts the kill, is gone by then) and then removes it (launcher.cleanup).
        "run", "--name", cfg["name"], "--pull", "never",
        # The container's groups nest below the job's: its cpuset, memory limit, OOM count,
        # usage and MBA membership are the job's (noded/cgroups reads nested groups).
        "--cgroup-parent", cfg["cgroup_parent"],
        "--network", "host",  # distributed jobs reach MASTER_ADDR:MASTER_PORT as host jobs do
        "--user", cfg["user"],
        "--security-opt", "no-new-privileges",
        "--read-only", "--read-only-tmpfs=true",
        "--volume", f"{cfg['scratch']}:/scratch:rw,nodev,nosuid",
        "--workdir", cfg["workdir"],
        "--log-driver", "none",  # the output goes to the shim's log relay only
        "--init=false",
        *rlimit_flags(),
    ]
    if cfg.get("pidfile"):
        # The container's process runs once this file exists: noded acknowledges the job's
        # start only then (JobRunner.until_forked), so a stop that follows the
        # acknowledgement always finds it.
        args += ["--pidfile", cfg["pidfile"]]
    if not cfg["root"]:
        args += ["--cap-drop", "all"]
    for volume in volumes:
        args += ["--volume", volume]
    if cfg.get("metrics_dir"):  # the job's metrics channel, where its env says it is
        args += ["--volume", f"{cfg['metrics_dir']}:{METRICS_DIR}:rw,nodev,nosuid,noexec"]
    for device in cfg["devices"]:
        args += ["--device", device]
    for key in cfg["env"]:
        args += ["--env", key]  # the value comes from podman's environment, not argv
    return podman.argv(*args, image_id, *cfg["command"])


def run(jobdir: Path) -> int:
    cfg = json.loads((jobdir / "container.json").read_text())
    try:
        argv = prepare(jobdir, cfg)
    except LaunchFailed as exc:
        message = str(exc)
        (jobdir / ERROR_FILE).write_text(json.dumps({"reason": message}))
        print(f"[trellis] {message}", file=sys.stderr, flush=True)
        return EXIT_LAUNCH_FAILED
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **cfg["env"]}
    os.execvpe(argv[0], argv, env)
    return EXIT_LAUNCH_FAILED  # not reached


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m noded.containers.launch JOBDIR", file=sys.stderr)
        return 2
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
