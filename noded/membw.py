"""Measure a node's peak memory bandwidth when the configuration does not give it.

A STREAM-style copy: one worker process per core offered to jobs copies a buffer much larger
than any last-level cache (``dst[:] = src`` on bytearrays is a plain memcpy), all at once, for
a fraction of a second; bandwidth counts the bytes read plus the bytes written, as MBM does.
What comes out is the bandwidth software can actually draw, typically 60-80 % of the
datasheet figure, which is the right denominator for "75 % of peak": a node cannot be pushed
past it anyway. The contention loop also raises the peak to any higher node total that MBM
reports, so an underestimate corrects itself.

The result is cached in ``STATE_DIR/membw.json`` so a restarted noded does not load a busy node
again; delete the file (or set ``contention.peak_bandwidth_mbps``) to re-measure.

``python -m noded.membw --worker SECONDS`` is the worker; it prints bytes per second.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("trellis.node.membw")

BUFFER_BYTES = 64 << 20  # far above any L3, so the copy streams from DRAM
CACHE_FILE = "membw.json"


def copy_bandwidth(seconds: float, nbytes: int = BUFFER_BYTES) -> float:
    """Bytes per second (read + written) one process copies for ``seconds``."""
    src = bytearray(b"\x01") * nbytes
    dst = bytearray(nbytes)
    dst[:] = src  # touch every page once before timing
    moved = 0
    start = time.perf_counter()
    while True:
        dst[:] = src
        moved += 2 * nbytes
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return moved / elapsed


def measure_peak_bandwidth(workers: int, seconds: float = 0.5) -> float:
    """Sum of ``workers`` concurrent copy processes' bandwidth, in bytes per second."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "noded.membw", "--worker", str(seconds)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            cwd=str(Path(__file__).resolve().parent.parent),
        )
        for _ in range(workers)
    ]
    total = 0.0
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds * 10 + 30)
        if proc.returncode != 0:
            raise RuntimeError(f"memory bandwidth worker exited with {proc.returncode}")
        total += float(out.decode().strip())
    return total


def peak_bandwidth(state_dir: Path, workers: int, seconds: float = 0.5) -> float:
    """The cached measurement for this many workers, measuring (and caching) it if absent."""
    cache = state_dir / CACHE_FILE
    try:
        data = json.loads(cache.read_text())
        if data.get("workers") == workers and float(data["bytes_per_s"]) > 0:
            return float(data["bytes_per_s"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    started = time.monotonic()
    bps = measure_peak_bandwidth(workers, seconds)
    log.info("membw measured peak_mibps=%.0f workers=%d took_s=%.2f", bps / (1 << 20), workers,
             time.monotonic() - started)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps({"workers": workers, "bytes_per_s": bps, "time": time.time()}))
    tmp.replace(cache)
    return bps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m noded.membw")
    p.add_argument("--worker", type=float, metavar="SECONDS", help="run one copy worker")
    p.add_argument("--workers", type=int, default=1, help="measure with this many workers")
    args = p.parse_args(argv)
    if args.worker is not None:
        print(f"{copy_bandwidth(args.worker):.0f}")
        return 0
    print(f"{measure_peak_bandwidth(args.workers) / (1 << 20):.0f} MiB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
