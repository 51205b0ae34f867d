"""``trellisctl run`` (srun's contract) and ``trellisctl port-forward`` (docs/interactive.md).

``run`` submits one job, waits for it to start (saying why it waits as that changes), then
either streams its output (the logs stream, as ``logs -f``) with Ctrl-C cancelling the job,
or, with ``--pty``, attaches this terminal to the job's (raw mode, window size changes sent
along, the terminal restored on every way out). It exits with the job's exit code; a job that
ended otherwise exits with :data:`END_CODES`.

``port-forward`` listens on 127.0.0.1:LOCAL here and relays each connection to the port
REMOTE of the job on its node, through the master.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import sys
import time
from typing import Any

from control.usage import UsageError

# Exit codes for jobs that did not end by themselves (documented in docs/interactive.md).
END_CODES = {"cancelled": 130, "timeout": 124, "node_lost": 255}
WAIT_POLL_S = 0.2
JOB_CHECK_S = 2.0  # how often port-forward looks whether its job still runs
ACTIVE = ("queued", "starting", "running")


def exit_code(job: dict[str, Any]) -> int:
    """The code ``trellisctl run`` exits with for an ended job (srun's contract)."""
    state = job.get("state")
    if state in END_CODES:
        return END_CODES[state]
    code = job.get("exit_code")
    if isinstance(code, int):
        return code & 0xFF
    sig = job.get("signal")
    if isinstance(sig, int):
        return 128 + sig
    return 0 if state == "finished" else 1


def say(text: str) -> None:
    sys.stderr.write(f"trellisctl: {text}\r\n" if _raw_now else f"trellisctl: {text}\n")
    sys.stderr.flush()


_raw_now = False


# -- run ------------------------------------------------------------------------------------
def run(client: Any, args: Any) -> int:
    from control.submit import jobs_from_args

    if args.array or args.file:
        raise UsageError("run starts one job: --array and -f/--file belong to submit")
    if args.pty:
        for name, stream in (("standard input", sys.stdin), ("standard output", sys.stdout)):
            if not stream.isatty():
                raise UsageError(f"--pty needs a terminal, and {name} is not one: run it from "
                                 "an interactive shell, or drop --pty")
    jobs, ids = jobs_from_args(args)
    job = jobs[0]
    if args.pty:
        job["launch"] = dict(job.get("launch") or {}, pty=True)
        env = dict(job.get("env") or {})
        env.setdefault("TERM", os.environ.get("TERM", "xterm"))
        job["env"] = env
    params: dict[str, Any] = {"job": job}
    if ids[0]:
        params["id"] = ids[0]
    job_id = client.call("submit", params)["job"]["id"]
    try:
        view = _wait_for_start(client, job_id)
        if view["state"] == "running" and args.pty:
            if not _attach_terminal(client, job_id):
                _cancel(client, job_id)
                return 1
        elif view["state"] in ACTIVE or not args.pty:
            _stream_output(client, job_id)
        return _end(client, job_id)
    except KeyboardInterrupt:
        # Ctrl-C before the start or while the output streams: the job is cancelled (srun).
        _cancel(client, job_id)
        return 130


def attach(client: Any, job_id: str) -> int:
    """``trellisctl attach JOB``: this terminal to a running job's terminal again (after a
    dropped connection, within terminal_grace_s); exits as ``run --pty`` does."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("attach needs a terminal: run it from an interactive shell")
    view = client.call("job", {"id": job_id})["job"]
    if view["state"] != "running":
        say(f"job {job_id} is {view['state']}, not running: there is no terminal to attach to")
        return 1
    if not _attach_terminal(client, job_id):
        return 1
    return _end(client, job_id)


def _wait_for_start(client: Any, job_id: str) -> dict[str, Any]:
    said = ""
    while True:
        view = client.call("job", {"id": job_id})["job"]
        state = view["state"]
        if state not in ("queued", "starting"):
            return view
        news = (f"job {job_id} waits ({view.get('wait') or 'queued'}): "
                f"{view.get('reason') or 'for the next scheduling pass'}"
                if state == "queued" else f"job {job_id} is starting")
        if news != said:
            say(news)
            said = news
        time.sleep(WAIT_POLL_S)


def _end(client: Any, job_id: str) -> int:
    """Wait for the job's end, say why it ended unless it finished, and return the code
    ``run`` and ``attach`` exit with."""
    while (final := client.call("job", {"id": job_id})["job"])["state"] in ACTIVE:
        time.sleep(WAIT_POLL_S)
    if final["state"] != "finished" and final.get("reason"):
        say(f"job {job_id} {final['state']}: {final['reason']}")
    return exit_code(final)


def _cancel(client: Any, job_id: str) -> None:
    with contextlib.suppress(Exception):
        client.call("cancel", {"id": job_id})
    say(f"job {job_id} cancelled")


def _stream_output(client: Any, job_id: str) -> None:
    from control.logs import _Cursor, follow_wait

    cursor = _Cursor(job_id, True, None, None, follow_wait(getattr(client, "timeout", 30.0)))
    out = sys.stdout.buffer
    while not cursor.over:
        for chunk in cursor.take(client.call("logs", cursor.params())):
            out.write(chunk.data)
            out.flush()


# -- the terminal -----------------------------------------------------------------------------
def _attach_terminal(client: Any, job_id: str) -> bool:
    """Attach this terminal to the job's until its session ends; False when the master
    refused (the reason said)."""
    import termios
    import tty

    global _raw_now
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)

    def restore(*_: Any) -> None:
        global _raw_now
        if _raw_now:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
            _raw_now = False

    # SIGTERM and SIGHUP end trellisctl through the finally below (the terminal restored).
    previous = {sig: signal.signal(sig, _raise_exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        tty.setraw(fd, termios.TCSADRAIN)  # not TCSAFLUSH: keys typed while it waited count
        _raw_now = True
        refused, reason = asyncio.run(_terminal_session(client, job_id, fd))
    finally:
        restore()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if reason:
        say(reason)
    return not refused


def _raise_exit(signum: int, _: Any) -> None:
    raise SystemExit(128 + signum)


async def _terminal_session(client: Any, job_id: str, fd: int) -> tuple[bool, str]:
    """(refused, why the session ended when that is news)."""
    from control.relayclient import RelayRefused, open_stream

    rows, cols = _size(fd)
    try:
        stream = await open_stream(client, job_id, "pty", rows=rows, cols=cols,
                                   timeout=getattr(client, "timeout", 30.0))
    except RelayRefused as exc:
        return True, f"{exc.code}: {exc.message}"
    loop = asyncio.get_running_loop()
    keys: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)

    def readable() -> None:
        try:
            data = os.read(fd, 4096)
        except OSError:
            data = b""
        keys.put_nowait(data)
        if keys.full() or not data:
            loop.remove_reader(fd)  # the job is not taking keystrokes: stop reading them

    pending: set[asyncio.Task[None]] = set()

    def resized() -> None:
        r, c = _size(fd)
        task = loop.create_task(stream.resize(r, c))
        pending.add(task)
        task.add_done_callback(pending.discard)

    async def typing() -> None:
        while True:
            data = await keys.get()
            if not data:
                return
            await stream.send(data)
            if keys.empty():
                loop.add_reader(fd, readable)  # again, if a full queue stopped it

    loop.add_reader(fd, readable)
    loop.add_signal_handler(signal.SIGWINCH, resized)
    typist = loop.create_task(typing())
    out = sys.stdout.fileno()
    try:
        while data := await stream.recv():
            view = memoryview(data)
            while view:  # a blocking write: a terminal that does not keep up slows the job
                view = view[os.write(out, view):]
    finally:
        loop.remove_reader(fd)
        loop.remove_signal_handler(signal.SIGWINCH)
        typist.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await typist
        await stream.close()
    return False, "" if "session ended" in stream.reason else stream.reason


def _size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
        return size.lines, size.columns
    except OSError:
        return 24, 80


# -- port-forward -----------------------------------------------------------------------------
def parse_ports(text: str) -> tuple[int, int]:
    local, sep, remote = text.partition(":")
    try:
        lport = int(local)
        rport = int(remote) if sep else lport
    except ValueError:
        raise UsageError(f"ports must be LOCAL or LOCAL:REMOTE port numbers, got {text!r}"
                         ) from None
    for port in (lport, rport):
        if not 0 < port < 65536:
            raise UsageError(f"port {port} is out of range (1-65535)")
    return lport, rport


def port_forward(client: Any, job_id: str, ports: str) -> int:
    from control.relayclient import RelayRefused, open_stream

    lport, rport = parse_ports(ports)
    view = client.call("job", {"id": job_id})["job"]
    if view["state"] != "running":
        say(f"job {job_id} is {view['state']}, not running: only a running job's ports can "
            "be forwarded")
        return 1
    timeout = getattr(client, "timeout", 30.0)
    try:
        # Is anything of the job listening there? Asked before a local port is taken.
        asyncio.run(open_stream(client, job_id, "tcp", port=rport, probe=True,
                                timeout=timeout))
    except RelayRefused as exc:
        say(exc.message)
        return 1
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", lport))
        listener.listen(64)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            say(f"local port {lport} is taken already (127.0.0.1:{lport}); pick another "
                "LOCAL port")
        else:
            say(f"cannot listen on 127.0.0.1:{lport}: {exc.strerror or exc}")
        return 1
    print(f"Forwarding from 127.0.0.1:{lport} -> job {job_id} port {rport}", flush=True)
    try:
        return asyncio.run(_serve(client, job_id, rport, listener, timeout))
    except KeyboardInterrupt:
        return 0
    finally:
        listener.close()


async def _serve(client: Any, job_id: str, rport: int, listener: socket.socket,
                 timeout: float) -> int:
    from control.client import Unreachable
    from control.relayclient import RelayRefused, open_stream

    over: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            stream = await open_stream(client, job_id, "tcp", port=rport, timeout=timeout)
        except RelayRefused as exc:
            say(exc.message)
            writer.close()
            if exc.code == "not_running" and not over.done():
                over.set_result(1)
            return
        except Unreachable as exc:
            say(str(exc))
            writer.close()
            return
        await _splice(reader, writer, stream)

    async def watch() -> None:
        """The forward ends with the job (checked every JOB_CHECK_S)."""
        loop = asyncio.get_running_loop()
        while not over.done():
            await asyncio.sleep(JOB_CHECK_S)
            try:
                view = (await loop.run_in_executor(None, client.call, "job",
                                                   {"id": job_id}))["job"]
            except Exception:  # unreachable for a moment: the next look decides
                continue
            if view["state"] != "running" and not over.done():
                say(f"job {job_id} is {view['state']}: the forward ends")
                over.set_result(1)

    server = await asyncio.start_server(connection, sock=listener, limit=64 * 1024)
    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        async with server:
            return await over
    finally:
        watcher.cancel()


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  stream: Any) -> None:
    """One forwarded connection: each side's bytes to the other, each bounded by the
    other's pace (the stream's window one way, the socket's drain the other)."""
    async def upstream() -> None:
        while data := await reader.read(64 * 1024):
            await stream.send(data)
        await stream.close("the local connection closed")

    up = asyncio.get_running_loop().create_task(upstream())
    try:
        while data := await stream.recv():
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass  # the local peer went away: the stream ends with it
    finally:
        up.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await up
        await stream.close()
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()
            await writer.wait_closed()
