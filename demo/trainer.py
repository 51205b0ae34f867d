#!/usr/bin/env python3
"""A synthetic training job for demos and tests (standard library only).

Its data-loading stage does real CPU work in loader processes, and an emulated GPU
stage consumes batches; every finished iteration increments the counter in
``$TRELLIS_PROGRESS_FILE``, from which the emulated GPU backend derives utilisation.

    trainer.py --iterations 50 --load-ms 20 --gpu-ms 10 --loaders 1 [--fail-at N]

Emulating a model (for the profiler and GENIE's end-to-end tests)::

    trainer.py --emulate K0,K1,K2,GAMMA,LAMBDA --batch B --iterations N

runs at the rate GENIE's model predicts for a global batch ``B`` on this job's placement —
``d_node`` from ``NNODES`` (else ``WORLD_SIZE``), ``d_gpn`` from ``NPROC_PER_NODE`` (else the
number of ``CUDA_VISIBLE_DEVICES``): local batch ``b = B/(d_node·d_gpn)`` (Eq. 6),
``sPR = K0 + K1·b + K2·b²`` (Eq. 7), ``Comm`` from γ, λ (Eq. 8), ``PR = (D − Comm)·sPR``
(Eq. 5); each iteration takes ``B/PR`` seconds on a fixed schedule (so a late wake-up does
not slow the rate). The rank-0 process appends ``samples_per_sec <rate>`` lines, measured
over its own loop, to ``$TRELLIS_METRICS_FILE`` (see noded/metrics_channel.py).
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


def emulated_rate(coefficients: list[float], batch: float, d_node: int, d_gpn: int) -> float:
    """Samples/s of the whole job by GENIE Eq. 5-8 (written out here: jobs cannot import
    Trellis, and an independent copy is what the end-to-end tests check the fit against)."""
    k0, k1, k2, gamma, lam = coefficients
    total = d_node * d_gpn
    local = batch / total
    spr = k0 + k1 * local + k2 * local * local
    comm = 0.0 if total == 1 else ((d_node - 1) * d_gpn + lam * (d_gpn - 1)) * gamma / (total - 1)
    rate = (total - comm) * spr
    if not rate > 0:
        raise ValueError(f"the emulated model gives no throughput on <{d_node}, {d_gpn}> "
                         f"at batch {batch}")
    return rate


def placement_from_env() -> tuple[int, int]:
    env = os.environ
    d_node = int(env.get("NNODES") or env.get("WORLD_SIZE") or 1)
    if env.get("NPROC_PER_NODE"):
        d_gpn = int(env["NPROC_PER_NODE"])
    else:
        d_gpn = len([g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()])
    return max(1, d_node), max(1, d_gpn)


def report(path: str | None, name: str, value: float) -> None:
    """One line on the metrics channel: opened in append mode, written in one call."""
    if not path:
        return
    with open(path, "a") as f:
        f.write(f"{name} {value:.6g}\n")


def emulate(args: argparse.Namespace) -> int:
    try:
        coefficients = [float(x) for x in args.emulate.split(",")]
        if len(coefficients) != 5:
            raise ValueError("expected 5 numbers")
    except ValueError as exc:
        print(f"--emulate K0,K1,K2,GAMMA,LAMBDA: {exc}", file=sys.stderr)
        return 2
    if args.batch is None or args.batch < 1:
        print("--emulate needs --batch B (the global batch, >= 1)", file=sys.stderr)
        return 2
    d_node, d_gpn = placement_from_env()
    try:
        rate = emulated_rate(coefficients, args.batch, d_node, d_gpn)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    step = args.batch / rate
    rank0 = os.environ.get("RANK", "0") == "0"
    metrics = os.environ.get("TRELLIS_METRICS_FILE") if rank0 else None
    progress = os.environ.get("TRELLIS_PROGRESS_FILE")
    print(f"emulating <{d_node}, {d_gpn}> batch {args.batch}: {rate:.1f} samples/s, "
          f"{step * 1000:.1f} ms/iteration", flush=True)
    # Each report is the mean rate since the first iteration began: a late wake-up on a busy
    # machine then skews one report by (delay / elapsed), not (delay / report interval).
    start = mark = time.monotonic()
    deadline = start
    for i in range(args.iterations):
        deadline += step
        pause = deadline - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        write_progress(progress, i + 1)
        now = time.monotonic()
        if now - mark >= args.report_s or i + 1 == args.iterations:
            report(metrics, "samples_per_sec", (i + 1) * args.batch / (now - start))
            mark = now
    print(f"done {args.iterations} iterations in {time.monotonic() - start:.2f}s", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--load-ms", type=float, default=20.0, help="CPU time per batch to load")
    p.add_argument("--gpu-ms", type=float, default=10.0, help="emulated GPU time per batch")
    p.add_argument("--loaders", type=int, default=1, help="loader processes")
    p.add_argument("--fail-at", type=int, default=-1, help="exit 3 at this iteration")
    p.add_argument("--emulate", metavar="K0,K1,K2,GAMMA,LAMBDA",
                   help="run at the rate of GENIE's model with these coefficients")
    p.add_argument("--batch", type=int, help="global batch size (with --emulate)")
    p.add_argument("--report-s", type=float, default=0.25,
                   help="seconds between samples_per_sec reports (with --emulate)")
    args = p.parse_args()
    if args.emulate:
        return emulate(args)
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
