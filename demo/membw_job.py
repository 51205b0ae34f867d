#!/usr/bin/env python3
"""A memory-hungry CPU job for the demo (standard library only): it really copies memory.

    membw_job.py --mibps 380 --busy-s 10 --idle-s 6 --counter FILE --allowance FILE

For ``--busy-s`` seconds it copies a buffer larger than a last-level cache at ``--mibps``
(bytes read plus bytes written, as MBM counts them), then idles for ``--idle-s`` seconds. After
every 20 ms tick it writes the bytes it has moved so far to ``--counter``.

This machine has no Intel RDT, so the demo plays the memory controller (demo/memctl.py): it
counts what this job reports into the job's emulated MBM counters and, standing in for MBA,
writes the bandwidth the job's throttle level allows into ``--allowance``, which this job then
keeps to — as a throttled core would be slowed by the hardware.
"""

from __future__ import annotations

import argparse
import sys
import time

# Run as a script beside demo/trainer.py (jobs do not import Trellis): the same atomic write
# of a number into a file another process reads.
from trainer import write_progress

BUFFER_BYTES = 16 << 20
TICK_S = 0.02
MIB = 1 << 20


def read_allowance(path: str | None) -> float | None:
    """MiB/s the emulated MBA lets through, or None while unthrottled or unreadable."""
    if not path:
        return None
    try:
        with open(path) as f:
            return max(0.0, float(f.read().strip()))
    except (OSError, ValueError):
        return None


def copy_bytes(src: bytearray, dst: bytearray, amount: int, offset: int) -> int:
    """Copy about ``amount`` bytes (counted read + written) through the buffers; returns the
    next offset."""
    chunk = max(1, amount // 2)
    size = len(src)
    while chunk > 0:
        n = min(chunk, size - offset)
        dst[offset:offset + n] = src[offset:offset + n]
        chunk -= n
        offset = (offset + n) % size
    return offset


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mibps", type=float, required=True, help="bandwidth to draw, MiB/s")
    p.add_argument("--busy-s", type=float, required=True, help="seconds of copying")
    p.add_argument("--idle-s", type=float, default=0.0, help="seconds of idling afterwards")
    p.add_argument("--counter", help="file to write the bytes moved so far to")
    p.add_argument("--allowance", help="file the emulated MBA writes the allowed MiB/s to")
    args = p.parse_args()
    if not args.mibps > 0 or args.busy_s < 0 or args.idle_s < 0:
        print("--mibps must be positive, --busy-s and --idle-s not negative", file=sys.stderr)
        return 2
    src = bytearray(b"\x5a") * BUFFER_BYTES
    dst = bytearray(BUFFER_BYTES)
    moved, offset = 0, 0
    start = time.monotonic()
    busy_until = start + args.busy_s
    end = busy_until + args.idle_s
    tick = start
    print(f"copying at {args.mibps:g} MiB/s for {args.busy_s:g} s, then idle "
          f"{args.idle_s:g} s", flush=True)
    while True:
        tick += TICK_S
        now = time.monotonic()
        if now >= end:
            break
        if now - tick > TICK_S:
            tick = now  # woken late: no catching up in a burst (the MBA cap holds any window)
        if now < busy_until:
            allowed = read_allowance(args.allowance)
            rate = args.mibps if allowed is None else min(args.mibps, allowed)
            amount = int(rate * MIB * TICK_S)
            offset = copy_bytes(src, dst, amount, offset)
            moved += 2 * max(1, amount // 2)
        write_progress(args.counter, moved)
        pause = tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    write_progress(args.counter, moved)
    print(f"moved {moved / MIB:.0f} MiB in {time.monotonic() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
