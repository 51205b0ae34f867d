"""Job output through the master: ``trellisctl logs -f`` following a job that writes 1 GiB.

    python bench/logs.py [--gib 1.0]

Starts a real trellis-masterd and one trellis-noded (its log cap raised above the output) on
this machine and submits a job that prints one line, then waits for a go-file and writes
``--gib`` GiB of 100-character lines (``yes | head -c``) as fast as it can. With the job
running, it starts the real CLI as a subprocess, ``trellisctl logs -f JOB``, and times:

* ``first_byte_ms``: from starting ``trellisctl logs -f`` (process start-up included) to the
  job's first line on its stdout (target <= 500);
* ``mb_per_s``: once the go-file is there, the job's output in MB (10^6 bytes) over the
  seconds from the go-file to the CLI's exit at the job's end, every byte having gone from
  the shim's log through noded, the node's WebSocket, the master and the RPC to the CLI's
  stdout (target >= 50). The bytes received are counted and their CRC-32 checked against the
  log on the node;
* ``master_rss_growth_mb`` / ``noded_rss_growth_mb``: the daemons' largest resident size,
  sampled every 50 ms while relaying, less their size just before (psutil; targets <= 32:
  neither holds more than a chunk per request);
* ``readback_mb_per_s``: the same output read again without ``-f`` once the job has ended
  (the relay alone, no writer competing for the CPUs).

Last line: JSON with those, ``seconds`` (the whole run) and whether each target is met.
SIGTERM or Ctrl-C stops the CLI, the job and the daemons and removes the scratch directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.harness import exit_on_signals, scratch_dir  # noqa: E402

TARGET_MB_PER_S = 50.0
TARGET_RSS_GROWTH_MB = 32.0
TARGET_FIRST_BYTE_MS = 500.0
LINE = "0123456789" * 10  # 100 characters and a newline per line
FIRST = b"first line of the job\n"
SAMPLE_S = 0.05
MB = 1e6
MIB = 1 << 20


class RssPeaks:
    """Samples processes' resident size in a thread; ``peak`` is the largest seen."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.before = {name: p.memory_info().rss for name, p in self.procs.items()}
        self.peak = dict(self.before)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            for name, proc in self.procs.items():
                with contextlib.suppress(psutil.Error):
                    self.peak[name] = max(self.peak[name], proc.memory_info().rss)

    def growth_mb(self, name: str) -> float:
        return (self.peak[name] - self.before[name]) / MIB


def ctl_command(url: str) -> list[str]:
    # This tree's CLI (python -m, from ROOT), not whichever checkout installed `trellisctl`.
    return [sys.executable, "-m", "control.cli", "--master", url]


