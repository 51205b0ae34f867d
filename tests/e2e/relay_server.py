"""A job's TCP server for the port-forward tests and bench/interactive.py (run as the job, with
the system's python3): listens on a free loopback port, writes it to PORTFILE, and serves
each connection by its first line:

* ``echo``: sends back everything that follows until the peer closes;
* ``send N``: sends N bytes, then closes;
* ``flood``: sends as fast as the connection takes, writing the running total to
  COUNTFILE (a stalled reader must stop it: the relays' back-pressure).
"""

from __future__ import annotations

import os
import socket
import sys
import threading

CHUNK = 64 * 1024


def write_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def serve(conn: socket.socket, countfile: str) -> None:
    with conn:
        line = b""
        while not line.endswith(b"\n"):
            more = conn.recv(1)
            if not more:
                return
            line += more
        words = line.decode().split()
        block = b"x" * CHUNK
        if words[0] == "echo":
            while data := conn.recv(CHUNK):
                conn.sendall(data)
        elif words[0] == "send":
            left = int(words[1])
            while left > 0:
                sent = conn.send(block[:min(CHUNK, left)])
                left -= sent
        elif words[0] == "flood":
            total = 0
            while True:
                total += conn.send(block)
                write_atomic(countfile, str(total))


def main() -> None:
    portfile, countfile = sys.argv[1], sys.argv[2]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    write_atomic(portfile, str(listener.getsockname()[1]))
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, countfile), daemon=True).start()


if __name__ == "__main__":
    main()
