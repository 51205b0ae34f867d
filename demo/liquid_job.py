#!/usr/bin/env python3
"""A synthetic deep-learning job with Liquid's three phases (standard library only).

    liquid_job.py --pre 2 --train 10 --post 3 --util 85 --gpu-mem-mib 6000 [--cpu 1]

Launching (``--pre`` s) and saving (``--post`` s) keep the GPU nearly idle; training
(``--train`` s) keeps it at ``--util`` percent and counts iterations in
``$TRELLIS_PROGRESS_FILE``. On emulated GPUs the job declares its utilisation and GPU memory
in the files beside the progress counter (``noded/gpu/declared.py``), which is what noded's
usage accounting and post-phase detector then see; ``--cpu N`` burns N cores while training,
``--send BYTES`` sends that much to ``$MASTER_ADDR:--port`` (a sink the caller runs) so that
network counters have something to count; ``--stamp FILE`` appends ``JOB EVENT TIME``
lines (``start``, ``train``, ``trained``, ``end``; wall-clock seconds) for benchmarks that time
what happens on the GPU (bench/event_latency.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import sys
import time


def declare(directory: str | None, name: str, value: float) -> None:
    if not directory:
        return
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(f"{value:g}")
    os.replace(tmp, os.path.join(directory, name))


def stamp(path: str | None, event: str) -> None:
    if not path:
        return
    line = f"{os.environ.get('TRELLIS_JOB_ID', '-')} {event} {time.time():.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def burn(until: float) -> None:
    while time.monotonic() < until:
        pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--pre", type=float, default=1.0)
    p.add_argument("--train", type=float, default=5.0)
    p.add_argument("--post", type=float, default=1.0)
    p.add_argument("--util", type=float, default=85.0)
    p.add_argument("--gpu-mem-mib", type=float, default=4000.0)
    p.add_argument("--cpu", type=int, default=0)
    p.add_argument("--send", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--stamp", help="append JOB EVENT TIME lines to this file")
    args = p.parse_args()
    stamp(args.stamp, "start")
    if not 0 <= args.util <= 100:
        print("--util must be 0-100", file=sys.stderr)
        return 2
    progress = os.environ.get("TRELLIS_PROGRESS_FILE")
    directory = os.path.dirname(progress) if progress else None
    declare(directory, "util", 0)
    declare(directory, "memory", args.gpu_mem_mib)
    time.sleep(args.pre)
    declare(directory, "util", args.util)
    stamp(args.stamp, "train")
    until = time.monotonic() + args.train
    burners = [multiprocessing.Process(target=burn, args=(until,)) for _ in range(args.cpu)]
    for b in burners:
        b.start()
    if args.send and args.port:
        with socket.create_connection((os.environ.get("MASTER_ADDR", "127.0.0.1"),
                                       args.port)) as s:
            s.sendall(b"x" * args.send)
    done = 0
    while time.monotonic() < until:
        time.sleep(0.05)
        done += 1
        if progress:
            tmp = f"{progress}.tmp"
            with open(tmp, "w") as f:
                f.write(str(done))
            os.replace(tmp, progress)
    for b in burners:
        b.join()
    declare(directory, "util", 1)
    stamp(args.stamp, "trained")
    time.sleep(args.post)
    print(f"done {done} iterations", flush=True)
    stamp(args.stamp, "end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
