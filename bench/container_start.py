"""What running a job in an image costs: start overhead, pull rate, GPU escapes.

    python bench/container_start.py [--pairs 6] [--pull-mb 200]

Starts a real docker-registry on loopback (demo/registry.py) with busybox images built here,
a real trellis-masterd and one trellis-noded (podman + runc), and measures:

* ``start_overhead_s_p50``: the same short job submitted bare and with a cached image,
  alternating (``--pairs`` of each); each job's start is when its command first runs (it
  touches a file in a mounted directory; the file's mtime), from just before the submit
  RPC. The overhead of a pair is the image job's submit-to-running minus the bare job's;
  the median of the pairs (target <= 1.0);
* ``pull_mb_per_s``: a ``--pull-mb`` MB image (incompressible padding) pulled from the
  loopback registry into an empty store by the node's own pull code
  (noded/containers/cache.py): compressed bytes transferred / seconds;
* ``escape_attempts`` / ``escapes``: a container given GPU 2 of 8 emulated GPUs (character
  devices, major 195, in a scratch directory; the CDI spec noded writes) tries to open every
  other GPU's device file, at /dev and at its host path, and to mknod it (target 0 escapes);
* ``seconds``: the whole run.

Last line: JSON. SIGTERM or Ctrl-C stops everything and removes what it made.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.gpuprobe import fake_gpu_nodes, probe  # noqa: E402
from demo.harness import exit_on_signals, scratch_dir  # noqa: E402
from demo.registry import Registry, build_image, layer_bytes  # noqa: E402
from noded.containers.cache import ImageCache  # noqa: E402
from noded.containers.podman import Podman  # noqa: E402

TARGET_OVERHEAD_S = 1.0
MB = 1e6


def started_at(marker: Path, ended: Callable[[], dict | None],
               timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    polls = 0
    while not marker.exists():
        polls += 1
        if time.monotonic() > deadline:
            raise RuntimeError(f"the job never touched {marker}")
        if polls % 100 == 0 and (job := ended()) is not None and not marker.exists():
            raise RuntimeError(f"{job['id']} ended {job['state']} ({job['reason']}) "
                               f"without touching {marker}")
        time.sleep(0.005)
    return marker.stat().st_mtime


def run_pair(cluster: LocalCluster, image: str, marks: Path, i: int) -> tuple[float, float]:
    client = cluster.client(timeout=30)
    times = []
    for kind in ("bare", "image"):
        marker = marks / f"{kind}-{i}"
        if kind == "bare":
            job = {"command": ["/bin/sh", "-c", f"touch {marker}"]}
        else:
            job = {"command": ["/bin/sh", "-c", f"touch /marks/{marker.name}"],
                   "launch": {"image": image, "mounts": [{"source": str(marks),
                                                          "target": "/marks"}]}}
        job.update(name=f"{kind}-{i}", user=default_job_user(), kind="cpu", gpus=0, cpus=1)
        submitted = time.time()
        job_id = client.call("submit", {"job": job})["job"]["id"]

        def ended(j: str = job_id) -> dict | None:
            found = client.call("job", {"id": j})["job"]
            return found if found["state"] in ("finished", "failed", "cancelled") else None

        times.append(started_at(marker, ended) - submitted)
        cluster.wait_for(f"{job_id} to end", lambda j=job_id: client.call(
            "job", {"id": j})["job"]["state"] in ("finished", "failed"), timeout=120)
        state = client.call("job", {"id": job_id})["job"]
        if state["state"] != "finished":
            raise RuntimeError(f"{job_id} ended {state['state']}: {state['reason']}")
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--pull-mb", type=int, default=200)
    args = parser.parse_args()
    began = time.perf_counter()
    with exit_on_signals(), scratch_dir("trellis-test-bench-ctr-", mode=0o777) as root:
        layout = root / "oci"
        build_image(layout, "small")
        build_image(layout, "big", pad_mb=round(args.pull_mb * MB / (1 << 20)), seed=9)
        marks = root / "marks"
        marks.mkdir()
        marks.chmod(0o777)  # the jobs run as nobody
        stores = [root / "cluster" / "trellis-test-bctr-n1" / "containers", root / "pull",
                  root / "probe"]
        try:
            with Registry() as reg:
                small = reg.push(layout, "small", "trellis-test/small")
                big = reg.push(layout, "big", "trellis-test/big")
                # The pull rate: the node's own pull code, into an empty store.
                cache = ImageCache(Podman(root / "pull"), 1 << 40, progress=lambda s: None)
                t0 = time.perf_counter()
                cache.ensure(big, reg.host, None, tls_verify=False)
                pull_s = time.perf_counter() - t0
                pulled = layer_bytes(layout, "big")
                # Escapes: one GPU of eight given, every other one tried.
                nodes = fake_gpu_nodes(root / "dev", 8)
                result = probe(root / "probe", small, nodes, (2,), workdir=root)
                attempts, escapes = result.escapes((2,), nodes)
                if result.exit_code != 0 or sorted(result.present) != ["/dev/nvidia2",
                                                                       "/dev/nvidiactl"]:
                    raise RuntimeError(f"the probe container failed: {result.output}")
                # Start overhead: bare and image jobs alternating, the image cached first.
                with LocalCluster(root / "cluster", prefix="trellis-test-bctr", nodes=1,
                                  gpus_per_node=1, node_sections={"containers": {
                                      "allowed_mounts": [str(marks)],
                                      "insecure_registries": [reg.host]}}) as cluster:
                    cluster.start()
                    run_pair(cluster, small, marks, 0)  # warms the cache (the pull)
                    pairs = [run_pair(cluster, small, marks, i)
                             for i in range(1, args.pairs + 1)]
        finally:
            for store in stores:
                Podman(store).clean()
    overheads = [img - bare for bare, img in pairs]
    p50 = statistics.median(overheads)
    out = {
        "start_overhead_s_p50": round(p50, 3),
        "bare_start_s_p50": round(statistics.median(b for b, _ in pairs), 3),
        "image_start_s_p50": round(statistics.median(i for _, i in pairs), 3),
        "pairs": len(pairs),
        "pull_mb_per_s": round(pulled / MB / pull_s, 1),
        "pull_mb": round(pulled / MB, 1),
        "pull_s": round(pull_s, 2),
        "escape_attempts": attempts,
        "escapes": escapes,
        "seconds": round(time.perf_counter() - began, 1),
        "meets_targets": {"start_overhead_s_p50": p50 <= TARGET_OVERHEAD_S,
                          "escapes": escapes == 0},
    }
    print(f"start overhead p50 {out['start_overhead_s_p50']} s over {len(pairs)} pairs; "
          f"pull {out['pull_mb']} MB at {out['pull_mb_per_s']} MB/s; "
          f"{escapes} escapes of {attempts} attempts", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    os.umask(0o022)
    main()
