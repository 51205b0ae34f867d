"""Image jobs end to end: a real docker-registry on loopback, busybox images built here, real
masterd + noded, podman + runc. One registry and one cluster for the module (lean).

Checked on a container job: it runs as its user with no capabilities and no-new-privileges,
read-only except /scratch, inside the job's cgroup (cpuset, memory limit, OOM reported as
out of memory), its output in the job's log, SIGTERM at cancel reaching it; bad input (a
mount outside the allowed prefixes, a device mount, a missing image, a foreign
architecture, a registry down) fails the job with one sentence and leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from demo.cluster import LocalCluster, default_job_user
from demo.harness import scratch_dir
from demo.registry import Registry, build_image, free_port
from noded.containers.podman import Podman, node_architecture
from tests.conftest import needs_root

MISSING = [t for t in ("podman", "runc", "docker-registry", "skopeo") if not shutil.which(t)]
pytestmark = [needs_root, pytest.mark.root,
              pytest.mark.skipif(bool(MISSING), reason=f"not installed: {MISSING}")]

FOREIGN = "arm64" if node_architecture() != "arm64" else "amd64"


@pytest.fixture(scope="module")
def env() -> Iterator[dict]:
    with scratch_dir("trellis-test-ctr-", mode=0o777) as root:
        layout = root / "oci"
        build_image(layout, "v1")
        build_image(layout, "foreign", arch=FOREIGN, seed=1)
        build_image(layout, "private", seed=2)
        for seed in (3, 4, 5):  # three distinct images for the cache's size cap
            build_image(layout, f"c{seed}", seed=seed, pad_mb=1)
        allowed = root / "allowed"
        allowed.mkdir(mode=0o755)
        (allowed / "data.txt").write_text("from the host\n")
        creds = root / "creds"
        creds.mkdir(mode=0o700)
        with Registry() as reg, Registry(htpasswd=f"tester:{_bcrypt('s3cret')}") as locked:
            image = reg.push(layout, "v1", "trellis-test/busybox")
            foreign = reg.push(layout, "foreign", "trellis-test/busybox")
            cached = [reg.push(layout, f"c{seed}", "trellis-test/cache") for seed in (3, 4, 5)]
            private = locked.push(layout, "private", "trellis-test/private",
                                  creds="tester:s3cret")
            cluster = LocalCluster(root / "cluster", prefix="trellis-test-ctr", nodes=1,
                                   gpus_per_node=2, node_settings={"usage_interval_s": 0.2},
                                   node_sections={
                                       # The contention eliminator's MBA groups, emulated.
                                       "rdt": {"mode": "emulated"},
                                       "contention": {"interval_s": 0.2,
                                                      "peak_bandwidth_mbps": 1000},
                                       "containers": {
                                       "allowed_mounts": [str(allowed)],
                                       "insecure_registries": [reg.host, locked.host],
                                       "credentials_dir": str(creds),
                                       "pull_timeout_s": 20.0, "pull_retries": 1}})
            try:
                cluster.start()
                yield {"cluster": cluster, "image": image, "foreign": foreign, "reg": reg,
                       "allowed": allowed, "root": root, "private": private,
                       "locked": locked, "creds": creds, "cached": cached}
            finally:
                cluster.close()
                for store in (root / "cluster" / cluster.node_name(1) / "containers",
                              root / "probe-store", root / "cache-store"):
                    Podman(store).clean()  # then scratch_dir removes the store


def _bcrypt(password: str) -> str:
    """An htpasswd bcrypt hash (the registry accepts only bcrypt), from libxcrypt."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


def submit(env: dict, name: str, script: str, **kw: object) -> str:
    launch = {"image": kw.pop("image", env["image"])}
    if "mounts" in kw:
        launch["mounts"] = kw.pop("mounts")
    job = {"name": name, "user": default_job_user(), "kind": "cpu", "gpus": 0, "cpus": 1,
           "command": ["/bin/sh", "-c", script], "launch": launch, **kw}
    return env["cluster"].client().call("submit", {"job": job})["job"]["id"]


def ended(env: dict, job_id: str, timeout: float = 90) -> dict:
    client = env["cluster"].client()

    def check() -> dict | None:
        job = client.call("job", {"id": job_id})["job"]
        return job if job["state"] in ("finished", "failed", "cancelled", "timeout") else None

    return env["cluster"].wait_for(f"job {job_id} to end", check, timeout=timeout)