def read_all(proc: subprocess.Popen[bytes], crc: int = 0) -> tuple[int, int]:
    """Read the CLI's stdout to its end: how many bytes, and the CRC-32 of what came before
    (``crc``) and them."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    total = 0
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
        crc = zlib.crc32(chunk, crc)
    return total, crc


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="GiB the job writes (default 1)")
    args = p.parse_args()
    size = int(args.gib * (1 << 30))
    began = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    follow: subprocess.Popen[bytes] | None = None
    readback: subprocess.Popen[bytes] | None = None
    with exit_on_signals(), scratch_dir("trellis-test-bench-logs-", mode=0o777) as root, \
            LocalCluster(root / "c", nodes=1, gpus_per_node=1, prefix="trellis-bench-logs",
                         node_sections={"jobs": {"log_max_mb": 2 * args.gib * 1024 + 64}},
                         node_settings={"log_level": "warning"},
                         extra_master={"log_level": "warning"}) as cluster:
        try:
            cluster.start()
            client = cluster.client(timeout=30)
            node = cluster.node_name(1)
            go = root / "go"
            script = (f"printf '{FIRST.decode()[:-1]}\\n'; while [ ! -e {go} ]; do sleep 0.02; "
                      f"done; yes {LINE} 2>/dev/null | head -c {size}")
            job = client.call("submit", {"id": "bench-logs", "job": {
                "name": "bench-logs", "command": ["sh", "-c", script], "user":
                    default_job_user(), "kind": "cpu", "cpus": 1}})["job"]["id"]
            cluster.wait_for("the job's first line", lambda: client.call(
                "logs", {"id": job})["parts"][0]["data"] == FIRST, timeout=60)
            assert cluster.master is not None and cluster.master.proc is not None
            noded = cluster.node_daemons[node].proc
            assert noded is not None
            with RssPeaks({"master": cluster.master.proc.pid, "noded": noded.pid}) as rss:
                started = time.perf_counter()
                follow = subprocess.Popen([*ctl_command(cluster.url), "logs", "-f", job],
                                          stdout=subprocess.PIPE, env=env, cwd=ROOT)
                assert follow.stdout is not None
                first = os.read(follow.stdout.fileno(), len(FIRST))
                while not first.endswith(b"\n"):
                    more = os.read(follow.stdout.fileno(), len(FIRST))
                    if not more:
                        break
                    first += more
                first_byte_ms = (time.perf_counter() - started) * 1000
                if first != FIRST:
                    raise RuntimeError(f"the job's first line came as {first!r}")
                go.touch()
                flood = time.perf_counter()
                received, crc = read_all(follow, zlib.crc32(first))
                if follow.wait(timeout=60) != 0:
                    raise RuntimeError(f"trellisctl logs -f exited {follow.returncode}")
                seconds = time.perf_counter() - flood
            final = client.call("job", {"id": job})["job"]
            if final["state"] != "finished":
                raise RuntimeError(f"the job ended {final['state']}: {final['reason']}")
            kept = cluster.root / node / "logs" / f"{job}.log"
            if not kept.exists():
                kept = cluster.root / node / "jobs" / job / "output.log"
            on_node = kept.stat().st_size
            if received != size or on_node != size + len(FIRST):
                raise RuntimeError(f"relayed {received} bytes after the first line, the node "
                                   f"kept {on_node}; the job wrote {size} + {len(FIRST)}")
            expected = file_crc(kept)
            if crc != expected:
                raise RuntimeError("the bytes relayed differ from the log on the node")
            # Read back, without -f, once the job has ended: the relay alone.
            again = time.perf_counter()
            readback = subprocess.Popen([*ctl_command(cluster.url), "logs", job],
                                        stdout=subprocess.PIPE, env=env, cwd=ROOT)
            back, back_crc = read_all(readback)
            readback.wait(timeout=60)
            readback_s = time.perf_counter() - again
            if back != size + len(FIRST) or back_crc != expected:
                raise RuntimeError(f"read back {back} bytes (crc {back_crc:#x}), the node "
                                   f"keeps {size + len(FIRST)} (crc {expected:#x})")
        finally:
            stop(follow)
            stop(readback)
    mb_per_s = size / MB / seconds
    result = {
        "bytes": size,
        "client": "trellisctl logs -f (subprocess)",
        "mb_per_s": round(mb_per_s, 1),
        "first_byte_ms": round(first_byte_ms, 1),
        "master_rss_growth_mb": round(rss.growth_mb("master"), 1),
        "noded_rss_growth_mb": round(rss.growth_mb("noded"), 1),
        "relay_seconds": round(seconds, 2),
        "readback_mb_per_s": round((size + len(FIRST)) / MB / readback_s, 1),
        "seconds": round(time.perf_counter() - began, 1),
        "targets": {"mb_per_s": TARGET_MB_PER_S, "rss_growth_mb": TARGET_RSS_GROWTH_MB,
                    "first_byte_ms": TARGET_FIRST_BYTE_MS},
        "meets_targets": {
            "mb_per_s": mb_per_s >= TARGET_MB_PER_S,
            "master_rss_growth_mb": rss.growth_mb("master") <= TARGET_RSS_GROWTH_MB,
            "noded_rss_growth_mb": rss.growth_mb("noded") <= TARGET_RSS_GROWTH_MB,
            "first_byte_ms": first_byte_ms <= TARGET_FIRST_BYTE_MS,
        },
    }
    print(f"{size / MIB:.0f} MiB followed at {result['mb_per_s']} MB/s "
          f"({result['relay_seconds']} s), first line after {result['first_byte_ms']} ms; "
          f"RSS growth master {result['master_rss_growth_mb']} MiB, noded "
          f"{result['noded_rss_growth_mb']} MiB; read back at "
          f"{result['readback_mb_per_s']} MB/s", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
