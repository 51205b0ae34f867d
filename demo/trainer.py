#!/usr/bin/env python3
"""A synthetic training job for demos and tests (standard library only).

Its data-loading stage does real CPU work in loader processes, and an emulated GPU
stage consumes batches; every finished iteration increments the counter in
``$TRELLIS_PROGRESS_FILE``, from which the emulated GPU backend derives utilisation.

    trainer.py --iterations 50 --load-ms 20 --gpu-ms 10 --loaders 1 [--fail-at N]
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import time


def load_batch(ms: float) -> int:
    """Burn ``ms`` of CPU the way JPEG decoding would: real work, not sleep."""
    end = time.process_time() + ms / 1000
    digest = b"x"
    rounds = 0
    while time.process_time() < end:
        digest = hashlib.sha256(digest).digest()
        rounds += 1
    return rounds


def write_progress(path: str | None, done: int) -> None:
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(done))
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--load-ms", type=float, default=20.0, help="CPU time per batch to load")
    p.add_argument("--gpu-ms", type=float, default=10.0, help="emulated GPU time per batch")
    p.add_argument("--loaders", type=int, default=1, help="loader processes")
    p.add_argument("--fail-at", type=int, default=-1, help="exit 3 at this iteration")
    args = p.parse_args()
    progress = os.environ.get("TRELLIS_PROGRESS_FILE")
    rank = os.environ.get("RANK", "0")
    print(f"rank {rank}/{os.environ.get('WORLD_SIZE', '1')} gpus="
          f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')} cpus={sorted(os.sched_getaffinity(0))}",
          flush=True)
    with multiprocessing.Pool(max(1, args.loaders)) as pool:
        pending = [pool.apply_async(load_batch, (args.load_ms,)) for _ in range(args.loaders)]
        for i in range(args.iterations):
            pending.pop(0).get()
            pending.append(pool.apply_async(load_batch, (args.load_ms,)))
            time.sleep(args.gpu_ms / 1000)  # the emulated GPU step
            if i == args.fail_at:
                print(f"failing on purpose at iteration {i}", flush=True)
                return 3
            write_progress(progress, i + 1)
    print(f"done {args.iterations} iterations", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