def output(env: dict, job_id: str) -> str:
    reply = env["cluster"].client().call("logs", {"id": job_id})
    return "".join(p.get("data", "") if isinstance(p.get("data"), str) else
                   bytes(p.get("data", b"")).decode(errors="replace")
                   for p in reply["parts"])


def podman_ps(env: dict) -> list[str]:
    store = env["root"] / "cluster" / env["cluster"].node_name(1) / "containers"
    done = subprocess.run(Podman(store).argv("ps", "-a", "--format", "{{.Names}}"),
                          capture_output=True, text=True, timeout=30)
    return done.stdout.split()


PROBE = ("id -u; grep -e NoNewPrivs -e CapEff -e Cpus_allowed_list /proc/self/status; "
         "grep -e memory -e cpuset /proc/self/cgroup; cat /data/data.txt; "
         "echo x > /scratch/ok && echo scratch-writable; "
         "touch /etc/nope 2>/dev/null || echo root-read-only; "
         "(echo x > /data/no) 2>/dev/null || echo mount-read-only; echo to-stderr >&2; "
         # its metrics channel works in the container; running until the test saw the line
         # relayed (the master takes a job's metrics only while it runs)
         "echo 'probe_value 7' >> $TRELLIS_METRICS_FILE && "
         "while [ ! -e /data/probe-go ]; do sleep 0.2; done")


def test_an_image_job_runs_confined_in_its_cgroup(env: dict) -> None:
    job_id = submit(env, "probe", PROBE, memory_mib=128,
                    mounts=[{"source": str(env["allowed"]), "target": "/data",
                             "read_only": True}])
    client = env["cluster"].client()

    def relayed() -> dict | None:
        metrics = client.call("job", {"id": job_id}).get("metrics") or {}
        return metrics if "probe_value" in metrics and "image_pulled" in metrics else None

    go = env["allowed"] / "probe-go"
    try:
        # The pull's progress and the job's own metric reached the master (trellisctl show).
        metrics = env["cluster"].wait_for("the job's metrics", relayed, timeout=60)
        go.touch()
        job = ended(env, job_id)
    finally:
        go.unlink(missing_ok=True)
    out = output(env, job_id)
    assert job["state"] == "finished", (job, out)
    lines = out.splitlines()
    assert "65534" in lines  # nobody, as submitted (not root)
    assert "NoNewPrivs:\t1" in out and "CapEff:\t0000000000000000" in out
    # Its cpuset is the job's one core; its groups nest below the job's own.
    cpus = next(a["cpus"] for a in job["placement"])
    assert f"Cpus_allowed_list:\t{cpus[0]}" in out, out
    assert f"/{env['cluster'].node_name(1)}/{job_id}/" in out
    for want in ("from the host", "scratch-writable", "root-read-only", "mount-read-only",
                 "to-stderr"):
        assert want in lines, (want, out)
    assert podman_ps(env) == []  # removed with the job
    assert metrics.get("probe_value", {}).get("last") == 7, metrics
    assert metrics.get("image_pulled", {}).get("last") == 1, metrics
    assert metrics["image_pull_s"]["last"] > 0


def test_out_of_memory_in_a_container_is_reported_as_such(env: dict) -> None:
    hog = "dd if=/dev/zero of=/dev/null bs=256M count=1"  # one 256 MiB buffer, 64 MiB limit
    job = ended(env, submit(env, "hog", hog, memory_mib=64))
    assert job["state"] == "failed"
    assert job["reason"].startswith("out of memory: the kernel's OOM killer"), job


def test_cancel_reaches_the_container_with_sigterm(env: dict) -> None:
    script = "trap 'echo got-term; exit 3' TERM; echo up; while true; do sleep 0.2; done"
    job_id = submit(env, "term", script)
    client = env["cluster"].client()
    env["cluster"].wait_for("the container to be up", lambda: "up" in output(env, job_id),
                            timeout=60)
    client.call("cancel", {"id": job_id})
    job = ended(env, job_id)
    assert job["state"] == "cancelled"
    assert "got-term" in output(env, job_id)
    assert env["cluster"].wait_for("its container to be gone", lambda: podman_ps(env) == [],
                                   timeout=30) is True
    # One that ignores SIGTERM is killed at the end of its grace, container and all.
    stubborn = submit(env, "stubborn", "trap '' TERM; echo up; while true; do sleep 0.2; "
                      "done", stop={"grace_s": 1.0})
    env["cluster"].wait_for("it to be up", lambda: "up" in output(env, stubborn), timeout=60)
    started = time.monotonic()
    client.call("cancel", {"id": stubborn})
    assert ended(env, stubborn)["state"] == "cancelled"
    assert time.monotonic() - started < 20
    assert env["cluster"].wait_for("its container to be gone", lambda: podman_ps(env) == [],
                                   timeout=30) is True
    assert "did not stop within its grace period" in env["cluster"].log(
        env["cluster"].node_name(1))


