"""TCP flows on a wall-clock schedule, for the network-partition e2e test.

send: connects to host:port and writes as fast as TCP allows inside each ``--send A:B``
      window (epoch seconds), idles between windows, closes at the last window's end.
recv: listens on ``--ports``, counts the bytes each port delivers per ``--bucket`` seconds
      from ``--t0`` until ``--until`` (epoch seconds), then prints them as JSON.
Both stop by themselves at their deadline.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import sys
import time


def send(host: str, port: int, windows: list[tuple[float, float]]) -> int:
    end = windows[-1][1]
    sock = None
    while sock is None and time.time() < end:
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
        except OSError:
            time.sleep(0.05)
    if sock is None:
        return 1
    chunk = b"\0" * (1 << 16)
    sock.settimeout(0.2)
    try:
        for start, stop in windows:
            while time.time() < start:
                time.sleep(0.01)
            while time.time() < stop:
                try:
                    sock.send(chunk)
                except TimeoutError:
                    continue
    except OSError:
        pass  # the receiver hung up
    finally:
        sock.close()
    return 0


def receive(host: str, ports: list[int], t0: float, until: float, bucket: float) -> int:
    sel = selectors.DefaultSelector()
    for port in ports:
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind((host, port))
        lst.listen(1)
        lst.setblocking(False)
        sel.register(lst, selectors.EVENT_READ, ("listen", port))
    print("READY", flush=True)
    slots = max(1, int((until - t0) / bucket) + 1)
    counts = {port: [0] * slots for port in ports}
    while time.time() < until:
        for key, _ in sel.select(timeout=0.05):
            role, port = key.data
            if role == "listen":
                conn, _ = key.fileobj.accept()
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, ("conn", port))
                continue
            try:
                data = key.fileobj.recv(1 << 18)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                continue
            k = int((time.time() - t0) / bucket)
            if 0 <= k < slots:
                counts[port][k] += len(data)
    print(json.dumps({str(p): c for p, c in counts.items()}), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["recv", "send"])
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--send", action="append", default=[], help="A:B epoch window")
    ap.add_argument("--ports", default="")
    ap.add_argument("--t0", type=float, default=0.0)
    ap.add_argument("--until", type=float, default=0.0)
    ap.add_argument("--bucket", type=float, default=0.25)
    args = ap.parse_args()
    if args.role == "recv":
        ports = [int(p) for p in args.ports.split(",") if p]
        return receive(args.host, ports, args.t0, args.until, args.bucket)
    windows = [tuple(float(x) for x in w.split(":")) for w in args.send]
    return send(args.host, args.port, windows)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
