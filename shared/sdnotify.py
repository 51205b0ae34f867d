"""systemd's notification protocol (sd_notify), without libsystemd.

A service with ``Type=notify`` tells systemd it is ready by sending ``READY=1`` as a datagram
to the AF_UNIX socket named by ``$NOTIFY_SOCKET``; ``STATUS=...`` lines show up in
``systemctl status``; ``WATCHDOG=1`` pings keep a ``WatchdogSec=`` service from being killed.
A name starting with ``@`` is in the abstract socket namespace (a leading NUL byte).

Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op, so the daemons use the same
code in a terminal, in tests and under systemd.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping

log = logging.getLogger("trellis.sdnotify")

# Variables a service must not pass on: a job or helper inheriting them could report for us.
_OWN_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def socket_address(name: str) -> str | bytes:
    """The sockaddr for a ``$NOTIFY_SOCKET`` value; ``@name`` is abstract (leading NUL)."""
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    return name


class Notifier:
    """Sends notifications to the service manager named by the environment.

    The environment is read once and the service manager's variables are removed from it
    (``unset_environment``), so processes the daemon starts never talk to systemd in its name.
    Sending never raises: a daemon must not fail because its supervisor went away.
    """

    def __init__(
        self,
        environ: MutableMapping[str, str] | None = None,
        unset_environment: bool = True,
        pid: int | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET") or None
        self._monotonic = monotonic
        self.watchdog_s = _watchdog_seconds(env, os.getpid() if pid is None else pid)
        if unset_environment:
            for key in _OWN_VARIABLES:
                env.pop(key, None)
        self._sock: socket.socket | None = None
        self.last_status = ""

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *lines: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; True if it was handed to the socket."""
        if self.address is None:
            return False
        payload = "\n".join(lines).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, socket_address(self.address))
        except OSError as exc:
            log.debug("notify_socket=%s send failed: %s", self.address, exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        lines = ["READY=1"]
        if status is not None:
            lines.append(_status_line(status))
            self.last_status = status
        return self.notify(*lines)

    def status(self, text: str) -> bool:
        """Update the one-line status; repeated identical text is not re-sent."""
        if text == self.last_status:
            return False
        self.last_status = text
        return self.notify(_status_line(text))

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets systemd (Type=notify-reload) match this to the reload it asked for.
        usec = int(self._monotonic() * 1_000_000)
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self, status: str | None = None) -> bool:
        lines = ["STOPPING=1"]
        if status is not None:
            lines.append(_status_line(status))
            self.last_status = status
        return self.notify(*lines)

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    async def watchdog_loop(self) -> None:
        """Ping at half the watchdog interval from the event loop until cancelled: when the
        loop hangs the pings stop and systemd restarts the daemon."""
        if self.watchdog_s is None or not self.enabled:
            return
        period = self.watchdog_s / 2
        while True:
            self.watchdog()
            await asyncio.sleep(period)

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


def _status_line(text: str) -> str:
    # One datagram line per field: a newline inside the status would start a new field.
    return "STATUS=" + " ".join(text.split("\n"))


def _watchdog_seconds(env: MutableMapping[str, str], pid: int) -> float | None:
    """The watchdog interval in seconds if it applies to this process, else None."""
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    owner = env.get("WATCHDOG_PID")
    if owner:
        try:
            if int(owner) != pid:
                return None  # meant for another process (we were started by the service)
        except ValueError:
            return None
    try:
        usec = int(raw)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number; watchdog pings disabled", raw)
        return None
    return usec / 1_000_000 if usec > 0 else None