def test_a_containers_usage_is_metered_as_the_jobs(env: dict) -> None:
    """The container's CPU time counts as the job's: what the node meters is at least what
    the container's own shell says it used (``times``; the machine may be busy, so the
    amount, not the rate, is compared)."""
    spin = ("end=$(( $(date +%s) + 5 )); while [ $(date +%s) -lt $end ]; do :; done; times")
    job_id = submit(env, "spin", spin)
    assert ended(env, job_id)["state"] == "finished"
    client = env["cluster"].client()

    def final() -> dict | None:
        usage = client.call("job", {"id": job_id}).get("usage") or []
        return usage[0] if usage and usage[0]["final"] else None

    usage = env["cluster"].wait_for("its final usage", final, timeout=30)
    # ash's times: "0m1.20s 0m0.05s" for the shell, then the same for its children.
    used = 0.0
    for line in output(env, job_id).splitlines()[-2:]:
        for field in line.split():
            minutes, _, secs = field.rstrip("s").partition("m")
            used += int(minutes) * 60 + float(secs)
    metered = usage["cpu_mean"] * usage["seconds"]
    # Without the container's groups the node would meter podman's and the launch's time only.
    assert used > 0.5 and metered >= 0.8 * used, (used, usage)


def test_bad_input_fails_the_job_with_one_sentence_and_leaves_nothing(env: dict) -> None:
    down = f"127.0.0.1:{free_port()}/trellis-test/none:v1"
    cases = {
        "outside": ({"mounts": [{"source": "/etc", "target": "/x"}]},
                    "outside the prefixes this node allows"),
        "device": ({"mounts": [{"source": "/dev/null", "target": "/x"}]}, "is a device"),
        "missing": ({"image": f"{env['reg'].host}/trellis-test/nothere:v1"},
                    "does not exist in registry"),
        "foreign": ({"image": env["foreign"]}, f"is built for {FOREIGN}"),
        "down": ({"image": down}, "cannot be reached"),
    }
    ids = {name: submit(env, name, "echo ran-the-command", **kw)
           for name, (kw, _) in cases.items()}
    for name, (_, words) in cases.items():
        job = ended(env, ids[name])
        assert job["state"] == "failed", (name, job)
        assert words in job["reason"], (name, job["reason"])
        assert "\n" not in job["reason"] and "Traceback" not in job["reason"]
        assert "ran-the-command" not in output(env, ids[name])
    assert podman_ps(env) == []
    store = env["root"] / "cluster" / env["cluster"].node_name(1) / "containers"
    assert not any((store / "pull-tmp").iterdir())  # no half-pulled blob
    # The node runs the next job.
    assert ended(env, submit(env, "next", "echo fine"))["state"] == "finished"
    # No group left below the node's parent, in any hierarchy: podman's cgroupfs manager
    # made the next job's path in every one, noded's or not.
    from noded.containers.launcher import cgroup_roots

    for root in cgroup_roots():
        parent = root / env["cluster"].node_name(1)
        left = [p for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
        assert not left, left
    # A reference that does not parse never reaches a node: the master refuses it.
    from control.client import RpcError

    with pytest.raises(RpcError) as refused:
        submit(env, "unparsable", "true", image="Team/Img:v1")
    assert refused.value.code == "bad_image"
    assert "invalid repository component 'Team'" in str(refused.value)


def test_registry_credentials_are_the_operators_file_mode_0600(env: dict) -> None:
    path = env["creds"] / env["locked"].host
    path.write_text("tester:wrong\n")
    path.chmod(0o644)
    job = ended(env, submit(env, "open-file", "echo in", image=env["private"]))
    assert job["state"] == "failed" and "must be 0600" in job["reason"], job["reason"]
    path.chmod(0o600)
    job = ended(env, submit(env, "wrong", "echo in", image=env["private"]))
    assert job["state"] == "failed" and "refused the node's credentials" in job["reason"], \
        job["reason"]
    path.write_text("tester:s3cret\n")
    job_id = submit(env, "right", "cat /etc/seed", image=env["private"])
    assert ended(env, job_id)["state"] == "finished"
    assert "2" in output(env, job_id).splitlines()  # the private image's own file


def test_a_running_container_follows_a_live_re_pin(env: dict) -> None:
    """What the CPU tuner does (cgroups.update on the job's group) moves the container's
    processes too, though podman nested their group below the job's."""
    from dataclasses import replace

    from noded.cgroups import detect_cgroups

    script = ("while true; do grep Cpus_allowed_list /proc/self/status; "
              "[ -e /scratch/stop ] && exit 0; sleep 0.2; done")
    job_id = submit(env, "repin", script, time_limit_s=120)
    cluster = env["cluster"]
    first = cluster.wait_for("its first line", lambda: [
        ln for ln in output(env, job_id).splitlines() if ln.startswith("Cpus_allowed")],
        timeout=60)[0]
    placed = int(first.split()[-1])
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: nowhere to re-pin to")
    other = next(c for c in cores if c != placed)
    groups = detect_cgroups(cluster.node_name(1))
    groups.update(job_id, replace(groups.limits(job_id), cpus=(other,)))
    cluster.wait_for("the container on its new core", lambda: any(
        ln == f"Cpus_allowed_list:\t{other}" for ln in output(env, job_id).splitlines()),
        timeout=30)
    env["cluster"].client().call("cancel", {"id": job_id})
    assert ended(env, job_id)["state"] == "cancelled"


def test_a_container_gets_its_gpus_and_no_other(env: dict) -> None:
    """The CDI spec noded writes from a GpuDeviceNodes puts exactly the job's GPU (and the
    control file) into the container; the others cannot be opened or made there."""
    from demo.gpuprobe import fake_gpu_nodes, probe

    with scratch_dir("trellis-test-gpudev-") as scratch:
        nodes = fake_gpu_nodes(scratch / "dev", 4)
        result = probe(env["root"] / "probe-store", env["image"], nodes, (1,),
                       workdir=scratch)
    assert result.exit_code == 0, result.output
    assert sorted(result.present) == ["/dev/nvidia1", "/dev/nvidiactl"], result.output
    # Its own GPU opens as far as the driver (absent here: ENXIO), never EPERM.
    assert "No such device or address" in result.opened["/dev/nvidia1"], result.output
    attempts, escapes = result.escapes((1,), nodes)
    assert attempts == 9 and escapes == 0, result.output
    assert all("Operation not permitted" in v for v in result.mknod.values()), result.output


def test_the_cache_evicts_least_recently_used_never_an_image_in_use(env: dict) -> None:
    from noded.containers.cache import ImageCache

    store = env["root"] / "cache-store"
    podman = Podman(store)
    a, b, c = env["cached"]
    cache = ImageCache(podman, max_bytes=1 << 40, progress=lambda line: None)
    ids = {ref: cache.ensure(ref, env["reg"].host, None, tls_verify=False) for ref in (a, b, c)}
    size = max(int(i["Size"]) for i in cache.images() if i["Id"] in ids.values())
    for ref in (a, b, c):  # a is the least recently used, then b
        cache.touch(ids[ref])
    # A container uses a: it must stay though it is the oldest.
    subprocess.run(podman.argv("create", "--name", "trellis-test-holder", ids[a], "true"),
                   check=True, capture_output=True, timeout=60)
    try:
        others = sum(int(i["Size"]) for i in cache.images() if i["Id"] not in ids.values())
        cache.max_bytes = others + 2 * size + size // 2  # room for two of the three
        removed = cache.evict(keep=ids[c])
        assert removed == [ids[b]]
        left = {i["Id"] for i in cache.images()}
        assert ids[a] in left and ids[c] in left and ids[b] not in left
    finally:
        subprocess.run(podman.argv("rm", "-f", "trellis-test-holder"), capture_output=True,
                       timeout=60)
        for image_id in ids.values():
            subprocess.run(podman.argv("rmi", "-f", image_id), capture_output=True, timeout=60)


def test_a_hung_or_garbage_registry_or_a_full_disk_fails_the_pull_and_leaves_nothing(
        env: dict) -> None:
    """The node's pull code (what a job's launch runs) against a registry that hangs (killed
    at the timeout, retried once), one that answers garbage and a store on a full disk."""
    from demo.registry import BrokenRegistry
    from noded.containers.cache import ImageCache, PullFailed

    cache = ImageCache(Podman(env["root"] / "cache-store"), 1 << 40, pull_timeout_s=2.0,
                       pull_retries=1, progress=lambda line: None)
    with BrokenRegistry("hang") as hang:
        started = time.monotonic()
        with pytest.raises(PullFailed, match=r"did not finish within 2s \(2 attempts\)"):
            cache.ensure(f"{hang.host}/trellis-test/x:v1", hang.host, None, tls_verify=False)
        assert time.monotonic() - started < 15
    with BrokenRegistry("garbage") as garbage, pytest.raises(
            PullFailed, match="not an image registry's response"):
        cache.ensure(f"{garbage.host}/trellis-test/x:v1", garbage.host, None, tls_verify=False)
    assert not (cache.store / "pull-tmp").exists() or not any(
        (cache.store / "pull-tmp").iterdir())
    # A store on a 4 MiB file system cannot take a 3 MiB image's layer (and its copy).
    tiny = env["root"] / "tiny-store"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "trellis-test-tiny", str(tiny)],
                   check=True)
    try:
        full = ImageCache(Podman(tiny), 1 << 40, pull_retries=1, progress=lambda line: None)
        with pytest.raises(PullFailed, match="image store is full") as failed:
            full.ensure(env["cached"][0], env["reg"].host, None, tls_verify=False)
        assert "attempts" not in str(failed.value)  # not retried
        assert full.image_id(env["cached"][0]) is None
        assert not (tiny / "pull-tmp").exists() or not any((tiny / "pull-tmp").iterdir())
    finally:
        Podman(tiny).clean()
        subprocess.run(["umount", "-l", str(tiny)], check=False)


