"""Interactive jobs on an idle cluster: ``trellisctl run --pty`` scripted through a
pseudo-terminal, and ``trellisctl port-forward`` against a direct loopback copy.

    python bench/interactive.py [--starts 5] [--keys 200] [--mib 256]

Starts a real trellis-masterd and one trellis-noded on this machine, then:

* ``pty_start_s_p50``: ``--starts`` times, from starting ``trellisctl run --pty --cpus 1 -- sh``
  on a terminal of ours (process start-up, submission, scheduling, the shim, the relay) to
  the job's shell prompt on it (target <= 1.5 s); each session then types ``exit``;
* ``keystroke_echo_ms_p99``: in one of those sessions, ``--keys`` single keystrokes, each
  timed from our write to its echo by the job's terminal coming back through node, master
  and trellisctl (target <= 50 ms on loopback);
* ``port_forward_mb_per_s``: a job's TCP server sends ``--mib`` MiB on a connection through
  ``trellisctl port-forward`` (job -> noded -> master -> trellisctl -> us);
  ``direct_mb_per_s`` the same server and size on a direct loopback connection, in the same
  run; ``port_forward_ratio`` the first over the second (the goal: >= 0.95);
  ``relay_cpu_s`` the CPU time (user + system) noded, the master and trellisctl spent
  during the forwarded copy.

Last line: JSON with those, ``seconds`` (the whole run) and whether each target is met.
SIGTERM or Ctrl-C stops everything it started and removes the scratch directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from demo.cluster import LocalCluster, default_job_user  # noqa: E402
from demo.harness import exit_on_signals, scratch_dir  # noqa: E402
from demo.terminal import Terminal  # noqa: E402

TARGET_START_S = 1.5
TARGET_ECHO_MS = 50.0
TARGET_RATIO = 0.95
MB = 1e6


def ctl(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "control.cli", "--master", url, *args]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def receive(sock: socket.socket, size: int) -> float:
    """Seconds to receive ``size`` bytes on ``sock``."""
    buf = bytearray(1 << 20)
    got = 0
    started = time.perf_counter()
    while got < size:
        n = sock.recv_into(buf)
        if not n:
            raise RuntimeError(f"the connection closed after {got} of {size} bytes")
        got += n
    return time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--starts", type=int, default=5, help="terminal sessions started")
    p.add_argument("--keys", type=int, default=200, help="keystrokes timed")
    p.add_argument("--mib", type=int, default=256, help="MiB copied each way")
    args = p.parse_args()
    began = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRELLIS_")}
    env.update(PYTHONPATH=str(ROOT), TERM="xterm")
    user = default_job_user()
    size = args.mib << 20
    forward: subprocess.Popen[bytes] | None = None
    with exit_on_signals(), scratch_dir("trellis-test-bench-interactive-", mode=0o777) as root, \
            LocalCluster(root / "c", nodes=1, gpus_per_node=1,
                         prefix="trellis-bench-interactive",
                         node_settings={"log_level": "warning"},
                         extra_master={"log_level": "warning"}) as cluster:
        try:
            cluster.start()
            client = cluster.client(timeout=30)
            starts: list[float] = []
            echoes: list[float] = []
            for i in range(args.starts):
                started = time.perf_counter()
                with Terminal(ctl(cluster.url, "run", "--id", f"shell-{i}", "--user", user,
                                  "--cpus", "1", "--pty", "--", "sh"), env, ROOT) as term:
                    term.expect(b"$ ", 60)
                    starts.append(time.perf_counter() - started)
                    if i == 0:
                        for k in range(args.keys):
                            key = b"abcdefghij"[k % 10:k % 10 + 1]
                            typed = time.perf_counter()
                            term.type(key)
                            term.expect(key, 10)
                            echoes.append((time.perf_counter() - typed) * 1000)
                        term.type(b"\x15")  # Ctrl-U: the typed line is dropped
                    term.type(b"exit\r")
                    if term.wait(30) != 0:
                        raise RuntimeError(f"shell-{i} exited {term.proc.returncode}")

            shutil.copy(ROOT / "tests" / "e2e" / "relay_server.py", root / "server.py")
            portfile = root / "server.port"
            client.call("submit", {"id": "server", "job": {
                "name": "server", "command": ["python3", str(root / "server.py"),
                                              str(portfile), str(root / "count")],
                "user": user, "kind": "cpu", "cpus": 1}})
            remote = int(cluster.wait_for("the job's server", lambda: portfile.exists()
                                          and portfile.read_text(), timeout=60))
            with socket.create_connection(("127.0.0.1", remote)) as direct:
                direct.sendall(f"send {size}\n".encode())
                direct_s = receive(direct, size)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                local = s.getsockname()[1]
            forward = subprocess.Popen(ctl(cluster.url, "port-forward", "server",
                                           f"{local}:{remote}"), stdout=subprocess.PIPE,
                                       env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
            assert forward.stdout is not None
            if not forward.stdout.readline().startswith(b"Forwarding from"):
                raise RuntimeError("trellisctl port-forward did not start")
            # The CPU the relaying processes spend on it: noded, the master, trellisctl.
            relaying = [psutil.Process(d.proc.pid) for d in (cluster.master,
                        *cluster.node_daemons.values()) if d is not None and d.proc] + [
                        psutil.Process(forward.pid)]
            cpu_before = sum(cpu_seconds(p) for p in relaying)
            with socket.create_connection(("127.0.0.1", local)) as relayed:
                relayed.sendall(f"send {size}\n".encode())
                relayed_s = receive(relayed, size)
            relay_cpu_s = sum(cpu_seconds(p) for p in relaying) - cpu_before
            client.call("cancel", {"id": "server"})
        except Exception:
            print(cluster.log("master")[-2000:], cluster.log(cluster.node_name(1))[-2000:],
                  file=sys.stderr)
            raise
        finally:
            if forward is not None and forward.poll() is None:
                forward.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    forward.wait(10)
                if forward.poll() is None:
                    forward.kill()
                    forward.wait()
    start_p50 = statistics.median(starts)
    echo_p99 = percentile(echoes, 0.99)
    forwarded = size / MB / relayed_s
    direct_rate = size / MB / direct_s
    ratio = forwarded / direct_rate
    result = {
        "pty_start_s_p50": round(start_p50, 3),
        "pty_start_s_max": round(max(starts), 3),
        "keystroke_echo_ms_p50": round(statistics.median(echoes), 2),
        "keystroke_echo_ms_p99": round(echo_p99, 2),
        "port_forward_mb_per_s": round(forwarded, 1),
        "direct_mb_per_s": round(direct_rate, 1),
        "port_forward_ratio": round(ratio, 3),
        "relay_cpu_s": round(relay_cpu_s, 2),
        "bytes": size,
        "seconds": round(time.perf_counter() - began, 1),
        "targets": {"pty_start_s_p50": TARGET_START_S,
                    "keystroke_echo_ms_p99": TARGET_ECHO_MS,
                    "port_forward_ratio": TARGET_RATIO},
        "meets_targets": {"pty_start_s_p50": start_p50 <= TARGET_START_S,
                          "keystroke_echo_ms_p99": echo_p99 <= TARGET_ECHO_MS,
                          "port_forward_ratio": ratio >= TARGET_RATIO},
    }
    print(f"shell prompt after {start_p50:.2f} s (p50 of {len(starts)}), keystroke echo "
          f"p99 {echo_p99:.1f} ms, port-forward {forwarded:.0f} MB/s vs direct "
          f"{direct_rate:.0f} MB/s ({ratio:.2f}), relaying it took {relay_cpu_s:.1f} CPU-s",
          file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
