#!/usr/bin/env python3
"""An inference replica for the demo (standard library only).

The master starts one per replica the placer launches, with ``TRELLIS_SERVICE``,
``TRELLIS_REPLICA``, ``TRELLIS_REPLICA_KIND`` (cpu or gpu), ``TRELLIS_BATCH`` and
``TRELLIS_SERVICE_PORT`` in its environment. It listens on 127.0.0.1 at that port and answers
every connection with one line naming itself, so a client routed by ``place`` can check that
an endpoint really is the replica the master says it is. It runs until it is stopped (the
master retires a replica with SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys


def main() -> int:
    env = os.environ
    try:
        port = int(env["TRELLIS_SERVICE_PORT"])
    except (KeyError, ValueError):
        print("TRELLIS_SERVICE_PORT is not set: register the service with a port",
              file=sys.stderr)
        return 2
    greeting = (f"{env.get('TRELLIS_REPLICA', '?')} kind={env.get('TRELLIS_REPLICA_KIND', '?')} "
                f"batch={env.get('TRELLIS_BATCH', '?')} "
                f"cuda={env.get('CUDA_VISIBLE_DEVICES', '')}\n").encode()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("127.0.0.1", port))
        except OSError as exc:
            print(f"cannot listen on 127.0.0.1:{port}: {exc}", file=sys.stderr)
            return 1
        server.listen(16)
        print(f"serving on 127.0.0.1:{port}", flush=True)
        while True:
            conn, _ = server.accept()
            with conn, contextlib.suppress(OSError):
                conn.sendall(greeting)


if __name__ == "__main__":
    sys.exit(main())