def test_a_container_job_outlives_a_noded_crash_and_is_collected_after(env: dict) -> None:
    import signal

    cluster = env["cluster"]
    go = env["allowed"] / "go-crash"
    job_id = submit(env, "crash", "echo up; while [ ! -e /data/go-crash ]; do sleep 0.2; done; "
                    "echo done", mounts=[{"source": str(env["allowed"]), "target": "/data",
                                          "read_only": True}])
    cluster.wait_for("the container to be up", lambda: "up" in output(env, job_id), timeout=60)
    node = cluster.node_name(1)
    cluster.node_daemons[node].stop(signal.SIGKILL)
    try:
        assert podman_ps(env) == [f"{node}-{job_id}-0"]  # still running without noded
    finally:
        cluster.node_daemons[node].start(cluster._env())
    cluster.wait_nodes(1)
    go.touch()
    try:
        job = ended(env, job_id)
    finally:
        go.unlink()
    assert job["state"] == "finished", job
    assert "done" in output(env, job_id)
    assert cluster.wait_for("its container to be gone", lambda: podman_ps(env) == [],
                            timeout=30) is True


def test_the_mba_group_holds_the_containers_processes(env: dict) -> None:
    """The contention eliminator puts the job's processes in its resctrl group (emulated
    here): the container's, in the group podman nested below the job's, included."""
    from rdt import group_for_job

    cluster = env["cluster"]
    job_id = submit(env, "mba", "echo up; while true; do sleep 0.2; done")
    cluster.wait_for("the container to be up", lambda: "up" in output(env, job_id), timeout=60)
    store = env["root"] / "cluster" / cluster.node_name(1) / "containers"
    name = f"{cluster.node_name(1)}-{job_id}-0"
    pid = subprocess.run(Podman(store).argv("inspect", "--format", "{{.State.Pid}}", name),
                         capture_output=True, text=True, timeout=30).stdout.strip()
    assert pid.isdigit() and int(pid) > 0, pid
    tasks = env["root"] / "cluster" / cluster.node_name(1) / "resctrl" / group_for_job(
        job_id) / "tasks"
    cluster.wait_for("the container's init in the job's MBA group", lambda: tasks.exists()
                     and pid in tasks.read_text().split(), timeout=30)
    cluster.client().call("cancel", {"id": job_id})
    assert ended(env, job_id)["state"] == "cancelled"


def test_a_batch_script_runs_in_its_image(env: dict) -> None:
    """trellisctl submit script.sh with --container-image (pyxis' spelling): the script the
    job carries is not in the image; the node puts it where the container sees it."""
    script = "#!/bin/sh\necho \"script in $(cat /etc/hostname >/dev/null; pwd) args: $*\"\n"
    launch = {"image": env["image"], "script": script}
    job = {"name": "batch", "user": default_job_user(), "kind": "cpu", "gpus": 0, "cpus": 1,
           "command": ["batch", "one", "two"], "launch": launch, "workdir": "/scratch"}
    job_id = env["cluster"].client().call("submit", {"job": job})["job"]["id"]
    done = ended(env, job_id)
    out = output(env, job_id)
    assert done["state"] == "finished", (done, out)
    assert "script in /scratch args: one two" in out, out
