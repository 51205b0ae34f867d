"""TCP flows for the netshape tests, run as subprocesses inside network namespaces.

recv: listens on several ports, accepts one connection on each, lets them warm up, then counts
      the bytes each delivers in one common measuring window and prints them as JSON.
send: connects to one port and writes as fast as TCP allows until the receiver hangs up.
Both stop by themselves at a hard deadline.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import sys
import time


def receive(host: str, ports: list[int], warmup: float, measure: float, deadline: float) -> int:
    sel = selectors.DefaultSelector()
    listeners = []
    for port in ports:
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind((host, port))
        lst.listen(1)
        lst.setblocking(False)
        sel.register(lst, selectors.EVENT_READ, ("listen", port))
        listeners.append(lst)
    print("READY", flush=True)
    counts = {port: 0 for port in ports}
    conns: dict[int, socket.socket] = {}
    window: tuple[float, float] | None = None
    while time.monotonic() < deadline:
        now = time.monotonic()
        if window is None and len(conns) == len(ports):
            window = (now + warmup, now + warmup + measure)
        if window is not None and now >= window[1]:
            break
        for key, _ in sel.select(timeout=0.05):
            role, port = key.data
            if role == "listen":
                conn, _ = key.fileobj.accept()
                conn.setblocking(False)
                conns[port] = conn
                sel.unregister(key.fileobj)
                sel.register(conn, selectors.EVENT_READ, ("conn", port))
                continue
            try:
                data = key.fileobj.recv(1 << 18)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                continue
            t = time.monotonic()
            if window is not None and window[0] <= t < window[1]:
                counts[port] += len(data)
    for sock in [*conns.values(), *listeners]:
        sock.close()
    if window is None:
        print(json.dumps({"error": f"only {len(conns)} of {len(ports)} flows connected"}))
        return 1
    print(json.dumps({str(p): n for p, n in counts.items()}), flush=True)
    return 0


def send(host: str, port: int, wait_stdin: bool, deadline: float) -> int:
    if wait_stdin:
        sys.stdin.readline()  # the test classifies this process first, then says go
    sock = None
    while sock is None and time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, port), timeout=1.0)
        except OSError:
            time.sleep(0.05)
    if sock is None:
        return 1
    chunk = b"\0" * (1 << 16)
    sock.settimeout(1.0)
    try:
        while time.monotonic() < deadline:
            try:
                sock.sendall(chunk)
            except TimeoutError:
                continue
    except OSError:
        pass  # the receiver hung up: the measurement is over
    finally:
        sock.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["recv", "send"])
    ap.add_argument("--host", required=True)
    ap.add_argument("--ports", default="")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--warmup", type=float, default=0.7)
    ap.add_argument("--measure", type=float, default=3.0)
    ap.add_argument("--wait-stdin", action="store_true")
    ap.add_argument("--timeout", type=float, default=15.0)
    args = ap.parse_args()
    deadline = time.monotonic() + args.timeout
    if args.role == "recv":
        ports = [int(p) for p in args.ports.split(",") if p]
        return receive(args.host, ports, args.warmup, args.measure, deadline)
    return send(args.host, args.port, args.wait_stdin, deadline)


if __name__ == "__main__":
    sys.exit(main())
